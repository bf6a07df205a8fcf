"""Run.rank_batches: a table read rank by rank from one listing of the run's files (a listing
walks every rank's folders: one per rank was quadratic, ~30 s of `compare` on 1024 ranks), read
as batches(rank=r) reads it: damaged row groups left out and named, journal segments read, rows
outside the run's span counted once per read."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from counterprof.analysis.compare_runs import SAMPLE_COLUMNS, bounds_of, figures
from counterprof.ground.schema import SAMPLES_SCHEMA, samples_batch
from counterprof.store.journal import JournalWriter
from counterprof.store.reader import Run
from helpers import count_listings as _listings, rank_files, table_file

T0 = 1_796_000_000_000_000_000
S = 10**9
ROWS = 200           # 20 s at 10 Hz, two metrics


def _samples(rank: int) -> pa.RecordBatch:
    t = [T0 + (k // 2 + 1) * S // 10 for k in range(ROWS)]
    metric = ["task-clock", "proc.rss"] * (ROWS // 2)
    dur = [S // 10 if m == "task-clock" else None for m in metric]
    value = [float(1e8 * (1 + rank / 10)) if m == "task-clock" else 1e9 for m in metric]
    return samples_batch(t, dur, "perf", metric, ["process"] * ROWS, value)


def _run(path: Path, ranks: int, journal_rank: int | None = None, damaged_rank: int | None = None,
         stray_rank: int | None = None) -> Path:
    """ranks ranks of samples in Parquet files (two row groups each); journal_rank's in a journal
    segment instead; damaged_rank's second row group damaged; stray_rank with a row timed
    outside the run's span (a flipped bit: 36 years later)."""
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0,
                                                "end_ns": T0 + 20 * S}))
    for r in range(ranks):
        b = _samples(r)
        if r == stray_rank:
            t = b.column("time").cast("int64").to_pylist()
            t[5] += 36 * 365 * 86400 * S
            b = pa.RecordBatch.from_arrays([pa.array(t).cast(SAMPLES_SCHEMA.field("time").type)]
                                           + b.columns[1:], schema=b.schema)
        if r == journal_rank:
            rank_files(path, r).mkdir(parents=True)
            w = JournalWriter(rank_files(path, r), "99999999-a")       # a writer long gone
            w.write("samples", b)
            w.close()
            continue
        f = table_file(path, "samples", r)
        pq.write_table(pa.Table.from_batches([b], SAMPLES_SCHEMA), f, row_group_size=ROWS // 2)
        if r == damaged_rank:
            rg = pq.ParquetFile(f).metadata.row_group(1)
            at = min(rg.column(i).data_page_offset for i in range(rg.num_columns))
            data = bytearray(f.read_bytes())
            data[at:at + 64] = b"\xff" * 64
            f.write_bytes(bytes(data))
    return path


def _read(batches) -> pa.Table | None:
    got = list(batches)
    return pa.Table.from_batches(got) if got else None


def test_rank_batches_read_what_batches_of_one_rank_read(tmp_path):
    run = _run(tmp_path / "r", 5, journal_rank=1, damaged_rank=3, stray_rank=4)
    one, each = Run(run, skip_unreadable=True), Run(run, skip_unreadable=True)
    of_rank = one.rank_batches("samples", SAMPLE_COLUMNS)
    for r in range(5):
        a, b = _read(of_rank(r)), _read(each.batches("samples", SAMPLE_COLUMNS, rank=r))
        assert a is not None and a.equals(b), r
        assert a.num_rows == {3: ROWS // 2, 4: ROWS - 1}.get(r, ROWS), r
    assert _read(of_rank(7)) is None              # no such rank: nothing, as batches(rank=7)
    assert one.skipped == each.skipped and len(one.skipped) == 1 and "row group 2 of 2" in one.skipped[0]
    assert one.left_out == each.left_out and len(one.left_out) == 1
    # a rank read again is read afresh: its row out of the span counted once, not twice
    _read(of_rank(4))
    assert one.left_out == each.left_out


def test_only_some_ranks_asked_for_lists_only_theirs(tmp_path, monkeypatch):
    run = _run(tmp_path / "r", 6)
    r = Run(run)
    seen = _listings(monkeypatch, run)
    of_rank = r.rank_batches("samples", ["value"], ranks=[2])
    assert seen["samples"] == 1            # the run's ranks; nothing listed for rank 2 yet
    assert _read(of_rank(2)).num_rows == ROWS


def test_compare_lists_a_runs_samples_once_however_many_ranks(tmp_path, monkeypatch):
    counts = {}
    for n in (3, 12):
        run = Run(_run(tmp_path / f"r{n}", n))
        bounds = bounds_of(run)
        seen = _listings(monkeypatch, run.path)
        f = figures(run, print, 2 * S, bounds)
        assert f.ranks == list(range(n)) and sorted(f.metrics["task-clock"]) == list(range(n))
        counts[n] = seen["samples"]
        monkeypatch.undo()
    # a listing per rank: 12 ranks listed <run>/samples 4 times as often as 3 did
    assert counts[12] == counts[3] < 12, counts
