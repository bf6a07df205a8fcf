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
    from ..interval_rows import IntervalPrinter
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
    p.add_argument("-I", "--interval-ms", type=float, default=100.0, metavar="MS", action=_Given,
                   help="counter sampling interval in ms (default 100; 1 works); given, the "
                        "counts of each interval are printed as they come, as perf stat -I prints "
                        "them (--no-interval-rows: the totals only)")
    p.add_argument("--no-interval-rows", action="store_true",
                   help="with -I: sample every MS but print only the totals at the end")
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
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no summary table at the end (--json, -j and -x still print theirs)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also say which default collectors cannot run here (no GPU, no Neuron "
                        "device) and why")
    machine = p.add_mutually_exclusive_group()
    machine.add_argument("--json", action="store_true",
                         help="the summary as one JSON object on stdout (the workload's stdout "
                              "goes to stderr then, so stdout is that one document)")
    machine.add_argument("-j", "--json-lines", dest="json_lines", action="store_true",
                         help="perf stat -j: one JSON object per counter on stdout (with -I, per "
                              "counter and interval); the workload's stdout goes to stderr")
    machine.add_argument("-x", "--field-separator", dest="field_separator", metavar="SEP",
                         help="perf stat -x SEP: the counters as CSV on stdout (value,unit,event,"
                              "run-time,pcnt-running,metric-value,metric-unit; with -I the time "
                              "first, with -r the variance after the event); the workload's stdout "
                              "goes to stderr")
    p.add_argument("--live", action="store_true",
                   help="a live dashboard at the bottom of the terminal while it runs (q stops "
                        "profiling, the workload runs on); one line a second when stderr is not "
                        "a terminal")
    from .repeat import add_arguments as add_repeat_arguments
    from .serve import add_arguments as add_serve_arguments
    add_repeat_arguments(p)
    add_serve_arguments(p)
    p.set_defaults(collector_options=_add_collector_options(p), interval_given=False)
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
    _output_options(args)
    from ..perf_warmup import warm_up
    warm_up()          # the kernel's first-perf-event wait, overlapped with the imports below
    keep_pandas_out()
    import_arrow_with_one_blas_thread()
    use_system_allocator()
    if args.repeat is not None:
        from .repeat import run_repeated
        return run_repeated(args, _run, build_parser().format_usage())
    return _run(args)


class _Given(argparse.Action):
    """Stores the value and that it was given (-I given prints interval rows, as perf stat's)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.interval_given = True


def _output_options(args: argparse.Namespace) -> None:
    """What the run prints, and where: the machine-readable forms (--json, -j, -x) on stdout,
    alone (the workload's stdout is sent to stderr, so stdout is one document), everything
    for people on stderr; -I given: the interval rows as they come (as perf stat -I)."""
    sep = args.field_separator
    if sep is not None and (sep == "" or "\n" in sep):
        raise _usage("-x takes a field separator, e.g. -x, (perf stat's CSV)")
    args.machine = ("json" if args.json else "jsonl" if args.json_lines else
                    "csv" if sep is not None else None)
    # interval rows: -I given, not turned off, not under the live view's dashboard; the one
    # JSON document of --json has no interval rows (-j -I has them, as perf's)
    args.interval_form = None
    if args.interval_given and not args.no_interval_rows and not args.live and args.machine != "json":
        if args.machine is not None:
            args.interval_form = args.machine if args.machine == "csv" else "json"
        elif not args.quiet:
            args.interval_form = "text"
    args.out = sys.stdout
    if args.machine is not None:
        try:
            out_fd = os.dup(1)
        except OSError:                 # started with stdout closed: nowhere to print it
            args.machine = args.interval_form = None
            return
        args.out = os.fdopen(out_fd, "w", encoding="utf-8", closefd=True)
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.dup2(2, 1)     # the workload (and anything else on fd 1) writes to stderr now


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
    config, collectors, named = _collector_config(args)
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
    if not args.quiet or args.machine is not None:   # the summary's sums as the run goes
        from ..analysis.summary import Totals
        totals = Totals()
    intervals: IntervalPrinter | None = None
    session: Session | None = None
    if args.interval_form is not None:
        from ..interval_rows import IntervalPrinter
        intervals = IntervalPrinter(sys.stderr if args.interval_form == "text" else args.out,
                                    args.interval_form, lambda: session.start_ns if session else 0,
                                    sep=args.field_separator or ",")
    warnings.seen = getattr(args, "warnings_seen", None)     # -r: each warning said once
    session = Session(args.output, collectors=collectors, config=config, target=target,
                      per_rank=_per_rank_mode(args, command),
                      command=command or None, replace=args.force, rank=0, on_warning=warnings,
                      sinks=[s for s in (window, exporter, totals, intervals) if s is not None] or None,
                      named=named)
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
    _report(session, args, totals, intervals)
    return exit_status


def _collector_config(args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], list[str] | None,
                                                        list[str] | None]:
    """The options as the collectors' configuration, each collector's from its own options,
    the collectors to run (None: the default ones), and those the user asked for by name or
    flag (--collectors, --torch, --jax: said when they cannot run here; with -v every one)."""
    from ..collector import named_collectors
    from ..ground.errors import UsageError
    config: dict[str, dict[str, Any]] = {}
    collectors = named_collectors(args.collectors)
    named = list(collectors or [])
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
            named.append(name)
    return config, collectors, (None if args.verbose else named)


def _per_rank_mode(args: argparse.Namespace, command: list[str]) -> bool | str:
    """--per-rank, --no-per-rank, or the default: auto where a collector turned on finds a
    Python job's ranks as they init (--torch, --jax)."""
    from ..ranks import per_rank_mode
    added: dict[str, type[CollectorOptions]] = args.collector_options     # build_parser's
    finds_ranks = any(options.finds_ranks and options.turned_on(args) for options in added.values())
    return per_rank_mode(command, args.per_rank, finds_ranks)


def _report(session: Session, args: argparse.Namespace, totals: Totals | None = None,
            intervals: IntervalPrinter | None = None) -> None:
    """totals: the summary's sums taken as the batches passed (analysis.summary.Totals).
    The table on stderr (not with -q); --json, -j, -x on stdout (-j and -x with -I: the interval
    lines were the output, as perf's); the run directory on stderr."""
    machine = args.machine
    if not args.quiet or machine is not None:
        from ..analysis.summary import run_summary
        from ..store.reader import Run
        try:
            run = Run(session.path)
            # joined to another process's run: the summary covers what the others wrote too
            summary = (totals.summary(run.catalog, run.meta) if totals is not None and not session.joined
                       else run_summary(run))
            from ..render.summary import print_machine, print_summary
            if machine is not None:
                if not (machine in ("csv", "jsonl") and args.interval_form is not None):
                    print_machine(summary, machine, args.out, args.field_separator or ",")
                else:
                    args.out.flush()
            if not args.quiet and machine is None:
                print_summary(summary, False, verbose=args.verbose)
        except Exception as exc:   # the data is on disk; a rendering problem must not hide that
            err(f"could not print the summary: {exc}")
    if intervals is not None and intervals.rows == 0 and args.interval_form == "text":
        err(f"-I {args.interval_ms:g}: no interval ended with a counter reading (the run took "
            "less than one interval, or no counter could be read); the totals are above")
    err(f"run directory: {session.path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
