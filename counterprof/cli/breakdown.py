"""counterprof breakdown: where the GPU's (or a NeuronCore's) time went, from a run's traces.

    counterprof breakdown RUN [--json] [--rank R] [--rules counterprof|hta]

Per rank and summed over ranks: the temporal breakdown (idle, compute, non-compute over the
GPU-active time), kernel types and their overlaps, the communication time overlapped by
compute, idle time per stream (host wait, kernel wait, other), kernel launch statistics and
the top kernels. The definitions are HTA's (see the README). A NeuronCore's device profile
(Neuron Explorer): each engine's busy time and semaphore waits, the instructions that took the
most time, the DMA queues by type and the collectives.
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
    from ..analysis import breakdown_neuron
    run = Run(args.run)
    spans = spans_by_rank(run, COLUMNS, NEEDED, args.rank)
    neuron_spans = spans_by_rank(run, breakdown_neuron.COLUMNS, breakdown_neuron.CATEGORIES, args.rank)
    if not spans and not neuron_spans:
        which = f" for rank {', '.join(map(str, args.rank))}" if args.rank else ""
        raise RunDirectoryError(
            f"{run.path} holds no torch trace spans or Neuron profile{which}: record with `counterprof run "
            "--torch` (or --neuron-profile), or convert traces with `counterprof import`")
    neuron = [b for r, t in sorted(neuron_spans.items())
              if (b := breakdown_neuron.neuron_breakdown(t, r, args.top)) is not None]
    result = analyze(spans, rules=args.rules, include_last_step=args.include_last_step,
                     top_n=args.top) if spans else None
    if args.json:
        print(json.dumps({"run": str(run.path), "rules": args.rules, **(result.to_json() if result else {}),
                          **({"neuron": [b.to_json() for b in neuron]} if neuron else {})}, indent=2))
        return 0
    from ..render.console import console
    if result is not None and (result.ranks or not neuron):
        from ..render.breakdown import render
        console().print(render(result, rules=args.rules))
    if neuron:
        from ..render.breakdown_neuron import render_neuron
        console().print(render_neuron(neuron))
    return 0
