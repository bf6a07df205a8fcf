"""`counterprof run -r N`: one command run N times into a run set (counterprof/repeat_set.py).

The runs go on after a workload fails (its status is recorded and is the set's exit status);
a run stopped by a signal `counterprof run` forwards (Ctrl-C, a termination) ends the
repetitions, and the set keeps the runs that finished, with their means ± sd in runset.json.
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the signals `counterprof run` forwards to the workload: a run ended by one was stopped on purpose
STOPPING = {128 + int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}


def new_set(base: Path, command: list[str], n: int) -> dict[str, Any]:
    """The set's record, written to base's runset.json before its first run."""
    from . import __version__
    from .repeat_set import write_set
    data: dict[str, Any] = {"kind": "counterprof run set", "counterprof_version": __version__, "command": command,
                            "repeat": n, "runs": [], "exit_statuses": [], "start_time": time.time()}
    write_set(base, data)
    return data


def repeat(base: Path, data: dict[str, Any], run_member: Callable[[Path], int],
           warn: Callable[[str], None]) -> int:
    """run_member(its directory) for each of the set's data["repeat"] runs, recorded in data and
    runset.json as each ends; the first failing run's exit status, else 0."""
    from .repeat_set import member_name, write_set
    n = data["repeat"]
    status = 0
    for i in range(1, n + 1):
        rc = run_member(base / member_name(i))
        data["runs"].append(member_name(i))
        data["exit_statuses"].append(rc)
        write_set(base, data)
        if rc and not status:
            status = rc
        if rc in STOPPING:
            warn(f"run {i} of {n} was stopped (exit status {rc}); not repeating further")
            data["stopped_after"] = i
            break
    return status


def finish_set(base: Path, data: dict[str, Any], warn: Callable[[str], None]) -> tuple[list[Path], Any]:
    """The set's runs and their summary (analysis.repeat.combine; None when it could not be
    made, said through warn), the summary kept in runset.json. A set whose first run failed
    before it wrote anything (bad events, say) is removed: ([], None)."""
    from .analysis.repeat import combine
    from .analysis.summary import run_summary
    from .repeat_set import SET_FILE, members, write_set
    from .store.reader import Run
    runs = members(base)
    if not runs:
        (base / SET_FILE).unlink(missing_ok=True)
        try:
            base.rmdir()
        except OSError:
            pass
        return [], None
    summary = None
    try:
        summary = combine([run_summary(Run(p)) for p in runs])
        data["summary"] = summary.to_dict()
        write_set(base, data)
    except Exception as exc:     # the runs are on disk; a summary problem must not hide that
        warn(f"could not summarize the run set: {exc}")
    return runs, summary
