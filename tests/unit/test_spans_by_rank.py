"""RunQuery.spans(by_rank=True): every span, by rank then start, read as a stream (each rank
sorted as the next begins) rather than by DuckDB's ORDER BY, which holds a second copy of the
spans while it sorts. The rows must be the same rows in the same order either way."""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof.ground.schema import SPANS_SCHEMA, spans_batch
from counterprof.store.query import RunQuery, rank_ordered
from helpers import table_file

T0 = 1_796_000_000_000_000_000


def _spans(rng: random.Random, n: int) -> pa.Table:
    start = [T0 + rng.randrange(10**9) for _ in range(n)]
    return pa.Table.from_batches([spans_batch(start, [s + 1000 for s in start], [f"s{k}" for k in range(n)],
                                              [rng.choice(["step", "collective", "cpu_op"]) for _ in range(n)])],
                                 SPANS_SCHEMA)


@pytest.mark.parametrize("seed", range(6))
def test_spans_by_rank_are_the_rows_ordered_by_rank_then_start(tmp_path, seed):
    rng = random.Random(seed)
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0, "end_ns": T0 + 2 * 10**9}))
    for rank in rng.sample(range(12), 7):
        for writer in "ab"[:rng.randint(1, 2)]:            # one rank's rows in two files
            pq.write_table(_spans(rng, rng.randint(0, 300)), table_file(run, "spans", rank, writer),
                           row_group_size=rng.choice([7, 50, 1000]))
    q = RunQuery(run, threads=2)
    want = q.arrow("SELECT * FROM spans ORDER BY rank, start, name")
    got = q.spans(by_rank=True)
    q.close()
    assert got.num_rows == want.num_rows > 0

    def key(t):
        return list(zip(t["rank"].to_pylist(), t["start"].cast(pa.int64()).to_pylist(), t["name"].to_pylist()))
    assert key(got) == sorted(key(got)) == key(want)          # (the start times here are distinct)
    assert got.sort_by([("rank", "ascending"), ("start", "ascending"), ("name", "ascending")]).equals(want)


def test_a_rank_that_comes_back_later_in_the_stream_is_put_in_place():
    """A live run's journal rows come after the files: rank 0 again after rank 1."""
    t = pa.table({"rank": pa.array([0, 0, 1, 1, 0, None, 1], pa.int64()),
                  "start": pa.array([5, 1, 3, 2, 0, 9, 1], pa.int64()).cast(pa.timestamp("ns", "UTC")),
                  "row": list(range(7))})
    got = rank_ordered(pa.RecordBatchReader.from_batches(t.schema, t.to_batches(max_chunksize=3)))
    assert got["row"].to_pylist() == [4, 1, 0, 6, 3, 2, 5]      # nulls last, stable among equals
    assert rank_ordered(t.slice(0, 0)).num_rows == 0
    ordered = rank_ordered(t.slice(0, 4))
    assert ordered["row"].to_pylist() == [1, 0, 3, 2]
    assert np.all(np.diff(ordered["rank"].to_numpy()) >= 0)


@pytest.mark.parametrize("seed", range(6))
def test_run_spans_by_rank_are_runquerys_rows_and_table_s_rows_reordered(tmp_path, seed):
    """Run.spans_by_rank (compare's and history's read): the rows RunQuery gives, in its order,
    and the rows Run.table gives, each rank's in the same order (a stable sort by start). With
    odd seeds a second writer stores its category as a plain string: both cast it to the store's
    type (Run.table could not concatenate such files before)."""
    from counterprof.store.reader import Run
    rng = random.Random(100 + seed)
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0, "end_ns": T0 + 2 * 10**9}))
    for rank in rng.sample(range(12), 5):
        for writer in "ab"[:rng.randint(1, 2)]:
            t = _spans(rng, rng.randint(1, 200))
            if writer == "b" and seed % 2:
                t = t.set_column(t.schema.get_field_index("category"), "category", t["category"].cast(pa.string()))
            pq.write_table(t, table_file(run, "spans", rank, writer), row_group_size=rng.choice([7, 50, 1000]))
    got = Run(run).spans_by_rank()
    assert got.schema.field("rank").type == pa.int32()
    q = RunQuery(run, threads=2)
    want = q.spans(by_rank=True)
    q.close()

    def rows(t):
        return list(zip(t["rank"].to_pylist(), t["start"].cast(pa.int64()).to_pylist(), t["name"].to_pylist(),
                        t["category"].cast(pa.string()).to_pylist()))
    assert rows(got) == rows(want) and len(rows(got)) > 0
    whole = Run(run).table("spans", with_rank=True)
    assert whole.schema.field("category").type == pa.dictionary(pa.int32(), pa.string())
    order = np.lexsort((np.arange(whole.num_rows), whole["start"].cast(pa.int64()).to_numpy(),
                        whole["rank"].to_numpy()))
    assert rows(got) == rows(whole.take(pa.array(order)))


def test_run_spans_by_rank_of_a_run_without_spans_is_empty(tmp_path):
    from counterprof.store.reader import Run
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0, "end_ns": T0 + 10**9}))
    got = Run(run).spans_by_rank()
    assert got.num_rows == 0 and "rank" in got.column_names
