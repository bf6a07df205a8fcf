"""Short and unmarked jobs under `counterprof run --torch`, with real torch on the CPU: a loop of
raw ops that never marks a step (no counterprof.step(), optimizer or nn.Module) gets its first
time window about a second after torch's import, so a 5-second benchmark has a trace, a roofline
and a compute/memory split; a job that ends while a window records still writes it; a window
that catches no op is dropped and tried again; a gloo collective benchmark's ranks are traced; a
training job's set-up leaves no time window once its steps are marked; a time schedule given is
followed exactly.

Nothing here times the workload: what --torch costs it is measured in paired rounds by
benchmarks/torch_cost.py."""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import counterprof
from helpers import PYTHON, free_port, run_cli, traces_dir

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """An environment whose XDG_CACHE_HOME holds this machine's ceilings (the roofline's roofs;
    without them the busy time stays `compute|memory`), as `counterprof calibrate --quick`
    measures them (--force: the machine may be shared), every roof raised 4-fold, the ridge
    where it was: what is tested is which side of the ridge the ops fall on, and an op running
    on a quieter machine than calibrate did would pass a roof measured under load (the report
    then rightly leaves the split out)."""
    home = tmp_path_factory.mktemp("xdg")
    e = {**os.environ, "XDG_CACHE_HOME": str(home)}
    proc = run_cli("calibrate", "--quick", "--no-collectives", "--force", "--json", timeout=300, env=e)
    assert proc.returncode == 0, proc.stderr
    (saved,) = (home / "counterprof" / "ceilings").glob("*-cpu.json")
    doc = json.loads(saved.read_text())
    doc["peaks"] = {k: 4 * v for k, v in doc["peaks"].items()}
    doc["bandwidth_bytes_per_s"] *= 4
    saved.write_text(json.dumps(doc))
    return e


def script(tmp_path: Path, body: str, name: str = "work.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def run_torch(tmp_path: Path, work: Path, *args: str, env=None, run_name: str = "run"):
    run = tmp_path / run_name
    proc = run_cli("run", "--torch", "-q", "-o", str(run), *args, "--", PYTHON, str(work),
                   timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return run, proc


def report(run: Path, env) -> dict:
    proc = run_cli("report", str(run), "--json", timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def by_category(t: pa.Table, category: str) -> pa.Table:
    return t.filter(pc.equal(t["category"].cast(pa.string()), category))


def windows(run: Path, rank: int = 0) -> list[tuple[int, int, str]]:
    w = by_category(counterprof.load(run).table("spans", rank=rank), "window")
    starts = pc.cast(w["start"], pa.int64()).to_pylist()
    ends = pc.cast(w["end"], pa.int64()).to_pylist()
    return sorted(zip(starts, ends, w["name"].to_pylist()))


def held_left(run: Path) -> list[str]:
    return [p.name for p in Path(run).rglob("*.tmp")]


def assert_time_windows_only(run: Path) -> dict:
    st = counterprof.load(run).meta["collectors"]["torch"]
    assert st["status"] == "ok" and st["traces"] >= 1 and st["step_marks"] == ["window"], st
    names = [p.name for p in traces_dir(run, 0).glob("*.pt.trace.json")]
    assert names and all(n.endswith(".time.pt.trace.json") for n in names), names
    assert not held_left(run)
    return st


def assert_split(overall: dict, side: str) -> None:
    """No PMU here: the busy time is split by the roofline, not left as compute|memory. The
    verdict is that side, or host where the main thread waited for a CPU (a machine shared
    with other jobs), or a tie of the two; never unknown for want of a trace."""
    other = {"compute": "memory", "memory": "compute"}[side]
    shares = set(overall["shares"])
    assert side in shares and not {other, "compute|memory"} & shares, overall
    assert overall["verdict"] in (side, "host") or \
        (overall["verdict"] == "unknown" and set(overall.get("undecided") or []) <= {side, "host"}), overall


MATMUL = """
import time, torch
a, b = torch.randn(512, 512), torch.randn(512, 512)
t0 = time.monotonic()
while time.monotonic() - t0 < 4.5:        # a user's 5-second benchmark: no step, no module
    c = a @ b
"""

ELEMENTWISE = """
import time, torch
n = 16 * 1024 * 1024                      # 64 MB of fp32 per tensor
a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
t0 = time.monotonic()
while time.monotonic() - t0 < 4.5:
    torch.add(a, b, out=c)
"""


def test_a_five_second_matmul_loop_gets_a_roofline_and_a_compute_split(tmp_path, env):
    run, proc = run_torch(tmp_path, script(tmp_path, MATMUL), env=env)
    assert "no trace was recorded" not in proc.stderr
    assert_time_windows_only(run)
    r = report(run, env)
    roof = r["roofline"]
    assert roof is not None and roof["ceilings"] is not None, roof
    top = roof["top_ops"][0]
    assert top["name"] == "aten::mm" and top["input_dims"] == [[512, 512], [512, 512]], top
    assert top["bound"] == "compute", top
    assert_split(r["overall"], "compute")


def test_a_five_second_elementwise_loop_is_memory_bound(tmp_path, env):
    run, _ = run_torch(tmp_path, script(tmp_path, ELEMENTWISE), env=env)
    assert_time_windows_only(run)
    r = report(run, env)
    top = r["roofline"]["top_ops"][0]
    assert top["name"] == "aten::add" and top["bound"] == "memory", top
    assert_split(r["overall"], "memory")


def test_a_job_ending_1_5_s_after_its_first_op_has_its_trace(tmp_path):
    """Two seconds of pure Python after torch's import (more imports, reading data): the
    windows tried meanwhile catch no op and are dropped; the one that catches the first ops
    comes within about a second, and the window still recording at exit is written then."""
    work = script(tmp_path, """
    import time, torch
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.0:
        sum(range(1000))                   # Python, no torch op
    first = time.time_ns()
    x = torch.randn(256, 256)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.5:
        x = torch.tanh(x @ x)
    print(first, time.time_ns())
    """)
    run, proc = run_torch(tmp_path, work, "--collectors", "host,torch")
    first, last = map(int, proc.stdout.split())
    st = assert_time_windows_only(run)
    w = windows(run)
    # no window of the two seconds before the first op was kept: every one holds ops after it
    assert all(end > first for _, end, _ in w), (first, w)
    assert w[0][0] - first < 1.5e9, (first, w)            # within about a second of it
    # the account adds up: every window started was kept or dropped as empty, none lost
    acct = st["time_windows"]
    assert acct["started"] == acct["kept"] + acct["empty"] and acct["kept"] == len(w), (acct, w)
    assert acct["empty"] >= 1, acct                        # the two seconds of Python caught none
    # one still recording when the job ended is written then (the pace after a window is its
    # cost over 5% of the time: on a loaded machine the next one may fall after the end)
    if acct["recording_at_exit"]:
        assert max(end for _, end, _ in w) >= last - 50_000_000, (last, w, acct)
    ops = set(by_category(counterprof.load(run).table("spans"), "cpu_op")["name"].to_pylist())
    assert {"aten::mm", "aten::tanh"} <= ops


def test_a_gloo_all_reduce_benchmark_is_traced_on_each_rank(tmp_path, env):
    """Raw tensors, no module, ranks from torch.multiprocessing.spawn (children of the
    launching process, which tell their rank after init_process_group)."""
    work = script(tmp_path, """
    import sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
    def bench(rank, port):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        x, go = torch.randn(1 << 20), torch.ones(1)
        t0 = time.monotonic()
        while True:
            go.fill_(1.0 if time.monotonic() - t0 < 3.0 else 0.0)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)      # every rank stops at the same one
            if go.item() == 0:
                break
            dist.all_reduce(x)
        dist.destroy_process_group()
    if __name__ == "__main__":
        mp.spawn(bench, args=(int(sys.argv[1]),), nprocs=2)
    """)
    run = tmp_path / "run"
    proc = run_cli("run", "--torch", "-q", "-o", str(run), "--", PYTHON, str(work), str(free_port()),
                   timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    r = counterprof.load(run)
    assert r.ranks() == [0, 1]
    for rank in (0, 1):
        names = [p.name for p in traces_dir(run, rank).glob("*.pt.trace.json")]
        assert names and all(n.endswith(".time.pt.trace.json") for n in names), (rank, names)
        coll = by_category(r.table("spans", rank=rank), "collective")
        assert coll.num_rows >= 3 and "all_reduce" in set(coll["collective"].to_pylist())
    assert not held_left(run)
    rep = report(run, env)
    assert rep["overall"]["shares"].get("collectives", 0) > 0, rep["overall"]


def test_a_training_jobs_set_up_leaves_no_time_window(tmp_path):
    """2.5 s of set-up ops before the first optimizer step: the time windows recorded meanwhile
    are held back, and dropped once the steps are marked. The rule is held on the job's clock: a
    time window is kept only if the first step came HOLD_S (3 s) or more after it ended (on a
    loaded machine the first step, its lazy imports included, can come that late; that window is
    then rightly the job's)."""
    work = script(tmp_path, """
    import time, torch
    x = torch.randn(256, 256)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.5:     # building, loading, warming up: ops, no step yet
        x = torch.tanh(x @ x)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(12):
        opt.zero_grad(); model(torch.randn(32, 64)).square().mean().backward(); opt.step()
        if i == 0:
            print(time.time_ns())          # the first step has been marked by now
    """)
    run, proc = run_torch(tmp_path, work, "--collectors", "host,torch", "--torch-window", "3/6")
    first_step = int(proc.stdout.split()[0])
    st = counterprof.load(run).meta["collectors"]["torch"]
    assert st["status"] == "ok", st
    acct = st["time_windows"]
    assert acct["started"] >= 1, acct                  # the set-up was recorded: there was one to drop
    names = [p.name for p in traces_dir(run, 0).glob("*.pt.trace.json")]
    assert len([n for n in names if ".time." not in n]) == 2, names    # the two step windows
    kept = windows(run)
    kept = [(s, e) for s, e, _ in kept if e < first_step]             # time windows of the set-up
    assert acct["kept"] == len(kept) == len([n for n in names if ".time." in n]), (acct, kept, names)
    for _, end in kept:                                # kept only when no step came within HOLD_S
        assert first_step - end >= 3e9, (first_step, kept, acct)
    assert st["step_marks"] == (["optimizer", "window"] if kept else ["optimizer"]), st
    assert not held_left(run)


def test_a_time_schedule_given_is_followed_exactly(tmp_path):
    """--torch-time-window 0.5/30: the first window after 30 s, so a 3-second loop has none,
    and the reason says so."""
    work = script(tmp_path, """
    import time, torch
    a = torch.randn(256, 256)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:
        a = torch.tanh(a @ a)
    """)
    run, proc = run_torch(tmp_path, work, "--collectors", "host,torch", "--torch-time-window", "0.5/30")
    st = counterprof.load(run).meta["collectors"]["torch"]
    assert st["status"] == "empty" and "a time window starts after 30 s" in st["reason"], st
    assert "no trace was recorded" in proc.stderr


def test_the_inventory_names_the_adaptive_time_windows():
    from counterprof.collectors.torch_trace import TorchCollector
    rows = dict(TorchCollector.inventory()[0]["rows"])
    assert rows["time window"].startswith("the first ~1 s after torch's import"), rows
    rows = dict(TorchCollector.inventory({"window_s": 1.0, "window_every_s": 10.0})[0]["rows"])
    assert rows["time window"].startswith("1 s every 10 s"), rows
