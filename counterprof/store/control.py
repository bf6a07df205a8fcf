"""A run's control channel: `counterprof trace` asks the drivers inside a running job for a
window now, and each answers (the driver's side: collectors/torch_trace/bootstrap).

<run>/_control/drivers/<host>_<pid>.json     a Python process of the job with a driver: pid, host, rank
<run>/_control/trace/<id>.json               an ask: id, steps or ms, start_step, asked_ns, by
<run>/_control/answers/<id>/<host>_<pid>.json   a process's answer: status (traced, not reached),
                                             steps [first, last] or ms, file, bytes, why

Files are written whole (renamed into place), 0600 in 0700 folders, never through a link; the
folder starts with "_", so dataset readers skip it.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any

CONTROL = "_control"
LEAD_S = 3.0


def _read(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            doc = json.loads(os.read(fd, 1 << 20))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _docs(folder: Path) -> list[dict[str, Any]]:
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    return [d for d in (_read(folder / n) for n in names) if d is not None]


def _last_steps(run: Path) -> list[tuple[int, list[int]]]:
    """Per steps file: (the last step number, the ns from one step's start to the next's over its
    last steps: a step's pace, what lies between two annotated steps included)."""
    from .rundir import trace_files
    out = []
    for f in trace_files(run, "*.steps"):
        try:
            with open(f, "rb") as fh:
                fh.seek(max(0, os.path.getsize(f) - 65536))
                lines = fh.read().decode(errors="replace").splitlines()[1:]
        except OSError:
            continue
        found: list[tuple[int, int, int]] = []
        for ln in lines:
            parts = ln.split("\t")
            if len(parts) == 5 and parts[0] == "step" and "#" in parts[4]:
                try:
                    found.append((int(parts[4].rsplit("#", 1)[1]), int(parts[1]), int(parts[2])))
                except ValueError:
                    continue
        if found:
            recent = found[-21:]
            periods = [b[1] - a[1] for a, b in zip(recent, recent[1:]) if b[1] > a[1]]
            out.append((found[-1][0], periods or [recent[-1][2] - recent[-1][1]]))
    return out


def start_step(runs: list[Path]) -> int | None:
    """The first step every process can still reach in time (None: no process marks steps):
    past the step each process last wrote (its steps file, flushed once a second) by what its
    fastest recent step (start to start) covers in LEAD_S (a second for that file to be flushed, a second for the
    driver to look, and a margin), so every rank is still before it when the ask reaches it."""
    starts = []
    for run in runs:
        for last, durations in _last_steps(run):
            pace = min(durations) if durations else 0      # the fastest recent step: the most ahead
            ahead = min(100_000, math.ceil(LEAD_S * 1e9 / pace)) if pace > 0 else 1
            starts.append(last + 1 + ahead)
    return max(starts) if starts else None


def new_ask(runs: list[Path], steps: int | None, ms: int | None, by: str) -> dict[str, Any]:
    """An ask for the runs of one job: its id, what, the step every process starts from."""
    return {"id": time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3),
            "steps": steps, "ms": ms, "start_step": start_step(runs) if steps else None,
            "asked_ns": time.time_ns(), "by": by}


def drivers(run: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The processes of the job that registered a driver, in name order."""
    return _docs(Path(run) / CONTROL / "drivers")


def asks(run: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every ask made of the run, oldest first."""
    return sorted(_docs(Path(run) / CONTROL / "trace"), key=lambda d: d.get("asked_ns") or 0)


def answers(run: str | os.PathLike[str], ask_id: str) -> list[dict[str, Any]]:
    return _docs(Path(run) / CONTROL / "answers" / ask_id)


def write_ask(run: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """<run>/_control/trace/<id>.json, whole. Raises OSError."""
    folder = Path(run)
    for part in (CONTROL, "trace"):
        folder = folder / part
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        name = f"{doc['id']}.json"
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            os.write(fd, json.dumps(doc).encode())
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
