"""Arrow schemas of a run's tables, and the metric catalog.

samples: long form, one row per metric per entity per tick.
spans:   intervals (torch ops, kernels, regions, steps, DataLoader waits) for the trace collectors.
"""
from __future__ import annotations

import array
from dataclasses import asdict
from typing import Any

import pyarrow as pa
from counterprof.ground.record import record

_dict = pa.dictionary(pa.int32(), pa.string())

SAMPLES_SCHEMA = pa.schema([
    pa.field("time", pa.timestamp("ns", tz="UTC"), nullable=False),   # end of interval / instant
    pa.field("duration_ns", pa.int64()),     # interval a delta covers; null for gauges
    pa.field("source", _dict, nullable=False),   # collector name
    pa.field("metric", _dict, nullable=False),   # units live in the catalog
    pa.field("entity", _dict, nullable=False),   # process, tid:123, cpu:3, system, gpu:0
    pa.field("value", pa.float64()),         # null means unknown, never 0
    pa.field("quality", pa.float32()),       # fraction of the interval counted; 1.0 exact
])

SPANS_SCHEMA = pa.schema([
    pa.field("start", pa.timestamp("ns", tz="UTC"), nullable=False),
    pa.field("end", pa.timestamp("ns", tz="UTC"), nullable=False),
    pa.field("name", pa.string(), nullable=False),
    pa.field("category", _dict, nullable=False),
    pa.field("kernel_class", _dict),
    pa.field("device", pa.int32()),
    pa.field("stream", pa.int64()),
    pa.field("pid", pa.int64()),
    pa.field("tid", pa.int64()),
    pa.field("correlation", pa.int64()),
    pa.field("collective", pa.string()),
    pa.field("bytes", pa.int64()),
    pa.field("group_size", pa.int32()),
    pa.field("attrs", pa.string()),          # small JSON object of extra attributes
])

TABLES = {"samples": SAMPLES_SCHEMA, "spans": SPANS_SCHEMA}

KINDS = ("delta", "gauge", "ratio")


@record(frozen=True)
class Metric:
    """One catalog entry. `kind`: delta (change over duration_ns), gauge (instant), ratio."""

    name: str
    unit: str
    kind: str
    description: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name}: kind must be one of {KINDS}, not {self.kind!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _dictionary(values: list[str]) -> pa.DictionaryArray:
    uniq = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(uniq)}
    return pa.DictionaryArray.from_arrays(
        pa.array([index[v] for v in values], pa.int32()), pa.array(uniq, pa.string()))


def samples_batch(time_ns: list[int], duration_ns: list[int | None], source: str,
                  metric: list[str], entity: list[str], value: list[float | None],
                  quality: list[float | None] | None = None) -> pa.RecordBatch:
    """A samples batch from Python lists (for collectors with few rows per tick)."""
    n = len(time_ns)
    if quality is None:
        quality = [1.0] * n
    return pa.RecordBatch.from_arrays([
        pa.array(time_ns, SAMPLES_SCHEMA.field("time").type),   # ints as ns (no cast: no pyarrow.compute)
        pa.array(duration_ns, pa.int64()),
        _dictionary([source] * n),
        _dictionary(metric),
        _dictionary(entity),
        pa.array(value, pa.float64()),
        pa.array(quality, pa.float32()),
    ], schema=SAMPLES_SCHEMA)


def samples_from_columns(n: int, time_ns: Any, duration_ns: Any, duration_valid: Any, source: pa.Array,
                         metric_idx: Any, metrics: pa.Array, entity_idx: Any, entities: pa.Array,
                         value: Any) -> pa.RecordBatch:
    """A samples batch of n rows over column buffers (numpy arrays or C buffers; no per-row
    Python): time and duration int64 ns, duration_valid a validity bitmap (None: every row has
    one), metric and entity int32 indices into the string arrays `metrics` and `entities`, value
    float64. source: the one-string dictionary of the collector's name. Quality is 1 (exact)."""

    def col(type_: pa.DataType, data: Any, validity: Any = None) -> pa.Array:
        return pa.Array.from_buffers(type_, n, [None if validity is None else pa.py_buffer(validity),
                                                pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays([
        col(SAMPLES_SCHEMA.field("time").type, time_ns),
        col(pa.int64(), duration_ns, duration_valid),
        pa.DictionaryArray.from_arrays(col(pa.int32(), bytes(4 * n)), source),
        pa.DictionaryArray.from_arrays(col(pa.int32(), metric_idx), metrics),
        pa.DictionaryArray.from_arrays(col(pa.int32(), entity_idx), entities),
        col(pa.float64(), value),
        col(pa.float32(), array.array("f", [1.0]) * n),
    ], schema=SAMPLES_SCHEMA)


def spans_batch(start: list[int], end: list[int], name: list[str], category: list[str],
                **columns: list[Any]) -> pa.RecordBatch:
    """A spans batch from Python lists; columns not given are null."""
    n = len(start)
    arrays = []
    given: dict[str, list[Any]] = {"start": start, "end": end, "name": name, "category": category, **columns}
    for field in SPANS_SCHEMA:
        values = given.get(field.name)
        if field.name in ("start", "end"):
            arrays.append(pa.array(values, field.type))
        elif pa.types.is_dictionary(field.type):
            arrays.append(_dictionary(values) if values is not None
                          else pa.nulls(n, field.type))
        else:
            arrays.append(pa.array(values, field.type) if values is not None else pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=SPANS_SCHEMA)
