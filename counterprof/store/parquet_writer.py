"""One local Parquet file written a table at a time: the writer both the journal's compaction
and `counterprof import` use.

pyarrow.parquet's ParquetWriter wraps pyarrow._parquet's to resolve filesystems: importing it
loads pyarrow.fs, its S3, GCS, HDFS and Azure modules and ssl, ~20 ms of a `counterprof run --
true` that writes a few local files. So the writer beneath it is used directly, with
pyarrow.parquet's defaults, where this pyarrow's private API takes them; where it does not (an
older or newer pyarrow), pyarrow.parquet's writer is used as before.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from . import parquet_meta

# pyarrow.parquet.ParquetWriter's defaults, spelled out: the files are the same either way
DEFAULTS: dict[str, Any] = dict(compression="snappy", version="2.6", use_dictionary=True,
                                write_statistics=True, data_page_version="1.0", store_schema=True)


def open_parquet(target: str | os.PathLike[str], schema: pa.Schema, *,
                 catalog: Mapping[str, Mapping[str, Any]] | None = None, **options: Any) -> Any:
    """A writer of tables with `schema` into target (created or truncated):
    write_table(table, row_group_size=None), close(). options: pyarrow.parquet's (compression,
    use_dictionary, ...) over DEFAULTS.

    A file of one of the run's tables (samples, spans) says what it holds (store/parquet_meta.py):
    each column's unit in its field metadata and the footer's key-value metadata, and a samples
    file the unit and kind of every metric in it (counterprof.units), from `catalog` (by metric
    name; None: the catalog.json of the run target is in)."""
    merged = {**DEFAULTS, **options}
    table = parquet_meta.table_of(schema)
    if table is not None:
        schema = parquet_meta.annotate(schema, table)
    try:
        from pyarrow import _parquet
        inner = _open_local(_parquet, os.fspath(target), schema, merged)
    except (ImportError, TypeError, AttributeError):   # another pyarrow's private API
        import pyarrow.parquet as pq
        inner = pq.ParquetWriter(os.fspath(target), schema, **merged)
    return _Writer(inner, schema, os.fspath(target), table, catalog)


class _LocalFile:
    """pyarrow._parquet's writer over a local file it does not own (closed here after it)."""

    def __init__(self, writer: Any, file: Any) -> None:
        self.writer, self.file = writer, file

    def write_table(self, table: pa.Table, row_group_size: int | None = None) -> None:
        self.writer.write_table(table, row_group_size=row_group_size)

    def add_key_value_metadata(self, metadata: dict[str, str]) -> None:
        self.writer.add_key_value_metadata(metadata)

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            self.file.close()


def _open_local(_parquet: Any, target: str, schema: pa.Schema, options: dict[str, Any]) -> _LocalFile:
    file = pa.OSFile(target, "wb")
    try:
        writer = _parquet.ParquetWriter(file, schema, writer_engine_version="V2", **options)
    except BaseException:
        file.close()
        raise
    return _LocalFile(writer, file)


class _Writer:
    """The file's writer, checking each table's schema as pyarrow.parquet does, and noting the
    metrics a samples file holds for its footer."""

    def __init__(self, inner: Any, schema: pa.Schema, target: str, table: str | None,
                 catalog: Mapping[str, Mapping[str, Any]] | None) -> None:
        self.inner, self.schema, self.target, self.table = inner, schema, target, table
        self.catalog = catalog
        self.metrics: set[str] = set()

    def write_table(self, table: pa.Table, row_group_size: int | None = None) -> None:
        # pyarrow.parquet's check, with its message: the file's schema is fixed by its first table
        # (its metadata aside: the units are the file's, not the table's)
        if not table.schema.equals(self.schema, check_metadata=False):
            raise ValueError("Table schema does not match schema used to create file: "
                             f"\ntable:\n{table.schema!s} vs. \nfile:\n{self.schema!s}")
        if self.table == "samples":
            self.metrics |= parquet_meta.metric_names(table.column("metric"))
        self.inner.write_table(table, row_group_size=row_group_size)

    def close(self) -> None:
        try:
            if self.table == "samples":
                catalog = self.catalog if self.catalog is not None else parquet_meta.catalog_near(self.target)
                units = parquet_meta.units_json(self.metrics, catalog)
                add = getattr(self.inner, "add_key_value_metadata", None)
                if add is not None:        # (a pyarrow whose writer cannot add them after its rows: none)
                    add({parquet_meta.UNITS_KEY: units})
        finally:
            self.inner.close()


def write_file(target: Path, schema: pa.Schema, tables: list[pa.Table], *, row_group_size: int | None = None,
               **options: Any) -> None:
    """tables into a new private file at target (a run's own temporary name), in order: 0600
    from its first byte, removed if any part fails (no half file left behind)."""
    from . import safepath
    safepath.unlink_in_run(target)       # a temporary name of ours (or a planted link)
    safepath.create_private(target)
    writer = open_parquet(target, schema, **options)
    try:
        for table in tables:
            writer.write_table(table, row_group_size=row_group_size)
    except BaseException:
        try:
            writer.close()
        finally:
            target.unlink(missing_ok=True)
        raise
    writer.close()
    os.chmod(target, 0o600)
