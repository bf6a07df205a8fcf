"""`counterprof export` on real runs: a `counterprof run` (perf + host samples), every real GPU
trace in ../shared/traces imported, a 2-rank gloo job under --torch, a killed profiler's run,
and the memory of exporting a large synthetic run (slow)."""
from __future__ import annotations

import json
import subprocess

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import counterprof
from helpers import COUNTERPROF, EXAMPLES, PYTHON, REPO, run_cli, rank_files
from kineto_traces import needs_shared_traces, shared, shared_traces
from perfetto_check import check, ns


def export(run_dir, out, *args):
    proc = run_cli("export", str(run_dir), "--perfetto", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def test_a_recorded_run_becomes_counter_tracks(tmp_path):
    run_dir = tmp_path / "r"
    proc = run_cli("run", "-q", "-I", "10", "-o", str(run_dir), "--", PYTHON, str(EXAMPLES / "busy.py"), "1")
    assert proc.returncode == 0, proc.stderr
    run = counterprof.load(run_dir)
    samples = run.samples()
    catalog = run.catalog
    out = tmp_path / "t.json.gz"
    export(run_dir, out)
    t = check(out)
    assert list(t.processes.values()) == ["rank 0"]
    pid = t.process("rank 0")
    # one counter track per (source, metric, entity), with its unit
    series = {(s, m, e) for s, m, e in zip(*(samples[c].cast(pa.string()).to_pylist()
                                            for c in ("source", "metric", "entity")))}
    names = t.counter_names(pid)
    assert len(names) == len(series)
    for s, m, e in series:
        unit = catalog[m]["unit"]
        unit = ("/s" if unit == "count" else f"{unit}/s") if catalog[m]["kind"] == "delta" else unit
        assert f"{s} {m} {e} [{unit}]" in names
    # every known value is there, at its time on the run's clock
    known = samples.filter(pc.is_valid(samples["value"]))
    assert sum(len(v) for v in t.counters.values()) == known.num_rows
    tc = known.filter(pc.equal(known["metric"].cast(pa.string()), "task-clock"))
    first = tc.select(["duration_ns", "value"]).slice(0, 1).to_pylist()[0]
    start_ns = run.meta["start_ns"]
    time_ns = tc["time"].cast(pa.int64())[0].as_py()
    want_ts = (time_ns - first["duration_ns"] - start_ns) / 1000
    ts, rate = t.counters[(pid, "perf task-clock process [ns/s]")][0]
    assert ns(ts) == round(want_ts * 1000)
    assert rate == pytest.approx(first["value"] * 1e9 / first["duration_ns"])
    assert 0 < rate <= 2.1e9            # at most the 2 CPUs of this machine, in ns per s


@needs_shared_traces
@pytest.mark.parametrize("path", shared_traces(), ids=lambda p: p.name)
def test_every_real_trace_exports_and_nests(tmp_path, path):
    run_dir = tmp_path / "run"
    assert run_cli("import", str(path), "-o", str(run_dir)).returncode == 0
    out = tmp_path / "t.json"
    export(run_dir, out)
    t = check(out)         # incl. every track nesting as Perfetto requires
    spans = counterprof.load(run_dir).table("spans")
    assert sum(len(v) for v in t.slices.values()) == spans.num_rows


@needs_shared_traces
def test_nccl_trace_kernels_on_their_streams_and_flows(tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli("import", str(shared("a100_nccl_rank0of2.json.gz")), "-o", str(run_dir)).returncode == 0
    out = tmp_path / "t.json.gz"
    proc = export(run_dir, out)
    t = check(out)
    spans = counterprof.load(run_dir).table("spans")
    gpu_pid = t.process("rank 0 · GPU 0")
    streams = {n: tid for tid, n in t.threads_of(gpu_pid).items()}
    assert set(streams) == {"stream 7", "stream 40"}
    for stream, tid in streams.items():
        on_stream = spans.filter(pc.equal(spans["stream"], int(stream.split()[1])))
        assert len(t.slices[(gpu_pid, tid)]) == on_stream.num_rows
        nccl = [e for e in t.slices[(gpu_pid, tid)] if e["name"].startswith("ncclKernel")]
        if stream == "stream 40":
            assert nccl and all(e["args"]["kernel_class"] == "communication" for e in nccl)
    # flows: every runtime call whose correlation a GPU span shares, computed here with a join
    host = spans.filter(pc.and_(pc.is_null(spans["device"]), pc.is_valid(spans["correlation"])))
    gpu = spans.filter(pc.and_(pc.is_valid(spans["device"]), pc.is_valid(spans["correlation"])))
    linked = host.select(["pid", "correlation"]).join(gpu.select(["pid", "correlation"]).group_by(
        ["pid", "correlation"]).aggregate([]), ["pid", "correlation"], join_type="inner")
    assert len(t.flows) == linked.num_rows == 3774
    assert f"{linked.num_rows:,} launch→GPU flows" in proc.stderr
    host_pid = t.process("rank 0")
    for events in list(t.flows.values())[:50]:
        (s,) = [e for e in events if e["ph"] == "s"]
        (f,) = [e for e in events if e["ph"] == "f"]
        assert s["pid"] == host_pid and f["pid"] == gpu_pid
        launch = [x for x in t.slices[(s["pid"], s["tid"])] if x["ts"] <= s["ts"] <= x["ts"] + x["dur"]]
        assert any(x["cat"] == "runtime" for x in launch)


def test_a_two_rank_gloo_run(tmp_path):
    run_dir = tmp_path / "r"
    proc = run_cli("run", "-q", "--torch", "-o", str(run_dir), "--", PYTHON,
                   str(EXAMPLES / "gloo_allreduce.py"), "10", timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "t.json.gz"
    export(run_dir, out)
    t = check(out)
    assert sorted(t.processes.values()) == ["rank 0", "rank 1"]
    spans = counterprof.load(run_dir).table("spans", with_rank=True)
    for rank in (0, 1):
        pid = t.process(f"rank {rank}")
        threads = t.threads_of(pid)
        by_name = {}
        for tid, name in threads.items():
            for e in t.slices[(pid, tid)]:
                by_name.setdefault(e["name"], set()).add(name)
        # collectives on gloo's own threads, not the main thread; steps on their track
        mine = spans.filter(pc.equal(spans["rank"], rank))
        colls = mine.filter(pc.equal(mine["name"], "gloo:all_reduce")).num_rows
        assert colls > 0
        assert sum(1 for tid in threads for e in t.slices[(pid, tid)] if e["name"] == "gloo:all_reduce") == colls
        assert all(n.startswith("thread ") for n in by_name["gloo:all_reduce"])
        assert by_name["ProfilerStep#1"] == {next(n for n in threads.values() if n.startswith("steps"))}
        assert sum(len(t.slices[(pid, tid)]) for tid in threads) == mine.num_rows
    # --torch finds the ranks the example launches (auto per-rank): each rank has its counters
    assert t.counter_names(t.process("rank 0")) and t.counter_names(t.process("rank 1"))


def test_a_killed_profilers_run_is_recovered_first(tmp_path):
    run_dir = tmp_path / "r"
    proc = subprocess.Popen([*COUNTERPROF, "run", "-q", "-o", str(run_dir), "--", PYTHON,
                             str(EXAMPLES / "busy.py"), "3"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    from helpers import end_processes, kill_profiler, wait_for_samples
    wait_for_samples(run_dir, rows=20)
    end_processes(kill_profiler(proc))
    out = tmp_path / "t.json"
    done = export(run_dir, out)
    assert "recovered" in done.stderr
    assert json.loads((run_dir / "meta.json").read_text())["status"] == "recovered"
    t = check(out)
    assert sum(len(v) for v in t.counters.values()) > 0


def _peak_rss_mb(*args: str) -> float:
    """Peak RSS of `counterprof ARGS` in a child of a fresh interpreter (so that only it counts)."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
            "capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([PYTHON, "-c", code, *COUNTERPROF, *args], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return int(out.stdout) / 1024


@pytest.mark.slow
def test_export_streams_memory_does_not_grow_with_the_run(tmp_path):
    big = tmp_path / "big"
    subprocess.run([PYTHON, str(REPO / "benchmarks" / "synthetic_run.py"), "-o", str(big),
                    "--ranks", "16", "--minutes", "1", "--hz", "100", "--metrics", "20"],
                   check=True, capture_output=True)
    one = _peak_rss_mb("export", str(big), "--perfetto", str(tmp_path / "one.json.gz"), "--ranks", "0")
    every = _peak_rss_mb("export", str(big), "--perfetto", str(tmp_path / "all.json.gz"))
    # 16x the rows (1.92 M samples, ~200 MB of JSON) in about the same memory
    assert every < one + 40, (one, every)
    assert every < 250
    t = check(tmp_path / "one.json.gz")
    assert sum(len(v) for v in t.counters.values()) == 60 * 100 * 20


def test_a_journal_segment_that_grows_between_the_passes(tmp_path, monkeypatch):
    """A live run's last segment gains rows between the export's plan and its write: only the
    planned rows are written (more crashed the export)."""
    from counterprof.cli import export as export_cli
    from counterprof.render import perfetto
    from counterprof.ground.schema import spans_batch
    from counterprof.store.journal import JournalWriter
    from perfetto_check import check
    run_dir = tmp_path / "r"
    with counterprof.profile(path=run_dir, collectors=["host"]):
        with counterprof.region("work"):
            pass
    start = counterprof.load(run_dir).meta["start_ns"]
    jw = JournalWriter(rank_files(run_dir, 0), "999999-live")     # a writer still appending

    def more(n, at):
        return spans_batch([start + at + i * 1000 for i in range(n)], [start + at + i * 1000 + 500 for i in range(n)],
                           ["live"] * n, ["region"] * n)

    jw.write("spans", more(5, 0))
    plan_finish = perfetto.SpanPlan.finish

    def finish_then_grow(self):
        out = plan_finish(self)
        jw.write("spans", more(7, 10_000_000))
        return out

    monkeypatch.setattr(perfetto.SpanPlan, "finish", finish_then_grow)
    out = tmp_path / "t.json"
    assert export_cli.main([str(run_dir), "--perfetto", str(out)]) == 0
    jw.close()
    t = check(out)
    assert sum(1 for v in t.slices.values() for e in v if e["name"] == "live") == 5
