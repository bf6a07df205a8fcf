"""The torch collector with real torch on the CPU: in-process, and in launched workloads
(`counterprof run --torch`), including a 2-process torch.distributed gloo job."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import counterprof
from helpers import PYTHON, free_port, run_cli, traces_dir
from kineto_traces import X, profiler_after_first_trace, write_trace


pytest.importorskip("torch")
pytestmark = pytest.mark.slow

TORCHRUN = str(Path(PYTHON).parent / "torchrun")


def script(tmp_path: Path, body: str, name: str = "work.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def run_python(path: Path, *args, env=None, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([PYTHON, str(path), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return proc


def by_category(t: pa.Table, category: str) -> pa.Table:
    return t.filter(pc.equal(t["category"].cast(pa.string()), category))


MODEL = """
    import torch, counterprof
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    def train_step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
"""


def test_in_process_windows_of_optimizer_steps(tmp_path):
    run = tmp_path / "run"
    run_python(script(tmp_path, MODEL + f"""
    with counterprof.profile(path={str(run)!r}, collectors=["host", "torch"],
                             config={{"torch": {{"every": 4, "active": 2}}}}):
        for i in range(10):
            train_step()
    """))
    r = counterprof.load(run)
    assert r.meta["collectors"]["torch"]["status"] == "ok"
    assert r.meta["collectors"]["torch"]["traces"] == 3           # steps 0-1, 4-5, 8-9
    spans = r.table("spans")
    assert by_category(spans, "window").num_rows == 3
    # every step is timed, traced or not: one span per optimizer step, none twice
    steps = by_category(spans, "step")
    assert sorted(steps["name"].to_pylist()) == sorted(f"ProfilerStep#{i}" for i in range(10))
    ops = set(by_category(spans, "cpu_op")["name"].to_pylist())
    assert {"aten::addmm", "aten::relu"} <= ops
    # every span is inside the session's time
    start = pc.min(pc.cast(spans["start"], pa.int64())).as_py()
    assert r.meta["start_ns"] <= start <= r.meta["end_ns"]
    assert len(list(traces_dir(run).glob("*.pt.trace.json"))) == 3


def test_counterprof_step_marks_take_precedence_over_optimizer_steps(tmp_path):
    run = tmp_path / "run"
    run_python(script(tmp_path, MODEL + f"""
    with counterprof.profile(path={str(run)!r}, collectors=["torch"],
                             config={{"torch": {{"every": 4, "active": 2}}}}):
        for i in range(10):
            train_step()
            counterprof.step()       # one step, not two
    """))
    spans = counterprof.load(run).table("spans")
    assert by_category(spans, "window").num_rows == 3


def test_without_step_marks_the_block_is_one_window(tmp_path):
    run = tmp_path / "run"
    run_python(script(tmp_path, f"""
    import torch, counterprof
    with counterprof.profile(path={str(run)!r}, collectors=["torch"]):
        a = torch.randn(128, 128)
        for _ in range(5):
            a = a @ a.T / 128
    """))
    spans = counterprof.load(run).table("spans")
    assert by_category(spans, "window").num_rows == 1
    assert "aten::matmul" in set(spans["name"].to_pylist())


def test_the_scripts_own_profiler_is_left_in_charge_and_its_traces_copied(tmp_path):
    run, theirs = tmp_path / "run", tmp_path / "theirs"
    theirs.mkdir()
    run_python(script(tmp_path, MODEL + f"""
    import torch.profiler as tp
    def handler(prof):
        prof.export_chrome_trace({str(theirs)!r} + f"/{{prof.step_num}}.json")
    with counterprof.profile(path={str(run)!r}, collectors=["torch"]):
        with tp.profile(activities=[tp.ProfilerActivity.CPU],
                        schedule=tp.schedule(wait=1, warmup=1, active=2, repeat=1), on_trace_ready=handler) as prof:
            for i in range(6):
                train_step()
                prof.step()
    """), env={})
    assert len(list(theirs.glob("*.json"))) == 1          # their handler still ran
    spans = counterprof.load(run).table("spans")
    windows = by_category(spans, "window")
    assert windows.num_rows == 1                         # their window, copied; ours discarded
    assert by_category(spans, "step").num_rows == 6      # every step timed, traced or not


def test_two_process_gloo_job_under_run_torch(tmp_path):
    train = script(tmp_path, """
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grad = torch.ones(4_000_000)                 # a 16 MB all_reduce per step
    for step in range(8):
        loss = model(torch.randn(64, 256)).sum()
        opt.zero_grad(); loss.backward()
        dist.all_reduce(grad)
        opt.step()
    dist.destroy_process_group()
    """, "train.py")
    run = tmp_path / "run"
    proc = run_cli("run", "--torch", "--torch-window", "3/4", "-q", "-o", str(run), "--",
                   TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()), str(train),
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = counterprof.load(run)
    assert r.ranks() == [0, 1]
    for rank in (0, 1):
        spans = r.table("spans", rank=rank)
        assert by_category(spans, "window").num_rows == 2
        coll = by_category(spans, "collective")
        assert coll.num_rows >= 3
        assert set(coll["collective"].to_pylist()) == {"all_reduce"}
        assert set(coll["bytes"].to_pylist()) == {16_000_000}
        assert set(coll["group_size"].to_pylist()) == {2}
        attrs = [json.loads(a) for a in by_category(spans, "window")["attrs"].to_pylist()]
        assert {a["distributed"]["rank"] for a in attrs} == {rank}
        # every step of the rank, traced or not, in its own partition, from its own process
        steps = by_category(spans, "step")
        assert sorted(steps["name"].to_pylist()) == sorted(f"ProfilerStep#{i}" for i in range(8))
        assert set(steps["pid"].to_pylist()) == set(by_category(spans, "window")["pid"].to_pylist())
        assert {a["distributed"]["backend"] for a in attrs} == {"gloo"}
    # the torchrun launcher imported torch too, but recorded nothing: two processes traced
    traces = [p for rank in (0, 1) for p in traces_dir(run, rank).glob("*.pt.trace.json")]
    assert len({p.name.split(".")[0] for p in traces}) == 2 and len(traces) == 4
    assert r.meta["collectors"]["torch"]["traces"] == 4
    proc = run_cli("breakdown", str(run))
    assert proc.returncode == 0 and "No GPU activity" in proc.stdout


def test_bootstrap_keeps_an_existing_sitecustomize_and_skips_processes_without_torch(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITECUSTOMIZE'] = 'ran'\n")
    probe = script(tmp_path, """
    import os, sys
    print(os.environ.get("THEIR_SITECUSTOMIZE"), "torch" in sys.modules)
    """)
    proc = run_cli("run", "--torch", "-q", "-o", str(tmp_path / "run"), "--", PYTHON, str(probe),
                   env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ran", "False"]
    assert "no trace was recorded" in proc.stderr


def test_a_killed_workload_keeps_the_windows_already_written(tmp_path):
    work = script(tmp_path, MODEL + """
    import os, signal
    for i in range(7):
        train_step()
    os.kill(os.getpid(), signal.SIGKILL)          # in the middle of the third window
    """)
    run = tmp_path / "run"
    proc = run_cli("run", "--torch", "--torch-window", "2/3", "-q", "-o", str(run), "--",
                   PYTHON, str(work))
    assert proc.returncode == 128 + 9
    spans = counterprof.load(run).table("spans")
    assert by_category(spans, "window").num_rows == 2


def test_recover_converts_traces_a_killed_profiler_left(tmp_path):
    """The profiler dies after converting trace A, in the middle of converting trace B, and
    before it saw trace C: recover converts B and C, each exactly once."""
    run = tmp_path / "run"
    def trace(name, pid, t0):
        evs = [X("cpu_op", f"op{i}", t0 + i, 1, pid=pid) for i in range(3000)]
        # recorded now: on the run's clock
        return write_trace(tmp_path / name, evs, {"baseTimeNanoseconds": time.time_ns()})
    a, b, c = trace("a.pt.trace.json", 11, 0), trace("b.pt.trace.json", 22, 10_000), \
        trace("c.pt.trace.json", 33, 20_000)
    code = profiler_after_first_trace(run, a) + textwrap.dedent(f"""
    from counterprof.collectors.torch_trace.convert import TraceConversion
    shutil.copy({str(b)!r}, traces)
    shutil.copy({str(c)!r}, traces)
    for i, batch in enumerate(TraceConversion(traces / "b.pt.trace.json", batch_rows=1000)):
        s.emit("spans", batch, rank=0)                # killed in the middle of trace b
        if i == 1:
            break
    os._exit(9)                                       # killed: no compaction, no final meta
    """)
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    proc = run_cli("recover", str(run), "--force", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "converted b.pt.trace.json: 3,000 spans into rank 0 (replacing 2,000 rows" in proc.stderr
    assert "converted c.pt.trace.json: 3,000 spans" in proc.stderr
    spans = counterprof.load(run).table("spans")
    for pid in (11, 22, 33):
        assert spans.filter(pc.equal(spans["pid"], pid)).num_rows == 3001     # + its window span
    assert run_cli("recover", str(run), "--force", "-q").stderr.count("converted") == 0   # idempotent
