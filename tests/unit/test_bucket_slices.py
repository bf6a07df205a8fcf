"""RunQuery.buckets aggregates a slice of time at a time (at most GROUPS_PER_SLICE groups a
query, DuckDB's hash table ~500 bytes a group): the slices' rows, put in metric order, must be
the rows of one query over the whole run, to the bit, whatever the session's time zone, the
time column's stored type, or a page damaged in the middle of a file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import counterprof.store.query as query
from counterprof.analysis.report import bucket_ns, build_report, extent_of, regroup, ReportInputs
from counterprof.analysis.signals import RunData, load_buckets
from counterprof.store.query import RunQuery

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "synthetic_run.py"


@pytest.fixture(scope="module")
def syn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("slices") / "syn"
    subprocess.run([sys.executable, str(BENCH), "-o", str(run), "--ranks", "3", "--minutes", "0.5", "--hz", "10",
                    "--metrics", "4"], check=True, capture_output=True)
    return run


def _buckets(run: Path, monkeypatch: pytest.MonkeyPatch, per_slice: int, extent: bool = True,
             bucket: int | None = None, zone: str | None = None, skipped: list[str] | None = None
             ) -> tuple[pa.Table, int]:
    """(the buckets, how many bucket queries ran) with GROUPS_PER_SLICE = per_slice; zone: the
    session's time zone set before (what a user's DuckDB settings could make it)."""
    monkeypatch.setattr(query, "GROUPS_PER_SLICE", per_slice)
    skipped = [] if skipped is None else skipped
    q = RunQuery(run, threads=2)
    if zone is not None:
        q.con.execute(f"SET TimeZone = '{zone}'")
    calls = []
    arrow = q.arrow
    monkeypatch.setattr(q, "arrow", lambda sql: (calls.append(sql), arrow(sql))[1])
    meta = json.loads((run / "meta.json").read_text())
    bn = bucket_ns(meta) if bucket is None else bucket
    if extent:
        groups = q.groups()
        calls.clear()
        out = q.buckets(bn, *extent_of(groups))
    else:         # (no scan first: a damaged page is met by a slice)
        out = q.buckets(bn, (meta["start_ns"], meta["end_ns"]), metrics=4)
    if zone is not None:
        assert q.con.sql("SELECT current_setting('TimeZone')").fetchall()[0][0] == zone
    skipped.extend(q.files.skipped)
    q.close()
    return out, len(calls)


def test_slices_give_the_rows_of_one_query(syn: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole, one = _buckets(syn, monkeypatch, 10**12)
    assert one == 1 and whole.num_rows == 4 * 300          # 4 metrics x 30 s of 100 ms
    for per in (4 * 7, 4 * 100, 4 * 299):                   # 7, 100 and 299 buckets a slice
        sliced, n = _buckets(syn, monkeypatch, per)
        assert n >= -(-300 // (per // 4)) >= 2                # the slices each ran
        assert sliced.equals(whole), per
    asked, n = _buckets(syn, monkeypatch, 4 * 7, extent=False)     # the extent of meta.json
    assert n >= 300 // 7 and asked.equals(whole)
    q = RunQuery(syn, threads=2)                 # the extent asked of DuckDB, the metrics counted
    assert q.buckets(bucket_ns(json.loads((syn / "meta.json").read_text()))).equals(whole)
    q.close()


def test_a_zone_other_than_utc_moves_no_row(syn: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB casts a timestamp literal in the session's zone. The connection is set to UTC; in
    a zone that is not (+05:30) the slices' edges would move by 5.5 h, off the edges of 7 ms
    buckets, and split them in two: the run is then read in one query."""
    whole, _ = _buckets(syn, monkeypatch, 10**12, bucket=7_000_000)
    sliced, n = _buckets(syn, monkeypatch, 4 * 100, bucket=7_000_000)
    assert n > 20 and sliced.equals(whole)
    shifted, n = _buckets(syn, monkeypatch, 4 * 100, bucket=7_000_000, zone="Asia/Kolkata")
    assert n == 1 and shifted.equals(whole)


def test_rows_on_the_edges_and_before_1970_fall_in_one_slice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples stamped exactly on bucket (and slice) edges, and one before 1970 in a run with
    no span to leave it out (DuckDB's // rounds toward zero): each (metric, bucket) once, the
    rows those of one query."""
    from counterprof.ground.schema import SAMPLES_SCHEMA, samples_batch
    from counterprof.store import rundir
    run = tmp_path / "edges"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "complete"}))
    bn = 100_000_000
    t = [k * bn for k in range(1, 201)] + [-1, -3 * bn, 0]        # -1 and 0: both metric a's bucket 0
    n = len(t)
    d = rundir.dataset_dir(run, "samples", 0)
    pq.write_table(pa.Table.from_batches([samples_batch(t, [bn] * n, "perf", ["a", "b"] * (n // 2) + ["a"] * (n % 2),
                                                        ["process"] * n, [1.0] * n)]).cast(SAMPLES_SCHEMA),
                   d / "samples-edges.parquet")
    whole, _ = _buckets(run, monkeypatch, 10**12, bucket=bn)
    sliced, k = _buckets(run, monkeypatch, 2 * 1, bucket=bn)      # a bucket a slice
    assert k > 150 and sliced.equals(whole)
    keys = list(zip(sliced["metric"].to_pylist(), sliced["b"].to_pylist()))
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("ranks", [[1], [0, 1, 2]])
def test_files_with_another_time_type_give_the_same_rows(syn: Path, tmp_path: Path, ranks: list[int],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by another tool with microsecond times: one of them (the view's time is
    still nanoseconds), or all (it is not, and the run is read in one query)."""
    import shutil
    run = tmp_path / "us"
    shutil.copytree(syn, run)
    for r in ranks:
        f = next((run / "samples" / f"rank={r}").glob("*.parquet"))
        t = pq.read_table(f)
        pq.write_table(t.set_column(t.schema.get_field_index("time"), "time",
                                    t["time"].cast(pa.timestamp("us", tz="UTC"), safe=False)), f)
    whole, _ = _buckets(run, monkeypatch, 10**12)
    got, n = _buckets(run, monkeypatch, 4 * 10)
    assert n == (31 if len(ranks) == 1 else 1)
    assert got.equals(whole)


def test_a_damaged_page_met_in_a_later_slice_costs_only_its_rows(syn: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of the last row groups damaged (the footer reads): the slices before it read
    the file whole, the slice that meets it reads it again without its damaged row groups; the
    result is the one query's, which leaves the same rows out."""
    import shutil
    run = tmp_path / "dmg"
    shutil.copytree(syn, run)
    f = next((run / "samples" / "rank=2").glob("*.parquet"))
    t = pq.read_table(f)
    pq.write_table(t, f, row_group_size=max(1, t.num_rows // 6))
    md = pq.read_metadata(f)
    column = md.row_group(md.num_row_groups - 1).column(md.schema.to_arrow_schema().get_field_index("time"))
    at = column.data_page_offset + 8            # inside the last row group's times
    data = bytearray(f.read_bytes())
    data[at:at + 32] = bytes(b ^ 0x5A for b in data[at:at + 32])
    f.write_bytes(bytes(data))
    clean, n0 = _buckets(syn, monkeypatch, 4 * 10, extent=False)
    whole, _ = _buckets(run, monkeypatch, 10**12, extent=False)
    skipped: list[str] = []
    sliced, n = _buckets(run, monkeypatch, 4 * 10, extent=False, skipped=skipped)
    assert n == n0 > 20            # (the slice that met it was read again inside RunQuery._run)
    assert skipped and all(str(f) in w and "row group 6 of 6" in w for w in skipped), skipped
    assert sliced.equals(whole) and sliced.num_rows == clean.num_rows
    assert pa.compute.sum(sliced["n"]).as_py() < pa.compute.sum(clean["n"]).as_py()


def test_load_buckets_reads_sorted_and_unsorted_tables_alike(syn: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """load_buckets takes RunQuery.buckets' rows as they come (in metric order: no copy) and
    sorts any other table first: the series are the same."""
    whole, _ = _buckets(syn, monkeypatch, 10**12)
    shuffled = whole.take(pa.array(list(range(whole.num_rows))[::-1]))
    a, b = RunData(), RunData()
    load_buckets(a, whole, {})
    load_buckets(b, shuffled, {})
    assert a.series.keys() == b.series.keys() and a.sources == b.sources
    for name in a.series:
        sa, sb = a.series[name], b.series[name]
        assert (sa.starts == sb.starts).all() and (sa.ends == sb.ends).all()
        assert ((sa.values == sb.values) | (sa.values != sa.values)).all()


def test_the_report_lets_its_buckets_go_unless_asked_to_keep_them(syn: Path) -> None:
    q = RunQuery(syn, threads=2)
    meta = json.loads((syn / "meta.json").read_text())
    groups = q.groups()
    totals, devices, _ = regroup(groups)
    inputs = ReportInputs(q.buckets(bucket_ns(meta), *extent_of(groups)), totals, devices, q.spans(), {}, meta)
    q.close()
    rows = inputs.buckets.num_rows
    kept = build_report(inputs, 1.0).to_json()
    assert inputs.buckets.num_rows == rows
    let_go = build_report(inputs, 1.0, keep_buckets=False).to_json()
    assert inputs.buckets.num_rows == 0 and inputs.buckets.schema.names[0] == "metric"
    assert kept == let_go
