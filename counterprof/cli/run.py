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


# The threads collector's thread wakes every interval: under -I 1 it was two thirds of the
# profiler's CPU (5% of a core against perf stat -I 1's 3.4%); 10 ms still resolves the
# verdict's 100 ms regions. --threads-interval-ms goes finer.
THREADS_FINEST_DEFAULT_MS = 10.0
# Under --sampling kernel nothing else wakes per interval: a 10 ms threads tick would be most
# of its cost (0.5-0.7% of a core on a VM, perf stat -I 10's whole cost is 0.9%), so its
# threads default to the verdict's 100 ms regions there.
THREADS_KERNEL_DEFAULT_MS = 100.0


def _threads_interval_ms(args: argparse.Namespace) -> float:
    if args.threads_interval_ms is not None:
        return float(args.threads_interval_ms)
    finest = THREADS_KERNEL_DEFAULT_MS if args.sampling == "kernel" else THREADS_FINEST_DEFAULT_MS
    return max(float(args.interval_ms), finest)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof run", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-e", "--events", action="append",
                   help="events in perf's syntax, comma separated; repeatable "
                        "(default: perf stat's: task-clock, context-switches, cpu-migrations, "
                        "page-faults, cycles, instructions, branches, branch-misses)")
    p.add_argument("-I", "--interval-ms", type=float, default=100.0, metavar="MS",
                   help="counter sampling interval in ms (default 100; 1 works)")
    p.add_argument("--sampling", choices=("tick", "kernel"), default="tick",
                   help="how counters are sampled: tick (default) reads them every -I of wall time; "
                        "kernel has the kernel sample every -I of each thread's CPU time (a launched "
                        "command, Linux 6.12+; rows still land on the -I wall-time grid, a thread's "
                        "counts at its next sample; falls back to tick with a warning)")
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
    p.add_argument("-A", "--no-aggr", action="store_true",
                   help="with -a: one series per CPU instead of their sum")
    p.add_argument("--per-thread", action="store_true",
                   help="with --pid: one series per thread instead of their sum")
    p.add_argument("--torch", action="store_true",
                   help="record torch.profiler traces in every Python process of the command that "
                        "imports torch (a window of steps every N), converted into spans")
    p.add_argument("--torch-window", metavar="ACTIVE/EVERY", default=None,
                   help="with --torch: record ACTIVE steps every EVERY steps, exactly (default: 5 "
                        "every 50 or more, paced so the profiler's own calls take under 5%% of "
                        "the run)")
    p.add_argument("--torch-time-window", metavar="SECONDS/EVERY", default=None,
                   help="with --torch, in a process with no step marks and no module forwards: "
                        "record SECONDS every EVERY seconds, exactly (default: the first window "
                        "~1 s after torch's import, the next ones paced so the profiler's own "
                        "calls take under 5%% of the run, each at most 2 s)")
    p.add_argument("--jax", action="store_true",
                   help="record jax.profiler profiles in every Python process of the command that "
                        "imports jax (a window of StepTraceAnnotation steps every N, else windows "
                        "of time), converted into spans; every step is timed")
    p.add_argument("--jax-window", metavar="ACTIVE/EVERY", default=None,
                   help="with --jax: record ACTIVE steps every EVERY steps, exactly (default: 5 "
                        "every 50 or more, after the first step, paced so the profiler's start "
                        "and stop take under 5%% of the run)")
    p.add_argument("--host-interval-ms", type=float, default=100.0, metavar="MS",
                   help="host collector interval in ms (default 100)")
    p.add_argument("--host-system-interval-ms", type=float, default=1000.0, metavar="MS",
                   help="the system's CPU and memory figures (/proc/stat, /proc/meminfo) every MS "
                        "(default 1000; 0: with every host sample)")
    p.add_argument("--threads-interval-ms", type=float, default=None, metavar="MS",
                   help="threads collector interval in ms (default: -I's, 10 at the finest; 100 at "
                        "the finest under --sampling kernel): thread states by role, which the "
                        "verdict follows, so they sample as finely as the counters down to 10 ms")
    p.add_argument("--gpus", metavar="LIST",
                   help="GPUs to sample, by CUDA ordinal as the workload sees them (after "
                        "CUDA_VISIBLE_DEVICES), comma separated (default: every visible GPU)")
    p.add_argument("--nvml-interval-ms", type=float, default=100.0, metavar="MS",
                   help="GPU (NVML) sampling interval in ms (default 100)")
    p.add_argument("--gpm-interval-ms", type=float, default=100.0, metavar="MS",
                   help="GPM window in ms, Hopper and newer (default 100; at least 100)")
    p.add_argument("--neuron-interval-ms", type=float, default=1000.0, metavar="MS",
                   help="Neuron sampling interval in ms (default 1000): neuron-monitor reports at "
                        "most once a second, the Neuron sysfs counters at this interval")
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
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    return p


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


def _run(args) -> int:
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

    window = view = None
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
    totals = None
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


def _collector_config(args) -> tuple[dict, list[str] | None]:
    """The options as the collectors' configuration, and the collectors asked for (None: the
    default ones)."""
    perf_cfg: dict = {"interval_ms": args.interval_ms, "per_thread": args.per_thread,
                      "per_cpu": args.no_aggr, "sampling": args.sampling}
    if args.events:
        perf_cfg["events"] = ",".join(args.events)
    nvml_cfg: dict = {"interval_ms": args.nvml_interval_ms, "gpm_interval_ms": args.gpm_interval_ms}
    if args.gpus is not None:
        nvml_cfg["gpus"] = args.gpus
    host_cfg = {"interval_ms": args.host_interval_ms, "system_interval_ms": args.host_system_interval_ms}
    config = {"perf": perf_cfg, "host": host_cfg,
              "threads": {"interval_ms": _threads_interval_ms(args)}, "nvml": nvml_cfg,
              "neuron": {"interval_ms": args.neuron_interval_ms}}
    collectors = [c.strip() for c in args.collectors.split(",") if c.strip()] if args.collectors else None
    if args.gpus is not None and collectors is not None and "nvml" not in collectors:
        raise _usage("--gpus selects GPUs for the nvml collector, which --collectors leaves out")
    if args.torch:
        from ..collector import resolve
        config["torch"] = {}
        if args.torch_window is not None:      # given: followed to the step (else the paced default)
            active, _, every = args.torch_window.partition("/")
            if not (active.isdigit() and every.isdigit()):
                raise _usage(f"--torch-window {args.torch_window!r}: give ACTIVE/EVERY, e.g. 5/50")
            config["torch"] = {"active": int(active), "every": int(every)}
        if args.torch_time_window is not None:   # given: followed exactly (else paced)
            seconds, _, every_s = args.torch_time_window.partition("/")
            try:
                config["torch"].update(window_s=float(seconds), window_every_s=float(every_s))
            except ValueError:
                raise _usage(f"--torch-time-window {args.torch_time_window!r}: give "
                             "SECONDS/EVERY, e.g. 2/20") from None
        if collectors is None:
            collectors = list(resolve(None))
        if "torch" not in collectors:
            collectors.append("torch")
    if args.jax_window is not None and not args.jax:
        raise _usage("--jax-window applies with --jax")
    if args.jax and (args.pid is not None or not any(c != "--" for c in args.command)):
        raise _usage("--jax profiles a command counterprof launches (`counterprof run --jax -- CMD`), "
                     "not a running process")
    if args.jax:
        from ..collector import resolve
        config["jax"] = {}
        if args.jax_window is not None:        # given: followed to the step (else the paced default)
            active, _, every = args.jax_window.partition("/")
            if not (active.isdigit() and every.isdigit()):
                raise _usage(f"--jax-window {args.jax_window!r}: give ACTIVE/EVERY, e.g. 5/50")
            config["jax"] = {"active": int(active), "every": int(every)}
        if collectors is None:
            collectors = list(resolve(None))
        if "jax" not in collectors:
            collectors.append("jax")
    return config, collectors


def _per_rank_mode(args, command: list[str]) -> bool | str:
    from ..ranks import per_rank_mode
    return per_rank_mode(command, args.per_rank, args.torch or args.jax)


def _report(session, args, totals=None) -> None:
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
