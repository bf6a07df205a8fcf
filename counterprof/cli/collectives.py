"""counterprof collectives: every collective call matched across ranks: its size, who arrived
late, wait against transfer, bus bandwidth against this machine's measured curve.

    counterprof collectives RUN              per operation, size and group; per rank; the calls to look at
    counterprof collectives RUN --json       every call (op, bytes, group_size, skew_us, transfer_us,
                                             busbw_gbps, fraction_of_curve...) and by_rank
    counterprof collectives RUN --html FILE  the same with the pictures: busbw per call over the
                                             measured curve, arrival lag per rank over time

Calls come from the run's torch traces (`run --torch`, `import`, `merge`): NCCL kernels on
GPUs, gloo's spans on CPUs. The curve is `counterprof calibrate`'s sweep of message sizes
(copied into the run at its start, or --ceilings FILE).
"""
from __future__ import annotations

import os
import sys

from .arguments import ceilings_from, ceilings_option, run_output_parser
from .common import UsageFailure, check_output_file, err, guarded, open_run, write_text_file
from .process_setup import use_system_allocator


def main(argv: list[str]) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    use_system_allocator()         # each rank's spans are freed once read: give the memory back
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    p = run_output_parser("counterprof collectives", __doc__, "every call and the per-rank figures as JSON",
                          "also write the page with the pictures (self-contained HTML)")
    p.add_argument("--rank", type=int, action="append", metavar="R",
                   help="only these ranks (repeatable); default every rank")
    ceilings_option(p)
    p.add_argument("--top", type=int, default=3, metavar="N", help="calls named per reason (default 3)")
    args = p.parse_args(argv)
    if args.html:
        check_output_file(args.html, "--html", [args.run])
    file_docs = ceilings_from(p, args.ceilings)

    from ..analysis.collectives import COLUMNS, NEEDED, analyze_calls, curves_from_ceilings
    from ..analysis.roofline_run import choose_ceilings
    from ..ground.errors import RunDirectoryError
    from ..store.span_tables import spans_rank_by_rank
    run = open_run(args.run, skip_unreadable=True)      # a damaged file: the rest is read, it is named
    ranks = [r for r in run.ranks() if not args.rank or r in args.rank]
    if args.rank and not ranks:
        raise UsageFailure(f"--rank {', '.join(map(str, args.rank))}: the run has rank(s) "
                           f"{', '.join(map(str, run.ranks())) or 'none'}", p.format_usage())

    # each rank's spans let go once read; the run's files listed once, not once per rank
    result = analyze_calls(spans_rank_by_rank(run, COLUMNS, NEEDED, ranks),
                           {r: (run.rank_meta(r).get("host") or {}).get("hostname") for r in ranks})
    if not result.ranks:
        which = f" for rank {', '.join(map(str, args.rank))}" if args.rank else ""
        raise RunDirectoryError(
            f"{run.path} holds no torch trace spans{which}: record with `counterprof run --torch` "
            "or convert traces with `counterprof import`")
    for problem in run.skipped:
        err(problem)
    doc, _ = choose_ceilings(result.on_device, None, file_docs, run.meta)
    result.attach(curves_from_ceilings(doc))
    if args.html:
        from ..render.collectives import collectives_html
        write_text_file(args.html, collectives_html(result, f"counterprof collectives: {run.path.name}"),
                        "--html")
    if args.json:
        result.write_json(sys.stdout, args.top, run=str(run.path))
        return 0
    from ..render.collectives import collectives_text
    collectives_text(result, sys.stdout, top=args.top)
    return 0

