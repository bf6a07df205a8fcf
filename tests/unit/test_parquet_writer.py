"""counterprof.store.parquet_writer: the files it writes are pyarrow.parquet's, byte for byte,
through pyarrow._parquet's writer or (another pyarrow) pyarrow.parquet's own; a full disk or a
missing folder is the OSError the callers turn into their messages; a table of another schema
is refused as pyarrow.parquet refuses it."""
import errno
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof.ground.schema import SAMPLES_SCHEMA, samples_batch
from counterprof.store import parquet_writer
from counterprof.store.parquet_writer import open_parquet


def _samples(n: int, offset: int = 0) -> pa.Table:
    batch = samples_batch([offset + i * 1000 for i in range(n)], [100] * n, "perf",
                          ["task-clock" if i % 3 else "page-faults" for i in range(n)],
                          [f"cpu{i % 2}" for i in range(n)], [float(i) for i in range(n)],
                          [1.0] * n)
    return pa.Table.from_batches([batch], SAMPLES_SCHEMA)


def _with_pyarrow_parquet(path, schema, tables, **options) -> bytes:
    writer = pq.ParquetWriter(str(path), schema, **options)
    for t in tables:
        writer.write_table(t)
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("options", [dict(compression="zstd"),
                                     dict(compression="zstd", use_dictionary=["source", "metric"]),
                                     dict()],
                         ids=["compaction's", "dictionaries named", "defaults"])
def test_the_files_are_pyarrow_parquets_byte_for_byte(tmp_path, options):
    tables = [_samples(500), _samples(3, offset=10**9)]
    ours = tmp_path / "ours.parquet"
    w = open_parquet(ours, SAMPLES_SCHEMA, **options)
    assert isinstance(w, parquet_writer._LocalParquetWriter)    # this pyarrow's private API took them
    for t in tables:
        w.write_table(t)
    w.close()
    assert ours.read_bytes() == _with_pyarrow_parquet(tmp_path / "pq.parquet", SAMPLES_SCHEMA, tables, **options)
    back = pq.read_table(ours)
    assert back.num_rows == 503 and back.schema.equals(SAMPLES_SCHEMA)
    assert pq.ParquetFile(ours).metadata.num_row_groups == 2


def test_another_pyarrow_gets_pyarrow_parquets_writer(tmp_path, monkeypatch):
    """Where pyarrow._parquet cannot be imported (or refuses the options), the writer is
    pyarrow.parquet's, and the file the same."""
    monkeypatch.setitem(sys.modules, "pyarrow._parquet", None)     # import raises ImportError
    monkeypatch.delattr(pa, "_parquet")         # (`from pyarrow import _parquet` looks here first)
    path = tmp_path / "fallback.parquet"
    w = open_parquet(path, SAMPLES_SCHEMA, compression="zstd")
    assert isinstance(w, pq.ParquetWriter)
    w.write_table(_samples(10))
    w.close()
    assert path.read_bytes() == _with_pyarrow_parquet(tmp_path / "pq.parquet", SAMPLES_SCHEMA,
                                                      [_samples(10)], compression="zstd")


def test_a_private_writer_that_refuses_the_options_falls_back_and_closes_its_file(tmp_path, monkeypatch):
    """Another pyarrow whose pyarrow._parquet.ParquetWriter takes other arguments (a TypeError,
    as Cython raises for an unknown keyword): pyarrow.parquet's writer, the same file, and the
    file the first attempt opened closed again (no descriptor left)."""
    import os
    from pyarrow import _parquet

    opened: list = []
    real_osfile = pa.OSFile

    def osfile(*args, **kwargs):
        f = real_osfile(*args, **kwargs)
        opened.append(f)
        return f

    real_writer, calls = _parquet.ParquetWriter, []

    def refuses(*args, **kwargs):      # the first call is ours; pyarrow.parquet's goes through
        calls.append(kwargs)
        if len(calls) == 1:
            raise TypeError("__cinit__() got an unexpected keyword argument 'store_schema'")
        return real_writer(*args, **kwargs)

    monkeypatch.setattr(pa, "OSFile", osfile)
    monkeypatch.setattr(_parquet, "ParquetWriter", refuses)
    fds = set(os.listdir("/proc/self/fd"))
    path = tmp_path / "fallback.parquet"
    w = open_parquet(path, SAMPLES_SCHEMA, compression="zstd")
    assert isinstance(w, pq.ParquetWriter) and len(calls) == 2
    assert len(opened) == 1 and opened[0].closed
    w.write_table(_samples(10))
    w.close()
    assert set(os.listdir("/proc/self/fd")) == fds
    assert path.read_bytes() == _with_pyarrow_parquet(tmp_path / "pq.parquet", SAMPLES_SCHEMA,
                                                      [_samples(10)], compression="zstd")


def test_a_full_disk_and_a_missing_folder_are_oserrors(tmp_path):
    with pytest.raises(OSError) as full:
        w = open_parquet("/dev/full", SAMPLES_SCHEMA, compression="zstd")
        w.write_table(_samples(1000))
        w.close()
    assert full.value.errno == errno.ENOSPC
    with pytest.raises(FileNotFoundError):
        open_parquet(tmp_path / "no" / "such.parquet", SAMPLES_SCHEMA)


def test_a_table_of_another_schema_is_refused_and_the_file_still_closes(tmp_path):
    path = tmp_path / "x.parquet"
    w = open_parquet(path, SAMPLES_SCHEMA)
    w.write_table(_samples(4))
    with pytest.raises(ValueError, match="does not match schema"):
        w.write_table(pa.table({"other": [1, 2]}))
    w.close()
    assert w.file.closed
    assert pq.read_table(path).num_rows == 4
