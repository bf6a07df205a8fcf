"""counterprof trace: trace a running job's next steps now, on every rank, without a restart.

    counterprof trace RUN --steps 3          every process of the job traces 3 steps, all from the
                                             same step number
    counterprof trace RUN --ms 500           the next 500 ms (a process that marks no steps does
                                             this for --steps too)
    counterprof trace RUN1 RUN2 --steps 3    the runs of one job on several hosts (COUNTERPROF_JOB)
    counterprof trace --pid PID --ms 500 -o RUN   a PyTorch job NOT started under counterprof, started
                                             with KINETO_USE_DAEMON=1 (Kineto's daemon mode, as for
                                             dynolog): counterprof answers as the daemon; a
                                             launcher's pid reaches its workers

RUN is the -o of a `counterprof run --torch -- ...` that is running now. Each process answers:
traced (its steps, the trace's size) or not reached, and why; the command returns once every
process has answered, or --timeout passes. The spans land in the run on its clock; `report`
lists the windows asked for.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..ground.units import si
from .common import ArgumentParser, UsageFailure, guarded


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    p = ArgumentParser(prog="counterprof trace", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", metavar="RUN",
                   help="the run directory of the running job (several: one per host)")
    p.add_argument("--pid", type=int, action="append", metavar="PID",
                   help="a job not under counterprof, started with KINETO_USE_DAEMON=1 (repeatable); with -o")
    p.add_argument("--job", type=int, metavar="ID",
                   help="every process of a Slurm job (its SLURM_JOB_ID) started with KINETO_USE_DAEMON=1; with -o")
    p.add_argument("-o", "--output", metavar="RUN", help="with --pid/--job: the run directory the traces become")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--steps", type=int, metavar="N", help="trace the next N steps on every rank")
    what.add_argument("--ms", type=int, metavar="T", help="trace the next T milliseconds")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="give up waiting after S seconds (default: 30, or --ms plus 15 s)")
    p.add_argument("--json", action="store_true", help="print the ask and every answer as JSON")
    args = p.parse_args(argv)
    for flag, v in (("--steps", args.steps), ("--ms", args.ms)):
        if v is not None and not 0 < v <= 1_000_000:
            raise UsageFailure(f"{flag} must be a positive number (at most 1000000)", p.format_usage())
    if args.timeout is not None and not args.timeout > 0:
        raise UsageFailure("--timeout must be a positive number of seconds", p.format_usage())

    if args.pid or args.job is not None:
        if args.runs or not args.output:
            raise UsageFailure("--pid/--job take no RUN and need -o RUN (the run the traces become)", p.format_usage())
        return _by_pid(args)
    if not args.runs:
        raise UsageFailure("give the RUN of a job running under `counterprof run --torch`, or --pid PID -o RUN",
                           p.format_usage())
    if args.output:
        raise UsageFailure("-o is for --pid (a RUN is written by the job's own `counterprof run`)", p.format_usage())
    from ..trace_now import ask, wait
    runs = [Path(r) for r in args.runs]
    a = ask(runs, steps=args.steps, ms=args.ms)
    timeout = args.timeout or (30.0 if args.steps else args.ms / 1000 + 15)
    what_asked = f"{args.steps} step(s)" + (f" from step {a.start_step}" if a.start_step is not None else "") \
        if args.steps else f"{args.ms} ms"
    gone = f" ({len(a.gone)} more had exited)" if a.gone else ""
    print(f"counterprof trace: asked {len(a.expected)} process(es){gone} for {what_asked} (ask {a.id})",
          file=sys.stderr, flush=True)
    got = wait(a, timeout)
    rows = sorted(got.items(), key=lambda kv: (kv[1].get("rank") if isinstance(kv[1].get("rank"), int) else 1 << 30,
                                               kv[0]))
    if args.json:
        json.dump({"id": a.id, "steps": a.steps, "ms": a.ms, "start_step": a.start_step,
                   "answers": [{"run": k[0], **d} for k, d in rows]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for (run, _host, pid), d in rows:
            where = f"rank {d.get('rank')} (pid {pid}{'' if len(runs) == 1 else ', ' + run})"
            if d.get("status") == "traced":
                size = si(d.get("bytes") or 0, "B")
                span = (f"steps {d['steps'][0]}-{d['steps'][1]}" if d.get("steps")
                        else f"{d.get('ms')} ms (it marks no steps)")
                late = (f" (it was past step {a.start_step} when the ask reached it)"
                        if d.get("steps") and a.start_step is not None and d["steps"][0] > a.start_step else "")
                print(f"  {where}: traced {span}, {size}: {d.get('file')}{late}")
            else:
                print(f"  {where}: not reached: {d.get('why')}")
    traced = [d for d in got.values() if d.get("status") == "traced"]
    if not got:
        print("counterprof trace: no process of the job to ask", file=sys.stderr)
    return 0 if traced else 1


def _by_pid(args: argparse.Namespace) -> int:
    """Answer Kineto's daemon-mode requests of the processes given (or their workers) with one
    trace each, then import the traces into -o RUN."""
    import os
    import tempfile

    from ..import_trace import check_run_target, import_traces
    from ..kineto_daemon import serve
    args.pid = args.pid or []
    for pid in args.pid:
        if not os.path.exists(f"/proc/{pid}"):
            raise UsageFailure(f"--pid {pid}: no such process here", "")
    check_run_target(args.output, replace=False)
    timeout = args.timeout or (40.0 if args.steps else args.ms / 1000 + 30)
    what = f"{args.steps} step(s)" if args.steps else f"{args.ms} ms"
    who = ", ".join([*(f"pid {p}" for p in args.pid), *([f"Slurm job {args.job}"] if args.job is not None else [])])
    print(f"counterprof trace: serving Kineto's daemon mode for {who}: {what} "
          f"(each asks every 5 s; up to {timeout:g} s)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="counterprof-kineto-") as folder:
        os.chmod(folder, 0o733)              # the job may run as another user: it writes, we read
        served = serve(set(args.pid), Path(folder), args.ms, args.steps, timeout, job=args.job)
        files = [f for v in served.values() for f in v.files]
        for pid, v in sorted(served.items()):
            if v.files:
                size = sum(f.stat().st_size for f in v.files)
                print(f"  pid {pid}: traced {what}, {si(size, 'B')}")
            else:
                print(f"  pid {pid}: not reached: asked, but wrote no trace within {timeout:g} s")
        for pid in args.pid:
            if not any(pid in v.chain for v in served.values()):
                print(f"  pid {pid}: not reached: it never asked Kineto's daemon (start it with "
                      "KINETO_USE_DAEMON=1 in its environment, or under `counterprof run --torch`)")
        if args.job is not None and not served:
            print(f"  Slurm job {args.job}: no process of it asked Kineto's daemon (start its processes with "
                  "KINETO_USE_DAEMON=1)")
        if not files:
            return 1
        # a trace without torch.distributed's rank: one rank per process, in pid order
        import_traces([str(f) for f in files], args.output,
                      command=["counterprof", "trace", *[f"--pid={p}" for p in args.pid],
                               *([f"--job={args.job}"] if args.job is not None else [])],
                      file_ranks={str(f): i for i, f in enumerate(files)})
    print(f"counterprof trace: {len(files)} trace(s) into {args.output}", file=sys.stderr)
    return 0
