"""Torch traces of a multi-rank job where every rank runs counterprof.profile() into one run:
each rank's in-process collector converts its own traces, every trace is converted once, and
a trace is converted by one process at a time (its claim), never twice and never lost."""
from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import counterprof
from helpers import PYTHON, ClaimHeldElsewhere, free_port, run_cli, table_files, traces_dir
from kineto_traces import X, profiler_after_first_trace, write_trace


pytest.importorskip("torch")
pytestmark = pytest.mark.slow

TORCHRUN = str(Path(PYTHON).parent / "torchrun")


def by_category(t: pa.Table, category: str) -> pa.Table:
    return t.filter(pc.equal(t["category"].cast(pa.string()), category))


# gloo_allreduce.py's loop, each rank profiling itself into the same run directory
RANK_SCRIPT = """
import sys, torch, torch.distributed as dist, counterprof
dist.init_process_group("gloo")
torch.set_num_threads(1)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
bucket = torch.ones(1024 * 1024)
x = torch.randn(32, 64)
with counterprof.profile(path=sys.argv[1], collectors=["host", "torch"],
                         config={"torch": {"every": 4, "active": 3}}):
    for _ in range(8):
        opt.zero_grad()
        model(x).square().mean().backward()
        dist.all_reduce(bucket)
        opt.step()
    dist.barrier()
dist.destroy_process_group()
"""


def test_each_rank_converts_its_own_traces_once(tmp_path):
    train = tmp_path / "ranks.py"
    train.write_text(RANK_SCRIPT)
    run = tmp_path / "run"
    proc = subprocess.run([TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()),
                           str(train), str(run)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = counterprof.load(run)
    assert r.ranks() == [0, 1]
    for rank in (0, 1):
        rank_meta = r.rank_meta(rank)
        assert rank_meta["status"] == "complete" and rank_meta["rank"] == rank
        own_pid = rank_meta["profiler"]["pid"]
        # the partition holds the spans its own profiler converted, none of the other rank's
        writers = {f.name.split("-")[1] for f in table_files(run, "spans", rank)}
        assert writers == {str(own_pid)}, writers
        traces = sorted(p.name for p in traces_dir(run, rank).glob("*.pt.trace.json"))
        assert len(traces) >= 2
        assert rank_meta["collectors"]["torch"]["traces"] == len(traces)
        spans = r.table("spans", rank=rank)
        windows = Counter(by_category(spans, "window")["name"].to_pylist())
        assert windows == Counter(traces)                       # each trace once
        steps = by_category(spans, "step")
        assert steps.num_rows == len(set(steps["name"].to_pylist()))   # no step twice
        assert steps.num_rows <= 8
    report = run_cli("report", str(run), "--json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    step_region = next(g for g in data["regions"] if g["name"] == "ProfilerStep")
    per_rank = [by_category(r.table("spans", rank=k), "step").num_rows for k in (0, 1)]
    assert step_region["count"] == sum(per_rank)
    for f in data["rank_analysis"]["ranks"]:           # collectives happen inside the steps
        assert f["collective_s_per_step"] <= f["step_mean_s"] * 1.05, f
    # the summary says whose peak a process-tree gauge is
    rss = next(x for x in data["summary"]["rows"] if x["metric"] == "proc.rss")
    assert rss["aggregate"] == "peak of one rank"
    text = run_cli("report", str(run)).stdout
    assert "proc.rss (peak of one rank)" in text and "proc.rss (peak)" not in text


def _trace(tmp_path: Path, name: str, pid: int, t0: int) -> Path:
    evs = [X("cpu_op", f"op{i}", t0 + i, 1, pid=pid) for i in range(3000)]
    # recorded now: on the run's clock
    return write_trace(tmp_path / name, evs, {"baseTimeNanoseconds": time.time_ns()})


def test_a_trace_is_converted_by_one_process_once(tmp_path):
    """A live profiler converted trace a (its spans are in its journal) and has not yet seen
    trace b when `counterprof recover --force` runs: recover converts b only; the profiler's
    next sweep leaves b alone."""
    run = tmp_path / "run"
    a, b = _trace(tmp_path, "a.pt.trace.json", 11, 0), _trace(tmp_path, "b.pt.trace.json", 22, 10_000)
    code = profiler_after_first_trace(run, a) + textwrap.dedent(f"""
    shutil.copy({str(b)!r}, traces)
    print("ready", flush=True)
    sys.stdin.readline()
    print("swept", col.sweep(), col.traces, flush=True)
    s.stop()
    """)
    proc = subprocess.Popen([PYTHON, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        rec = run_cli("recover", str(run), "--force", "-q")
        assert rec.returncode == 0, rec.stderr
        assert "converted b.pt.trace.json: 3,000 spans" in rec.stderr
        assert "a.pt.trace.json" not in rec.stderr             # converted by the live profiler
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.split() == ["swept", "0", "1"]                  # b: converted by recover already
    spans = counterprof.load(run).table("spans")
    for pid in (11, 22):
        assert spans.filter(pc.equal(spans["pid"], pid)).num_rows == 3001     # + its window span
    assert run_cli("recover", str(run), "-q").stderr.count("torch: converted") == 0


def test_a_trace_held_by_a_converter_is_left_to_it_and_recovered_once_it_died(tmp_path):
    run = tmp_path / "run"
    with counterprof.profile(path=run, collectors=["host"]):
        pass
    traces = traces_dir(run)
    traces.mkdir(parents=True)
    trace = Path(shutil.copy(_trace(tmp_path, "c.pt.trace.json", 33, 0), traces))
    with ClaimHeldElsewhere(trace) as holder:
        rec = run_cli("recover", str(run), "-q")
        assert rec.returncode == 0, rec.stderr
        assert "c.pt.trace.json (rank 0): being converted by another process; left to it" in rec.stderr
        assert by_category(counterprof.load(run).table("spans"), "window").num_rows == 0
        holder.die()        # killed while converting: nothing marked
    rec = run_cli("recover", str(run), "-q")
    assert "converted c.pt.trace.json: 3,000 spans" in rec.stderr, rec.stderr
    spans = counterprof.load(run).table("spans")
    assert spans.filter(pc.equal(spans["pid"], 33)).num_rows == 3001
    assert run_cli("recover", str(run), "-q").stderr.count("torch: converted") == 0
