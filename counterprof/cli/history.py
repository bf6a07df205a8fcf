"""counterprof history: a team's nightly runs in one DuckDB file, with trends and change points.

    counterprof history add RUN [RUN...] --db perf.duckdb      append each run's summary
    counterprof history show --db perf.duckdb [--metric step_time] [--html trends.html] [--json]

`add` records per run: wall time, step and region times (median) with their verdicts, each
metric's median, the MFU of the traced steps (metric:roofline.mfu, percent of the measured peak;
metric:roofline.mfu_datasheet), the classifier's key signals, the host (meta.json) and the git revision of the
run's working directory as the run recorded it at its start (meta.json's git_revision). Runs made
before counterprof recorded it have it read when they are added (the checkout's HEAD now, said on
stderr: add such a run right after it ran). `show` prints each series' trend per command with its
change points (E-divisive, analysis/changepoints.py); series not shown by default are counted
on a last line.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import ArgumentParser, UsageFailure, check_output_file, err, guarded, write_text_file

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    import argparse

    from ..store.history import RunRecord

# (--metric picks any series)
DEFAULT_SHOWN = ("wall_time", "step_time", "region:*", "metric:roofline.mfu*", "signal:*", "correlate:*")


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv), reads_runs=True)   # sized to the memory limits first


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof history", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", metavar="{add,show}")
    a = sub.add_parser("add", help="append runs' summaries to the history file")
    a.add_argument("runs", nargs="+", metavar="RUN",
                   help="run directories, or run sets from `run -r N` (each adds its runs)")
    a.add_argument("--db", required=True, metavar="FILE", help="the DuckDB history file (created if missing)")
    a.add_argument("--correlation", action="append", default=[], metavar="FILE",
                   help="a `counterprof correlate --json` output of one of the runs: its figures become "
                        "correlate:SOURCE:* series of that run (repeatable; a run already in the file gets "
                        "the series it lacks)")
    a.set_defaults(parser=a)
    s = sub.add_parser("show", help="trends per series, with change points")
    s.add_argument("--db", required=True, metavar="FILE", help="the DuckDB history file")
    s.add_argument("--metric", action="append", metavar="SERIES",
                   help="a series or a glob (step_time, region:*, metric:task-clock, signal:cpu_busy); "
                        "repeatable (default: wall_time, step_time, regions and signals)")
    s.add_argument("--threshold", default="3", metavar="PCT",
                   help="smallest median shift that is a change point, in percent (default 3)")
    s.add_argument("--html", metavar="FILE", help="also write the trends as one self-contained HTML page")
    s.add_argument("--json", action="store_true", help="print the trends as JSON")
    s.set_defaults(parser=s)
    return p


def _add(args: argparse.Namespace) -> int:
    from ..analysis.history import run_record
    from ..repeat_set import expand as expand_sets
    from ..store.history import add_records, check_file
    from .common import open_run
    check_file(args.db)                                # a bad --db before reading the runs
    args.runs = expand_sets(args.runs)                 # a run set (`run -r N`) adds its runs in order
    # read every run before writing anything
    records = [(p, run_record(open_run(p, skip_unreadable=True), p, err)) for p in args.runs]
    if args.correlation:
        from ..analysis.history import correlation_series
        for f in args.correlation:
            run_id, series = correlation_series(f)
            hits = [rec for _, rec in records if rec.run_id == run_id]
            if not hits:
                raise UsageFailure(f"--correlation {f}: it correlates run {run_id!r}, which is none of the runs "
                                   f"given ({', '.join(rec.run_id for _, rec in records)})", args.parser.format_usage())
            hits[0].figures += series

    def said(path: str, rec: RunRecord, seq: int, added: bool) -> None:
        if added:
            rev = f", git {rec.git_rev[:12]}" if rec.git_rev else ", no git revision (cwd is not a checkout)"
            err(f"{path}: added as run {seq} ({len(rec.figures)} series, verdict {rec.verdict}{rev})")
        elif rec.appended:
            err(f"{path}: already in {args.db} as run {seq}; its {rec.appended} correlate series added to it")
        else:
            err(f"{path}: already in {args.db} as run {seq}; not added again")
    add_records(args.db, records, said)
    return 0


def _show(args: argparse.Namespace, p: ArgumentParser) -> int:
    from ..analysis.compare_runs import parse_threshold
    from ..store.history import connect, run_count, select_trends
    try:
        threshold = parse_threshold(args.threshold)
    except ValueError as exc:
        raise UsageFailure(str(exc), p.format_usage()) from None
    if not Path(args.db).exists():
        raise UsageFailure(f"{args.db}: no such history file (`counterprof history add RUN --db "
                           f"{args.db}` creates it)", p.format_usage())
    if args.html:
        check_output_file(args.html, "--html", [args.db])
    con = connect(args.db, read_only=True)
    try:
        found, hidden = select_trends(con, args.db, args.metric, DEFAULT_SHOWN)
        runs = run_count(con)
    finally:
        con.close()
    from ..analysis.history import order_trends
    found, points = order_trends(found, threshold)
    from ..render.history import history_json, history_text, hidden_text
    if args.json:
        json.dump(history_json(found, points, threshold, hidden), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from ..render.console import inert_lines
        sys.stdout.write(inert_lines(history_text(args.db, runs, found, points, threshold, hidden)))
    if args.html:
        from ..render.history_html import history_html
        page = history_html(args.db, found, points, threshold, hidden_text(hidden))
        write_text_file(args.html, page, "--html")
        err(f"HTML trends: {args.html}")
    return 0


def _main(argv: list[str]) -> int:
    p = _parser()
    args = p.parse_args(argv)
    _load_duckdb()
    if args.action == "add":
        return _add(args)
    if args.action == "show":
        return _show(args, args.parser)
    raise UsageFailure("history takes add or show", p.format_usage())


def _load_duckdb() -> None:
    """DuckDB loaded here, where a library the loader could not map for want of memory (a
    `ulimit -v`) reaches guarded as memory running out, not as DuckDB missing (store/history.py
    says that for any other ImportError)."""
    from ..store.limits import is_out_of_memory
    try:
        import duckdb  # noqa: F401
    except ImportError as exc:
        if is_out_of_memory(exc):
            raise
