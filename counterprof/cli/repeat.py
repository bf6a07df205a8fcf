"""counterprof run -r N -- CMD: run the command N times, like `perf stat -r N`.

Each repetition is an ordinary `counterprof run` into SET/run-<i>/ (see counterprof/repeat_set.py);
the summary on stderr gives the means over the runs with their standard deviations, and
runset.json records the set, so `compare SET_A SET_B` and `history add SET` take its runs as
the runs of one side. The runs go on after a workload fails (its status is recorded and is the
exit status); Ctrl-C or a forwarded termination signal stops the repetitions, and the set keeps
the runs that finished.
"""
from __future__ import annotations

from collections.abc import Callable

from .common import UsageFailure, err

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    import argparse
    from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-r", "--repeat", type=int, metavar="N",
                   help="run the command N times (like perf stat -r): the summary gives means "
                        "± the standard deviation of the mean, as perf prints it; -o DIR holds "
                        "the runs as DIR/run-1 ... run-N")


def run_repeated(args: argparse.Namespace, run_once: Callable[[argparse.Namespace], int],
                 usage: str) -> int:
    """Run `run_once(args)` args.repeat times, each into its own member directory."""
    from ..repeat import finish_set, new_set, repeat
    from ..repeat_set import prepare_dir
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
    machine = getattr(args, "machine", None)
    args.warnings_seen = set()      # a warning every run gives is said once

    def run_member(path: Path) -> int:
        args.output, args.force, args.quiet, args.machine = str(path), False, True, None
        return run_once(args)
    data = new_set(base, command, n)
    try:
        return repeat(base, data, run_member, err)
    finally:
        runs, summary = finish_set(base, data, err)
        if summary is not None and machine is not None:
            from ..render.summary import print_machine
            print_machine(summary, machine, args.out, getattr(args, "field_separator", None) or ",")
        elif summary is not None and not quiet:
            from ..render.summary import print_summary
            print_summary(summary, False, verbose=getattr(args, "verbose", True))
        if runs:
            last = f", {base}/run-1 to run-{len(runs)}" if len(runs) > 1 else ""
            err(f"run set: {base} ({len(runs)} run{'s' if len(runs) != 1 else ''}{last})")
