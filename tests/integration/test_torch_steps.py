"""Every step timed, traced or not, under `counterprof run --torch` with real torch: steps
marked by optimizer.step() or by outermost module forwards, DataLoader waits as `input` spans,
time windows when nothing marks steps, a status that says why nothing was traced, and the steps
a killed profiler had not read, recovered."""
from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import counterprof
from helpers import COUNTERPROF, PYTHON, journal_dir, run_cli

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def script(tmp_path: Path, body: str, name: str = "work.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def run_torch(tmp_path: Path, work: Path, *args: str,
              run_name: str = "run") -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path / run_name
    proc = run_cli("run", "--torch", "--collectors", "host,torch", "-q", "-o", str(run), *args, "--",
                   PYTHON, str(work), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return run, proc


def by_category(t: pa.Table, category: str) -> pa.Table:
    return t.filter(pc.equal(t["category"].cast(pa.string()), category))


def steps_of(run: Path) -> pa.Table:
    steps = by_category(counterprof.load(run).table("spans"), "step")
    return steps.sort_by([("start", "ascending")])


def step_numbers(steps: pa.Table) -> list[int]:
    return [int(n.split("#")[1]) for n in steps["name"].to_pylist()]


# a resnet-style inference loop as users write it: eval(), no_grad(), no optimizer, a loss module
INFERENCE = """
import os, threading, torch
torch.manual_seed(0)
class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)
    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), Block(16), Block(16),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
model.eval()
criterion = torch.nn.CrossEntropyLoss()          # a module without parameters: not a step
x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
calls = 0
with torch.no_grad():
    for _ in range(24):
        loss = criterion(model(x), y)
        calls += 1
print(calls, os.getpid(), threading.get_native_id())
"""


def test_an_inference_loop_is_traced_with_each_forward_a_step(tmp_path):
    run, proc = run_torch(tmp_path, script(tmp_path, INFERENCE), "--torch-window", "3/10")
    calls, pid, tid = map(int, proc.stdout.split())
    r = counterprof.load(run)
    torch_status = r.meta["collectors"]["torch"]
    assert torch_status["status"] == "ok" and torch_status["traces"] >= 2, torch_status
    assert torch_status["step_marks"] == ["forward"]
    steps = steps_of(run)
    assert step_numbers(steps) == list(range(calls))             # one per model call, in order
    assert set(steps["pid"].to_pylist()) == {pid} and set(steps["tid"].to_pylist()) == {tid}
    spans = r.table("spans")
    assert "aten::conv2d" in set(by_category(spans, "cpu_op")["name"].to_pylist())
    report = run_cli("report", str(run))
    assert report.returncode == 0, report.stderr
    row = next(line for line in report.stdout.splitlines() if line.startswith("torch "))
    assert row.split()[1] == "ok", row


TRAINING = """
import os, threading, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
steps = 0
for _ in range(60):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    steps += 1
print(steps, os.getpid(), threading.get_native_id())
"""


def test_every_optimizer_step_is_a_step_span_traced_or_not(tmp_path):
    run, proc = run_torch(tmp_path, script(tmp_path, TRAINING), "--torch-window", "5/50")   # exactly
    taken, pid, tid = map(int, proc.stdout.split())
    steps = steps_of(run)
    assert step_numbers(steps) == list(range(taken))           # all 60, each once
    assert set(steps["pid"].to_pylist()) == {pid} and set(steps["tid"].to_pylist()) == {tid}
    start = pc.cast(steps["start"], pa.int64()).to_pylist()
    end = pc.cast(steps["end"], pa.int64()).to_pylist()
    assert start[1:] == end[:-1]                 # mark to mark: each step starts where the last ended
    spans = counterprof.load(run).table("spans")
    windows = by_category(spans, "window")
    assert windows.num_rows == 2                                 # steps 0-4 and 50-54 traced
    w0, w1 = (pc.cast(windows["start"], pa.int64()).to_pylist(),
              pc.cast(windows["end"], pa.int64()).to_pylist())
    inside = [s for s, e in zip(start, end) if any(a <= s and e <= b for a, b in zip(w0, w1))]
    assert 2 <= len(inside) < taken            # traced steps are among the 60, not added to them


SERVING = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
with torch.inference_mode():
    for _ in range(3000):                        # batch-1 requests: each forward a step of ~50 us
        model(torch.randn(1, 32)).argmax().item()
"""


def test_the_default_windows_are_paced_by_their_cost(tmp_path):
    """3000 steps of ~50 µs: an exact 5/50 schedule starts 60 windows, each costing more than
    the steps it records; the default paces them (what a window cost in profiler calls stays
    under 5% of the time to the next) and warms the first one up, so step 0, which pays for
    the profiler's start, is never recorded. Every step is timed either way."""
    work = script(tmp_path, SERVING)
    exact, _ = run_torch(tmp_path, work, "--torch-window", "5/50", run_name="exact")
    paced, _ = run_torch(tmp_path, work, run_name="paced")
    windows = {}
    for name, run in (("exact", exact), ("paced", paced)):
        spans = counterprof.load(run).table("spans")
        windows[name] = by_category(spans, "window")
        assert step_numbers(steps_of(run)) == list(range(3000)), name
    assert windows["exact"].num_rows >= 50
    assert 1 <= windows["paced"].num_rows <= 3, windows["paced"].num_rows


def test_a_serving_loop_runs_without_global_module_hooks_between_windows(tmp_path):
    """While any global forward hook is registered, every module call in the process takes
    nn.Module's slow path (~3 us each here). The driver's global hooks only find the loop's
    outermost module; then a wrapper of that module alone times its calls: after the first
    forwards none is left, and every request is still a step, windows still recorded."""
    work = script(tmp_path, SERVING + textwrap.dedent("""
        from torch.nn.modules import module as m
        print(len(m._global_forward_hooks) + len(m._global_forward_pre_hooks),
              "_compiled_call_impl" in model.__dict__)
        """))
    run, proc = run_torch(tmp_path, work)
    assert proc.stdout.split() == ["0", "True"], proc.stdout
    assert step_numbers(steps_of(run)) == list(range(3000))
    st = counterprof.load(run).meta["collectors"]["torch"]
    assert st["step_marks"] == ["forward"] and st["traces"] >= 1, st


def test_a_window_does_not_import_inductor_into_the_workload(tmp_path):
    """torch.profiler's start asks hasattr(torch, "_inductor"), which imports inductor, dynamo
    and sympy (~820 modules, about a second) inside the workload's step; a workload that never
    imported inductor keeps it unloaded."""
    work = script(tmp_path, SERVING + 'import sys\nprint("torch._inductor" in sys.modules)\n')
    run, proc = run_torch(tmp_path, work)
    assert proc.stdout.split() == ["False"], proc.stdout
    assert counterprof.load(run).meta["collectors"]["torch"]["traces"] >= 1


def test_the_default_first_window_warms_up(tmp_path):
    """The first optimizer step marks step 1's start and starts the profiler. An exact schedule
    records step 1 at once, with the profiler's own start in it (on a GPU, CUPTI's set-up made
    such a step 3x its length); the default warms up through step 1 and records from step 2."""
    work = script(tmp_path, TRAINING)
    ops_in = {}
    for name, args in (("exact", ("--torch-window", "5/50")), ("paced", ())):
        run, _ = run_torch(tmp_path, work, *args, run_name=name)
        spans = counterprof.load(run).table("spans")
        steps = steps_of(run)
        bounds = dict(zip(step_numbers(steps), zip(pc.cast(steps["start"], pa.int64()).to_pylist(),
                                                   pc.cast(steps["end"], pa.int64()).to_pylist())))
        ops = pc.cast(by_category(spans, "cpu_op")["start"], pa.int64()).to_pylist()
        ops_in[name] = {n: sum(1 for t in ops if bounds[n][0] <= t < bounds[n][1]) for n in (1, 2)}
    assert ops_in["exact"][1] > 0, ops_in
    assert ops_in["paced"][1] == 0 and ops_in["paced"][2] > 0, ops_in


DATALOADER = """
import time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self):
        return 48
    def __getitem__(self, i):
        time.sleep(0.02)                         # a slow decode, in the workers
        return torch.full((16,), float(i))
model = torch.nn.Linear(16, 4)
loader = DataLoader(Slow(), batch_size=4, num_workers=2)
waited = 0.0
with torch.no_grad():
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            waited += time.perf_counter() - t0
            break
        waited += time.perf_counter() - t0
        model(batch)
print(f"{waited:.6f}")
"""


def test_dataloader_waits_are_input_spans_for_the_whole_run(tmp_path):
    run, proc = run_torch(tmp_path, script(tmp_path, DATALOADER))
    waited = float(proc.stdout.split()[-1])
    inputs = by_category(counterprof.load(run).table("spans"), "input")
    assert set(inputs["name"].to_pylist()) == {
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"}
    assert inputs.num_rows == 48 // 4 + 1                     # every next(), StopIteration's too
    total = pc.sum(pc.subtract(pc.cast(inputs["end"], pa.int64()),
                               pc.cast(inputs["start"], pa.int64()))).as_py() / 1e9
    assert abs(total - waited) <= 0.1 * waited, (total, waited)
    assert counterprof.load(run).meta["collectors"]["torch"]["dataloader_waits"] == 13


def test_nothing_recorded_says_why(tmp_path):
    no_torch = script(tmp_path, "print('no torch here')\n", "plain.py")
    run, proc = run_torch(tmp_path, no_torch, run_name="plain")
    st = counterprof.load(run).meta["collectors"]["torch"]
    assert st["status"] == "empty" and "never imported torch" in st["reason"], st
    assert "no trace was recorded: the workload never imported torch" in proc.stderr
    idle = script(tmp_path, "import torch\nprint(torch.__version__)\n", "idle.py")
    run, proc = run_torch(tmp_path, idle, run_name="idle")
    st = counterprof.load(run).meta["collectors"]["torch"]
    assert st["status"] == "empty", st
    assert "torch imported but no step, forward or window was seen" in st["reason"]
    report = run_cli("report", str(run))
    row = next(line for line in report.stdout.splitlines() if line.startswith("torch "))
    assert "empty" in row and "torch imported but no step" in row, row
    assert "no trace was recorded: torch imported but no step" in proc.stderr


def test_a_loop_without_marks_or_modules_is_recorded_in_time_windows(tmp_path):
    work = script(tmp_path, f"""
    import glob, time, torch
    a = torch.randn(128, 128)
    t0 = time.monotonic()
    # a custom loop; it runs until the first window is written (however loaded the machine)
    while time.monotonic() - t0 < 60 and not glob.glob({str(tmp_path / "run")!r} + "/_ranks/rank=0/traces/*.json"):
        a = torch.tanh(a @ a)
    """)
    run, _ = run_torch(tmp_path, work, "--torch-time-window", "0.4/1.6")
    r = counterprof.load(run)
    st = r.meta["collectors"]["torch"]
    assert st["status"] == "ok" and st["traces"] >= 1 and st["step_marks"] == ["window"], st
    spans = r.table("spans")
    assert "aten::mm" in set(by_category(spans, "cpu_op")["name"].to_pylist())
    assert by_category(spans, "step").num_rows == 0
    w = by_category(spans, "window")
    lengths = pc.subtract(pc.cast(w["end"], pa.int64()), pc.cast(w["start"], pa.int64())).to_pylist()
    assert all(0.3e9 <= n <= 1.5e9 for n in lengths), lengths      # 0.4 s windows
    # named apart from step windows: the step verdict leaves them out (they may hold step 0)
    assert all(n.endswith(".time.pt.trace.json") for n in w["name"].to_pylist()), w["name"].to_pylist()


KILLED = """
import atexit, os, sys, time
go, done = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(done, "w").close())
import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
def train_step():
    opt.zero_grad(); model(x).square().mean().backward(); opt.step()
for _ in range(6):
    train_step()
time.sleep(1.5)                         # the profiler reads these steps, then it is killed
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.05)
for _ in range(9):
    train_step()
"""


def test_a_killed_profiler_keeps_every_step_after_recover(tmp_path):
    work = script(tmp_path, KILLED)
    run, go, done = tmp_path / "run", tmp_path / "go", tmp_path / "done"
    prof = subprocess.Popen([*COUNTERPROF, "run", "--torch", "--collectors", "torch", "-q", "-o",
                             str(run), "--", PYTHON, str(work), str(go), str(done)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert prof.stdout.readline().strip() == "ready", prof.stderr.read()
        time.sleep(1.0)                 # its collector has emitted the first steps by now
    finally:
        prof.kill()
        prof.wait()
        prof.stdout.close()
        prof.stderr.close()
    journal = list(journal_dir(run).glob("spans~*"))
    assert journal, "the profiler had emitted no steps before it was killed"
    go.touch()
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.exists()
    rec = run_cli("recover", str(run), "-q")
    assert rec.returncode == 0, rec.stderr
    assert "torch: timed " in rec.stderr, rec.stderr
    assert step_numbers(steps_of(run)) == list(range(15))        # 6 + 9, each once
    again = run_cli("recover", str(run), "-q")
    assert "timed" not in again.stderr
    assert step_numbers(steps_of(run)) == list(range(15))
