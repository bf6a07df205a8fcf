"""store.query (DuckDB over the run's files) agrees with the in-memory Arrow path, skips a
corrupt file and says so, and sees journal segments a killed profiler left."""
import json

import pyarrow as pa
import pytest

import counterprof
from counterprof.analysis.report import ReportInputs, bucket_ns, build_report, inputs_from_samples, regroup
from counterprof.analysis.signals import bucket_table
from counterprof.analysis.summary import metric_totals
from counterprof.store.query import RunQuery
from helpers import EXAMPLES, PYTHON, run_cli, table_dir


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("q") / "r"
    proc = run_cli("run", "-q", "-I", "10", "-o", str(run_dir), "--", PYTHON, str(EXAMPLES / "busy.py"), "1")
    assert proc.returncode == 0, proc.stderr
    return counterprof.load(run_dir)


def _sorted(t: pa.Table, keys) -> list[dict]:
    return t.sort_by([(k, "ascending") for k in keys]).to_pylist()


def test_buckets_and_totals_agree_with_the_arrow_path(real_run):
    q = RunQuery(real_run.path)
    b = bucket_ns(real_run.meta)
    duck = _sorted(q.buckets(b).select(["metric", "b", "start_ns", "end_ns", "vsum", "n", "nulls"]), ["metric", "b"])
    arrow = _sorted(bucket_table([real_run.samples()], b).select(
        ["metric", "b", "start_ns", "end_ns", "vsum", "n", "nulls"]), ["metric", "b"])
    assert len(duck) == len(arrow) > 100
    for d, a in zip(duck, arrow):
        assert d["metric"] == a["metric"]
        nums = ("b", "start_ns", "end_ns", "vsum", "n", "nulls")
        assert [d[k] for k in nums] == pytest.approx([a[k] for k in nums], rel=1e-9, nan_ok=True)
    totals, _devices, _ranks = regroup(q.groups())
    duck_t = {(r["source"], r["metric"]): r for r in totals.to_pylist()}
    arrow_t = {(r["source"], r["metric"]): r for r in metric_totals([real_run.samples()]).to_pylist()}
    assert duck_t.keys() == arrow_t.keys()
    for k in duck_t:
        for col in ("value_sum", "value_count", "dur_sum", "unknown_sum"):
            assert duck_t[k][col] == pytest.approx(arrow_t[k][col], rel=1e-9), (k, col)
    q.close()


def test_reports_from_files_and_from_memory_agree(real_run):
    meta, catalog = real_run.meta, real_run.catalog
    q = RunQuery(real_run.path)
    totals, devices, _ranks = regroup(q.groups())
    from_files = build_report(ReportInputs(q.buckets(bucket_ns(meta)), totals, devices,
                                           q.spans(), catalog, meta), 1.0)
    from_memory = build_report(inputs_from_samples(real_run.samples(), real_run.table("spans"), catalog, meta), 1.0)
    assert from_files.overall.verdict == from_memory.overall.verdict
    assert from_files.overall.shares == pytest.approx(from_memory.overall.shares)
    assert [w.verdict for w in from_files.windows] == [w.verdict for w in from_memory.windows]


def test_corrupt_partition_is_skipped_and_named(tmp_path, real_run):
    import shutil
    run_dir = tmp_path / "copy"
    shutil.copytree(real_run.path, run_dir)
    bad = table_dir(run_dir, "samples", 1)
    (bad / "samples-broken.parquet").write_bytes(b"PAR1 this is not parquet")
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    assert "skipped an unreadable file" in rep.stderr and "samples-broken.parquet" in rep.stderr
    assert json.loads(rep.stdout)["overall"]["verdict"] in ("unknown", "compute", "memory", "host")


def test_compare_and_history_skip_a_corrupt_file_and_name_it(tmp_path, real_run):
    import shutil
    from counterprof.ground.errors import RunDirectoryError
    from counterprof.store.reader import Run
    run_dir = tmp_path / "copy"
    shutil.copytree(real_run.path, run_dir)
    broken = table_dir(run_dir, "samples", 0) / "samples-broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(RunDirectoryError, match="samples-broken.parquet"):   # strict by default
        Run(run_dir).table("samples")
    lenient = Run(run_dir, skip_unreadable=True)
    assert lenient.table("samples").num_rows == real_run.samples().num_rows
    assert sum(b.num_rows for b in lenient.batches("samples")) == real_run.samples().num_rows
    assert len(lenient.skipped) == 1 and "samples-broken.parquet" in lenient.skipped[0]

    proc = run_cli("compare", str(real_run.path), str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "skipped an unreadable file" in proc.stderr and "samples-broken.parquet" in proc.stderr
    j = json.loads(proc.stdout)
    assert any("samples-broken.parquet" in n for n in j["notes"])
    tc = next(r for r in j["rows"] if r["key"] == "metric:task-clock" and r["rank"] is None)
    # the same rows: no change (its interval, two independent resamplings of a noisy series, may
    # still reach past the threshold: then it is too wide to call, never a change)
    assert tc["status"] in ("unchanged", "inconclusive") and tc["change"] == pytest.approx(0, abs=1e-9)
    proc = run_cli("history", "add", str(run_dir), "--db", str(tmp_path / "h.duckdb"))
    assert proc.returncode == 0, proc.stderr
    assert "samples-broken.parquet" in proc.stderr and "added as run 1" in proc.stderr
