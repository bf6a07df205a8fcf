"""The report reads its spans a rank at a time (analysis/report.py SpanScan, signals.load_rank_spans,
RunQuery.spans_of_each_rank): what it makes of them must be what it made of the whole table, and
every rank's rows must come by once, in rank order, from a run on disk as from a table."""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from counterprof.analysis import intervals as iv
from counterprof.analysis.report import build_report, each_rank, inputs_from_samples
from counterprof.analysis.signals import RunData, load_rank_spans, load_spans
from counterprof.ground.schema import SAMPLES_SCHEMA, spans_batch
from counterprof.store import rundir
from counterprof.store.query import RunQuery, rank_ordered

T0 = 1_796_000_000_000_000_000
MS = 1_000_000

# (category, names, device?, kernel_class) a rank's spans are drawn from: every kind load_spans sorts
KINDS = [("step", ["ProfilerStep#1", "ProfilerStep#2"], False, None),
         ("collective", ["allreduce", "broadcast"], False, None),
         ("collective", ["ncclAllReduce"], True, "communication"),
         ("kernel", ["gemm", "elementwise"], True, "compute"),
         ("memcpy", ["Memcpy HtoD"], True, "memory"),
         ("region", ["forward", "backward"], False, None),
         ("annotation", ["enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "Optimizer.step"],
          False, None),
         ("input", ["enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"], False, None),
         ("window", ["trace.pt.trace.json", "t.time.pt.trace.json"], False, None),
         ("cpu_op", ["aten::mm", "aten::add", "c10d::allreduce_", "enumerate(DataLoader)#it.__next__"], False, None),
         ("pysample", ["f (a.py:1)", "g (b.py:2)"], False, None),
         ("dispatch", ["PjitFunction(step)"], False, None),
         ("xla_op", ["fusion.1", "dot.2", "all-reduce.3"], False, None),
         ("neuron_inst", ["PE MATMUL", "ACT SEMAPHORE_WAIT", "POOL ADD"], True, "compute"),
         ("neuron_dma", ["DMA qSyncIO"], True, None),
         ("neuron_cc", ["AllReduce"], True, None),
         ("neuron_runtime", ["nrt_execute"], True, None)]


def _rank_spans(rng: random.Random, rank: int | None, n: int, inputs: bool) -> pa.Table:
    start, end, name, cat, dev, kclass, tid, coll = [], [], [], [], [], [], [], []
    for _ in range(n):
        c, names, on_device, k = rng.choice([x for x in KINDS if inputs or x[0] != "input"])
        s = T0 + rng.randrange(0, 20_000) * MS // 10
        start.append(s)
        end.append(s + rng.choice([0, 1, rng.randrange(1, 400) * MS // 10]))
        name.append(rng.choice(names))
        cat.append(c)
        dev.append(0 if on_device else None)
        kclass.append(k)
        tid.append(rng.choice([100, 101]))
        coll.append(name[-1] if c == "collective" else None)
    t = pa.Table.from_batches([spans_batch(start, end, name, cat, device=dev, kernel_class=kclass, tid=tid,
                                           collective=coll)])
    # (as RunQuery gives them: DuckDB reads the store's dictionaries as strings)
    t = t.cast(pa.schema([pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type)
                          for f in t.schema]))
    if rank is not None or rng.random() < 0.5:
        t = t.append_column("rank", pa.array([rank] * n, pa.int64()))
    return t


def _fields(d: RunData) -> dict:
    """RunData's span-made fields, as plain values (Packed and lists alike)."""
    def plain(x):
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, iv.Packed)):
            return [tuple(p) if isinstance(p, (tuple, list)) else p for p in x]
        return x
    keys = ["start_ns", "end_ns", "gpu_busy", "gpu_class", "gpu_kernel_count", "short_kernels", "cpu_collectives",
            "windows", "step_windows", "regions", "region_kind", "region_count", "input_waits", "input_whole_run",
            "rank_collectives", "main_ops", "comm_ops", "rank_steps", "py_samples", "xla_busy", "xla_ops",
            "xla_dispatch", "xla_class", "neuron_busy", "neuron_class", "neuron_engines", "neuron_waits",
            "neuron_dma_queues", "neuron_dma_bytes", "neuron_cc_ops", "neuron_runtime"]
    out = {k: plain(getattr(d, k)) for k in keys}
    # (dict order too: what reads them per rank goes in their order)
    # (region_kind and region_count are only looked up by name)
    out["order"] = {k: list(getattr(d, k)) for k in keys
                    if isinstance(getattr(d, k), dict) and k not in ("region_kind", "region_count")}
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_rank_at_a_time_makes_what_the_whole_table_made(seed):
    rng = random.Random(seed)
    ranks = sorted(rng.sample(range(-1, 8), rng.randint(1, 5)))
    if 0 not in ranks and len(ranks) > 1 and rng.random() < 0.5:
        ranks.append(None)         # rows of no rank (they load as rank 0's: without one here)
    inputs = rng.random() < 0.5          # DataLoader waits timed for the whole run, or only traced
    parts = [_rank_spans(rng, r, rng.randint(0, 60), inputs and rng.random() < 0.6) for r in ranks]
    if len(parts) > 1 or "rank" in parts[0].column_names:
        parts = [p if "rank" in p.column_names else p.append_column("rank", pa.array([r] * p.num_rows, pa.int64()))
                 for p, r in zip(parts, ranks)]
    whole = pa.concat_tables(parts)
    if "rank" in whole.column_names:
        whole = rank_ordered(whole)
    old, new = RunData(), RunData()
    load_spans(old, whole, 10.0)
    load_rank_spans(new, each_rank(whole), 10.0)
    a, b = _fields(new), _fields(old)
    if None in ranks or -1 in ranks:
        # (rows of no rank load as rank 0's, met last in the whole table; rank -1's main thread
        # came after the others' in a set's order: both only read as sums over the ranks)
        for k in ("input_waits", "py_samples", "main_ops", "comm_ops"):
            del a["order"][k], b["order"][k]
    assert a == b
    # the regions in the same order (the report lists ties in it)
    assert list(new.regions) == list(old.regions)


def _write_run(tmp_path, rng: random.Random, ranks: list[int]) -> tuple:
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0 - 10**9,
                                               "end_ns": T0 + 4 * 10**9}))
    tables = {}
    for r in ranks:
        t = _rank_spans(rng, r, rng.randint(1, 300), True).drop_columns(["rank"])
        tables[r] = t
        pq.write_table(t, rundir.dataset_dir(run, "spans", r) / "spans-a.parquet",
                       row_group_size=rng.choice([16, 1000]))
    return run, tables


@pytest.mark.parametrize("seed", range(6))
def test_a_run_on_disk_gives_each_rank_once_in_rank_order(tmp_path, seed):
    rng = random.Random(seed)
    ranks = sorted(rng.sample(range(40), rng.randint(1, 12)))
    run, tables = _write_run(tmp_path, rng, ranks)
    q = RunQuery(run, threads=2)
    got = [(r, t) for r, t in q.spans_of_each_rank()]
    assert [r for r, _ in got] == ranks
    whole = q.spans(by_rank=True)
    q.close()
    assert sum(t.num_rows for _, t in got) == whole.num_rows == sum(t.num_rows for t in tables.values())
    for r, t in got:
        starts = t["start"].cast(pa.int64()).to_numpy()
        assert np.all(np.diff(starts) >= 0)                # each rank in time order
        assert sorted(starts.tolist()) == sorted(tables[r]["start"].cast(pa.int64()).to_pylist())


def _damage(run, rank: int) -> None:
    path = rundir.dataset_dir(run, "spans", rank) / "spans-a.parquet"
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 4, len(data) // 4 + 64):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_damaged_file_met_on_the_way_is_left_out_and_the_other_ranks_still_come(tmp_path):
    """A page damaged inside a file whose footer reads (DuckDB fails on it mid-stream): the ranks
    already given stay given, the file is left out (its rows Arrow can still read kept), and the
    ranks after it come, each once."""
    rng = random.Random(7)
    ranks = list(range(6))
    run, tables = _write_run(tmp_path, rng, ranks)
    _damage(run, 3)
    q = RunQuery(run, threads=1)
    got = [r for r, _ in q.spans_of_each_rank()]
    q.close()
    assert sorted(set(got)) == got and set(got) >= {0, 1, 2, 4, 5}, got


def test_the_report_of_a_run_equals_the_report_of_its_table(tmp_path):
    """build_report given the run's spans a rank at a time from disk, and given them as one table."""
    rng = random.Random(3)
    ranks = [0, 1, 2, 5]
    run, _ = _write_run(tmp_path, rng, ranks)
    q = RunQuery(run, threads=2)
    table = q.spans(by_rank=True)
    samples = SAMPLES_SCHEMA.empty_table()
    meta = {"start_ns": T0 - 10**9, "end_ns": T0 + 4 * 10**9, "status": "complete"}
    a = inputs_from_samples(samples, table, {}, meta, ranks=len(ranks))
    b = inputs_from_samples(samples, table, {}, meta, ranks=len(ranks))
    b.spans = q.spans_of_each_rank
    ra, rb = build_report(a).to_json(), build_report(b).to_json()
    q.close()
    assert ra == rb
    assert ra["regions"]          # (something to compare)


def test_report_of_a_run_with_a_page_damaged_mid_file_names_the_file_and_reports(tmp_path):
    """(The build before failed the whole report with "a file: reading or writing it failed".)"""
    from helpers import run_cli
    run, _ = _write_run(tmp_path, random.Random(7), list(range(6)))
    _damage(run, 3)
    proc = run_cli("report", str(run), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "roofline left out" not in proc.stderr, proc.stderr
    assert "rank=3/spans-a.parquet" in proc.stderr and "skipped" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["rank_analysis"] is not None


def test_a_rank_rescued_from_a_damaged_row_group_still_comes_in_rank_order(tmp_path):
    """A row group of rank 3's file damaged: its other row groups are rescued and come after
    every file's rows in DuckDB's view; the ranks still come in order, rank 3 once."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "complete"}))
    n = 3000
    for r in range(6):
        s = [T0 + i * MS for i in range(n)]
        t = pa.Table.from_batches([spans_batch(s, [x + MS // 2 for x in s], [f"ProfilerStep#{i}" for i in range(n)],
                                               [("step", "window", "collective")[i % 3] for i in range(n)])])
        pq.write_table(t, rundir.dataset_dir(run, "spans", r) / "spans-a.parquet", row_group_size=500)
    path = rundir.dataset_dir(run, "spans", 3) / "spans-a.parquet"
    off = pq.read_metadata(path).row_group(2).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    for i in range(off + 20, off + 60):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    q = RunQuery(run, threads=1)
    for _ in range(2):           # (the second read: the damaged group known from the start)
        got = [(r, t.num_rows) for r, t in q.spans_of_each_rank()]
        assert got == [(0, n), (1, n), (2, n), (3, n - 500), (4, n), (5, n)], got
    assert any("rank=3" in s for s in q.files.skipped), q.files.skipped
    q.close()


def test_each_ranks_verdict_finds_its_spans_whatever_order_they_come_in(tmp_path):
    """The per-rank verdicts look each rank's buckets up as its spans come by: a source giving
    the ranks out of order judges each with its own spans, as the table does."""
    import subprocess
    import sys
    from pathlib import Path

    from counterprof.analysis.report import ReportInputs, bucket_ns, regroup
    from counterprof.store.query import rank_slices
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "synthetic_run.py"
    run = tmp_path / "syn"
    subprocess.run([sys.executable, str(bench), "-o", str(run), "--ranks", "4", "--minutes", "0.5", "--hz", "10",
                    "--metrics", "4"], check=True, capture_output=True)
    q = RunQuery(run, threads=2)
    meta = json.loads((run / "meta.json").read_text())
    totals, devices, rank_buckets = regroup(q.groups())
    buckets = q.buckets(bucket_ns(meta))
    table = q.spans(by_rank=True)
    q.close()

    def inputs(spans):
        return ReportInputs(buckets, totals, devices, spans, {}, meta, ranks=4, rank_buckets=rank_buckets,
                            hosts={r: "h" for r in range(4)}, world_size=4)

    def shuffled():
        parts = list(rank_slices(table))
        return [parts[i] for i in (2, 0, 3, 1)]
    a, b = build_report(inputs(table)).to_json(), build_report(inputs(shuffled)).to_json()
    assert [v["scope"] for v in a["rank_verdicts"]] == [f"rank {r}" for r in range(4)]
    assert a["rank_verdicts"] == b["rank_verdicts"]
    # (each with its collectives, which only its spans hold)
    assert all(v["shares"].get("collectives", 0) > 0 for v in a["rank_verdicts"]), a["rank_verdicts"]


def test_the_roofline_borrowing_the_reports_connection_gives_back_its_memory_limit(tmp_path):
    """(The report's spans passes read through the connection after it: not at the roofline's
    64 MB.)"""
    from counterprof.store.op_rows import OpRows
    run, _ = _write_run(tmp_path, random.Random(5), [0, 1])
    q = RunQuery(run, threads=1)
    def limit_mib() -> float:        # (DuckDB says it rounded: "953.6 MiB")
        value, unit = q.con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0].split()
        return float(value) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[unit]
    q.con.execute("SET memory_limit = '1GB'")
    before = limit_mib()
    src = OpRows.of(q)
    assert limit_mib() < 100
    src.close()
    assert limit_mib() == pytest.approx(before, rel=1e-3)
    q.close()


def test_a_long_runs_figures_across_ranks_keep_each_ranks_latest_steps(monkeypatch: pytest.MonkeyPatch):
    """Past ACROSS_ROWS (over the ranks) a rank's steps, collectives and windows, the figures
    across ranks keep only its latest, from a step's start on, and say so: they are then those
    of the table cut there; the per-rank verdicts still read every span."""
    import counterprof.analysis.report as report_mod
    from counterprof.analysis.across_ranks import analyze_ranks
    rows = []
    for k in range(50):                 # 50 steps of 100 ms, rank 2 slow into the all_reduce in the first 30
        t0 = T0 + k * 100 * MS
        for r in range(4):
            late = 30 if (r == 2 and k < 30) or (r == 1 and k >= 30) else 0
            rows.append((r, "step", f"ProfilerStep#{k}", t0, t0 + 100 * MS))
            rows.append((r, "collective", "gloo:all_reduce", t0 + (50 + late) * MS, t0 + 100 * MS))
    table = pa.Table.from_batches([spans_batch([x[3] for x in rows], [x[4] for x in rows], [x[2] for x in rows],
                                               [x[1] for x in rows])]).append_column(
        "rank", pa.array([x[0] for x in rows], pa.int64()))
    meta = {"start_ns": T0, "end_ns": T0 + 5_000 * MS, "status": "complete"}
    empty = SAMPLES_SCHEMA.empty_table()

    def rank_analysis() -> dict:
        inputs = inputs_from_samples(empty, table, {}, meta, ranks=4)
        inputs.hosts = {r: "h" for r in range(4)}
        return build_report(inputs).to_json()["rank_analysis"]
    whole = rank_analysis()
    assert whole["steps"] == 50 and whole["straggler"] == 2 and not any("latest" in n for n in whole["notes"])
    monkeypatch.setattr(report_mod, "ACROSS_ROWS", 4 * 40)     # 40 rows a rank: its last 20 steps
    monkeypatch.setattr(report_mod, "MIN_ROWS_PER_RANK", 1)
    cut = rank_analysis()
    assert cut["steps"] == 20 and cut["straggler"] == 1              # the latest steps' straggler
    assert "4 of 4 ranks had more than 40" in cut["notes"][-1]
    tail = table.filter(pc.greater_equal(table["start"].cast(pa.int64()), T0 + 30 * 100 * MS))
    expected = analyze_ranks(tail, {r: "h" for r in range(4)}).to_json()
    assert {k: v for k, v in cut.items() if k != "notes"} == {k: v for k, v in expected.items() if k != "notes"}


def test_the_scans_name_codes_are_one_list_for_every_rank_nulls_kept():
    """SpanScan numbers the across rows' names once for the run (not a dictionary per rank):
    decoded, each row's name is its own, a null one null, whether a rank's names come as
    strings or as a dictionary."""
    from counterprof.analysis.report import SpanScan
    parts = []
    for r, names in enumerate([["a", None, "b", "a"], ["b", "c", None, "c"], ["c", "a", "a", "d"]]):
        t = pa.Table.from_batches([spans_batch([T0 + k for k in range(4)], [T0 + k + 1 for k in range(4)],
                                               names, ["step", "collective", "window", "step"])])
        t = t.set_column(t.schema.get_field_index("name"), "name", pa.array(names, pa.string()))
        if r == 1:
            t = t.set_column(t.schema.get_field_index("name"), "name", pc.dictionary_encode(t["name"]))
        parts.append((r, t.append_column("rank", pa.array([r] * 4, pa.int64()))))
    scan = SpanScan()
    assert [r for r, _ in scan.each(lambda: iter(parts))] == [0, 1, 2]
    across = scan.across_ranks()
    given = [n for _, t in parts for n in t["name"].cast(pa.string()).to_pylist()]
    assert across["name"].cast(pa.string()).to_pylist() == given
    assert across["category"].cast(pa.string()).to_pylist() == ["step", "collective", "window", "step"] * 3
    assert len(across["name"].chunks[0].dictionary) == 4         # a, b, c, d: once each


@pytest.mark.parametrize("seed", range(12))
def test_window_starts_join_each_sets_windows_as_all_times_at_once_did(seed, monkeypatch):
    """window_starts takes the windows each set's times fall in a set at a time (not every
    rank's step edges in one array): the same windows and length as from all times at once,
    however many doublings the window needs."""
    from counterprof.analysis import report
    from counterprof.analysis.signals import Series
    monkeypatch.setattr(report, "MAX_WINDOWS", random.Random(seed).choice([3, 10, 40, 1000]))
    rng = np.random.default_rng(seed)
    lo, hi = T0, T0 + int(rng.integers(10**9, 10**12))
    ends = np.sort(rng.integers(lo - 10**9, hi + 10**9, 50))
    data = RunData(series={"m": Series("delta", ends - 10**8, ends, np.ones(len(ends)))}, start_ns=lo, end_ns=hi)
    for r in range(int(rng.integers(0, 6))):
        a = np.sort(rng.integers(lo, hi, 2 * int(rng.integers(1, 30)))).reshape(-1, 2)
        data.rank_steps[r] = iv.Packed(iv.merge_array(a[:, 0], a[:, 1]))
        data.main_ops[r] = [(int(x), int(y)) for x, y in a[::2]]
    data.windows = [(lo + 5, lo + 10**9)]
    step0 = 10**8
    times = np.concatenate([ends, ends - 10**8, *(iv.edges(s) for s in data.rank_steps.values()),
                            *(iv.edges(s) for s in data.main_ops.values() if s), iv.edges(data.windows)])
    t, want_step = np.clip(times, lo, hi - 1), step0
    while len(np.unique((t - lo) // want_step)) > report.MAX_WINDOWS:
        want_step *= 2
    want = [int(lo + i * want_step) for i in np.unique((t - lo) // want_step)]
    step, starts = report.window_starts(data, step0)
    if -(-(hi - lo) // step0) <= report.MAX_WINDOWS:
        assert (step, starts) == (step0, list(range(lo, hi, step0)))
    else:
        assert (step, starts) == (want_step, want)


def test_a_long_runs_collective_calls_are_of_the_steps_every_rank_kept(monkeypatch: pytest.MonkeyPatch):
    """Past ACROSS_ROWS the report's collective calls are matched over the steps every rank
    kept, as the ranks table is: a rank whose clock runs early started the cut's first step
    before the cut, so that step is no one's, and no call is left unmatched at the edge. The
    figures are those of the calls of the steps kept, and the cut is said in their notes."""
    import counterprof.analysis.report as report_mod
    from counterprof.analysis.collectives import analyze_calls
    rows = []
    for k in range(50):                 # 50 steps of 100 ms; rank 3's clock 40 ms early
        for r in range(4):
            t0 = T0 + k * 100 * MS - (40 * MS if r == 3 else 0)
            late = 30 if r == 2 else 0
            rows.append((r, "step", f"ProfilerStep#{k}", t0, t0 + 100 * MS, None))
            rows.append((r, "collective", "gloo:all_reduce", t0 + (50 + late) * MS, t0 + 100 * MS, "all_reduce"))
    table = pa.Table.from_batches([spans_batch([x[3] for x in rows], [x[4] for x in rows], [x[2] for x in rows],
                                               [x[1] for x in rows], collective=[x[5] for x in rows])]).append_column(
        "rank", pa.array([x[0] for x in rows], pa.int64()))
    meta = {"start_ns": T0 - 100 * MS, "end_ns": T0 + 5_000 * MS, "status": "complete"}

    def calls() -> dict:
        inputs = inputs_from_samples(SAMPLES_SCHEMA.empty_table(), table, {}, meta, ranks=4)
        inputs.hosts = {r: "h" for r in range(4)}
        rep = build_report(inputs).to_json()
        late = [e["text"] for e in rep["overall"]["secondary"] if e["metric"] == "late_rank"]
        return {**rep["collective_calls"], "late": late}
    whole = calls()
    assert whole["calls"] == 50 and not whole["unmatched"] and not any("latest" in n for n in whole["notes"])
    assert whole["late"][0].startswith("rank 2 arrived last at 50 of 50 collective calls; ")
    monkeypatch.setattr(report_mod, "ACROSS_ROWS", 4 * 40)     # 40 rows a rank: its last 20 steps
    monkeypatch.setattr(report_mod, "MIN_ROWS_PER_RANK", 1)
    cut = calls()
    assert cut["late"][0].startswith("rank 2 arrived last at 19 of 19 collective calls in the run's latest part")
    # the cut falls at step 30's start on ranks 0-2; rank 3 began it 40 ms before: steps 31-49
    assert cut["calls"] == 19 and not cut["unmatched"]
    assert any("collective calls are of the steps every rank kept" in n for n in cut["notes"])
    names = pc.is_in(table["name"], pa.array([f"ProfilerStep#{k}" for k in range(31, 50)]))
    first = {r: T0 + 31 * 100 * MS - (40 * MS if r == 3 else 0) for r in range(4)}
    firsts = pa.array([first[r] for r in table["rank"].to_pylist()])
    tail = table.filter(pc.or_(names, pc.and_(pc.equal(table["category"], "collective"),
                                              pc.greater_equal(table["start"].cast(pa.int64()), firsts))))
    want = analyze_calls({r: tail.filter(pc.equal(tail["rank"], r)) for r in range(4)},
                         {r: "h" for r in range(4)}).to_json(top=1, calls=False)
    assert cut["by_rank"] == want["by_rank"]
    assert cut["summary"] == [{k: v for k, v in x.items() if k != "worst"} for x in want["summary"]]


def test_a_long_runs_collective_calls_without_steps_are_all_kept(monkeypatch: pytest.MonkeyPatch):
    """Calls of ranks without steps are matched by their order over the run: a cut in time
    could shift one rank's order by a call, so past ACROSS_ROWS every call is still matched,
    as in the whole run, and the note says the calls were read whole."""
    import counterprof.analysis.report as report_mod
    rows = [(r, T0 + k * 100 * MS - (40 * MS if r == 3 else 0)) for k in range(50) for r in range(4)]
    table = pa.Table.from_batches([spans_batch([t + 50 * MS for _, t in rows], [t + 100 * MS for _, t in rows],
                                               ["gloo:all_reduce"] * len(rows), ["collective"] * len(rows),
                                               collective=["all_reduce"] * len(rows))]).append_column(
        "rank", pa.array([r for r, _ in rows], pa.int64()))
    meta = {"start_ns": T0 - 100 * MS, "end_ns": T0 + 5_000 * MS, "status": "complete"}

    def report() -> dict:
        inputs = inputs_from_samples(SAMPLES_SCHEMA.empty_table(), table, {}, meta, ranks=4)
        inputs.hosts = {r: "h" for r in range(4)}
        return build_report(inputs).to_json()
    whole = report()["collective_calls"]
    monkeypatch.setattr(report_mod, "ACROSS_ROWS", 4 * 20)
    monkeypatch.setattr(report_mod, "MIN_ROWS_PER_RANK", 1)
    cut = report()
    assert cut["collective_calls"] == whole and whole["calls"] == 50
    assert "the collective calls and `counterprof collectives` read them all" in cut["rank_analysis"]["notes"][-1]


@pytest.mark.parametrize("shape", ["names differ by rank", "a rank without steps", "names recur"])
def test_a_long_runs_collective_calls_cut_only_where_the_steps_say_where(shape, monkeypatch: pytest.MonkeyPatch):
    """The calls are cut only over steps every rank (>= 0, with spans) names alike; else every
    call is matched, as in the whole run. A step name that recurs (a restarted profiler) does
    not reach back before the cut: the calls kept are the latest part's, not the run's."""
    import counterprof.analysis.report as report_mod
    rows = []
    for k in range(50):
        for r in range(4):
            t0 = T0 + k * 100 * MS - (40 * MS if r == 3 else 0)
            step = {"names differ by rank": f"{'Step' if r == 3 else 'ProfilerStep'}#{k}",
                    "names recur": f"ProfilerStep#{k % 10}"}.get(shape, f"ProfilerStep#{k}")
            rows.append((r, "step", step, t0, t0 + 100 * MS, None))
            rows.append((r, "collective", "gloo:all_reduce", t0 + 50 * MS, t0 + 100 * MS, "all_reduce"))
    if shape == "a rank without steps":
        rows += [(4, "cpu_op", "aten::mm", T0 + k * 100 * MS, T0 + k * 100 * MS + MS, None) for k in range(50)]
    table = pa.Table.from_batches([spans_batch([x[3] for x in rows], [x[4] for x in rows], [x[2] for x in rows],
                                               [x[1] for x in rows], collective=[x[5] for x in rows])]).append_column(
        "rank", pa.array([x[0] for x in rows], pa.int64()))
    meta = {"start_ns": T0 - 100 * MS, "end_ns": T0 + 5_000 * MS, "status": "complete"}
    n = 5 if shape == "a rank without steps" else 4

    def report() -> dict:
        inputs = inputs_from_samples(SAMPLES_SCHEMA.empty_table(), table, {}, meta, ranks=n)
        inputs.hosts = {r: "h" for r in range(n)}
        return build_report(inputs).to_json()
    whole = report()["collective_calls"]
    monkeypatch.setattr(report_mod, "ACROSS_ROWS", n * 40)
    monkeypatch.setattr(report_mod, "MIN_ROWS_PER_RANK", 1)
    cut = report()
    assert any("latest part" in x for x in cut["rank_analysis"]["notes"])
    if shape == "names recur":
        assert sum(b["calls"] for b in cut["collective_calls"]["by_rank"]) <= 4 * 20   # steps 30-49 at most
        assert sum(b["calls"] for b in whole["by_rank"]) == 4 * 50
    else:
        assert cut["collective_calls"] == whole
        assert "the collective calls and `counterprof collectives` read them all" in cut["rank_analysis"]["notes"][-1]
