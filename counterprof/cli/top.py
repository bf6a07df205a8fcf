"""counterprof top: a live view of this machine, or of one running process.

    counterprof top                  every GPU, system CPU and memory, the busiest processes
    counterprof top --pid PID        one process: the perf and host collectors on it

q (or Ctrl-C) quits. Nothing is kept unless -o DIR is given: the collectors write to a
temporary run directory that is removed at the end. When stderr is not a terminal, one
plain line a second (use --duration to stop).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from .common import (ArgumentParser, LiveViewSlot, UsageFailure, WarningRoute, check_pid, err, guarded)
from .process_setup import keep_pandas_out, use_system_allocator

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    import threading
    from typing import Any

    from ..live.processes import ProcessPoller
    from ..live.window import LiveWindow
    from ..session import Session

EPILOG = """\
examples:
  counterprof top
  counterprof top --pid 1234
  counterprof top --duration 10 2> top.log      # one line a second, for 10 s
  counterprof top --pid 1234 -o attach-run      # keep what was recorded
  counterprof top --serve 9464                  # and OpenMetrics on 127.0.0.1:9464/metrics
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof top", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-p", "--pid", type=int, help="watch one running process (all its threads)")
    p.add_argument("-e", "--events", action="append",
                   help="perf events, comma separated (default: perf stat's)")
    p.add_argument("-I", "--interval-ms", type=float, default=100.0, metavar="MS",
                   help="counter sampling interval in ms (default 100)")
    p.add_argument("--collectors", metavar="LIST",
                   help="collectors to use, comma separated (default: every available one)")
    p.add_argument("-n", "--processes", type=int, default=None, metavar="N",
                   help="processes listed without --pid (default: as many as the terminal has "
                        "rows for below the panels)")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    from .arguments import output_path
    p.add_argument("-o", "--output", metavar="DIR", type=output_path(
                       "name the run directory, or leave -o out to keep nothing"),
                   help="keep what was recorded as a run directory (default: nothing is kept)")
    p.add_argument("--force", action="store_true", help="replace the run already in -o DIR")
    from .serve import add_arguments as add_serve_arguments
    add_serve_arguments(p)
    return p


def main(argv: list[str]) -> int:
    from ..workload import block_signals
    block_signals()          # Ctrl-C and kill are taken by the main thread's sigtimedwait
    keep_pandas_out()
    use_system_allocator()
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.pid is not None:
        check_pid(args.pid, build_parser().format_usage())
    if args.processes is not None and args.processes < 0:
        raise UsageFailure("-n must be 0 or more", build_parser().format_usage())

    from ..collector import Target
    from ..live.window import LiveWindow
    from ..session import Session

    perf_cfg: dict[str, Any] = {"interval_ms": args.interval_ms}
    if args.events:
        perf_cfg["events"] = ",".join(args.events)
    # top is the machine's view: its CPU and memory figures with every refresh, not once a second
    config = {"perf": perf_cfg, "host": {"interval_ms": 100.0, "system_interval_ms": 0.0}}
    collectors = [c.strip() for c in args.collectors.split(",") if c.strip()] if args.collectors else None
    machine = args.pid is None
    target = Target("pid", None, system_wide=True) if machine else Target("pid", args.pid)

    window = LiveWindow()
    from .serve import exporter_for
    exporter = exporter_for(args, window)     # --serve: listening now, before anything starts
    keep = args.output is not None
    tmp = None if keep else tempfile.mkdtemp(prefix="counterprof-top-")
    path = args.output if tmp is None else os.path.join(tmp, "run")     # (tmp: None when keep)
    warnings = WarningRoute()
    session = Session(path, collectors=collectors, config=config, target=target, command=None,
                      replace=args.force, rank=0, on_warning=warnings,
                      sinks=[window] + ([exporter] if exporter is not None else []))
    if exporter is not None:
        exporter.attach(session, scope="machine" if machine else "process", cpus=os.cpu_count(),
                        perf_system_wide=machine)
    try:
        return _watch(session, window, warnings, args, machine, keep)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


class _TopView(LiveViewSlot):
    """The view, with the machine's busiest processes polled while it is drawn."""

    def __init__(self, procs: ProcessPoller | None, window: LiveWindow, warnings: WarningRoute,
                 title: str, show_run_path: bool = True, **options: Any) -> None:
        super().__init__(window, warnings, title, show_run_path,
                         processes=procs.rows if procs is not None else None, **options)
        self.procs = procs

    def open(self, session: Session) -> threading.Event:
        if self.procs is not None:
            self.procs.start()
        return super().open(session)

    def close(self) -> dict[str, Any] | None:
        facts = super().close()
        if self.procs is not None:
            self.procs.stop()
        return facts


def _watch(session: Session, window: LiveWindow, warnings: WarningRoute, args: argparse.Namespace,
           machine: bool, keep: bool) -> int:
    from ..live.processes import ProcessPoller
    from ..profile_run import observe
    session.prepare()
    # without -n, the busiest FILL_PROCESSES: the view lists those the terminal has rows for
    n = FILL_PROCESSES if args.processes is None else args.processes
    procs = ProcessPoller(n) if machine and n else None
    title = "this machine" if machine else f"pid {args.pid} {_name(args.pid)}".rstrip()
    view = _TopView(procs, window, warnings, title, show_run_path=keep, keys_hint="q quits",
                    scope="machine" if machine else "process", cpus=os.cpu_count())
    why = observe(session, args.pid, args.duration, view, compact=keep)
    if why == "target exited":
        err(f"pid {args.pid} exited")
    if keep:
        print(f"counterprof: run directory: {session.path}", file=sys.stderr)
    return 0


FILL_PROCESSES = 200       # more than a terminal has rows for


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f"({f.read().strip()})"
    except OSError:
        return ""
