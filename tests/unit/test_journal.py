"""Journal segments, cut-off tails, compaction, and reading a run back."""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof.ground.schema import SAMPLES_SCHEMA, samples_batch
from counterprof.store import rundir
from counterprof.store.compact import compact_rank, parquet_name
from counterprof.store.journal import JournalWriter, read_segment, segments, SegmentRead
from counterprof.store.reader import Run


def batch(start: int, n: int, metric="task-clock", entity="process") -> pa.RecordBatch:
    return samples_batch([start + i for i in range(n)], [1000] * n, "perf", [metric] * n,
                         [entity] * n, [float(i) for i in range(n)], [1.0] * n)


def parquet_file(rank, writer, table="samples"):
    """Where compaction puts a writer's table of the rank whose own folder is `rank`."""
    return rundir.table_dir(rank, table) / parquet_name(table, writer)


def make_run(tmp_path):
    path = rundir.create(tmp_path / "run")
    rundir.write_json(path / rundir.META, {"status": "running"})
    return path, rundir.rank_dir(path, 0)


def test_batches_reach_the_file_as_they_are_written(tmp_path):
    _, rank = make_run(tmp_path)
    w = JournalWriter(rank, "w1")
    w.write("samples", batch(0, 10))
    w.write("samples", batch(10, 5, metric="page-faults"))   # a new dictionary mid-stream
    # not closed: a reader sees both batches already (what a SIGKILL would leave)
    segs = segments(rank)
    assert [(s.table, s.writer, s.seq) for s in segs] == [("samples", "w1", 0)]
    got = list(read_segment(segs[0].path))
    assert [b.num_rows for b in got] == [10, 5]
    assert got[1].column("metric").to_pylist() == ["page-faults"] * 5
    w.close()


def test_cut_off_tail_keeps_every_whole_batch(tmp_path):
    _, rank = make_run(tmp_path)
    w = JournalWriter(rank, "w1")
    for i in range(3):
        w.write("samples", batch(i * 100, 100))
    w.close()
    path = segments(rank)[0].path
    data = path.read_bytes()
    path.write_bytes(data[:-50])
    report = SegmentRead()
    got = list(read_segment(path, report))
    assert sum(b.num_rows for b in got) == 200
    assert report.truncated and report.error


def test_empty_segment_is_reported_not_fatal(tmp_path):
    _, rank = make_run(tmp_path)
    (rank / rundir.JOURNAL).mkdir()
    (rank / rundir.JOURNAL / "samples~w1~000000.arrows").write_bytes(b"")
    report = compact_rank(rank)
    assert report.rows == 0 and report.truncated


def test_segments_rotate_and_compact_in_order(tmp_path):
    _, rank = make_run(tmp_path)
    w = JournalWriter(rank, "w1", segment_bytes=2000)
    for i in range(20):
        w.write("samples", batch(i * 10, 10))
    w.close()
    assert len(segments(rank)) > 3
    report = compact_rank(rank)
    assert report.rows == 200 and not report.truncated
    assert [f.name for f in report.files] == ["samples-w1.parquet"]
    assert not (rank / rundir.JOURNAL).exists()
    table = pq.read_table(parquet_file(rank, "w1"))
    assert table.column("time").cast("int64").to_pylist() == list(range(200))
    assert table.schema.equals(SAMPLES_SCHEMA)
    assert oct(os.stat(parquet_file(rank, "w1")).st_mode & 0o777) == "0o600"


def test_compaction_is_idempotent_and_finishes_an_interrupted_one(tmp_path):
    _, rank = make_run(tmp_path)
    w = JournalWriter(rank, "w1")
    w.write("samples", batch(0, 10))
    w.close()
    compact_rank(rank)
    # an interrupted compaction: Parquet renamed into place, segments not yet deleted
    w = JournalWriter(rank, "w1")
    w.write("samples", batch(0, 10))
    w.close()
    report = compact_rank(rank)
    assert report.rows == 0 and not segments(rank)
    assert pq.read_table(parquet_file(rank, "w1")).num_rows == 10


def test_writers_compact_separately(tmp_path):
    _, rank = make_run(tmp_path)
    for wid in ("a", "b"):
        w = JournalWriter(rank, wid)
        w.write("samples", batch(0, 3))
        w.close()
    report = compact_rank(rank)
    assert sorted(f.name for f in report.files) == ["samples-a.parquet", "samples-b.parquet"]


def test_reader_merges_parquet_and_journal_in_time_order(tmp_path):
    path, rank = make_run(tmp_path)
    w = JournalWriter(rank, "old")
    w.write("samples", batch(100, 5))
    w.close()
    compact_rank(rank)
    w = JournalWriter(rank, "new")
    w.write("samples", batch(0, 5, metric="page-faults"))   # still in the journal
    run = Run(path)
    t = run.samples()
    assert t.num_rows == 10
    assert t.column("time").cast("int64").to_pylist() == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]
    assert t.schema.equals(SAMPLES_SCHEMA)
    assert run.samples(with_rank=True).column("rank").to_pylist() == [0] * 10
    w.close()


def test_run_directory_refusals(tmp_path):
    path = rundir.create(tmp_path / "r")
    assert oct(path.stat().st_mode & 0o777) == "0o700"
    rundir.write_json(path / rundir.META, {})
    with pytest.raises(Exception, match="already holds a run"):
        rundir.create(path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("x")
    with pytest.raises(Exception, match="not empty and is not a run directory"):
        rundir.create(other)
    with pytest.raises(Exception, match="not a counterprof run"):
        Run(other)
    (path / "rank=0").mkdir()                                    # the older layout
    (path / "rank=0" / "samples-x.parquet").write_text("junk")
    (rundir.dataset_dir(path, "spans", 1) / "spans-x.parquet").write_text("junk")
    (rundir.rank_dir(path, 1) / rundir.JOURNAL).mkdir()
    rundir.create(path, replace=True)
    assert [p.name for p in path.iterdir()] == [rundir.MARKER]     # the new run's claim, only


def test_write_json_is_atomic_and_private(tmp_path):
    p = tmp_path / "meta.json"
    rundir.write_json(p, {"a": 1})
    assert json.loads(p.read_text()) == {"a": 1}
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    assert [f.name for f in tmp_path.iterdir()] == ["meta.json"]


def test_a_partition_another_host_writes_is_left_to_that_host(tmp_path):
    """A rank of a multi-node job on a shared filesystem: its writer's pid means nothing here,
    so this host's compaction (and recovery) leaves its journal alone; --force takes it."""
    import json
    import socket
    from counterprof import recover as rec
    from counterprof.store import liveness
    path, _ = make_run(tmp_path)
    rank = rundir.rank_dir(path, 1)
    w = JournalWriter(rank, "4242-abcdef")
    w.write("samples", batch(0, 3))
    w.close()
    meta = {"status": "running", "profiler": {"pid": 1, "host": socket.gethostname() + "-other"}}
    (rank / "meta.json").write_text(json.dumps(meta))
    report = compact_rank(rank)
    assert report.live == [f"rank=1 (written on {socket.gethostname()}-other)"] and not report.files
    assert list((rank / rundir.JOURNAL).iterdir())
    assert liveness.profiler_alive(meta) and not rec.needs_recovery(meta)
    assert compact_rank(rank, force=True).files


def test_two_compactions_of_one_partition_at_once_keep_every_row(tmp_path):
    """Two readers recovering one killed run compact together: one at a time, every row once."""
    import threading
    _, rank = make_run(tmp_path)
    w = JournalWriter(rank, "4243-abcdef", segment_bytes=4096)
    for i in range(200):
        w.write("samples", batch(i * 100, 50))
    w.close()
    errors = []

    def compact():
        try:
            compact_rank(rank)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=compact) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pq.read_table(parquet_file(rank, "4243-abcdef")).num_rows == 200 * 50
    assert not (rank / rundir.JOURNAL).exists()
