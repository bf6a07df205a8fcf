"""Each table of a run is its own dataset (RUN/samples, RUN/spans, hive-partitioned by rank), so
the readers people already use open it in one line: pyarrow.dataset, pandas, DuckDB, Polars, with
the real libraries. Runs of the older layout (everything of a rank in RUN/rank=<r>/) still read."""
from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter

import pytest

import counterprof
from counterprof.ground.schema import TABLES
from counterprof.store import rundir
from helpers import PYTHON, rank_files, run_cli, table_files, to_older_layout, two_rank_run

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return two_rank_run(tmp_path_factory.mktemp("readers") / "run")


def per_rank(run_dir, table):
    """What counterprof's own reader holds: rows per rank."""
    t = counterprof.load(run_dir).table(table)
    return Counter(t["rank"].to_pylist())


def pyarrow_dataset(run_dir, table):
    import pyarrow.dataset
    t = pyarrow.dataset.dataset(f"{run_dir}/{table}", partitioning="hive").to_table()
    return t.column_names, Counter(t["rank"].to_pylist())


def pandas_read(run_dir, table):
    import pandas
    df = pandas.read_parquet(f"{run_dir}/{table}")
    return list(df.columns), Counter(int(r) for r in df["rank"])


def duckdb_sql(run_dir, table):
    import duckdb
    rel = duckdb.sql(f"select * from '{run_dir}/{table}/*/*.parquet'")
    ranks = duckdb.sql(f"select rank, count(*) from '{run_dir}/{table}/*/*.parquet' group by rank")
    return rel.columns, Counter({int(r): n for r, n in ranks.fetchall()})


def polars_scan(run_dir, table):
    import polars
    df = polars.scan_parquet(f"{run_dir}/{table}/**/*.parquet", hive_partitioning=True).collect()
    return df.columns, Counter(df["rank"].to_list())


@pytest.mark.parametrize("table", ["samples", "spans"])
@pytest.mark.parametrize("reader", [pyarrow_dataset, pandas_read, duckdb_sql, polars_scan],
                         ids=["pyarrow.dataset", "pandas", "duckdb", "polars"])
def test_each_table_opens_in_one_line_with_its_rank(run_dir, table, reader):
    columns, counts = reader(run_dir, table)
    assert columns == TABLES[table].names + ["rank"]          # one schema per table, rank last
    assert set(counts) == {0, 1} and all(counts.values())
    assert counts == per_rank(run_dir, table)                 # every row, in its own rank


def test_nothing_but_the_tables_is_where_readers_look(run_dir):
    """The working files (journal, traces, meta of joined ranks) and files being written are
    under names dataset readers skip."""
    for table in rundir.TABLE_NAMES:
        for f in (run_dir / table).rglob("*"):
            assert f.is_dir() or f.suffix == ".parquet" or f.name.startswith("."), f
    assert sorted(p.name for p in run_dir.iterdir() if not p.name.startswith((".", "_"))) == \
        ["catalog.json", "meta.json", "samples", "spans"]


def test_samples_carry_the_rank_whenever_the_run_has_several(run_dir, tmp_path):
    run = counterprof.load(run_dir)
    assert run.ranks() == [0, 1]
    s = run.samples()
    assert s.column_names == TABLES["samples"].names + ["rank"]
    assert Counter(s["rank"].to_pylist()) == per_rank(run_dir, "samples")
    assert set(run.samples(rank=1)["rank"].to_pylist()) == {1}    # the same columns for one rank
    assert "rank" not in run.samples(with_rank=False).column_names
    with counterprof.profile(path=tmp_path / "one", collectors=["host"]):
        pass
    one = counterprof.load(tmp_path / "one")
    assert one.ranks() == [0] and one.samples().column_names == TABLES["samples"].names
    assert one.samples(with_rank=True)["rank"].to_pylist() == [0] * one.samples().num_rows


@pytest.fixture(scope="module")
def older_run(run_dir, tmp_path_factory):
    """The same run, rewritten in the layout counterprof wrote before (a run someone kept)."""
    old = tmp_path_factory.mktemp("older") / "run"
    shutil.copytree(run_dir, old)
    to_older_layout(old)
    assert (old / "rank=0").is_dir() and (old / "rank=1").is_dir()
    assert not (old / "samples").exists() and not (old / rundir.RANKS).exists()
    return old


def test_a_run_of_the_older_layout_reads_the_same(run_dir, older_run):
    new, old = counterprof.load(run_dir), counterprof.load(older_run)
    assert old.ranks() == new.ranks() == [0, 1]
    for table in rundir.TABLE_NAMES:
        assert old.table(table).equals(new.table(table))
        assert sum(b.num_rows for b in old.batches(table)) == new.table(table).num_rows
    assert old.catalog == new.catalog
    joined = [r for r in (0, 1) if (rank_files(run_dir, r) / "meta.json").exists()]
    assert [old.rank_meta(r) for r in joined] == [new.rank_meta(r) for r in joined]
    reports = [run_cli("report", str(p), "--json") for p in (run_dir, older_run)]
    assert all(r.returncode == 0 for r in reports), [r.stderr for r in reports]
    a, b = (json.loads(r.stdout) for r in reports)
    assert a["overall"] == b["overall"] and a["rank_verdicts"] == b["rank_verdicts"]


def test_an_older_run_exports_and_merges_into_the_current_layout(run_dir, older_run, tmp_path):
    exported = []
    for run in (run_dir, older_run):
        out = tmp_path / f"{run.parent.name}.json"
        proc = run_cli("export", str(run), "--perfetto", str(out))
        assert proc.returncode == 0, proc.stderr
        exported.append(Counter(e.get("ph") for e in json.loads(out.read_text())["traceEvents"]))
    assert exported[0] == exported[1] and exported[0]["X"] >= 16      # 2 ranks x 8 regions
    merged = tmp_path / "merged"
    proc = run_cli("merge", str(older_run), "-o", str(merged))
    assert proc.returncode == 0, proc.stderr
    assert not list(merged.glob("rank=*"))                      # the current layout
    for table in rundir.TABLE_NAMES:
        assert per_rank(merged, table) == per_rank(run_dir, table)
        assert pyarrow_dataset(merged, table)[1] == per_rank(run_dir, table)
        assert [f.name for f in table_files(merged, table)] == [f.name for f in table_files(run_dir, table)]


def test_an_older_run_a_killed_profiler_left_is_recovered_in_its_own_layout(tmp_path):
    """A journal left in rank=<r>/journal/ is compacted beside it, as before."""
    from counterprof.ground.schema import samples_batch
    from counterprof.store.journal import JournalWriter
    run = tmp_path / "run"
    with counterprof.profile(path=run, collectors=["host"]):
        pass
    before = counterprof.load(run).samples().num_rows
    to_older_layout(run)
    gone = subprocess.Popen([PYTHON, "-c", ""])
    gone.wait()                                      # a pid whose process has exited
    meta = json.loads((run / "meta.json").read_text())
    meta["status"] = "running"                       # its profiler died before finishing
    meta["profiler"]["pid"] = gone.pid
    (run / "meta.json").write_text(json.dumps(meta))
    w = JournalWriter(run / "rank=0", f"{gone.pid}-dead")
    w.write("samples", samples_batch([meta["start_ns"] + 1], [1000], "perf", ["task-clock"],
                                     ["process"], [5.0], [1.0]))
    w.close()
    assert counterprof.load(run).samples().num_rows == before + 1      # read from the journal
    proc = run_cli("recover", str(run))
    assert proc.returncode == 0, proc.stderr
    assert (run / "rank=0" / f"samples-{gone.pid}-dead.parquet").exists()
    assert not (run / "rank=0" / rundir.JOURNAL).exists() and not (run / "samples").exists()
    assert counterprof.load(run).samples().num_rows == before + 1
