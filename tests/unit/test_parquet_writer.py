"""counterprof.store.parquet_writer: the files it writes are pyarrow.parquet's, byte for byte
(given the same units metadata, store/parquet_meta.py), through pyarrow._parquet's writer or
(another pyarrow) pyarrow.parquet's own; a full disk or a
missing folder is the OSError the callers turn into their messages; a table of another schema
is refused as pyarrow.parquet refuses it."""
import errno
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import json

from counterprof.ground.schema import SAMPLES_SCHEMA, SPANS_SCHEMA, samples_batch, spans_batch
from counterprof.store import parquet_meta, parquet_writer
from counterprof.store.parquet_writer import open_parquet


def _samples(n: int, offset: int = 0) -> pa.Table:
    batch = samples_batch([offset + i * 1000 for i in range(n)], [100] * n, "perf",
                          ["task-clock" if i % 3 else "page-faults" for i in range(n)],
                          [f"cpu{i % 2}" for i in range(n)], [float(i) for i in range(n)],
                          [1.0] * n)
    return pa.Table.from_batches([batch], SAMPLES_SCHEMA)


def _with_pyarrow_parquet(path, schema, tables, units: dict | None = None, **options) -> bytes:
    """pyarrow.parquet's file of these tables, with the metadata a run's file carries: the
    columns' (annotate) and, for samples, the units of its metrics (none in a catalog here)."""
    table = parquet_meta.table_of(schema)
    writer = pq.ParquetWriter(str(path), parquet_meta.annotate(schema, table) if table else schema, **options)
    metrics: set[str] = set()
    for t in tables:
        writer.write_table(t)
        if table == "samples":
            metrics |= set(t["metric"].cast("string").to_pylist())
    if table == "samples":
        writer.add_key_value_metadata({parquet_meta.UNITS_KEY: parquet_meta.units_json(metrics, units or {})})
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
    assert isinstance(w.inner, parquet_writer._LocalFile)    # this pyarrow's private API took them
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
    assert isinstance(w.inner, pq.ParquetWriter)
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
    assert isinstance(w.inner, pq.ParquetWriter) and len(calls) == 2
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
    assert w.inner.file.closed
    assert pq.read_table(path).num_rows == 4


CATALOG = {"task-clock": {"name": "task-clock", "unit": "ns", "kind": "delta", "source": "perf",
                          "description": "CPU time of the task"},
           "page-faults": {"name": "page-faults", "unit": "count", "kind": "delta", "source": "perf",
                           "description": "page faults"},
           "proc.rss": {"name": "proc.rss", "unit": "bytes", "kind": "gauge", "source": "host",
                        "description": "resident set size"}}


def test_a_samples_file_names_the_unit_of_each_metric_it_holds_and_no_other(tmp_path):
    path = tmp_path / "s.parquet"
    w = open_parquet(path, SAMPLES_SCHEMA, catalog=CATALOG, compression="zstd")
    w.write_table(_samples(5))
    w.write_table(_samples(3, offset=10**9).slice(1, 1))      # a slice: the indices' offset
    w.close()
    md = pq.read_metadata(path).metadata
    units = json.loads(md[b"counterprof.units"])
    assert units == {m: {k: CATALOG[m][k] for k in ("unit", "kind", "source", "description")}
                     for m in ("task-clock", "page-faults")}            # proc.rss: not in the file
    assert md[b"counterprof.schema_version"] == parquet_meta.SCHEMA_VERSION.encode()
    assert md[b"counterprof.table"] == b"samples"
    schema = pq.read_schema(path)
    assert schema.field("value").metadata[b"unit"] == parquet_meta.VALUE_UNIT.encode()
    assert schema.field("time").metadata == {b"unit": b"ns", b"timezone": b"UTC",
                                             b"description": schema.field("time").metadata[b"description"]}
    assert pq.read_table(path).num_rows == 6


def test_a_metric_missing_from_the_catalog_is_named_with_no_unit(tmp_path):
    path = tmp_path / "s.parquet"
    w = open_parquet(path, SAMPLES_SCHEMA, catalog={})
    w.write_table(_samples(2))
    w.close()
    units = parquet_meta.read_units(pq.read_metadata(path).metadata)
    assert units["task-clock"] == {"unit": None, "kind": None, "source": None,
                                   "description": parquet_meta.NOT_IN_CATALOG}


def test_the_catalog_of_the_run_the_file_is_in_is_found(tmp_path):
    run = tmp_path / "run"
    folder = run / "samples" / "rank=1"
    folder.mkdir(parents=True)
    (run / "catalog.json").write_text(json.dumps([CATALOG["task-clock"]]))
    (run / "_ranks" / "rank=1").mkdir(parents=True)      # a rank that joined: its own catalog
    (run / "_ranks" / "rank=1" / "catalog.json").write_text(json.dumps([CATALOG["page-faults"]]))
    w = open_parquet(folder / ".samples-x.parquet.tmp", SAMPLES_SCHEMA)
    w.write_table(_samples(4))
    w.close()
    units = parquet_meta.read_units(pq.read_metadata(folder / ".samples-x.parquet.tmp").metadata)
    assert units["task-clock"]["unit"] == "ns" and units["page-faults"]["unit"] == "count"


def test_spans_files_carry_their_columns_units_and_other_tables_nothing(tmp_path):
    spans = tmp_path / "spans.parquet"
    w = open_parquet(spans, SPANS_SCHEMA)
    w.write_table(pa.Table.from_batches([spans_batch([1, 2], [3, 4], ["a", "b"], ["kernel", "memcpy"],
                                                     bytes=[None, 64])]))
    w.close()
    schema = pq.read_schema(spans)
    for name, unit in (("start", b"ns"), ("end", b"ns"), ("bytes", b"bytes")):
        assert schema.field(name).metadata[b"unit"] == unit
    md = pq.read_metadata(spans).metadata
    assert md[b"counterprof.table"] == b"spans" and b"counterprof.units" not in md
    assert json.loads(md[b"counterprof.columns"])["start"] == {**parquet_meta.COLUMNS["spans"]["start"]}
    other = tmp_path / "other.parquet"
    w = open_parquet(other, pa.schema([pa.field("x", pa.int64())]))
    w.write_table(pa.table({"x": [1]}))
    w.close()
    assert not any(k.startswith(b"counterprof.") for k in pq.read_metadata(other).metadata)
