"""counterprof correlate: a run held against predictions (a model's, a simulator's, the roofline's,
another run's), per op, kernel, region and step: measured, predicted, ratio, within tolerance.

    counterprof correlate RUN --predictions sim.csv       a file: CSV, JSON lines or Parquet
    counterprof correlate RUN --model roofline            max(FLOPs / peak, bytes / bandwidth) per op,
                                                          from the run's measured ceilings
    counterprof correlate RUN --model datasheet           the same from the GPU's datasheet
    counterprof correlate RUN --predictions OTHER_RUN     another run's medians (a machine, a driver
                                                          or a software version against another)
    ... --json | --csv FILE | --html FILE                 every row; the log-log scatter page
    ... --fail-above 15                                   exit 1 when a source's MAPE is above 15%

The columns of a predictions file and the figures: docs/correlate.md. `counterprof history add
RUN --db FILE --correlation CORR.json` keeps a `correlate --json` output's figures as series.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .arguments import ceilings_from, ceilings_option, run_output_parser
from .common import UsageFailure, check_output_file, err, guarded, open_run, write_text_file

DEFAULT_TOLERANCE = "20%"


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv))


def _percent(text: str, what: str, zero: bool = False) -> float:
    t = text.strip()
    try:
        x = float(t[:-1] if t.endswith("%") else t)
    except ValueError:
        raise ValueError(f"{what} takes a percentage (20 or 20%), not {text!r}") from None
    if not (0 <= x if zero else 0 < x) or not x <= 10000:
        raise ValueError(f"{what} must be a percentage from {0 if zero else 'above 0'} to 10000, not {text!r}")
    return x / 100


def _main(argv: list[str]) -> int:
    p = run_output_parser("counterprof correlate", __doc__, "every row and the figures as JSON",
                          "also write the predicted-vs-measured scatter (self-contained HTML)")
    p.add_argument("--predictions", action="append", default=[], metavar="FILE|RUN",
                   help="a predictions file (CSV, JSON lines, Parquet) or another run; repeatable")
    p.add_argument("--model", action="append", default=[], choices=("roofline", "datasheet"),
                   help="a built-in predictor: the roofline under the run's ceilings, or the GPU's datasheet")
    p.add_argument("--csv", metavar="FILE", help="also write every row as CSV")
    p.add_argument("--rank", type=int, metavar="R", help="one rank (default: every rank together)")
    p.add_argument("--tolerance", default=DEFAULT_TOLERANCE, metavar="PCT",
                   help=f"a row is within when |measured / predicted - 1| <= PCT (default {DEFAULT_TOLERANCE}); "
                        "a file's tolerance column overrides it per row")
    p.add_argument("--fail-above", metavar="PCT", help="exit 1 when a source's MAPE is above PCT percent")
    p.add_argument("--top", type=int, default=15, metavar="N", help="rows in the text table (default 15)")
    ceilings_option(p)
    args = p.parse_args(argv)
    try:
        tolerance = _percent(args.tolerance, "--tolerance")
        fail_above = _percent(args.fail_above, "--fail-above", zero=True) if args.fail_above is not None else None
    except ValueError as exc:
        raise UsageFailure(str(exc), p.format_usage()) from None
    if args.top < 1:
        raise UsageFailure(f"--top must be 1 or more, not {args.top}", p.format_usage())
    if args.html and args.csv and Path(args.html).resolve() == Path(args.csv).resolve():
        raise UsageFailure("--html and --csv name the same file", p.format_usage())
    if not args.predictions and not args.model:
        raise UsageFailure("nothing to hold the run against: give --predictions FILE (or another run), "
                           "or --model roofline", p.format_usage())
    for path, flag in ((args.html, "--html"), (args.csv, "--csv")):
        if path:
            check_output_file(path, flag, [args.run, *args.predictions])
    file_docs = ceilings_from(p, args.ceilings)

    from ..analysis.correlate import Prediction, correlate, run_predictions
    from ..store.correlate import read_predictions
    run = open_run(args.run, skip_unreadable=True)
    for problem in run.skipped:
        err(f"skipped an unreadable file: {problem}")
    preds: list[Prediction] = []
    m, roof = _measure(run, file_docs, args.rank, p)
    for given in args.predictions:
        taken = {x.source for x in preds}
        if Path(given).is_dir():
            other = open_run(given, skip_unreadable=True)
            rank = args.rank if args.rank is None or args.rank in other.ranks() else None
            if rank != args.rank:
                err(f"{given} has no rank {args.rank}: every rank of it predicts rank {args.rank}")
            om, _ = _measure(other, file_docs, rank, p)
            name = f"run {other.path.name}"
            preds += run_predictions(om, name if name not in taken else f"run {other.path}")
        else:
            rows = read_predictions(given)
            for row in rows:            # two files of one name are two sources, not one
                if row["source"] in taken:
                    row["source"] = f"{row['source']} ({given})"
            preds += [Prediction(**row) for row in rows]
    for model in args.model:
        preds += _model(model, m, roof)
    c = correlate(m, preds, tolerance)
    if args.csv:
        write_text_file(args.csv, _csv(c), "--csv")
    if args.html:
        from ..render.correlate import correlate_html
        write_text_file(args.html, correlate_html(c, f"counterprof correlate: {run.path.name}"), "--html")
    if args.json:
        json.dump({"run": str(run.path), "run_id": run.meta.get("id") or run.path.name,
                   "rank": args.rank, "tolerance": tolerance, **c.to_json()}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from ..render.correlate import correlate_text
        correlate_text(c, sys.stdout, top=args.top)
    if fail_above is not None:
        over = [s for s in c.sources if s.figures.mape is not None and s.figures.mape > fail_above]
        for s in over:
            err(f"MAPE {100 * (s.figures.mape or 0):.1f}% of {s.name} is above --fail-above "
                f"{100 * fail_above:g}%")
        empty = [s for s in c.sources if s.figures.mape is None]
        for s in empty:          # nothing compared is no pass
            err(f"--fail-above: no row of {s.name} could be compared with the run (see its unmatched rows)")
        if over or empty or not c.sources:
            return 1
    return 0


def _measure(run: Any, file_docs: Any, rank: int | None, p: Any) -> tuple[Any, Any]:
    """The run's items (analysis.correlate.Measured) and its Roofline (None without op spans)."""
    from ..analysis.correlate import measure
    from ..analysis.roofline import CallTimes
    from ..analysis.roofline_run import run_roofline
    from ..store.op_rows import OpRows
    from ..store.query import RunQuery
    q = RunQuery(run.path)
    try:
        src = OpRows.of(q, rank)
        if rank is not None and rank not in run.ranks():
            raise UsageFailure(f"--rank {rank}: {run.path} has rank(s) {', '.join(map(str, run.ranks())) or 'none'}",
                               p.format_usage())
        durations = src.durations(("kernel", "memcpy", "memset", "region", "annotation", "step"), CallTimes.STEP)
        has_ops = src.con.execute(f"SELECT count(*) FROM {src.view} WHERE category IN ('cpu_op', 'xla_op')"
                                  ).fetchall()[0][0]
        roof = run_roofline(run, q, rank, file_docs, keep_atoms=False, keep_calls=True) if has_ops else None
    finally:
        q.close()
    for problem in q.files.left_out:
        err(problem)
    return measure(roof, durations), roof


def _model(model: str, m: Any, roof: Any) -> list[Any]:
    from ..analysis.correlate import roofline_predictions
    from ..ground.errors import UsageError
    if roof is None:
        raise UsageError(f"--model {model} predicts ops from their FLOPs and bytes, and the run has no op spans "
                         "with shapes: record it with `counterprof run --torch` (or --jax), or import a trace "
                         "recorded with record_shapes=True")
    if model == "roofline":
        if not roof.ceilings:
            raise UsageError("--model roofline: " + (roof.origin or "no ceilings for this run") +
                             " (or use --model datasheet for a GPU)")
        doc = roof.ceilings
        preds = roofline_predictions(m, doc, f"roofline ({doc.get('source') or 'calibrate'}: {doc.get('device')})")
    else:
        from ..calibrate import datasheet
        doc = datasheet.lookup(roof.device) if roof.device not in ("cpu", "gpu") else None
        if doc is None:
            raise UsageError(f"--model datasheet: no datasheet entry for the device {roof.device!r} "
                             f"(known: {', '.join(datasheet.known())}); for a CPU, `counterprof calibrate` "
                             "and --model roofline")
        preds = roofline_predictions(m, doc, f"datasheet ({doc['datasheet_entry']})")
    if not preds:
        raise UsageError(f"--model {model} predicts ops from their FLOPs and bytes, and none of this run's ops has "
                         "them: " + ("; ".join(roof.missing) or "no op with a cost model ran"))
    return preds


def _csv(c: Any) -> str:
    import csv
    import io
    cols = ["source", "line", "key", "kind", "name", "group", "items", "calls", "measured_us", "p10_us",
            "p90_us", "measured_total_us", "predicted_us", "predicted_total_us", "ratio", "error",
            "tolerance", "within", "savings_us"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for s in c.sources:
        for r in s.rows:
            w.writerow(r.to_json())
    return buf.getvalue()
