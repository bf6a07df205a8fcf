"""counterprof run: profile a command, a running process, or the whole machine.

    counterprof run [-e EVENTS] [-I MS] [-o DIR] [--collectors perf,host,nvml] [--gpus 0,1] -- CMD ...
    counterprof run --pid PID [--duration S]
    counterprof run -a [--duration S] [-- CMD ...]
    counterprof run --live -- CMD ...      (a live dashboard; q stops profiling)

The summary goes to stderr, so the workload's stdout stays clean for pipes. The exit
status is the workload's (128+N when it died of signal N).
"""
from __future__ import annotations

import argparse
import os
import sys

from .common import (ArgumentParser, LiveViewSlot, UsageFailure, WarningRoute, check_pid, err, guarded)
from .process_setup import (import_arrow_with_one_blas_thread, keep_pandas_out, pause_gc, resume_gc,
                            use_system_allocator)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..analysis.summary import Totals
    from ..collector import CollectorOptions
    from ..live.window import LiveWindow
    from ..session import Session

EPILOG = """\
examples:
  counterprof run -- python train.py
  counterprof run -e task-clock,page-faults,cycles,instructions -I 10 -o out -- python examples/busy.py
  counterprof run -e '{cycles,instructions}:u,cpu/event=0x3c,umask=0x0/' -- ./bench
  counterprof run --pid 1234 --duration 10
  counterprof run -a -A --duration 5
  counterprof run --live -- python train.py
  counterprof run --gpus 0,1 --nvml-interval-ms 50 -- python train.py
  counterprof run --torch -- torchrun --nproc_per_node 2 train.py
  counterprof run --jax -- python train.py                      (jax.profiler windows)
  counterprof run -r 5 -o base -- python bench.py     # 5 runs: means ± sd; compare base cand
  counterprof run --serve 127.0.0.1:9464 -- python train.py   # OpenMetrics on /metrics
  counterprof run --torch -- python train_with_mp_spawn.py      (ranks found as they init)
  counterprof run --per-rank -- python launcher.py              (ranks: COUNTERPROF_RANK=<r>)
"""


def build_parser() -> ArgumentParser:
    """run's own options, then every registered collector's, a group each (CollectorOptions:
    the collectors declare their flags; this module names none). The collectors whose options
    were added are the namespace's `collector_options`."""
    p = ArgumentParser(prog="counterprof run", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # every collector's interval unless it has its own: perf counts at it, threads follows it
    p.add_argument("-I", "--interval-ms", type=float, default=100.0, metavar="MS",
                   help="counter sampling interval in ms (default 100; 1 works)")
    from .arguments import output_path
    p.add_argument("-o", "--output", metavar="DIR", type=output_path(
                       "name the run directory, or leave -o out for ./counterprof-<date>-<time>"),
                   help="run directory (default: ./counterprof-<date>-<time>)")
    p.add_argument("--force", action="store_true", help="replace the run already in -o DIR")
    p.add_argument("--collectors", metavar="LIST",
                   help="collectors to use, comma separated (default: every available one; "
                        "see `counterprof list`)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("-p", "--pid", type=int, help="attach to a running process (all its threads)")
    target.add_argument("-a", "--all-cpus", action="store_true",
                        help="count on every CPU (needs root, CAP_PERFMON or perf_event_paranoid <= 0)")
    p.add_argument("--duration", type=float, metavar="S",
                   help="with --pid or -a and no command: stop after S seconds")
    ranks = p.add_mutually_exclusive_group()
    ranks.add_argument("--per-rank", dest="per_rank", action="store_const", const=True, default=None,
                       help="a multi-rank job: count each rank process (COUNTERPROF_RANK, RANK, ... "
                            "in its environment, or, with --torch, the rank it announces after "
                            "init_process_group) into its own rank=<r>/ partition, and not the "
                            "launcher (default for torchrun, mpirun, srun, ...; with --torch, "
                            "the default is auto: the tree counts as one until ranks appear)")
    ranks.add_argument("--no-per-rank", dest="per_rank", action="store_const", const=False,
                       help="count the launched process tree as one, even under torchrun")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary table at the end")
    p.add_argument("--json", action="store_true",
                   help="the summary as one JSON object on stderr instead of the table (like perf "
                        "stat -j; stdout stays the workload's)")
    p.add_argument("--live", action="store_true",
                   help="a live dashboard at the bottom of the terminal while it runs (q stops "
                        "profiling, the workload runs on); one line a second when stderr is not "
                        "a terminal")
    from .repeat import add_arguments as add_repeat_arguments
    from .serve import add_arguments as add_serve_arguments
    add_repeat_arguments(p)
    add_serve_arguments(p)
    p.set_defaults(collector_options=_add_collector_options(p))
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    return p


def _add_collector_options(p: ArgumentParser) -> dict[str, type[CollectorOptions]]:
    """Every registered collector's flags, a group each: counterprof's own collectors first,
    then third parties', each in the registry's order; those whose flags were added. One that
    does not load is left out here (the run says why it did not run, as for any collector that
    fails to load); one whose flags cannot be added (a flag another has: a third party's, as
    counterprof's come first) is said, and left out."""
    from ..collector import options_registry
    loaded = [(name, options) for name, options in options_registry().items()
              if not isinstance(options, Exception)]
    loaded.sort(key=lambda item: (not item[1].__module__.startswith("counterprof."), item[1].help_order))
    added: dict[str, type[CollectorOptions]] = {}
    for name, options in loaded:
        try:
            options.add_arguments(p.add_argument_group(options.title or f"{name} collector"))
        except Exception as exc:      # a third-party collector's: counterprof run goes on
            err(f"the {name} collector's options are left out: {exc}")
            continue
        added[name] = options
    return added


def main(argv: list[str]) -> int:
    pause_gc()        # until the run is prepared (_run): imports and set-up make no garbage
    try:
        # Before any thread exists: threads inherit the mask, so signals stay pending for
        # the main thread to take with sigtimedwait and forward.
        from ..workload import block_signals
        block_signals()
        return guarded(lambda: _main(argv))
    finally:
        resume_gc()   # a usage error before prepare (a caller in-process goes on collecting)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)     # --help and usage errors: before any Arrow
    from ..perf_warmup import warm_up
    warm_up()          # the kernel's first-perf-event wait, overlapped with the imports below
    keep_pandas_out()
    import_arrow_with_one_blas_thread()
    use_system_allocator()
    if args.repeat is not None:
        from .repeat import run_repeated
        return run_repeated(args, _run, build_parser().format_usage())
    return _run(args)


def _usage(message: str) -> UsageFailure:
    return UsageFailure(message, build_parser().format_usage())


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command and args.pid is None and not args.all_cpus:
        raise _usage("give a command after --, or --pid PID, or -a")
    if args.duration is not None and not args.duration > 0:
        raise _usage("--duration must be a positive number of seconds")
    if args.duration is not None and command:
        raise _usage("--duration applies to --pid and -a without a command")

    from .. import profile_run
    from ..collector import Target
    from ..session import Session
    from ..workload import check_command

    if command:
        check_command(command)     # 127/126 before anything is created
    if args.pid is not None:
        check_pid(args.pid, build_parser().format_usage())
    config, collectors = _collector_config(args)
    if args.pid is not None:
        target = Target("pid", args.pid)
    elif command:
        target = Target("launch", None, system_wide=args.all_cpus)   # its pid: once spawned
    else:
        target = Target("pid", None, system_wide=True)

    window: LiveWindow | None = None
    view: LiveViewSlot | None = None
    warnings = WarningRoute()
    if args.live:
        from ..live.window import LiveWindow
        from ..ground.redact import command_line
        window = LiveWindow()
        if command:
            view = LiveViewSlot(window, warnings, command_line(command))
        else:
            view = LiveViewSlot(window, warnings, "all CPUs" if args.pid is None else f"pid {args.pid}",
                                scope="process" if args.pid is not None else "machine",
                                cpus=os.cpu_count())
    from .serve import exporter_for
    exporter = exporter_for(args, window)     # --serve: listening now, before anything starts
    totals: Totals | None = None
    if not args.quiet:     # the summary's sums as the run goes: none to read back at the end
        from ..analysis.summary import Totals
        totals = Totals()
    session = Session(args.output, collectors=collectors, config=config, target=target,
                      per_rank=_per_rank_mode(args, command),
                      command=command or None, replace=args.force, rank=0, on_warning=warnings,
                      sinks=[s for s in (window, exporter, totals) if s is not None] or None)
    machine = not command and args.pid is None
    if exporter is not None:
        exporter.attach(session, scope="machine" if machine else "process",
                        cpus=os.cpu_count(), perf_system_wide=args.all_cpus)
    session.prepare()               # bad events, bad collectors, existing run: exit 2/1 here
    resume_gc()

    if command:
        exit_status = profile_run.launch(session, command, view, say=err).exit_status
    else:
        profile_run.observe(session, args.pid, args.duration, view)
        exit_status = 0
    _report(session, args, totals)
    return exit_status


def _collector_config(args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], list[str] | None]:
    """The options as the collectors' configuration, each collector's from its own options,
    and the collectors asked for (None: the default ones)."""
    from ..collector import named_collectors
    from ..ground.errors import UsageError
    config: dict[str, dict[str, Any]] = {}
    collectors = named_collectors(args.collectors)
    added: dict[str, type[CollectorOptions]] = args.collector_options     # build_parser's
    for name, options in added.items():
        try:
            cfg = options.config_from_args(args)
        except UsageError as exc:
            raise _usage(str(exc)) from None
        if cfg is not None:
            config[name] = cfg
        if options.turned_on(args):       # --torch, --jax: beside the default ones
            if collectors is None:
                from ..collector import resolve
                collectors = list(resolve(None))
            if name not in collectors:
                collectors.append(name)
    return config, collectors


def _per_rank_mode(args: argparse.Namespace, command: list[str]) -> bool | str:
    """--per-rank, --no-per-rank, or the default: auto where a collector turned on finds a
    Python job's ranks as they init (--torch, --jax)."""
    from ..ranks import per_rank_mode
    added: dict[str, type[CollectorOptions]] = args.collector_options     # build_parser's
    finds_ranks = any(options.finds_ranks and options.turned_on(args) for options in added.values())
    return per_rank_mode(command, args.per_rank, finds_ranks)


def _report(session: Session, args: argparse.Namespace, totals: Totals | None = None) -> None:
    """totals: the summary's sums taken as the batches passed (analysis.summary.Totals)."""
    if not args.quiet:
        from ..analysis.summary import run_summary
        from ..store.reader import Run
        try:
            run = Run(session.path)
            # joined to another process's run: the summary covers what the others wrote too
            summary = (totals.summary(run.catalog, run.meta) if totals is not None and not session.joined
                       else run_summary(run))
            from ..render.summary import print_summary
            print_summary(summary, args.json)
        except Exception as exc:   # the data is on disk; a rendering problem must not hide that
            err(f"could not print the summary: {exc}")
    err(f"run directory: {session.path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
