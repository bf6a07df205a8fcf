"""counterprof import: turn existing torch profiler traces and JAX profiles into a run directory.

    counterprof import TRACE_OR_DIR... -o RUN [--force] [--rank R]
    counterprof import NEURON_PROFILE_DIR... --into RUN

Any Kineto (torch.profiler) trace: .json or .json.gz, one or many ranks, old and new formats,
CUDA and ROCm. Any JAX profile (jax.profiler.trace's log dir, its plugins/profile/<time>/
session, a <host>.xplane.pb; a <host>.trace.json.gz or perfetto_trace.json.gz where there is no
.xplane.pb), alone or beside Kineto traces. Directories are searched for both. Each rank's spans
land in RUN/spans/rank=<r>/ (rank from the trace: distributedInfo, a JAX profile's rank or
process_index metadata; else the file name; else, for JAX profiles of several processes, their
order; else --rank). A Neuron Explorer profile directory (the Parquet tables neuron-explorer
writes) adds each NeuronCore's engine instructions, DMA packets and collectives on the run's
clock, alone, beside traces, or --into a finished run. Then `counterprof report RUN` or `counterprof breakdown RUN`.
"""
from __future__ import annotations

import argparse
import os
import sys

from .common import ArgumentParser, err, guarded, terminated_on_sigterm
from .process_setup import (keep_pandas_out, numpy_left_out, pause_gc, resume_gc,
                            use_system_allocator)

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    from typing import Any


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof import", description=__doc__.split("\n\n")[0],
                       epilog="example: counterprof import traces/ -o run && counterprof breakdown run",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE_OR_DIR",
                   help="trace files (.json, .json.gz; a JAX profile's .xplane.pb) or directories "
                        "holding them (a JAX log dir)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-o", "--output", metavar="RUN", help="run directory to create")
    where.add_argument("--into", metavar="RUN",
                       help="a finished run to add Neuron Explorer profiles to (its other data kept)")
    p.add_argument("--force", action="store_true",
                   help="replace the run already in RUN (with --into: the same profile imported before)")
    p.add_argument("--rank", type=int, default=0, metavar="R",
                   help="rank of traces that name none (no distributedInfo.rank, no rank in a JAX "
                        "profile's metadata, no rankN in the file name); default 0")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-file lines")
    return p


def main(argv: list[str]) -> int:
    # numpy's OpenBLAS starts a thread per core that spins at start-up; no BLAS is used here
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    keep_pandas_out()
    with terminated_on_sigterm():      # cleaned up as on Ctrl-C: no part-files, no half run
        return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # "" reads as the current directory, which would import every trace below it: an empty
    # argument is an unset shell variable far more often than a wish to import "."
    into = args.into is not None
    if into:
        args.output = args.into
    if "" in args.traces or args.output == "":
        parser.error("an empty path was given (an unset shell variable?); name the trace, the "
                     "directory or the run (. for the current directory)")
    # the first trace's inflate and parse go on beside the libraries' imports (~50 ms); a JAX
    # profile is not JSON to scan (a Kineto scan started on it would never be adopted)
    from ..collectors.torch_trace.scan import start_early
    from ..import_trace import is_jax_profile
    if not is_jax_profile(args.traces[0]):
        start_early(args.traces[0])
    # the libraries' imports (pyarrow: ~100 modules) make no garbage worth the cyclic
    # collector's passes over their new objects
    pause_gc()
    try:
        # after the arguments: --help and a usage error load no pyarrow; the conversion uses
        # no numpy, so pyarrow loads without it (~45 ms)
        with numpy_left_out():
            use_system_allocator()
            from ..import_trace import check_run_target, import_traces
            if not into:
                check_run_target(args.output, args.force)    # (loads the importer)
    finally:
        resume_gc()

    def report(trace: Any) -> None:
        if args.quiet and not trace.failed and not trace.problems:
            return
        if trace.failed:
            err(f"{trace.path}: not imported: {trace.failed}")
            return
        source = getattr(trace, "source", "")
        where = {"jax": "on devices", "neuron": "on the NeuronCore"}.get(source, "on the GPU")
        line = (f"{trace.path}: rank {trace.rank} ({trace.rank_source}), {trace.spans:,} spans "
                f"({trace.gpu_spans:,} {where}) in {trace.seconds:.2f} s")
        if source == "neuron":
            a = trace.alignment or {}
            from ..ground.units import duration
            line += (f"; Neuron Explorer schema {trace.version}, {trace.core}; clock aligned by {a.get('method')} "
                     f"to within {duration(a.get('within_ns') or 0)}")
        err(line)
        for problem in trace.problems:
            err(f"  {problem}")

    traces = import_traces(args.traces, args.output, replace=args.force, default_rank=args.rank,
                           command=["counterprof", "import", *argv], on_trace=report, into=into)
    ok = [t for t in traces if not t.failed]
    ranks = sorted({t.rank for t in ok})
    print(f"counterprof: imported {len(ok)} of {len(traces)} trace(s), rank(s) "
          f"{', '.join(map(str, ranks))}, into {args.output}", file=sys.stderr)
    return 0 if len(ok) == len(traces) else 1
