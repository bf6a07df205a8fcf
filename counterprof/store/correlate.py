"""The predictions file a user gives `counterprof correlate`: CSV, JSON lines or Parquet, read and
checked row by row (a bad row is refused with its line and what to write instead).

Columns (one row per prediction; unknown columns are kept and shown with the row):
    kind                   op | kernel | region | step (default op)
    name                   op / kernel / region / step name; a pattern with * ? [ ], or re:REGEX
                           (empty or * for step: every step)
    shapes                 op: input shapes as the trace records them, JSON ([[512, 512], [512, 512]])
    types                  op: input types as the trace records them, JSON (["float", "float"])
    dtype                  op: the dtype (fp32, bf16... or a trace input type such as "c10::BFloat16")
    predicted_us           time per call, µs                        } one of these, or one or both
    predicted_total_us     time of all its calls together, µs      } rates, which the op's measured
    predicted_flops_per_s  a rate: FLOPs per call / rate            } FLOPs and bytes per call turn
    predicted_bytes_per_s  a rate: bytes per call / rate            } into a time (the larger of two)
    source                 who predicted it (sim-v3, rtl-2026-11); default the file's name
    tolerance              this row's, as a fraction (0.2) or percent ("20%"); default --tolerance
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from ..ground.errors import UsageError

KNOWN = ("kind", "name", "shapes", "types", "dtype", "predicted_us", "predicted_total_us",
         "predicted_flops_per_s", "predicted_bytes_per_s", "source", "tolerance")
TIMES = ("predicted_us", "predicted_total_us")
RATES = ("predicted_flops_per_s", "predicted_bytes_per_s")
KINDS = ("op", "kernel", "region", "step")
MAX_BYTES = 256 << 20           # a predictions file larger than this is not a predictions file
MAX_US = 1e15                   # a time past 31 years is a unit mistake, not a prediction


def read_predictions(path: str) -> list[dict[str, Any]]:
    """The rows of a predictions file, checked, in file order: each the keyword arguments of an
    analysis.correlate.Prediction. A UsageError names the file, the line and what to fix."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--predictions {path}: no such file (CSV, JSON lines or Parquet; "
                         "or a run directory to hold this run against)")
    if p.stat().st_size > MAX_BYTES:
        raise UsageError(f"--predictions {path}: {p.stat().st_size >> 20} MiB is too large for a predictions "
                         f"file (at most {MAX_BYTES >> 20} MiB)")
    source = p.stem.split(".")[0] or p.name
    rows = list(_rows(p))
    if not rows:
        raise UsageError(f"--predictions {path}: no rows (a CSV's first line names the columns: "
                         "kind,name,shapes,predicted_us,...; then one row per prediction)")
    return [_check(path, line, raw, source) for line, raw in rows]


def _rows(p: Path) -> Any:
    head = p.open("rb").read(4)
    if head == b"PAR1":
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(p)
        except Exception as exc:
            raise UsageError(f"--predictions {p}: not a readable Parquet file ({exc})") from None
        for i, row in enumerate(table.to_pylist(), 1):       # (a null or NaN: not given)
            yield i, {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and v != v)}
        return
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"--predictions {p}: not text (CSV or JSON lines in UTF-8) nor Parquet") from None
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if first.lstrip().startswith("["):
        raise UsageError(f"--predictions {p}: a JSON list; JSON lines are one object per line "
                         '({"name": "aten::mm", "predicted_us": 50} on each)')
    if first.lstrip().startswith("{"):
        for i, ln in enumerate(text.splitlines(), 1):
            if not ln.strip():
                continue
            try:
                row = json.loads(ln)
            except ValueError as exc:
                raise UsageError(f"--predictions {p} line {i}: not JSON ({exc.args[0]}); one object per line") from None
            if not isinstance(row, dict):
                raise UsageError(f"--predictions {p} line {i}: a JSON object per line, not {type(row).__name__}")
            yield i, row
        return
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or "name" not in reader.fieldnames and "kind" not in reader.fieldnames:
        hint = " (columns are separated by commas, not semicolons)" if ";" in first and "," not in first else ""
        raise UsageError(f"--predictions {p}: the first line names the columns, and it has neither `kind` nor "
                         f"`name` ({', '.join(reader.fieldnames or [])}): e.g. kind,name,shapes,predicted_us{hint}")
    for row in reader:
        if None in row:
            raise UsageError(f"--predictions {p} line {reader.line_num}: more values than columns "
                             "(quote a value that holds a comma, e.g. \"[[512,512],[512,512]]\")")
        yield reader.line_num, {k: v for k, v in row.items() if v not in ("", None)}


def _plain(v: Any) -> Any:
    """A kept column's value as JSON can hold it (a NaN is none; a date or bytes, text)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def _check(path: str, line: int, raw: dict[str, Any], source: str) -> dict[str, Any]:
    where = f"--predictions {path} line {line}"
    raw = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v) for k, v in raw.items()}
    kind = str(raw.get("kind") or "op").strip().lower()
    if kind not in KINDS:
        raise UsageError(f"{where}: kind {kind!r} is none of {', '.join(KINDS)}")
    name = str(raw.get("name") or "").strip()
    if not name and kind != "step":
        raise UsageError(f"{where}: no name (the {kind}'s name, or a pattern such as *gemm*)")
    if name.startswith("re:"):
        import re
        try:
            re.compile(name[3:])
        except re.error as exc:
            raise UsageError(f"{where}: {name!r} is not a regular expression ({exc})") from None
    given = [k for k in TIMES + RATES if raw.get(k) is not None]
    times = [k for k in given if k in TIMES]
    if not given:
        raise UsageError(f"{where}: no prediction: give predicted_us (per call), predicted_total_us, "
                         "or predicted_flops_per_s / predicted_bytes_per_s")
    if len(times) > 1 or (times and len(given) > 1):
        raise UsageError(f"{where}: {' and '.join(given)} both given: a row predicts one way "
                         "(a time per call, a total, or rates)")
    values = {k: _positive(where, k, raw[k]) for k in given}
    out: dict[str, Any] = {
        "line": line, "kind": kind, "name": name, "source": str(raw.get("source") or source),
        "dims": _json_list(where, "shapes", raw.get("shapes")), "types": _json_list(where, "types", raw.get("types")),
        "dtype": (str(raw["dtype"]).strip() or None) if raw.get("dtype") is not None else None,
        "us": values.get("predicted_us"), "total_us": values.get("predicted_total_us"),
        "flops_per_s": values.get("predicted_flops_per_s"), "bytes_per_s": values.get("predicted_bytes_per_s"),
        "tolerance": _tolerance(where, raw.get("tolerance")),
        "extra": {k: _plain(v) for k, v in raw.items() if k not in KNOWN and v is not None},
    }
    if kind != "op" and (out["dims"] is not None or out["types"] is not None or out["dtype"]):
        raise UsageError(f"{where}: shapes, types and dtype key ops only (this row's kind is {kind})")
    return out


def _positive(where: str, column: str, v: Any) -> float:
    if isinstance(v, bool):
        raise UsageError(f"{where}: {column} {v!r} is not a number")
    try:
        x = float(str(v).strip()) if not isinstance(v, (int, float)) else float(v)
    except ValueError:
        raise UsageError(f"{where}: {column} {v!r} is not a number") from None
    if not math.isfinite(x) or x <= 0:
        raise UsageError(f"{where}: {column} {v!r} must be a positive number")
    if column in TIMES and x > MAX_US:
        raise UsageError(f"{where}: {column} {v!r} is past {MAX_US:g} µs (31 years): is it in µs?")
    return x


def _json_list(where: str, column: str, v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            raise UsageError(f"{where}: {column} {v!r} is not JSON: write it as the trace does, "
                             "e.g. [[512, 512], [512, 512]]") from None
    if not isinstance(v, list):
        raise UsageError(f"{where}: {column} must be a JSON list, e.g. [[512, 512], [512, 512]]")
    return v


def _tolerance(where: str, v: Any) -> float | None:
    if v is None:
        return None
    text = str(v).strip()
    try:
        x = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"{where}: tolerance {v!r} is not a fraction (0.2) or a percent (20%)") from None
    if not math.isfinite(x) or x <= 0:
        raise UsageError(f"{where}: tolerance {v!r} must be positive")
    return x
