"""`counterprof import` and `counterprof breakdown` as a user runs them."""
from __future__ import annotations

import gzip
import json
import subprocess

import pyarrow.compute as pc
import pytest

import counterprof
from helpers import PYTHON, run_cli
from kineto_traces import (X, launch, needs_shared_traces, shared, shared_traces, write_big_trace,
                           write_trace)


def gpu_trace(path, rank=None, base=1_700_000_000_000_000_000, t0=0):
    evs = [X("user_annotation", "ProfilerStep#1", t0, 100)]
    for i in range(5):
        evs += launch("sm80_gemm", t0 + 10 * i, 2, correlation=i + 1, kernel_ts=t0 + 10 * i + 3,
                      kernel_dur=5)
    meta = {"baseTimeNanoseconds": base}
    if rank is not None:
        meta["distributedInfo"] = {"rank": rank}
    return write_trace(path, evs, meta)


@needs_shared_traces
@pytest.mark.parametrize("path", shared_traces(), ids=lambda p: p.name)
def test_import_and_break_down_every_real_trace(tmp_path, path):
    run = tmp_path / "run"
    proc = run_cli("import", str(path), "-o", str(run))
    assert proc.returncode == 0, proc.stderr
    assert "imported 1 of 1" in proc.stderr
    r = counterprof.load(run)
    assert r.meta["source"] == "import" and r.meta["traces"][0]["spans"] > 0
    spans = r.table("spans")
    assert spans.num_rows == r.meta["traces"][0]["spans"] + 1        # + the window span
    proc = run_cli("breakdown", str(run), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if r.meta["traces"][0]["gpu_spans"]:
        t = out["ranks"][0]["temporal"]
        assert t["idle_pct"] + t["compute_pct"] + t["non_compute_pct"] == pytest.approx(100)
    else:
        assert out["ranks"] == [] and "no GPU activity" in list(out["skipped_ranks"].values())[0]
    proc = run_cli("breakdown", str(run))
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr


@needs_shared_traces
def test_breakdown_table_of_a_real_multi_rank_import(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("import", str(shared("sampled_rank0of128.json.gz")),
                   str(shared("sampled_rank1of128.json.gz")), "-o", str(run))
    assert proc.returncode == 0, proc.stderr
    assert counterprof.load(run).ranks() == [0, 1]
    proc = run_cli("breakdown", str(run))
    assert proc.returncode == 0, proc.stderr
    for text in ("rank 0", "rank 1", "all ranks", "compute + communication", "Top kernels",
                 "ncclKernel_SendRecv", "host wait"):
        assert text in proc.stdout
    out = json.loads(run_cli("breakdown", str(run), "--json", "--rules", "hta").stdout)
    assert out["total"]["temporal"]["kernel_time_ns"] == sum(
        r["temporal"]["kernel_time_ns"] for r in out["ranks"])


def test_import_a_directory_of_ranks_and_windows(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    gpu_trace(traces / "a.json", rank=0)
    gpu_trace(traces / "b.json", rank=1)
    gpu_trace(traces / "c.json.gz", rank=0, t0=10_000_000)     # rank 0's next window, later
    (traces / "c.json.gz").write_bytes(gzip.compress((traces / "c.json.gz").read_bytes()))
    (traces / "notes.txt").write_text("not a trace")
    run = tmp_path / "run"
    proc = run_cli("import", str(traces), "-o", str(run))
    assert proc.returncode == 0, proc.stderr
    r = counterprof.load(run)
    assert r.ranks() == [0, 1]
    out = json.loads(run_cli("breakdown", str(run), "--json").stdout)
    assert [x["windows"] for x in out["ranks"]] == [2, 1]


def test_two_traces_claiming_one_rank_at_once_are_refused(tmp_path):
    a = gpu_trace(tmp_path / "a.json", rank=0)
    b = gpu_trace(tmp_path / "b.json", rank=0)
    run = tmp_path / "run"
    proc = run_cli("import", str(a), str(b), "-o", str(run))
    assert proc.returncode == 1
    assert "claim the same rank" in proc.stderr and "a.json" in proc.stderr and "b.json" in proc.stderr
    assert "Traceback" not in proc.stderr and not run.exists()
    # a rank for files that carry none
    c = gpu_trace(tmp_path / "c.json")
    proc = run_cli("import", str(a), str(c), "--rank", "5", "-o", str(run))
    assert proc.returncode == 0, proc.stderr
    assert counterprof.load(run).ranks() == [0, 5]


def test_bad_input_gives_a_message_not_a_traceback(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    proc = run_cli("import", str(empty), "-o", str(tmp_path / "r1"))
    assert proc.returncode == 1 and "is empty" in proc.stderr and "Traceback" not in proc.stderr

    proc = run_cli("import", str(tmp_path / "missing.json"), "-o", str(tmp_path / "r2"))
    assert proc.returncode == 2 and "no such file" in proc.stderr

    notjson = tmp_path / "x.json"
    notjson.write_text("hello")
    proc = run_cli("import", str(notjson), "-o", str(tmp_path / "r3"))
    assert proc.returncode == 1 and "not a JSON trace" in proc.stderr

    # cut off: what came before the cut is imported, and the problem is said
    full = gpu_trace(tmp_path / "full.json", rank=0)
    data = full.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: int(len(data) * 0.7)])
    proc = run_cli("import", str(cut), "-o", str(tmp_path / "r4"))
    assert proc.returncode == 0 and "cut off" in proc.stderr, proc.stderr
    r = counterprof.load(tmp_path / "r4")
    assert 0 < r.table("spans").num_rows < 12
    assert any("cut off" in w for w in r.meta["warnings"])

    # no GPU events: imported; the breakdown says there is nothing on the GPU
    cpu = write_trace(tmp_path / "cpu.json", [X("cpu_op", "aten::add", 1, 2)])
    run_cli("import", str(cpu), "-o", str(tmp_path / "r5"), check=True)
    proc = run_cli("breakdown", str(tmp_path / "r5"))
    assert proc.returncode == 0 and "No GPU activity" in proc.stdout

    # an existing run is kept unless --force
    proc = run_cli("import", str(full), "-o", str(tmp_path / "r5"))
    assert proc.returncode == 1 and "already holds a run" in proc.stderr
    run_cli("import", str(full), "-o", str(tmp_path / "r5"), "--force", check=True)

    # breakdown of a run without traces
    proc = run_cli("breakdown", str(tmp_path))
    assert proc.returncode == 1 and "not a counterprof run" in proc.stderr


def test_one_bad_file_among_good_ones(tmp_path):
    good = gpu_trace(tmp_path / "good.json", rank=0)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x00garbage")
    proc = run_cli("import", str(good), str(bad), "-o", str(tmp_path / "run"))
    assert proc.returncode == 1 and "bad.json: not imported" in proc.stderr
    assert counterprof.load(tmp_path / "run").table("spans").num_rows > 0


def _peak_rss_mb(trace, run) -> float:
    code = ("import resource, sys; from counterprof.cli import main; "
            f"rc = main(['import', {str(trace)!r}, '-o', {str(run)!r}, '-q']); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024); sys.exit(rc)")
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return float(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_memory_does_not_grow_with_the_trace(tmp_path):
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    write_big_trace(small, 20 << 20)
    n = write_big_trace(big, 300 << 20)
    rss_small = _peak_rss_mb(small, tmp_path / "r1")
    rss_big = _peak_rss_mb(big, tmp_path / "r2")
    assert rss_big - rss_small < 60, (rss_small, rss_big)     # 15x the data, not 15x the memory
    spans = counterprof.load(tmp_path / "r2").table("spans")
    assert spans.num_rows == n + 1
    kernels = spans.filter(pc.equal(spans["category"].cast("string"), "kernel"))
    assert kernels["kernel_class"].null_count == 0
