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
from typing import Any

import pyarrow as pa

# pyarrow.parquet.ParquetWriter's defaults, spelled out: the files are the same either way
DEFAULTS: dict[str, Any] = dict(compression="snappy", version="2.6", use_dictionary=True,
                                write_statistics=True, data_page_version="1.0", store_schema=True)


def open_parquet(target: str | os.PathLike[str], schema: pa.Schema, **options: Any) -> Any:
    """A writer of tables with `schema` into target (created or truncated):
    write_table(table, row_group_size=None), close(). options: pyarrow.parquet's (compression,
    use_dictionary, ...) over DEFAULTS."""
    merged = {**DEFAULTS, **options}
    try:
        from pyarrow import _parquet
        return _LocalParquetWriter(_parquet, os.fspath(target), schema, merged)
    except (ImportError, TypeError, AttributeError):   # another pyarrow's private API
        import pyarrow.parquet as pq
        return pq.ParquetWriter(os.fspath(target), schema, **merged)


class _LocalParquetWriter:
    """pyarrow._parquet's writer over a local file it does not own (closed here after it)."""

    def __init__(self, _parquet: Any, target: str, schema: pa.Schema, options: dict[str, Any]):
        self.schema = schema
        self.file = pa.OSFile(target, "wb")
        try:
            self.writer = _parquet.ParquetWriter(self.file, schema, writer_engine_version="V2",
                                                 **options)
        except BaseException:
            self.file.close()
            raise

    def write_table(self, table: pa.Table, row_group_size: int | None = None) -> None:
        # pyarrow.parquet's check, with its message: the file's schema is fixed by its first table
        if not table.schema.equals(self.schema, check_metadata=False):
            raise ValueError("Table schema does not match schema used to create file: "
                             f"\ntable:\n{table.schema!s} vs. \nfile:\n{self.schema!s}")
        self.writer.write_table(table, row_group_size=row_group_size)

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            self.file.close()
