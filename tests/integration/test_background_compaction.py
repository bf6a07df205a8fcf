"""Rotated journal segments are compacted into parts while the run goes on (real runs, real
Parquet): the parts are there before the run stops, the dataset equals what one compaction at
the end gives, a profiler killed mid-run loses nothing and duplicates nothing, and every reader
(Run, RunQuery, pandas, DuckDB) reads parts and final file alike."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof import regions
from counterprof.ground.schema import samples_batch
from counterprof.session import Session
from counterprof.store import compact as compact_mod
from counterprof.store import journal, rundir
from counterprof.store.compact import compact_rank, compact_segment, part_name
from counterprof.store.journal import JournalWriter, segments
from counterprof.store.query import RunQuery
from counterprof.store.reader import Run

CLI = [sys.executable, "-m", "counterprof"]
KEY = ["time", "source", "metric", "entity"]


def batch(start: int, n: int) -> pa.RecordBatch:
    return samples_batch([start + i for i in range(n)], [1000] * n, "perf", ["task-clock"] * n,
                         ["process"] * n, [float(i) for i in range(n)], [1.0] * n)


def parts(run: Path, table: str = "samples") -> list[Path]:
    return sorted((run / table).glob(f"rank=*/{table}-*~*.parquet"))


def sorted_rows(table: pa.Table, t0: int = 0) -> list[tuple]:
    cols = [table.column(c).cast(pa.string()).to_pylist() if c != "time"
            else [t - t0 for t in table.column(c).cast("int64").to_pylist()] for c in KEY + ["value"]]
    return sorted(zip(*cols))


def emit_run(path: Path, background: bool, monkeypatch) -> tuple[Session, list[int]]:
    """An in-process session fed 40 batches through its journal, rotating every few kB; how
    many parts were on disk before stop(), batch by batch."""
    monkeypatch.setattr(journal, "SEGMENT_BYTES", 4096)
    if not background:
        monkeypatch.setattr(compact_mod.BackgroundCompactor, "submit", lambda self, r, s: None)
    s = Session(path, collectors=[], rank=0, on_warning=lambda m: None)
    s.start()
    seen = []
    t0 = s.start_ns
    for i in range(40):
        s.emit("samples", batch(t0 + i * 100, 100))
        time.sleep(0.01)         # a collector's pace: the compactor's thread gets its turns
        seen.append(len(parts(s.path)))
    deadline = time.monotonic() + 10
    while background and len(parts(s.path)) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    seen.append(len(parts(s.path)))
    s.stop()
    return s, seen


def test_parts_are_written_during_the_run_and_equal_one_compaction_at_the_end(tmp_path, monkeypatch):
    bg, seen = emit_run(tmp_path / "bg", True, monkeypatch)
    plain, seen_plain = emit_run(tmp_path / "plain", False, monkeypatch)
    assert seen[-1] >= 5, seen                  # compacted before stop(), not by it
    assert max(seen_plain) == 0 and not parts(plain.path)
    assert not list((tmp_path / "bg").glob("_ranks/rank=0/journal/*"))
    a, b = Run(bg.path).samples(), Run(plain.path).samples()
    assert a.num_rows == b.num_rows == 4000
    assert sorted_rows(a, bg.start_ns) == sorted_rows(b, plain.start_ns)
    assert bg.compaction is not None and bg.compaction.rows == 4000      # background + end
    # row groups stay bounded in every file
    for f in (tmp_path / "bg" / "samples").glob("rank=0/*.parquet"):
        md = pq.read_metadata(f)
        assert all(md.row_group(g).num_rows <= compact_mod.ROW_GROUP_ROWS for g in range(md.num_row_groups))


def test_a_segment_compacted_but_not_yet_deleted_is_read_once(tmp_path):
    """Killed between a part's rename and its segment's unlink: readers read the part only,
    and the next compaction deletes the segment instead of compacting it again."""
    path = rundir.create(tmp_path / "run")
    rundir.write_json(path / rundir.META, {"status": "running"})
    rank = rundir.rank_dir(path, 0)
    w = JournalWriter(rank, "4242-abcdef", segment_bytes=3000)
    for i in range(10):
        w.write("samples", batch(i * 100, 100))
    w.close()
    segs = segments(rank)
    assert len(segs) >= 3
    first = segs[0]
    kept = first.path.read_bytes()
    compact_segment(rank, first)
    part = rundir.table_dir(rank, "samples") / part_name("samples", first.writer, first.seq)
    assert part.exists() and not first.path.exists()
    first.path.write_bytes(kept)                  # as if the unlink never came
    assert Run(path).samples().num_rows == 1000
    assert RunQuery(path).arrow("select count(*) as n from samples").column("n")[0].as_py() == 1000
    report = compact_rank(rank)
    assert report.rows == 1000 - pq.read_metadata(part).num_rows
    assert not segments(rank)
    got = Run(path).samples()
    assert got.column("time").cast("int64").to_pylist() == list(range(1000))


def cli_run(run: Path, seconds: float, extra_env: dict[str, str]) -> subprocess.Popen:
    """`counterprof run -I 1` of a workload that waits for its run to hold parts, then sleeps."""
    code = ("import glob, os, sys, time\n"
            f"run = os.environ[{regions.ENV_RUN_DIR!r}]\n"
            "open(os.environ['PIDFILE'], 'w').write(str(os.getpid()))\n"
            "end = time.monotonic() + 30\n"
            "while not glob.glob(run + '/samples/rank=*/samples-*~*.parquet') and time.monotonic() < end:\n"
            "    time.sleep(0.05)\n"
            "print('parts', len(glob.glob(run + '/samples/rank=*/samples-*~*.parquet')), flush=True)\n"
            f"time.sleep({seconds})\n")
    env = {**os.environ, journal.SEGMENT_BYTES_ENV: "20000", "PIDFILE": str(run) + ".pid",
           **extra_env}
    return subprocess.Popen(CLI + ["run", "-I", "1", "-o", str(run), "--", sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_cli_run_compacts_as_it_goes_and_every_reader_reads_the_parts(tmp_path):
    run = tmp_path / "run"
    p = cli_run(run, 0.5, {})
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "parts " in out and int(out.split("parts ")[1].split()[0]) >= 1, out   # before stop
    files = sorted((run / "samples" / "rank=0").glob("*.parquet"))
    assert len(files) >= 2 and any("~" not in f.name for f in files)
    assert not list(run.glob("_ranks/rank=0/journal/*.arrows"))
    total = sum(pq.read_metadata(f).num_rows for f in files)
    t = Run(run).samples()
    assert t.num_rows == total > 0
    assert len(set(sorted_rows(t))) == total                 # no row twice
    assert RunQuery(run).arrow("select count(*) as n from samples").column("n")[0].as_py() == total
    pd = pytest.importorskip("pandas")
    assert len(pd.read_parquet(run / "samples")) == total
    duckdb = pytest.importorskip("duckdb")
    assert duckdb.sql(f"select count(*) from '{run}/samples/*/*.parquet'").fetchall()[0][0] == total


def test_sigkill_mid_run_then_recover_reads_every_row_once(tmp_path):
    run = tmp_path / "run"
    p = cli_run(run, 30, {})
    try:
        deadline = time.monotonic() + 60
        while len(parts(run)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(parts(run)) >= 2
        time.sleep(0.3)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        try:      # the workload outlives its killed profiler, and holds its pipes open
            os.kill(int(Path(str(run) + ".pid").read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        p.communicate()
    left = segments(rundir.rank_dir(run, 0))
    assert left                                     # the open segment(s) a SIGKILL leaves
    rank = rundir.rank_dir(run, 0)
    journaled = sum(b.num_rows for s in left if s.table == "samples"
                    and not compact_mod.compacted(rank, s) for b in journal.read_segment(s.path))
    in_parts = sum(pq.read_metadata(f).num_rows for f in parts(run))
    r = subprocess.run(CLI + ["recover", str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not list(run.glob("_ranks/rank=0/journal/*.arrows"))
    t = Run(run).samples()
    assert t.num_rows == in_parts + journaled
    assert len(set(sorted_rows(t))) == t.num_rows
    assert RunQuery(run).arrow("select count(*) as n from samples").column("n")[0].as_py() == t.num_rows
