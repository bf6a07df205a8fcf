"""`counterprof trace`: ask a job running under `counterprof run --torch` to trace its next
steps (or the next milliseconds) now, on every rank, and wait for the answers.

    a = ask(runs, steps=3)       # the ask written into each run (store/control.py), start_step set
    done = wait(a, timeout_s)    # per process: traced (steps, file, bytes) or not reached, and why

Steps: every process starts its window at the same step number (store/control.py's
start_step); a process that marks no steps traces a time window instead.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ground.errors import UsageError
from .store import control

POLL_S = 0.1


@dataclass
class Ask:
    id: str
    runs: list[Path]
    steps: int | None
    ms: int | None
    start_step: int | None
    expected: dict[tuple[str, str, int], dict[str, Any]]    # (run, host, pid) -> its driver's registration
    gone: dict[tuple[str, str, int], dict[str, Any]] = field(default_factory=dict)   # exited before it


def _alive(doc: dict[str, Any]) -> bool | None:
    """Whether a registered process runs (None: on another host, cannot tell from here)."""
    if doc.get("host") != socket.gethostname().split(".")[0]:
        return None
    try:
        pid = int(doc["pid"])
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False
    return state not in (b"Z", b"X")       # a zombie (its parent has not reaped it) has exited


def check_running(run: Path) -> None:
    """A UsageError unless run is a run being recorded now with torch drivers in it."""
    from .store.liveness import profiler_alive
    from .store.meta import read_meta
    if not (run / "meta.json").is_file():
        raise UsageError(f"{run}: not a counterprof run (no meta.json): give the -o of a running "
                         "`counterprof run --torch`")
    meta = read_meta(run / "meta.json")
    if not profiler_alive(meta):
        raise UsageError(f"{run}: its profiler is not running (the job has finished, or was not started "
                         "under `counterprof run`): `trace` asks a running job")
    if not control.drivers(run):
        command = " ".join(map(str, meta.get("command") or [])) or "the workload"
        drivers = {"torch", "jax"} & set(meta.get("collectors") or {})
        raise UsageError(f"{run}: no process of the job has counterprof's torch or jax driver ({command}): "
                         + ("it has not imported torch or jax yet, or is no Python program: only Python processes "
                            "that import them can be asked for a trace" if drivers else
                            "it runs without --torch or --jax: start it with `counterprof run --torch -- ...`"))


def _user() -> str:
    import getpass
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def ask(runs: list[Path], steps: int | None = None, ms: int | None = None) -> Ask:
    """Write the ask into each run (every process of every run traces the same steps)."""
    for r in runs:
        check_running(r)
    doc = control.new_ask(runs, steps, ms, f"{_user()}@{socket.gethostname()}")
    expected: dict[tuple[str, str, int], dict[str, Any]] = {}
    gone: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in runs:
        for d in control.drivers(r):
            key = (str(r), str(d.get("host")), int(d.get("pid") or 0))
            (gone if _alive(d) is False else expected)[key] = d
    for r in runs:
        control.write_ask(r, doc)
    return Ask(doc["id"], runs, steps, ms, doc["start_step"], expected, gone)


def wait(a: Ask, timeout_s: float) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Every expected process's answer; one that exits without answering, or has not answered
    by the timeout, gets a "not reached" of ours saying so."""
    deadline = time.monotonic() + timeout_s
    got: dict[tuple[str, str, int], dict[str, Any]] = {}
    while True:
        for r in a.runs:
            for d in control.answers(r, a.id):
                got[(str(r), str(d.get("host")), int(d.get("pid") or 0))] = d
        missing = [k for k in a.expected if k not in got]
        for k in missing:
            if _alive(a.expected[k]) is False:
                time.sleep(POLL_S)          # (an answer written as it exited)
                late = {(str(k[0]), str(d.get("host")), int(d.get("pid") or 0)): d for d in control.answers(k[0], a.id)}
                got[k] = late.get(k) or {**a.expected[k], "status": "not reached",
                                         "why": "the process exited without answering"}
        if all(k in got for k in a.expected) or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    for k in a.expected:
        if k not in got:
            why = (f"did not reach step {a.start_step} within {timeout_s:g} s" if a.start_step is not None
                   else f"did not answer within {timeout_s:g} s")
            got[k] = {**a.expected[k], "status": "not reached", "why": why}
    for k, d in a.gone.items():
        got[k] = {**d, "status": "not reached", "why": "exited before the ask"}
    return got
