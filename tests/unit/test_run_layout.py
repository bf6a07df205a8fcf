"""Where a run's files are (counterprof.store.rundir), in the current layout and the older one."""
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset
import pyarrow.parquet as pq

from counterprof.ground.schema import samples_batch
from counterprof.store import rundir
from counterprof.store.compact import compact_rank
from counterprof.store.journal import JournalSet, JournalWriter


def batch(n=3):
    return samples_batch(list(range(n)), [1] * n, "perf", ["task-clock"] * n, ["process"] * n,
                         [1.0] * n)


def test_a_ranks_own_folder_and_its_tables_datasets(tmp_path):
    run = rundir.create(tmp_path / "run")
    own = rundir.rank_dir(run, 3)
    assert own == run / "_ranks" / "rank=3" and own.is_dir()
    assert oct(own.stat().st_mode & 0o777) == "0o700"
    assert oct((run / "_ranks").stat().st_mode & 0o777) == "0o700"
    assert rundir.table_dir(own, "samples") == run / "samples" / "rank=3"
    assert rundir.traces_dir(run, 3) == own / "traces"
    assert rundir.rank_dirs(run) == [(3, own)]
    assert rundir.dataset_dir(run, "spans", 5) == run / "spans" / "rank=5"
    assert rundir.ranks(run) == [3, 5]                      # a rank with files only in a table


def test_the_older_layout_is_found_as_it_is(tmp_path):
    run = tmp_path / "run"
    old = run / "rank=2"
    (old / "traces").mkdir(parents=True)
    (old / "traces" / "h_1.1.pt.trace.json").write_text("{}")
    pq.write_table(pa.Table.from_batches([batch()]), old / "samples-w.parquet")
    assert rundir.rank_dirs(run) == [(2, old)]
    assert rundir.table_dir(old, "spans") == old
    assert rundir.table_files(run, "samples") == [(2, old / "samples-w.parquet")]
    assert rundir.table_files(run, "spans") == []
    assert [p for g in rundir.trace_globs("*.pt.trace.json") for p in run.glob(g)] == \
        [old / "traces" / "h_1.1.pt.trace.json"]


def test_compaction_writes_each_table_into_its_dataset(tmp_path):
    run = rundir.create(tmp_path / "run")
    sink = JournalSet(run, "w")
    sink.write("samples", batch(), rank=0)
    sink.write("samples", batch(2), rank=1)
    sink.close()
    # the journal is a rank's own file; the marker says the directory is a counterprof run
    assert sorted(p.name for p in run.iterdir()) == [rundir.MARKER, "_ranks"]
    for r in (0, 1):
        compact_rank(rundir.rank_dir(run, r))
    for d in (run / "samples", run / "samples" / "rank=1"):
        assert oct(d.stat().st_mode & 0o777) == "0o700"
    t = pyarrow.dataset.dataset(run / "samples", partitioning="hive").to_table()
    assert sorted(t["rank"].to_pylist()) == [0, 0, 0, 1, 1]
    assert rundir.table_files(run, "samples") == [
        (r, run / "samples" / f"rank={r}" / "samples-w.parquet") for r in (0, 1)]


def test_compaction_of_an_older_run_stays_beside_its_journal(tmp_path):
    run = tmp_path / "run"
    old = run / "rank=0"
    old.mkdir(parents=True)
    w = JournalWriter(old, "w")
    w.write("samples", batch())
    w.close()
    report = compact_rank(old)
    assert report.files == [old / "samples-w.parquet"]
    assert sorted(p.name for p in run.iterdir()) == ["rank=0"]


def test_a_file_being_compacted_is_hidden_from_dataset_readers(tmp_path, monkeypatch):
    """Until the rename, the Parquet file in the dataset folder has a name readers skip."""
    import counterprof.store.compact as compact
    run = rundir.create(tmp_path / "run")
    w = JournalWriter(rundir.rank_dir(run, 0), "w")
    w.write("samples", batch())
    w.close()
    seen = []
    real_replace = compact.os.replace

    def replace(src, dst):
        seen.append((Path(src).name, [p.name for p in Path(dst).parent.iterdir()]))
        real_replace(src, dst)

    monkeypatch.setattr(compact.os, "replace", replace)
    compact_rank(rundir.rank_dir(run, 0))
    assert seen == [(".samples-w.parquet.tmp", [".samples-w.parquet.tmp"])]
