"""counterprof roofline RUN: every torch op's FLOP/s and bytes/s against the machine's ceilings.

    counterprof roofline RUN                  the top ops: achieved, intensity, bound, share of the roof
    counterprof roofline RUN --json           every op + shape row, the unmodelled time, MFU
    counterprof roofline RUN --html roof.html the log-log roofline as one self-contained page
    counterprof roofline RUN --ceilings FILE  roofs from a file (a `calibrate --json` output)

Ceilings: --ceilings FILE, else the ones the run copied from this host's `counterprof calibrate`
at its start (a later calibrate does not change them), else (GPUs) the datasheet for the device
the trace names; a run from before counterprof copied them falls back to this host's cache as
it is today, and says so. None: the ops are listed without bounds, and it says so. An op, step
or MFU above 105% of its ceiling: a note says the ceilings do not fit this run (where they came
from, when, on how loaded a machine), and the verdict does not rest on them.
"""
from __future__ import annotations

import json
import sys

from .arguments import ceilings_from, ceilings_option, run_output_parser
from .common import UsageFailure, check_output_file, err, guarded, open_run, write_text_file


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    p = run_output_parser("counterprof roofline", __doc__, "print the roofline as JSON on stdout",
                          "also write the roofline plot as a self-contained HTML page")
    p.add_argument("--rank", type=int, metavar="R", help="one rank (default: all ranks together)")
    ceilings_option(p)
    p.add_argument("--top", type=int, default=15, metavar="N", help="ops in the text table (default 15)")
    args = p.parse_args(argv)
    if args.html:
        check_output_file(args.html, "--html", [args.run])
    file_docs = ceilings_from(p, args.ceilings)

    from ..analysis.roofline_run import run_roofline
    from ..render.roofline import roofline_html, roofline_text
    from ..store.op_rows import OpRows
    from ..store.query import RunQuery
    run = open_run(args.run)
    q = RunQuery(run.path)        # the roofline reads the spans through it, in batches
    try:
        for problem in q.files.skipped:
            err(f"skipped an unreadable file: {problem}")
        if args.rank is not None:
            ranks = OpRows.of(q).ranks()
            if args.rank not in ranks:
                raise UsageFailure(f"--rank {args.rank}: the run has rank(s) {ranks or 'none'}",
                                   p.format_usage())
        r = run_roofline(run, q, args.rank, file_docs, keep_atoms=False)
    finally:
        q.close()
    for problem in q.files.left_out:     # rows outside the run's span, left out
        err(problem)
    if args.html:
        write_text_file(args.html, roofline_html(r, f"counterprof roofline: {run.path.name}"), "--html")
    if args.json:
        print(json.dumps(r.to_json(), indent=1, default=float))
    else:
        roofline_text(r, sys.stdout, top=args.top)
    return 0
