"""counterprof run -r N -- CMD: run the command N times, like `perf stat -r N`.

Each repetition is an ordinary `counterprof run` into SET/run-<i>/ (see counterprof/runset.py);
the summary on stderr gives the means over the runs with their standard deviations, and
runset.json records the set, so `compare SET_A SET_B` and `history add SET` take its runs as
the runs of one side. The runs go on after a workload fails (its status is recorded and is the
exit status); Ctrl-C or a forwarded termination signal stops the repetitions, and the set keeps
the runs that finished.
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable

from .common import UsageFailure, err

# the signals `counterprof run` forwards to the workload: a run ended by one was stopped on purpose
_STOPPING = {128 + int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}


def add_arguments(p) -> None:
    p.add_argument("-r", "--repeat", type=int, metavar="N",
                   help="run the command N times (like perf stat -r): the summary gives means "
                        "± standard deviation; -o DIR holds the runs as DIR/run-1 ... run-N")


def run_repeated(args, run_once: Callable, usage: str) -> int:
    """Run `run_once(args)` args.repeat times, each into its own member directory."""
    from .. import __version__
    from ..runset import member_name, prepare_dir, write_set
    from ..store.rundir import default_run_path
    n = args.repeat
    if n < 1:
        raise UsageFailure("-r/--repeat takes a count of 1 or more", usage)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageFailure("-r repeats a command: give it after --", usage)
    if args.live:
        raise UsageFailure("-r and --live do not go together (one dashboard per run); drop one", usage)
    from ..workload import check_command
    check_command(command)          # 127/126 before the set is created
    base = prepare_dir(args.output or default_run_path(), replace=args.force)
    quiet = args.quiet
    data = {"kind": "counterprof run set", "counterprof_version": __version__, "command": command,
            "repeat": n, "runs": [], "exit_statuses": [], "start_time": time.time()}
    write_set(base, data)
    status = 0
    try:
        for i in range(1, n + 1):
            args.output, args.force, args.quiet = str(base / member_name(i)), False, True
            rc = run_once(args)
            data["runs"].append(member_name(i))
            data["exit_statuses"].append(rc)
            write_set(base, data)
            if rc and not status:
                status = rc
            if rc in _STOPPING:
                err(f"run {i} of {n} was stopped (exit status {rc}); not repeating further")
                data["stopped_after"] = i
                break
    finally:
        _finish(base, data, quiet, getattr(args, "json", False))
    return status


def _finish(base, data: dict, quiet: bool, as_json: bool = False) -> None:
    """The set's summary (means ± sd) into runset.json and, unless -q, on stderr."""
    from ..analysis.repeat import combine
    from ..runset import SET_FILE, members, write_set
    from ..store.reader import Run
    runs = members(base)
    if not runs:        # the first run failed before it wrote anything (bad events, say): no set
        (base / SET_FILE).unlink(missing_ok=True)
        try:
            base.rmdir()
        except OSError:
            pass
        return
    summary = None
    if runs:
        try:
            summary = combine([Run(p).summary() for p in runs])
            data["summary"] = summary.to_dict()
            write_set(base, data)
        except Exception as exc:     # the runs are on disk; a summary problem must not hide that
            err(f"could not summarize the run set: {exc}")
    if summary is not None and not quiet:
        from .run import print_summary
        print_summary(summary, as_json)
    last = f", {base}/run-1 to run-{len(runs)}" if len(runs) > 1 else ""
    err(f"run set: {base} ({len(runs)} run{'s' if len(runs) != 1 else ''}{last})")
