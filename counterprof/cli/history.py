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

import errno
import json
import sys
from pathlib import Path

from .common import (ArgumentParser, UsageFailure, check_output_file, err, guarded, use_system_allocator,
                     write_text_file)

DEFAULT_SHOWN = ("wall_time", "step_time", "region:*", "metric:roofline.mfu*", "signal:*")   # --metric picks any series


def main(argv: list[str]) -> int:
    use_system_allocator()
    return guarded(lambda: _main(argv))


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof history", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", metavar="{add,show}")
    a = sub.add_parser("add", help="append runs' summaries to the history file")
    a.add_argument("runs", nargs="+", metavar="RUN",
                   help="run directories, or run sets from `run -r N` (each adds its runs)")
    a.add_argument("--db", required=True, metavar="FILE", help="the DuckDB history file (created if missing)")
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


def run_git_revision(meta: dict, path) -> str | None:
    """The git revision the run was made from: meta.json's git_revision, recorded at the run's
    start (None: its working directory was not a checkout). Runs from before counterprof
    recorded it lack the key: for them, the HEAD of their working directory's checkout now,
    and stderr says so (it is the run's revision only if nothing was committed since)."""
    if "git_revision" in meta:
        rev = meta["git_revision"]
        return rev if isinstance(rev, str) and rev else None
    cwd = meta.get("cwd")
    if not cwd or not Path(cwd).is_dir():
        return None
    from ..gitrev import git_revision
    rev = git_revision(cwd)
    if rev:
        err(f"{path}: no git revision recorded at run time; using the checkout's HEAD now, {rev}")
    return rev


def _record(path: str):
    from .. import __version__
    from ..analysis.run_figures import summary_series
    from ..store.history import RunRecord, command_text
    from .common import open_run
    from .compare import figures
    from ..store.liveness import profiler_alive
    run = open_run(path, skip_unreadable=True)
    meta = run.meta
    if profiler_alive(meta):    # its figures would be partial, and the finished run refused later
        from ..errors import UsageError
        prof = meta.get("profiler") or {}
        raise UsageError(f"{run.path} is still being written (counterprof pid {prof.get('pid')} on "
                         f"{prof.get('host')}): add it once that run has finished")
    f = figures(run)
    for why in run.skipped:
        err(f"skipped an unreadable file (its rows are not in the summary): {why}")
    for why in run.left_out:
        err(why)
    if f.verdict is None and not f.times:
        err(f"{run.path}: no samples or spans: only its wall time and command are recorded")
    host = (meta.get("host") or {}).get("hostname") if isinstance(meta.get("host"), dict) else meta.get("host")
    series = summary_series(f)
    return RunRecord(
        run_id=str(meta.get("id") or run.path.name), path=str(run.path.resolve()), start_ns=meta.get("start_ns"),
        start_time=meta.get("start_time"), command=command_text(meta.get("command")), host=host,
        git_rev=run_git_revision(meta, path), ranks=len(run.ranks()),
        duration_s=(f.end_ns - f.start_ns) / 1e9, verdict=series[0][4] or "none",
        counterprof_version=meta.get("counterprof_version") or __version__, figures=series)


def _add(args) -> int:
    from ..store.history import add, check_file, connect
    check_file(args.db)                                # a bad --db before reading the runs
    from ..runset import expand as expand_sets
    args.runs = expand_sets(args.runs)                 # a run set (`run -r N`) adds its runs in order
    records = [_record(p) for p in args.runs]          # read every run before writing anything
    created = not Path(args.db).exists()
    try:
        con = connect(args.db)
    except BaseException:
        if created:
            _remove_db(args.db)
        raise
    try:
        for path, rec in zip(args.runs, records):
            seq, added = add(con, rec)
            if added:
                rev = f", git {rec.git_rev[:12]}" if rec.git_rev else ", no git revision (cwd is not a checkout)"
                err(f"{path}: added as run {seq} ({len(rec.figures)} series, verdict {rec.verdict}{rev})")
            else:
                err(f"{path}: already in {args.db} as run {seq}; not added again")
        con.close()           # its checkpoint writes too
    except Exception as exc:
        con.close()
        if created:           # a half-made file would make the next add refuse it
            _remove_db(args.db)
        if "No space left" in str(exc) or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
            from ..errors import DiskFull
            raise DiskFull(f"{Path(args.db).parent or '.'}: no space left on the device (adding to "
                           f"{args.db}); " + ("the new file was removed" if created else
                                              "the history file keeps what it had before")
                           + "; free some space and add again") from None
        raise
    return 0


def _remove_db(path: str) -> None:
    for p in (path, path + ".wal"):
        Path(p).unlink(missing_ok=True)


def _show(args, p) -> int:
    from ..errors import UsageError
    from ..store.history import connect, run_count, series_keys, series_names, trends
    from .compare import _threshold
    threshold = _threshold(args.threshold, p)
    if not Path(args.db).exists():
        raise UsageFailure(f"{args.db}: no such history file (`counterprof history add RUN --db "
                           f"{args.db}` creates it)", p.format_usage())
    if args.html:
        check_output_file(args.html, "--html")
    con = connect(args.db, read_only=True)
    try:
        patterns = args.metric or list(DEFAULT_SHOWN)
        found, shown = [], set()
        names = series_names(con)
        for pat in patterns:
            got = [t for t in trends(con, pat) if args.metric or "@" not in t.series]
            if not got and args.metric:
                alt = [f"metric:{pat}", f"signal:{pat}", f"region:{pat}"]
                got = [t for a in alt for t in trends(con, a)]
            if not got and args.metric:
                raise UsageError(f"no series {pat!r} in {args.db}; it has: {', '.join(names[:40])}"
                                 + (" ..." if len(names) > 40 else ""))
            for t in got:
                if (t.command, t.series) not in shown:
                    shown.add((t.command, t.series))
                    found.append(t)
        hidden: list[tuple[str, str]] = []
        if not args.metric:                # what the default leaves out, said on the last line
            hidden = [k for k in series_keys(con) if k not in shown]
        runs = run_count(con)
    finally:
        con.close()
    from ..analysis.changepoints import change_points
    found.sort(key=lambda t: (t.command, _order(t.series), t.series))
    points = [change_points(t.values, threshold=threshold) for t in found]
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


def _order(series: str) -> int:
    for i, prefix in enumerate(("wall_time", "step_time", "region:", "metric:roofline.mfu", "signal:", "metric:")):
        if series.startswith(prefix):
            return i
    return 9


def _main(argv: list[str]) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.action == "add":
        return _add(args)
    if args.action == "show":
        return _show(args, args.parser)
    raise UsageFailure("history takes add or show", p.format_usage())
