"""counterprof breakdown: where the GPU's time went, from a run's torch traces.

    counterprof breakdown RUN [--json] [--rank R] [--rules counterprof|hta]

Per rank and summed over ranks: the temporal breakdown (idle, compute, non-compute over the
GPU-active time), kernel types and their overlaps, the communication time overlapped by
compute, idle time per stream (host wait, kernel wait, other), kernel launch statistics and
the top kernels. The definitions are HTA's (see the README).
"""
from __future__ import annotations

import argparse
import json
import os

from .common import ArgumentParser, guarded
from .process_setup import use_system_allocator

# the span categories the breakdowns read (cpu ops, annotations... are left on disk)
NEEDED = ("kernel", "memcpy", "memset", "sync", "runtime", "step", "window")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof breakdown", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="run directory (from `counterprof run --torch` or `counterprof import`)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--rank", type=int, action="append", metavar="R",
                   help="only this rank (repeatable); default every rank")
    p.add_argument("--rules", choices=("counterprof", "hta"), default="counterprof",
                   help="kernel classes: counterprof's (default) or HTA 0.5.0's, to compare with HTA")
    p.add_argument("--include-last-step", action="store_true",
                   help="also count GPU work launched in each window's last profiler step")
    p.add_argument("--top", type=int, default=10, metavar="N", help="top N kernels (default 10)")
    return p


def main(argv: list[str]) -> int:
    # numpy's OpenBLAS starts a thread per core that spins at start-up; no BLAS is used here
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    use_system_allocator()
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from ..analysis.breakdown import COLUMNS, analyze
    from ..ground.errors import RunDirectoryError
    from ..store.reader import Run
    from ..store.span_tables import spans_by_rank
    run = Run(args.run)
    spans = spans_by_rank(run, COLUMNS, NEEDED, args.rank)
    if not spans:
        which = f" for rank {', '.join(map(str, args.rank))}" if args.rank else ""
        raise RunDirectoryError(
            f"{run.path} holds no torch trace spans{which}: record with `counterprof run --torch` "
            "or convert traces with `counterprof import`")
    result = analyze(spans, rules=args.rules, include_last_step=args.include_last_step,
                     top_n=args.top)
    if args.json:
        print(json.dumps({"run": str(run.path), "rules": args.rules, **result.to_json()}, indent=2))
        return 0
    from ..render.breakdown import render
    from ..render.console import console
    console().print(render(result, rules=args.rules))
    return 0
