"""RunFile.batches skips Span's row-by-row mask for a row group whose Parquet statistics prove
every row inside the run's span (store/span.py, Span.proven): what is read, and what is counted
as left out, is what the mask gives; only the mask's cost is saved. A statistic missing, of
another unit, or not proving it (a null time, a span's start after its end, which no statistic
shows), and a journal segment (no footer), keep the mask."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof.ground.schema import SAMPLES_SCHEMA, SPANS_SCHEMA, samples_batch, spans_batch
from counterprof.store.journal import JournalWriter
from counterprof.store.reader import Run
from counterprof.store.run_files import list_files
from counterprof.store.span import INSIDE, ORDER, Span, run_span
from helpers import rank_files, table_file

T0 = 1_796_000_000_000_000_000
S = 10**9
ROWS = 100                       # a row group's
YEAR_1915 = -1_735_689_600 * S    # 1915-01-01, as a flipped bit could make a time
YEARS_36 = 36 * 365 * 86400 * S
COLS = ["time", "duration_ns", "metric", "value"]


def _run(path: Path) -> Path:
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0,
                                                "end_ns": T0 + 20 * S}))
    return path


def _samples(groups: int, bad: str | None = None, gauges: bool = False) -> pa.Table:
    """groups row groups' worth of samples inside the span, one row of the last group made bad:
    a time of 1915, a negative duration, a duration of 36 years, a null time."""
    n = groups * ROWS
    t: list[int | None] = [T0 + k * S // 10 for k in range(n)]
    dur: list[int | None] = [None if gauges else S // 10] * n
    at = n - ROWS // 2
    if bad == "1915":
        t[at] = YEAR_1915
    elif bad == "negative":
        dur[at] = -5
    elif bad == "36 years":
        dur[at] = YEARS_36
    batch = samples_batch([0] * n, dur, "perf", ["task-clock"] * n, ["process"] * n,
                          [float(k) for k in range(n)])
    schema = SAMPLES_SCHEMA
    if bad == "null time":
        t[at] = None
        schema = SAMPLES_SCHEMA.set(0, SAMPLES_SCHEMA.field("time").with_nullable(True))
    return pa.Table.from_arrays([pa.array(t, SAMPLES_SCHEMA.field("time").type)] + batch.columns[1:],
                                schema=schema)


def _write(run: Path, table: pa.Table, name: str = "samples", **kw: object) -> Path:
    f = table_file(run, name, 0)
    pq.write_table(table, f, row_group_size=ROWS, **kw)
    return f


def _masks(monkeypatch) -> list[int]:
    """The number of batches Span.mask is asked about, as a one-item list."""
    calls = [0]
    mask = Span.mask

    def counted(self, *a, **k):
        calls[0] += 1
        return mask(self, *a, **k)
    monkeypatch.setattr(Span, "mask", counted)
    return calls


def _read(run: Path, name: str = "samples", columns: list[str] | None = COLS):
    """(the rows read, the rows counted out of span, Run's left_out)."""
    files = [f for fs in list_files(run, run_span(run), name).values() for f in fs]
    rows = pa.Table.from_batches([b for f in files for _, b in f.batches(columns)])
    r = Run(run)
    again = pa.Table.from_batches(list(r.batches(name, columns)))
    assert again.equals(rows)
    return rows, sum(f.out_of_span for f in files), r.left_out


def _masked(run: Path, monkeypatch, name: str = "samples", columns: list[str] | None = COLS):
    """_read with no statistics trusted: what the mask alone gives."""
    with monkeypatch.context() as m:
        m.setattr(Span, "proven", lambda *a, **k: None)
        return _read(run, name, columns)


@pytest.mark.parametrize("gauges", [False, True])
def test_a_file_all_inside_is_read_without_the_mask(tmp_path, monkeypatch, gauges):
    run = _run(tmp_path / "r")
    _write(run, _samples(3, gauges=gauges))          # gauges: every duration null
    want = _masked(run, monkeypatch)
    calls = _masks(monkeypatch)
    rows, out, left_out = _read(run)
    assert calls[0] == 0
    assert rows.equals(want[0]) and rows.num_rows == 3 * ROWS
    assert (out, left_out) == (0, []) == want[1:]
    # every column the file has, not only some
    assert _read(run, columns=None)[0].num_rows == 3 * ROWS and calls[0] == 0


@pytest.mark.parametrize("bad", ["1915", "negative", "36 years", "null time"])
def test_a_row_outside_is_left_out_and_counted_exactly(tmp_path, monkeypatch, bad):
    run = _run(tmp_path / "r")
    _write(run, _samples(2, bad))
    want = _masked(run, monkeypatch)
    calls = _masks(monkeypatch)
    rows, out, left_out = _read(run)
    assert calls[0] == 2                   # the second row group's, once per read; not the first's
    assert rows.num_rows == 2 * ROWS - 1 and out == 1
    assert ROWS + ROWS // 2 not in rows.column("value").to_pylist()      # the bad row
    assert rows.equals(want[0]) and (out, left_out) == want[1:]
    assert len(left_out) == 1 and "1 row(s) with times outside the run's span" in left_out[0]


@pytest.mark.parametrize("bad", [None, "1915", "36 years"])
def test_a_file_without_statistics_is_masked(tmp_path, monkeypatch, bad):
    run = _run(tmp_path / "r")
    f = _write(run, _samples(2, bad), write_statistics=False)
    assert pq.read_metadata(f).row_group(0).column(0).statistics is None
    want = _masked(run, monkeypatch)
    calls = _masks(monkeypatch)
    rows, out, left_out = _read(run)
    assert calls[0] == 2 * 2                # both row groups, both reads
    assert rows.equals(want[0]) and (out, left_out) == want[1:]
    assert out == (bad is not None) and rows.num_rows == 2 * ROWS - (bad is not None)


def test_statistics_of_another_unit_than_the_one_read_are_not_trusted(tmp_path):
    """mask() compares the values as read, cast to int64: statistics stored in another unit
    (or as INT96, with no usable statistics) say nothing of them."""
    us = pa.table({"time": pa.array([T0 // 1000], pa.timestamp("us", tz="UTC")),
                   "duration_ns": pa.array([1], pa.int64())})
    f = tmp_path / "us.parquet"
    pq.write_table(us, f)
    md = pq.read_metadata(f)
    span = Span(T0 // 1000 - S, T0 // 1000 + S)       # the stored microseconds, taken as ns
    assert span.proven("samples", md, 0, pq.ParquetFile(f).schema_arrow) == INSIDE   # as read
    as_ns = pa.schema([pa.field("time", pa.timestamp("ns", tz="UTC")), us.schema.field(1)])
    assert span.proven("samples", md, 0, as_ns) is None
    f96 = tmp_path / "int96.parquet"
    pq.write_table(us.cast(as_ns), f96, use_deprecated_int96_timestamps=True)
    pf = pq.ParquetFile(f96)
    assert Span(T0 - S, T0 + S).proven("samples", pf.metadata, 0, pf.schema_arrow) is None


def _spans(rows: list[tuple[int, int]]) -> pa.Table:
    n = len(rows)
    return pa.Table.from_batches([spans_batch([s for s, _ in rows], [e for _, e in rows],
                                              ["op"] * n, ["cpu_op"] * n)], SPANS_SCHEMA)


@pytest.mark.parametrize("bad", ["start after end", "1915", "36 years"])
def test_a_span_outside_or_ending_before_it_starts_is_left_out(tmp_path, monkeypatch, bad):
    run = _run(tmp_path / "r")
    ok = [(T0 + k * S // 10, T0 + k * S // 10 + S) for k in range(ROWS)]     # overlapping: ORDER
    other = list(ok)
    other[7] = {"start after end": (T0 + 5 * S, T0 + 4 * S),    # both inside the span
                "1915": (YEAR_1915, T0), "36 years": (T0, T0 + YEARS_36)}[bad]
    f = _write(run, _spans(ok + other), "spans")
    pf = pq.ParquetFile(f)
    span = run_span(run)
    assert [span.proven("spans", pf.metadata, g, pf.schema_arrow) for g in (0, 1)] == \
        [ORDER, ORDER if bad == "start after end" else None]
    want = _masked(run, monkeypatch, "spans", None)
    rows, out, left_out = _read(run, "spans", None)
    assert rows.num_rows == 2 * ROWS - 1 and out == 1 and len(left_out) == 1
    assert rows.equals(want[0]) and (out, left_out) == want[1:]


def test_spans_each_before_the_next_are_read_without_any_check(tmp_path, monkeypatch):
    run = _run(tmp_path / "r")
    _write(run, _spans([(T0, T0 + S), (T0 + S, T0 + 2 * S)]), "spans")   # every start <= every end
    calls = _masks(monkeypatch)
    rows, out, left_out = _read(run, "spans", None)
    assert (rows.num_rows, out, left_out, calls[0]) == (2, 0, [], 0)


def test_a_span_with_no_end_is_left_out_as_the_mask_leaves_it(tmp_path, monkeypatch):
    run = _run(tmp_path / "r")
    t = _spans([(T0, T0 + S), (T0 + S, T0 + 2 * S)])
    end = pa.array([T0 + S, None], SPANS_SCHEMA.field("end").type)
    i = SPANS_SCHEMA.get_field_index("end")
    _write(run, t.set_column(i, SPANS_SCHEMA.field("end").with_nullable(True), end), "spans")
    want = _masked(run, monkeypatch, "spans", None)
    rows, out, left_out = _read(run, "spans", None)
    assert (rows.num_rows, out, len(left_out)) == (1, 1, 1)
    assert rows.equals(want[0]) and (out, left_out) == want[1:]


def test_a_journal_segment_is_masked(tmp_path, monkeypatch):
    run = _run(tmp_path / "r")
    rank_files(run, 0).mkdir(parents=True)
    w = JournalWriter(rank_files(run, 0), "99999999-a")          # a writer long gone
    for b in _samples(1, "1915").to_batches():
        w.write("samples", b)
    w.close()
    calls = _masks(monkeypatch)
    rows, out, left_out = _read(run)
    assert calls[0] >= 2 and rows.num_rows == ROWS - 1 and out == 1 and len(left_out) == 1


@pytest.mark.parametrize("bad", ["1915", "negative", "36 years"])
def test_a_batch_its_statistics_vouch_for_is_still_held_to_the_span(bad):
    """Statistics written before a byte of a data page was damaged vouch for rows they never
    saw: keep() holds the batch's own extremes to the span before it trusts them."""
    span = Span(T0 - S, T0 + 30 * S)
    batch = _samples(1, bad).to_batches()[0]
    kept, dropped = span.keep("samples", batch, INSIDE)
    assert dropped == 1 and kept.num_rows == batch.num_rows - 1


@pytest.mark.parametrize("rows,left", [
    ([(T0, T0 + 5), (T0 + 10, T0 + 2)], 1),              # an end before its start: per row
    ([(YEAR_1915, T0), (T0 + 1, T0 + 2)], 1),            # a start of 1915
    ([(T0, T0 + 5), (T0 + 1, T0 + 9)], 0),               # overlapping, all inside: nothing
])
def test_spans_its_statistics_vouch_for_are_still_held_to_the_span(rows, left):
    span = Span(T0 - S, T0 + 30 * S)
    for proven in (INSIDE, ORDER):
        kept, dropped = span.keep("spans", _spans(rows), proven)
        assert dropped == left and kept.num_rows == len(rows) - left


def test_a_start_damaged_after_writing_is_left_out_of_runquerys_view_though_statistics_say_inside(tmp_path):
    """One span's start flipped to long before the run inside an uncompressed page: the footer's
    statistics still put every start inside, from which DuckDB would drop the filter; the view
    tests each row all the same, and the row is named left out."""
    from counterprof.store import rundir
    from counterprof.store.query import RunQuery
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0, "end_ns": T0 + 10**10}))
    n = 1000
    starts = [T0 + i * 10**6 for i in range(n)]
    path = rundir.dataset_dir(run, "spans", 0) / "spans-a.parquet"
    pq.write_table(pa.Table.from_batches([spans_batch(starts, [s + 500_000 for s in starts], ["step"] * n,
                                                      ["step"] * n)]),
                   path, compression="none", use_dictionary=False)
    data = bytearray(path.read_bytes())
    at = bytes(data).index((T0 + 500 * 10**6).to_bytes(8, "little"))
    data[at + 7] ^= 0x80                   # the 500th start's sign: ~235 years before the epoch
    path.write_bytes(bytes(data))
    q = RunQuery(run, threads=1)
    rows, first = q.con.sql("SELECT count(*), min(epoch_ns(start)) FROM spans").fetchall()[0]
    left_out = list(q.files.left_out)
    q.close()
    assert (rows, first) == (n - 1, T0)
    assert any("1 row(s)" in m for m in left_out), left_out
