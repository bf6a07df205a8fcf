"""What a run's Parquet files say about themselves: units and meanings any reader finds in the
file, without counterprof and without catalog.json.

Each file of a table (samples, spans) carries, in the Parquet footer's key-value metadata
(pyarrow: `ParquetFile.metadata.metadata`, `schema_arrow.metadata`; DuckDB:
`parquet_kv_metadata()`; Spark and Trino read the footer too):
  counterprof.schema_version   SCHEMA_VERSION
  counterprof.table            "samples" or "spans"
  counterprof.columns          JSON {column: {"unit", "timezone", "description"}}: each column's
                               unit where it has one (time, start, end: ns since the epoch, UTC)
and a samples file:
  counterprof.units            JSON {metric: {"unit", "kind", "source", "description"}} for each
                               metric present in the file, from the run's catalog (unit and kind
                               null for a metric the catalog does not hold)
Each field's Arrow metadata (pyarrow, polars and pandas through pyarrow) holds the same: `unit`
and `description`; the samples `value` field's unit is "see counterprof.units per metric",
since one column holds every metric.

The stored scale of each unit is the catalog's (docs/run-directory.md, "Units"): this module
only says what it is.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..ground.errors import RunDirectoryError
from ..ground.schema import TABLES
from . import safepath
from .meta import read_catalog
from .rundir import CATALOG, RANKS

SCHEMA_VERSION = "1"
VERSION_KEY = "counterprof.schema_version"
TABLE_KEY = "counterprof.table"
COLUMNS_KEY = "counterprof.columns"
UNITS_KEY = "counterprof.units"
VALUE_UNIT = "see counterprof.units per metric"
NOT_IN_CATALOG = "not in the run's catalog.json"

_TIME = {"unit": "ns", "timezone": "UTC"}
# per table, per column: what its values are measured in, and what they mean
COLUMNS: dict[str, dict[str, dict[str, str]]] = {
    "samples": {
        "time": {**_TIME, "description": "end of the interval (delta metrics) or the instant (gauges)"},
        "duration_ns": {"unit": "ns", "description": "the interval a delta covers; null for gauges"},
        "source": {"description": "the collector that wrote the row"},
        "metric": {"description": "the metric's name; its unit and kind: counterprof.units"},
        "entity": {"description": "what was measured: process, tid:N, cpu:N, system, gpu:N, ..."},
        "value": {"unit": VALUE_UNIT, "description": "the metric's value in its unit; null = unknown"},
        "quality": {"unit": "fraction", "description": "share of the interval the counter ran, 0-1"},
    },
    "spans": {
        "start": {**_TIME, "description": "start of the interval"},
        "end": {**_TIME, "description": "end of the interval"},
        "name": {"description": "op, kernel, runtime call, annotation, step, trace window"},
        "category": {"description": "kernel, memcpy, memset, sync, cpu_op, runtime, annotation, step, "
                                    "input, collective, window"},
        "device": {"description": "GPU index"},
        "pid": {"description": "host process id"},
        "tid": {"description": "host thread id"},
        "bytes": {"unit": "bytes", "description": "bytes a collective or a memcpy/memset moved"},
        "group_size": {"unit": "ranks", "description": "ranks taking part in a collective"},
        "attrs": {"description": "JSON object of further attributes"},
    },
}


def table_of(schema: pa.Schema) -> str | None:
    """Which of the run's tables this schema is (its metadata aside); None for any other."""
    for name, table_schema in TABLES.items():
        if schema.equals(table_schema, check_metadata=False):
            return name
    return None


def annotate(schema: pa.Schema, table: str) -> pa.Schema:
    """schema with each column's unit and meaning (field metadata) and the file-level keys
    known before any row: schema version, table, columns."""
    columns = COLUMNS[table]
    fields = [f.with_metadata({k: v for k, v in columns[f.name].items()}) if f.name in columns else f
              for f in schema]
    file_keys = {**(schema.metadata or {}), VERSION_KEY.encode(): SCHEMA_VERSION.encode(),
                 TABLE_KEY.encode(): table.encode(),
                 COLUMNS_KEY.encode(): json.dumps(columns, sort_keys=True).encode()}
    return pa.schema(fields, metadata=file_keys)


def metric_names(column: pa.ChunkedArray | pa.Array) -> set[str]:
    """The metric names present in a samples table's metric column (dictionary-encoded;
    without pyarrow.compute, whose import is ~30 ms of a short run)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: set[str] = set()
    for chunk in chunks:
        if len(chunk) == 0:
            continue
        if not isinstance(chunk, pa.DictionaryArray):
            out.update(v for v in chunk.to_pylist() if v is not None)
            continue
        words = chunk.dictionary.to_pylist()
        idx = chunk.indices
        if idx.null_count or idx.type != pa.int32():
            used: Iterable[int] = (i for i in idx.to_pylist() if i is not None)
        else:
            used = memoryview(idx.buffers()[1]).cast("i")[idx.offset:idx.offset + len(idx)]
        out.update(words[i] for i in set(used))
    return out


def units_json(metrics: Iterable[str], catalog: Mapping[str, Mapping[str, Any]]) -> str:
    """counterprof.units: each metric's unit, kind, source and description from the catalog."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(metrics):
        entry = catalog.get(name)
        if entry is None:
            out[name] = {"unit": None, "kind": None, "source": None, "description": NOT_IN_CATALOG}
        else:
            out[name] = {k: entry.get(k) for k in ("unit", "kind", "source", "description")}
    return json.dumps(out, sort_keys=True)


def catalog_near(target: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The catalog of the run a table file is written into (<run>/<table>/rank=<r>/<file>, or
    <run>/rank=<r>/<file> in the older layout): the run's catalog.json and the rank's own (a
    rank that joined the run). Empty where there is none or it cannot be read: the units are
    then unknown, never a failed write."""
    folder = Path(target).parent
    run = folder.parent.parent if folder.parent.name in TABLES else folder.parent
    candidates = [run / CATALOG, run / RANKS / folder.name / CATALOG, folder / CATALOG]
    out: dict[str, dict[str, Any]] = {}
    for path in candidates:
        if not safepath.plain_file(path, report=False):
            continue
        try:
            entries = read_catalog(path)
        except RunDirectoryError:
            continue
        for m in entries:
            out.setdefault(m["name"], m)
    return out


def read_units(metadata: Mapping[bytes, bytes] | None) -> dict[str, dict[str, Any]]:
    """counterprof.units of a file's key-value metadata (pyarrow's bytes keys); {} without."""
    raw = (metadata or {}).get(UNITS_KEY.encode())
    if raw is None:
        return {}
    doc = json.loads(raw)
    return doc if isinstance(doc, dict) else {}
