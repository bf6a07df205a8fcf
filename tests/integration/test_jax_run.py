"""`counterprof run --jax` with real jax jobs, written as JAX users write them: a Flax/optax
training loop with StepTraceAnnotation (every step timed, windows of steps traced, XLA ops
inside them), a jitted loop with no annotation (time windows), a job that never imports jax,
and a driver that has to stop (no traces folder; the job's own trace) without costing the job
anything or showing a traceback."""
from __future__ import annotations

import json
import statistics
import subprocess
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import counterprof
from helpers import COUNTERPROF, PYTHON, journal_dir, run_cli

pytest.importorskip("jax")
pytestmark = pytest.mark.slow

# The run's clock is CLOCK_MONOTONIC plus one offset taken when the run starts (clock.py); the
# job reads the real-time clock (time.time_ns()). Over a run of seconds the two part by what
# NTP slews meanwhile: microseconds. A step must lie inside the job's own interval within that.
CLOCKS_NS = 200_000


def script(tmp_path: Path, body: str, name: str = "work.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def run_jax(tmp_path: Path, work: Path, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path / "run"
    proc = run_cli("run", "--jax", "--collectors", "host,jax", "-q", "-o", str(run), *args, "--",
                   PYTHON, str(work), timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return run, proc


def by_category(t: pa.Table, category: str) -> pa.Table:
    return t.filter(pc.equal(t["category"].cast(pa.string()), category))


def intervals(t: pa.Table) -> list[tuple[int, int]]:
    return list(zip(pc.cast(t["start"], pa.int64()).to_pylist(), pc.cast(t["end"], pa.int64()).to_pylist()))


def jax_status(run: Path) -> dict:
    return counterprof.load(run).meta["collectors"]["jax"]


FLAX_TRAINING = """
import json, os, threading, time
import jax, jax.numpy as jnp
import flax.linen as nn
import optax

class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(256)(x))
        x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(10)(x)

model = MLP()
key, data_key = jax.random.split(jax.random.PRNGKey(0))
x = jax.random.normal(data_key, (128, 64))
y = jax.random.randint(data_key, (128,), 0, 10)
params = model.init(key, x)
tx = optax.adam(1e-3)
opt_state = tx.init(params)

@jax.jit
def train_step(params, opt_state, x, y):
    def loss_fn(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

measured = []
for step in range(60):
    t0 = time.time_ns()
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
        params, opt_state, loss = train_step(params, opt_state, x, y)
        loss = float(loss)                  # the host waits for the step, as a logging loop does
    measured.append((t0, time.time_ns()))
print(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id(), "steps": measured,
                  "loss": loss}))
"""


def test_a_flax_training_loop_has_every_step_timed_and_xla_ops_in_its_traced_steps(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    run, proc = run_jax(tmp_path, script(tmp_path, FLAX_TRAINING))    # the default, paced schedule
    job = json.loads(proc.stdout)
    st = jax_status(run)
    assert st["status"] == "ok" and st["profiles"] >= 1 and st["step_marks"] == ["annotation"], st
    spans = counterprof.load(run).table("spans")
    steps = by_category(spans, "step").sort_by([("start", "ascending")])
    # every step, traced or not, once: the job's count, its step numbers, its thread
    assert steps["name"].to_pylist() == [f"train#{i}" for i in range(len(job["steps"]))]
    assert set(steps["pid"].to_pylist()) == {job["pid"]}
    assert set(steps["tid"].to_pylist()) == {job["tid"]}
    for (s, e), (t0, t1) in zip(intervals(steps), job["steps"]):
        assert t0 - CLOCKS_NS <= s <= e <= t1 + CLOCKS_NS, ((s, e), (t0, t1))
    # the windows are step windows (the compile step is left out) and their steps have XLA ops
    windows = by_category(spans, "window")
    names = windows["name"].to_pylist()
    assert names and all(n.endswith(".jaxprof") and ".time." not in n for n in names), names
    ops = intervals(by_category(spans, "xla_op"))
    traced = [(s, e) for s, e in intervals(steps)
              if any(ws <= s and e <= we for ws, we in intervals(windows))]
    assert traced and intervals(steps)[0] not in traced, (traced, intervals(windows))
    for s, e in traced:
        assert any(s <= o0 and o1 <= e for o0, o1 in ops), ("no XLA op inside a traced step", (s, e))
    # no step counted twice: the profiles' own step annotations are not emitted again
    assert steps.num_rows == len(job["steps"])
    # the time windows tried during the set-up (before the first step) were dropped
    acct = st.get("time_windows") or {"started": 0, "kept": 0, "empty": 0, "dropped": 0}
    assert acct["kept"] == 0 and acct["started"] == acct["empty"] + acct["dropped"], acct


JITTED_LOOP = """
import time, jax, jax.numpy as jnp
@jax.jit
def f(a, b):
    return jnp.tanh(a @ b) + 1.0
a = jnp.ones((512, 512)); b = jnp.ones((512, 512)) / 512
first = time.time_ns()                   # the first jitted call (it compiles)
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < 3.0:
    a = f(a, b)
    n += 1
a.block_until_ready()
print(first, n)
"""


def test_a_jitted_loop_without_annotations_is_traced_in_time_windows(tmp_path):
    run, proc = run_jax(tmp_path, script(tmp_path, JITTED_LOOP))
    first = int(proc.stdout.split()[0])
    st = jax_status(run)
    assert st["status"] == "ok" and st["step_marks"] == ["window"] and st["steps"] == 0, st
    acct = st["time_windows"]
    assert acct["kept"] >= 1 and acct["dropped"] == 0, acct
    assert acct["started"] == acct["kept"] + acct["empty"], acct
    spans = counterprof.load(run).table("spans")
    windows = by_category(spans, "window")
    assert windows.num_rows == acct["kept"], (windows["name"].to_pylist(), acct)
    assert all(n.endswith(".time.jaxprof") for n in windows["name"].to_pylist())
    assert min(s for s, _ in intervals(windows)) - first < 1.5e9      # within about a second
    ops = by_category(spans, "xla_op")
    assert ops.num_rows > 0
    for s, e in intervals(windows):                  # each kept window caught ops
        assert any(s <= o0 <= e for o0, _ in intervals(ops)), (s, e)
    assert by_category(spans, "step").num_rows == 0


@pytest.mark.parametrize("body, reason", [
    ("import json\nprint(json.dumps([1, 2]))\n", "the workload never imported jax"),
    ("import jax\nprint(jax.__version__)\n", "jax imported but no step or window was seen"),
], ids=["no jax", "jax imported, nothing run"])
def test_a_job_with_nothing_to_trace_is_empty_with_the_reason(tmp_path, body, reason):
    run, _ = run_jax(tmp_path, script(tmp_path, body))
    st = jax_status(run)
    assert st["status"] == "empty" and st["reason"].startswith(reason), st


def test_no_traces_folder_stops_profiling_with_the_reason_and_the_job_goes_on(tmp_path):
    """The job finds its rank's traces folder taken by a file (a full or read-only disk acts
    alike): the driver stops, says why once, and the job's own output is whole."""
    work = script(tmp_path, """
    import os
    traces = os.path.join(os.environ["COUNTERPROF_RUN_DIR"], "_ranks", "rank=0", "traces")
    os.makedirs(os.path.dirname(traces), exist_ok=True)
    if os.path.isdir(traces):
        os.rmdir(traces)
    open(traces, "w").close()
    import jax, jax.numpy as jnp
    f = jax.jit(lambda a: jnp.tanh(a @ a))
    a = jnp.ones((128, 128)) / 128
    for step in range(30):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            a = f(a).block_until_ready()
    print("done", float(a.sum()))
    """)
    run, proc = run_jax(tmp_path, work)
    assert proc.stdout.startswith("done "), proc.stdout
    said = [line for line in proc.stderr.splitlines() if "jax profiling stopped" in line]
    assert len(said) == 1, proc.stderr
    st = jax_status(run)
    assert st["status"] == "empty" and st["reason"].startswith("profiling stopped: pid "), st
    assert "traces" in st["reason"], st
    assert counterprof.load(run).table("samples").num_rows > 0      # the run's other data is kept


OWN_TRACE = """
import os, sys, time, jax, jax.numpy as jnp
own = sys.argv[1]
f = jax.jit(lambda a: jnp.tanh(a @ a))
a = jnp.ones((128, 128)) / 128
for step in range(40):
    if step == 3:                         # inside counterprof's first window (steps 1-3)
        jax.profiler.start_trace(os.path.join(own, "a"))
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
        a = f(a).block_until_ready()
        time.sleep(0.005)
    if step == 8:
        jax.profiler.stop_trace()
    if step == 20:
        with jax.profiler.trace(os.path.join(own, "b")):    # the context manager too
            a = f(a).block_until_ready()
print("done")
"""


def test_the_jobs_own_trace_comes_first_and_costs_no_data(tmp_path):
    own = tmp_path / "own"
    work = script(tmp_path, OWN_TRACE)
    run = tmp_path / "run"
    proc = run_cli("run", "--jax", "--jax-window", "3/10", "--collectors", "host,jax", "-q",
                   "-o", str(run), "--", PYTHON, str(work), str(own), timeout=240)
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    assert "Traceback" not in proc.stderr and "stopped" not in proc.stderr, proc.stderr
    for mine in ("a", "b"):                                             # the job's own, both
        assert len(list((own / mine).glob("plugins/profile/*/*.xplane.pb"))) == 1, mine
    st = jax_status(run)
    assert st["status"] == "ok" and not st["problems"], st
    spans = counterprof.load(run).table("spans")
    assert by_category(spans, "step").num_rows == 40
    windows = sorted(intervals(by_category(spans, "window")))
    # the window of steps 1-3 ended where the job's trace began (written as far as it got),
    # none started while the job traced, and those due after it did (steps 11, 21, 31)
    assert len(windows) == 4, windows
    ops = intervals(by_category(spans, "xla_op"))
    for s, e in windows:
        assert any(s <= o0 <= e for o0, _ in ops), (s, e)


KILLED = """
import atexit, os, sys, time
go, done = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(done, "w").close())
import jax, jax.numpy as jnp
f = jax.jit(lambda a: jnp.tanh(a @ a))
a = jnp.ones((128, 128)) / 128
def steps(first, n):
    global a
    for step in range(first, first + n):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            a = f(a).block_until_ready()
steps(0, 6)
time.sleep(1.5)                         # the profiler reads these steps and the first window
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.05)
steps(6, 9)
"""


def test_a_killed_profiler_loses_no_step_and_no_window_after_recover(tmp_path):
    work = script(tmp_path, KILLED)
    run, go, done = tmp_path / "run", tmp_path / "go", tmp_path / "done"
    prof = subprocess.Popen([*COUNTERPROF, "run", "--jax", "--jax-window", "2/5", "--collectors", "jax",
                             "-q", "-o", str(run), "--", PYTHON, str(work), str(go), str(done)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert prof.stdout.readline().strip() == "ready", prof.stderr.read()
        time.sleep(1.0)                 # its collector has emitted the first steps by now
    finally:
        prof.kill()
        prof.wait()
        prof.stdout.close()
        prof.stderr.close()
    assert list(journal_dir(run).glob("spans~*")), "the profiler had emitted nothing before it was killed"
    go.touch()                          # the job goes on alone: two more windows, nine steps
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.exists()
    rec = run_cli("recover", str(run), "-q")
    assert rec.returncode == 0, rec.stderr
    assert rec.stderr.count("jax: converted ") == 2, rec.stderr       # the windows of steps 6, 11
    spans = counterprof.load(run).table("spans")
    steps = by_category(spans, "step").sort_by([("start", "ascending")])
    assert steps["name"].to_pylist() == [f"train#{i}" for i in range(15)]     # 6 + 9, each once
    assert "torch: timed " in rec.stderr, rec.stderr           # the steps files' recovery reads both
    windows = sorted(by_category(spans, "window")["name"].to_pylist())
    assert len(windows) == 3 and windows == sorted(p.name for p in run.glob("_ranks/rank=0/traces/*.jaxprof"))
    again = run_cli("recover", str(run), "-q")
    assert again.returncode == 0 and "converted" not in again.stderr, again.stderr
    assert counterprof.load(run).table("spans").num_rows == spans.num_rows


# Two processes of one jax.distributed job (CPU collectives over gloo), started by a plain Python
# launcher as a user's own script starts them: each process is a rank (its process_id), psums a
# matmul's result with the other in every annotated step, and writes down its pid, its rank and
# its steps' times.
DISTRIBUTED_WORKER = """
    import json, os, sys, time
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=rank)
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(jax.devices(), ("d",))

    # a data-parallel step in miniature: a small local matmul, then the 4 MB "gradient" summed
    # across the two processes (as DDP's all_reduce); compute_only is the same step unsynced
    def local(a, g):
        return a @ a.T, g * 0.5

    @jax.jit
    def step(x, g):
        return jax.shard_map(lambda a, b: tuple(jax.lax.psum(t, "d") for t in local(a, b)),
                             mesh=mesh, in_specs=(P("d"), P("d")), out_specs=(P(), P()))(x, g)

    compute_only = jax.jit(local)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), jnp.ones((256, 256)))
    g = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), jnp.ones((1 << 20,)))
    steps = []
    for i in range(40):
        t0 = time.time_ns()
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            jax.block_until_ready(step(x, g))
        steps.append((t0, time.time_ns()))
    xl, gl = jnp.ones((256, 256)), jnp.ones((1 << 20,))  # this process's shards
    jax.block_until_ready(compute_only(xl, gl))
    unsynced = []
    for _ in range(40):
        t0 = time.perf_counter_ns()
        jax.block_until_ready(compute_only(xl, gl))
        unsynced.append(time.perf_counter_ns() - t0)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "rank": jax.process_index(), "steps": steps,
                   "unsynced_ns": unsynced}, f)
"""

DISTRIBUTED_LAUNCHER = """
    import socket, subprocess, sys
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    worker, out = sys.argv[1], sys.argv[2]
    procs = [subprocess.Popen([sys.executable, worker, str(r), str(port), out]) for r in (0, 1)]
    sys.exit(max(p.wait() for p in procs))
"""


def test_a_two_process_jax_distributed_job_is_judged_by_its_ranks(tmp_path):
    """The launcher only waits: each jax.distributed process is announced as its rank and
    counted apart (run --jax's per-rank "auto"), its steps and XLA ops land in its partition,
    its all-reduces are collectives, and each rank gets its own verdict."""
    worker = script(tmp_path, DISTRIBUTED_WORKER, "worker.py")
    launcher = script(tmp_path, DISTRIBUTED_LAUNCHER, "launch.py")
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    proc = run_cli("run", "--jax", "-q", "-o", str(run_dir), "--", PYTHON, str(launcher),
                   str(worker), str(out), timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    jobs = {d["rank"]: d for d in (json.loads(p.read_text()) for p in out.glob("rank*.json"))}
    assert sorted(jobs) == [0, 1]
    run = counterprof.load(run_dir)
    meta = run.meta
    assert meta["per_rank"] == "auto" and run.ranks() == [0, 1]
    assert {int(r): e["pid"] for r, e in meta["ranks"].items()} == {r: d["pid"] for r, d in jobs.items()}
    for entry in meta["ranks"].values():
        assert entry["source"] == "jax.distributed" and entry["world_size"] == 2
    assert meta["rank_switch"]["root_pid"] not in {d["pid"] for d in jobs.values()}
    for rank, job in jobs.items():
        spans = run.table("spans", rank=rank)
        steps = by_category(spans, "step").sort_by([("start", "ascending")])
        assert steps["name"].to_pylist() == [f"train#{i}" for i in range(len(job["steps"]))]
        assert set(steps["pid"].to_pylist()) == {job["pid"]}
        for (s, e), (t0, t1) in zip(intervals(steps), job["steps"]):
            assert t0 - CLOCKS_NS <= s <= e <= t1 + CLOCKS_NS, (rank, (s, e), (t0, t1))
        coll = by_category(spans, "collective")
        assert coll.num_rows and set(coll["collective"].to_pylist()) == {"all-reduce"}, rank
        assert set(coll["pid"].to_pylist()) == {job["pid"]}
    rep = json.loads(run_cli("report", "--json", str(run_dir)).stdout)
    verdicts = {v["scope"]: v for v in rep["rank_verdicts"]}
    assert set(verdicts) == {"rank 0", "rank 1"}, rep["rank_verdicts"]
    for rank, job in jobs.items():
        # the job's own truth: the share of a step that the unsynced step does not cost
        synced = statistics.median(t1 - t0 for t0, t1 in job["steps"])
        truth = 1 - statistics.median(job["unsynced_ns"]) / synced
        assert truth > 0.6, (rank, truth)      # the job is the shape it claims to be
        v = verdicts[f"rank {rank}"]
        assert v["verdict"] == "collectives" and sum(v["shares"].values()) <= 1.0001, (truth, v)
        assert v["shares"]["collectives"] >= truth - 0.3, (truth, v)
    rows = {r["rank"]: r for r in rep["rank_analysis"]["ranks"]}
    assert sorted(rows) == [0, 1] and all(r["collective_s"] > 0 for r in rows.values()), rows
    # `collectives` matches each psum across the two processes: XLA fuses the step's two psums
    # into one all-reduce of this process's 256 x 256 product and its 2^20-float "gradient"
    coll = json.loads(run_cli("collectives", "--json", str(run_dir)).stdout)
    assert coll["calls_from"] == {"0": "XLA collective ops", "1": "XLA collective ops"}
    assert coll["calls"] and not coll["unmatched"], coll["unmatched"]
    for c in coll["calls"]:
        assert (c["op"], c["ranks"], c["bytes"], c["complete"]) == \
            ("all_reduce", [0, 1], 4 * (256 * 256 + (1 << 20)), True), c
        assert c["busbw_gbps"] > 0 and c["skew_us"] is not None
