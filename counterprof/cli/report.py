"""counterprof report RUN: what held the workload back, with the evidence.

    counterprof report RUN                 terminal report
    counterprof report RUN --json          the same, for machines
    counterprof report RUN --html r.html   one self-contained file with plots

A run a killed profiler left is recovered (compacted) first.
"""
from __future__ import annotations

import json
import sys

from .arguments import run_output_parser
from .common import check_output_file, err, guarded, open_run, write_text_file
from ..store.run_files import nothing_recorded

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    from ..store.reader import Run


def world_size(run: Run, ranks: list[int]) -> int | None:
    """The job's WORLD_SIZE as any rank recorded it (its meta.json env; the rank watcher's)."""
    from ..analysis.across_ranks import parse_world_size
    seen: list[int] = []
    for m in [run.meta] + [run.rank_meta(r) for r in ranks]:
        w = parse_world_size((m.get("env") or {}).get("WORLD_SIZE"))
        if w is not None:
            seen.append(w)
        seen += [e["world_size"] for e in (m.get("ranks") or {}).values()
                 if isinstance(e, dict) and isinstance(e.get("world_size"), int)]
    return max(seen) if seen else None


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv), reads_runs=True)   # sized to the memory limits first


def _main(argv: list[str]) -> int:
    p = run_output_parser("counterprof report", __doc__, "print the report as JSON on stdout",
                          "also write a self-contained HTML report")
    p.add_argument("--window", type=float, default=1.0, metavar="S",
                   help="length of the timeline's windows in seconds (default 1)")
    args = p.parse_args(argv)
    if not args.window > 0:
        from .common import UsageFailure
        raise UsageFailure("--window must be positive", p.format_usage())

    from ..analysis.report import ReportInputs, bucket_ns, build_report, extent_of, regroup
    from ..store import control
    from ..store.query import RunQuery
    from ..ground.errors import RunDirectoryError

    if args.html:
        check_output_file(args.html, "--html", [args.run])
    run = open_run(args.run)
    meta = run.meta
    q = RunQuery(run.path)
    catalog = run.catalog
    ranks = [r for r in run.ranks() if r >= 0]
    groups = q.groups()
    totals, devices, rank_buckets = regroup(groups)
    buckets = q.buckets(bucket_ns(meta), *extent_of(groups))
    del groups
    q.close()       # (what DuckDB held for the aggregates let go before the spans are read)
    # the spans are read a rank at a time by each pass of the report over them (a 1024-rank hour
    # of them held whole was half the report's memory, and grew with the run's length)
    sq = RunQuery(run.path, count_left_out=False)
    from ..analysis.roofline_run import roofline_if_ops
    try:
        inputs = ReportInputs(buckets, totals, devices, sq.spans_of_each_rank,
                              catalog, meta, ranks=len(ranks),
                              rank_buckets=rank_buckets if len(ranks) > 1 else None,
                              hosts={r: (run.rank_meta(r).get("host") or {}).get("hostname") for r in ranks},
                              world_size=world_size(run, ranks), roofline=roofline_if_ops(run, sq, err),
                              asks=[(a, control.answers(run.path, str(a.get("id")))) for a in control.asks(run.path)])
        del buckets         # (held by inputs alone: build_report lets it go unless the HTML needs it)
        report = build_report(inputs, args.window, keep_buckets=bool(args.html))
        span_rows = sq.count("spans") if report.overall.device == "none" and not report.windows else 0
    finally:
        sq.close()
        # (said whatever happened: what was left out, and why)
        skipped = list(dict.fromkeys(q.files.skipped + sq.files.skipped))
        for problem in skipped:
            err(f"skipped an unreadable file: {problem}")
        for problem in dict.fromkeys(q.files.left_out + sq.files.left_out + run.skipped):
            err(problem)
    if report.overall.device == "none" and not report.windows:
        raise RunDirectoryError(nothing_recorded(run, meta, "judge", span_rows, len(skipped)))
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from ..render.console import console
        from ..render.report_text import report_renderable
        console().print(report_renderable(report))
    if args.html:
        from ..render.report_html import report_html
        write_text_file(args.html, report_html(report, roofline=inputs.roofline, buckets=inputs.buckets,
                                               catalog=catalog, bucket_ns=bucket_ns(meta)), "--html")
        err(f"HTML report: {args.html}")
    return 0
