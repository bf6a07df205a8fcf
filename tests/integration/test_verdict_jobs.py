"""The verdict on jobs written as ML engineers write them (tests/jobs/), not around the
classifier: each job keeps its own accounting (its sleeps, its waits for the DataLoader, the
time its backward waits for DDP's reducer, its main thread's run delay from /proc) and the
report of `counterprof run --torch` is held to it: class shares within 10 points, the verdict
to the class that leads by construction.

Truth, per job: host = the main thread's own waits (sleep, DataLoader) plus its run delay
(runnable, no CPU: other load here, a busy process on its core), over its wall time;
collectives = the time its backward waited for the reducer beyond the same backward without
the all-reduce; busy CPU (compute|memory) = the rest. The machine is shared, so run delay is
measured on every run, never assumed zero.
"""
import importlib.util
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import COUNTERPROF, PYTHON, REPO, free_port, run_cli, traces_dir

torch = pytest.importorskip("torch")

JOBS = REPO / "tests" / "jobs"
TOLERANCE = 0.10           # class shares: within 10 points of the job's own accounting
BUSY = ("compute", "memory", "compute|memory")
XFAIL = "issue 10: the classifier counts every thread of the tree as the rank being busy"
NEEDS_TRANSFORMERS = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e .[test])")
NEEDS_DIST = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
# required: the main cases of the verdict (tests/conftest.py: in CI a skip of one fails the session)
pytestmark = [pytest.mark.slow, pytest.mark.required]


# ---- running a job and reading what it and the report say ---------------------------------

def profile(out: Path, *cmd: str, run_args: tuple[str, ...] = (), watch=None) -> tuple[dict, list[dict], Path]:
    """`counterprof run --torch [RUN_ARGS] -o OUT/run -- CMD`, then `report --json`: (the
    report, the job's truth lines, the run directory); the profiler's stderr is OUT/stderr.
    `watch(proc)` runs while the job runs."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir, truth = out / "run", out / "truth.jsonl"
    env = dict(os.environ, JOB_TRUTH=str(truth))
    args = [*COUNTERPROF, "run", "--torch", "-q", *run_args, "-o", str(run_dir), "--", *cmd]
    with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
        proc = subprocess.Popen(args, env=env, stdout=so, stderr=se)
        try:
            if watch is not None:
                watch(proc)
            proc.wait(timeout=280)
        finally:
            if proc.poll() is None:       # timed out: SIGINT reaches the workload through the profiler
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    stderr = (out / "stderr").read_text()
    assert proc.returncode == 0, f"{' '.join(args)} -> {proc.returncode}\n{stderr[-3000:]}"
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    lines = [json.loads(ln) for ln in truth.read_text().splitlines()] if truth.exists() else []
    assert lines, f"the job wrote no truth to {truth}:\n{stderr[-3000:]}"
    return json.loads(rep.stdout), lines, run_dir


def busy(shares: dict) -> float:
    return sum(shares.get(k, 0.0) for k in BUSY)


def verdict_class(v: dict) -> str:
    """host | collectives | busy (compute, memory, or the two undecided) | unknown."""
    if v["verdict"] in ("compute", "memory"):
        return "busy"
    if v["verdict"] == "unknown" and v["undecided"] and set(v["undecided"]) <= {"compute", "memory"}:
        return "busy"
    return v["verdict"]


class Truth:
    """A job's own accounting of its main thread's time per class (host, collectives, busy:
    the rest), in seconds over its wall time; `outside_s`: time of the report's scope that the
    job could not account for (interpreter start before its clock, its exit, the profiler's
    start): host or busy CPU, in a proportion it cannot know, so each of those two shares is
    known to lie in a range (never collectives: the jobs hold no process group then)."""

    def __init__(self, wall_s: float, host_s: float = 0.0, collectives_s: float = 0.0, outside_s: float = 0.0):
        host_s, collectives_s = min(host_s, wall_s), min(collectives_s, wall_s - min(host_s, wall_s))
        self.wall_s, self.outside_s = wall_s, max(0.0, outside_s)
        self.seconds = {"host": host_s, "collectives": collectives_s, "busy": wall_s - host_s - collectives_s}

    @classmethod
    def of_job(cls, t: dict, scope: dict | None, *waits: str, collectives: str | None = None) -> "Truth":
        """From a job's truth line: host = its waits plus its main thread's run delay; over
        `scope` (a verdict with start_ns/end_ns: the report's), the rest is outside."""
        if scope is not None and scope.get("scope") == "steps" and "loop_s" in t:
            # the headline is the steps' (start-up apart): the job's loop is its truth; its run
            # delay over the loop where it kept one, else its whole life's, pro rata
            delay = t.get("loop_run_delay_s", t["main_run_delay_s"] * t["loop_s"] / t["wall_s"])
            return cls(t["loop_s"], sum(t[w] for w in waits) + delay, t[collectives] if collectives else 0.0)
        outside = 0.0
        if scope is not None and scope.get("start_ns") is not None:
            outside = (scope["end_ns"] - scope["start_ns"]) / 1e9 - t["wall_s"]
        return cls(t["wall_s"], sum(t[w] for w in waits) + t["main_run_delay_s"],
                   t[collectives] if collectives else 0.0, outside)

    @property
    def shares(self) -> dict[str, float]:
        return {k: x / self.wall_s for k, x in self.seconds.items()}

    def bounds(self, cls: str) -> tuple[float, float]:
        whole = self.wall_s + self.outside_s
        lo = self.seconds[cls] / whole
        return lo, lo + (self.outside_s / whole if cls in ("host", "busy") else 0.0)

    def __repr__(self) -> str:
        return ("Truth(" + ", ".join(f"{k} {x:.2f} s" for k, x in self.seconds.items())
                + f" of {self.wall_s:.2f} s, {self.outside_s:.2f} s outside the job's clock)")


def allowed_verdicts(truth: Truth) -> set[str]:
    """The verdicts a true share-out allows: the leader when it leads by 20 points; the leader
    or unknown by 10 to 20; closer, the two leaders or unknown."""
    (top, a), (second, b) = sorted(truth.shares.items(), key=lambda kv: kv[1], reverse=True)[:2]
    if a - b >= 0.2:
        return {top}
    return {top, "unknown"} if a - b >= 0.1 else {top, second, "unknown"}


def hold_to_truth(v: dict, truth: Truth) -> None:
    """A verdict's shares within TOLERANCE of the truth per class, its verdict allowed by it.
    The jobs time their phases, not torch's ops: the Python between ops (framework overhead),
    host in the verdict, is busy time in their accounting, so it is folded back for the
    comparison (tests/integration/test_verdict_attribution.py holds that part to a job that
    times its Python itself)."""
    python = (v.get("host_parts") or {}).get("Python outside torch ops", 0.0)
    got = {"host": v["shares"].get("host", 0.0) - python, "collectives": v["shares"].get("collectives", 0.0),
           "busy": busy(v["shares"]) + python}
    for cls in truth.seconds:
        lo, hi = truth.bounds(cls)
        assert lo - TOLERANCE <= got[cls] <= hi + TOLERANCE, \
            f"{v['scope']}: {cls} {got[cls]:.0%}, the job's own accounting {lo:.0%}..{hi:.0%} " \
            f"(shares {v['shares']}; {truth})"
    allowed = allowed_verdicts(truth)
    if python >= 0.05 and v["shares"].get("host", 0.0) == max(v["shares"].values()):
        allowed.add("host")         # host through the Python the job counts as busy
    if python >= 0.05:
        # the verdict is the report's, Python host: the truth read that way allows it too (busy
        # 57% and host 27% by the DDP job's clock, 45% and 39% by the report's with its 13
        # points of Python between ops: a near tie, unknown, at load 3-4 on 2026-12-07, once
        # the collectives' truth no longer took the run delay's noise out of busy)
        moved = Truth(truth.wall_s, truth.seconds["host"] + python * truth.wall_s,
                      truth.seconds["collectives"], truth.outside_s)
        allowed |= allowed_verdicts(moved)
    assert verdict_class(v) in allowed, \
        f"{v['scope']}: verdict {v['verdict']} {v['undecided']}, truth {truth.shares}"


def evidence_text(v: dict) -> str:
    return " ".join(e["text"] for e in v["evidence"]).lower()


def region(report: dict, *words: str) -> dict | None:
    return next((r for r in report["regions"] if all(w in r["name"] for w in words)), None)


class BusyLoops:
    """`n` processes spinning on CPU `cpu` (as other jobs sharing a core would) until closed."""

    def __init__(self, cpu: int = 0, n: int = 1):
        self.procs = [subprocess.Popen(["taskset", "-c", str(cpu), PYTHON, "-c", "while True: pass"])
                      for _ in range(n)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


class RunDelayWatcher:
    """The run delay of a job's main thread, read by the test from /proc/<pid>/schedstat
    (field 2) while the job runs: the share of its life it was runnable but had no CPU."""

    def __init__(self, script: str):
        self.script, self.pid, self.delay_s, self.life_s = script, None, 0.0, 0.0

    def __call__(self, proc: subprocess.Popen) -> None:
        import psutil
        started = None
        while proc.poll() is None:
            if self.pid is None:
                for p in psutil.Process(proc.pid).children(recursive=True):
                    try:
                        if any(self.script in a for a in p.cmdline()):
                            self.pid, started = p.pid, p.create_time()
                    except psutil.NoSuchProcess:
                        pass
            else:
                try:
                    with open(f"/proc/{self.pid}/schedstat") as f:
                        delay_ns = int(f.read().split()[1])
                except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                    pass               # exited (or exiting): the last reading stands
                else:
                    self.delay_s, self.life_s = delay_ns / 1e9, time.time() - started
            time.sleep(0.05)
        assert self.pid is not None and self.life_s > 0, f"never saw {self.script} run"

    @property
    def share(self) -> float:
        return self.delay_s / self.life_s


def steps_truth(step_log: list, occurrences_s: list, overall: dict) -> Truth:
    """The job's own steps, over the time of a region's occurrences (seconds from the run's
    start): each step's sleep and run delay, weighted by how much of it the occurrences cover."""
    wall = host = 0.0
    for a, b in occurrences_s:
        lo, hi = overall["start_ns"] + a * 1e9, overall["start_ns"] + b * 1e9
        for start, end, slept, delay in step_log:
            cover = max(0.0, min(hi, end) - max(lo, start))
            if cover:
                wall += cover / 1e9
                host += (slept + delay) * cover / (end - start)
    assert wall > 0, f"no step of the job falls in the region's occurrences {occurrences_s[:5]}"
    return Truth(wall, host)


# ---- 1. GPT-2 training that sleeps 40% of every step ------------------------------------------

@pytest.fixture(scope="module")
def gpt2_sleepy(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("gpt2_sleepy"), PYTHON, str(JOBS / "gpt2_train.py"),
                   "--steps", "20", "--sleep-share", "0.4")


@NEEDS_TRANSFORMERS
def test_gpt2_asleep_40pct_of_each_step_is_that_much_host(gpt2_sleepy):
    report, (t,), _ = gpt2_sleepy
    assert 0.3 <= t["sleep_s"] / t["loop_s"] <= 0.5, t        # the job did what it says
    o = report["overall"]
    hold_to_truth(o, Truth.of_job(t, o, "sleep_s"))
    assert "main thread" in evidence_text(o), o["evidence"]     # which thread, in which state


@NEEDS_TRANSFORMERS
def test_gpt2_traced_steps_share_as_the_loop_does(gpt2_sleepy):
    report, (t,), _ = gpt2_sleepy
    steps = [r for r in report["regions"] if r["kind"] == "step"]
    assert steps and steps[0]["count"] >= 1, [r["name"] for r in report["regions"]]
    hold_to_truth(steps[0]["verdict"], steps_truth(t["step_log"], steps[0]["occurrences_s"], report["overall"]))


# ---- 2. a DataLoader whose 2 workers tokenize in pure Python ----------------------------------

@pytest.fixture(scope="module")
def dataloader_bound(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("dataloader"), PYTHON, str(JOBS / "dataloader_bound.py"))


def test_loop_waiting_for_its_dataloader_workers_is_host(dataloader_bound):
    report, (t,), _ = dataloader_bound
    assert t["next_wait_s"] > 0.5 * t["loop_s"], t            # input-bound by construction
    o = report["overall"]
    hold_to_truth(o, Truth.of_job(t, o, "next_wait_s"))
    assert "worker" in evidence_text(o), o["evidence"]     # how busy the DataLoader workers were


def test_the_dataloader_next_waits_are_the_steps_input_pipeline_share(dataloader_bound):
    """Every DataLoader next() is timed for the whole run (an `input` span each, not a region of
    its own): inside it the loop only waits for a worker's batch (and unpickles it), so the step
    region's host share names it as the input pipeline, as much of the steps' time as the job's
    own timing of its waits in __next__ says."""
    report, (t,), _ = dataloader_bound
    step = region(report, "ProfilerStep")
    assert step is not None, [r["name"] for r in report["regions"]]
    v = step["verdict"]
    assert v["verdict"] == "host", v
    parts = v.get("host_parts") or {}
    assert "input pipeline" in parts, f"the steps' host share names no input pipeline: {parts}"
    own = t["next_wait_s"] / t["loop_s"]
    assert abs(parts["input pipeline"] - own) <= TOLERANCE, \
        f"input pipeline {parts['input pipeline']:.0%} of the steps, the job's own waits in __next__ {own:.0%}"


# ---- 2b. the same loop's examples fetched over HTTP from a slow store --------------------------
# Its 2 workers wait on the network, off the CPU: the advice is more workers (or concurrent
# reads), not a deeper prefetch (which queued more items behind the same waits).

@pytest.fixture(scope="module")
def dataloader_io(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("dataloader_io"), PYTHON, str(JOBS / "dataloader_io.py"))


def test_loop_waiting_for_workers_blocked_on_the_network_is_host_and_says_so(dataloader_io):
    report, (t,), _ = dataloader_io
    assert t["next_wait_s"] > 0.5 * t["loop_s"], t            # input-bound by construction
    worker_idle = 1 - t["worker_item_cpu_s"] / t["worker_item_s"]
    assert worker_idle > 0.8, t                                 # the fetch is the item's time
    o = report["overall"]
    hold_to_truth(o, Truth.of_job(t, o, "next_wait_s"))
    text = next(e["text"] for e in o["evidence"] if e["metric"] == "input_wait")
    m = re.search(r"workers busy (\d+)% of their time, blocked (\d+)%", text)
    assert m, text
    assert abs(int(m.group(2)) / 100 - worker_idle) <= TOLERANCE, (text, worker_idle)
    assert "num_workers" in text and "more prefetch" not in text, text


# ---- 3. the GPT-2 loop sharing its core with two busy processes ------------------------------
# Two busy loops on the job's core leave it a third of that core: its main thread waits for the
# CPU ~2/3 of the time by construction (more where other load reaches CPU 0), so host leads busy
# CPU by 30 points or more, and the verdict, most seconds' and most live lines' must be host.
# (Beside one loop the wait is ~50%: a tie with busy CPU that allows any verdict but collectives,
# and too close to hold each second to.)
# Both GPT-2 runs (this one and the one alone that compare holds it to) sample at -I 10: a region
# as short as the optimizer's step (3 ms alone) gets its wait for a CPU from the buckets around
# it, and at the default 100 ms those are mostly its neighbours' (what compare then calls the
# region's wait is not its own: 2 of 5 runs here failed the gate on it, see the compare test).
CONTENDERS = 2
# the least run delay the construction leaves (2/3, less the job's own blocking); measured 67-79%
# in 15 runs here (2026-12-06, load average 5)
CONTENDED_WAIT = 0.6
# host in at least this share of the 1 s windows and of the --live lines: measured 95-100% of the
# windows and 100% of the lines in the same 15 runs (beside one loop it was about half)
HOST_MOST = 0.8
INTERVAL = ("-I", "10")


@pytest.fixture(scope="module")
def gpt2_contended(tmp_path_factory):
    watcher = RunDelayWatcher("gpt2_train.py")
    with BusyLoops(cpu=0, n=CONTENDERS):
        report, truth, run_dir = profile(
            tmp_path_factory.mktemp("gpt2_contended"),
            "taskset", "-c", "0", PYTHON, str(JOBS / "gpt2_train.py"), "--steps", "10",
            run_args=("--live", *INTERVAL), watch=watcher)
    return report, truth, run_dir, watcher


@NEEDS_TRANSFORMERS
def test_gpt2_sharing_its_core_is_host_contention(gpt2_contended):
    report, (t,), _, watcher = gpt2_contended
    # the test's reading of /proc and the job's own agree (one thread, one kernel counter)
    assert abs(watcher.share - t["main_run_delay_s"] / t["wall_s"]) < 0.1, (watcher.share, t)
    assert watcher.share >= CONTENDED_WAIT, \
        f"{CONTENDERS} busy loops on its core left the job a run delay of only {watcher.share:.0%}"
    o = report["overall"]
    outside = (o["end_ns"] - o["start_ns"]) / 1e9 - watcher.life_s
    truth = Truth(watcher.life_s, watcher.delay_s, outside_s=outside)
    assert allowed_verdicts(truth) == {"host"}, truth       # host leads by 20 points: only host will do
    hold_to_truth(o, truth)
    texts = evidence_text(o)
    assert "main thread" in texts and ("contention" in texts or "waiting for a cpu" in texts), o["evidence"]


@NEEDS_TRANSFORMERS
def test_gpt2_sharing_its_core_is_host_in_the_timeline_and_the_live_line(gpt2_contended):
    report, _, run_dir, watcher = gpt2_contended
    assert watcher.share >= CONTENDED_WAIT, f"run delay {watcher.share:.0%}: the busy loops did not contend"
    windows = [verdict_class(w) for w in report["windows"]]
    assert windows and windows.count("host") >= HOST_MOST * len(windows), windows
    live = [ln.split(" | ", 1)[1] for ln in (run_dir.parent / "stderr").read_text().splitlines() if " | " in ln]
    assert live, "--live printed no line"
    assert sum(ln.startswith("host") for ln in live) >= HOST_MOST * len(live), live


# ---- 4. resnet-style inference: no optimizer, no step marks -----------------------------------

@pytest.fixture(scope="module")
def resnet_infer(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("resnet"), PYTHON, str(JOBS / "resnet_infer.py"), "--batches", "60")


def test_resnet_inference_is_busy_cpu(resnet_infer):
    """The job's truth counts its main thread's run delay (measured on this run) as host: on a
    loaded machine the share-out moves toward host and the verdicts allowed widen with it (the
    two leaders or unknown when they are within 20 points); the share-out is held either way."""
    report, (t,), _ = resnet_infer
    o = report["overall"]
    hold_to_truth(o, Truth.of_job(t, o))


def test_resnet_inference_without_step_marks_is_traced(resnet_infer):
    report, _, run_dir = resnet_infer
    import counterprof
    import pyarrow.compute as pc
    spans = counterprof.load(run_dir).table("spans")
    ops = pc.sum(pc.equal(spans["category"].cast("string"), "cpu_op")).as_py() if spans.num_rows else 0
    assert ops, f"--torch recorded no op of the inference loop (torch collector: {report['collectors']['torch']})"


def test_torch_collector_says_ok_only_with_something_recorded(resnet_infer, tmp_path):
    """Both ways: the inference loop (no optimizer, no step marks) is traced and says ok; a
    workload that imports torch and then runs no step, forward or window records no trace and
    must not say ok."""
    report, _, run_dir = resnet_infer
    traces = traces_dir(run_dir)
    assert traces.exists() and any(traces.glob("*.pt.trace.json*")), \
        f"the inference loop was not traced (torch collector: {report['collectors']['torch']})"
    assert report["collectors"]["torch"]["status"] == "ok", report["collectors"]["torch"]
    idle = tmp_path / "idle"
    proc = run_cli("run", "--torch", "-q", "-o", str(idle), "--", PYTHON, "-c", "import torch", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not (traces_dir(idle).exists() and any(traces_dir(idle).glob("*.pt.trace.json*")))
    st = json.loads((idle / "meta.json").read_text())["collectors"]["torch"]
    assert st["status"] != "ok" and st["reason"], st


# ---- 5. DDP over gloo, 2 ranks: torchrun and torch.multiprocessing.spawn ------------------------

def torchrun() -> list[str]:
    exe = Path(PYTHON).with_name("torchrun")
    return [str(exe)] if exe.exists() else [PYTHON, "-m", "torch.distributed.run"]


@pytest.fixture(scope="module")
def ddp_torchrun(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("ddp_torchrun"), *torchrun(), "--standalone",
                   "--nproc_per_node", "2", str(JOBS / "ddp_train.py"))


@pytest.fixture(scope="module")
def ddp_spawn(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("ddp_spawn"), PYTHON, str(JOBS / "ddp_train.py"),
                   "--spawn", "2", "--port", str(free_port()))


def traced_windows(run_dir: Path) -> dict[int, list[tuple[int, int]]]:
    """Per rank, the (start, end) unix ns of its torch trace windows: the steps the report's
    op-level figures were measured over (the rest get them carried: the evidence says so)."""
    import counterprof
    spans = counterprof.load(run_dir).table("spans", with_rank=True).to_pylist()
    out: dict[int, list[tuple[int, int]]] = {}
    for s in spans:
        if s["category"] == "window":
            out.setdefault(int(s["rank"]), []).append(
                (int(s["start"].timestamp() * 1e9), int(s["end"].timestamp() * 1e9)))
    return out


def ddp_truth(t: dict, windows: list[tuple[int, int]]) -> Truth:
    """One rank's accounting over the steps its trace windows hold (a step whose middle falls
    in one): host its main thread's run delay, collectives its wait for the reducer (synced
    backward less no_sync backward) and for the buffers' broadcast (the forward that
    broadcasts less the one that does not), each phase less its own run delay: that is host
    already, and on a loaded machine it lengthens one phase and not its twin by tens of ms
    (2026-12-07, load 5-6: synced less local backward -57..+105 ms a step with the delay in,
    steps of 150-550 ms; clamped at 0 per step, that noise made a rank's truth over 30%
    collectives where, the delay out, it was 8%, and the report said 8%). Not the whole loop: the step in
    which a rank stops its trace (the export) holds the other rank waiting in its next
    collective, a wait of the profiler's making that no traced step shows."""
    steps = [s for s in t["per_step"]
             if any(a <= (s["start_unix_ns"] + s["end_unix_ns"]) // 2 <= b for a, b in windows)]
    assert len(steps) >= 3, f"rank {t['rank']}: {len(steps)} steps traced of {len(t['per_step'])}: {windows}"
    wall = sum(s["end_unix_ns"] - s["start_unix_ns"] for s in steps) / 1e9

    def on_clock(s: dict, phase: str) -> float:        # the phase's time, its run delay out
        return s[f"{phase}_s"] - s[f"{phase}_delay_s"]

    waits = sum(max(0.0, on_clock(s, "backward_synced") - on_clock(s, "backward_local"))
                + max(0.0, on_clock(s, "forward_local") - on_clock(s, "forward_synced")) for s in steps)
    return Truth(wall, sum(s["run_delay_s"] for s in steps), waits)


def over_scope(truth: list[dict], scope: dict, traced: Truth) -> Truth:
    """The ranks' accounting over the steps of a verdict's scope (a step whose middle falls in
    it): host their main threads' run delay in those steps (the report reads the threads'
    states over every step), collectives the traced steps' share of them carried to all (as
    the report carries the op-level figures: its evidence says so). On a loaded machine the
    traced steps' run delay and the other steps' differ: 47% against 62% in one run at load 6
    (2026-12-07), and the report's host, 60%, was the steps' own."""
    steps = [s for t in truth for s in t["per_step"]
             if scope["start_ns"] <= (s["start_unix_ns"] + s["end_unix_ns"]) // 2 <= scope["end_ns"]]
    assert len(steps) >= 3, f"{len(steps)} steps in {scope['scope']}"
    wall = sum(s["end_unix_ns"] - s["start_unix_ns"] for s in steps) / 1e9
    return Truth(wall, sum(s["run_delay_s"] for s in steps), traced.shares["collectives"] * wall)


def check_ddp(report: dict, truth: list[dict], run_dir: Path) -> None:
    """Every rank's collectives held to its own accounting over the same steps; the run's
    share-out to the ranks' together over its steps."""
    assert sorted(t["rank"] for t in truth) == [0, 1], truth
    o = report["overall"]
    windows = traced_windows(run_dir)
    per_rank = {t["rank"]: ddp_truth(t, windows.get(t["rank"], [])) for t in truth}
    traced = Truth(sum(x.wall_s for x in per_rank.values()), sum(x.seconds["host"] for x in per_rank.values()),
                   sum(x.seconds["collectives"] for x in per_rank.values()))
    assert traced.shares["collectives"] < 0.3, f"the job is not the minor-collectives case: {traced}"
    pooled = over_scope(truth, o, traced)
    hold_to_truth(o, pooled)
    by_rank = {int(v["scope"].split()[-1]): v for v in report["rank_verdicts"]}
    assert sorted(by_rank) == [0, 1], [v["scope"] for v in report["rank_verdicts"]]
    for r, truth_r in per_rank.items():
        v = by_rank[r]
        assert sum(v["shares"].values()) > 0.9, v            # the rank is not empty
        lo, hi = truth_r.bounds("collectives")
        assert lo - TOLERANCE <= v["shares"].get("collectives", 0.0) <= hi + TOLERANCE, (v, truth_r)


@NEEDS_DIST
def test_ddp_under_torchrun_collectives_are_a_minor_share(ddp_torchrun):
    report, truth, run_dir = ddp_torchrun
    check_ddp(report, truth, run_dir)


@NEEDS_DIST
def test_ddp_under_mp_spawn_has_both_ranks(ddp_spawn):
    report, truth, run_dir = ddp_spawn
    check_ddp(report, truth, run_dir)


@pytest.fixture(scope="module")
def ddp_beside_a_hog(tmp_path_factory):
    """The torchrun job beside an unrelated process that spins on a CPU the whole time."""
    hog = subprocess.Popen([PYTHON, "-c", "while True: pass"])
    try:
        return profile(tmp_path_factory.mktemp("ddp_hog"), *torchrun(), "--standalone",
                       "--nproc_per_node", "2", str(JOBS / "ddp_train.py"))
    finally:
        hog.kill()
        hog.wait()


@NEEDS_DIST
def test_a_ranks_wait_for_a_cpu_held_by_another_process_is_contention(ddp_beside_a_hog):
    """Each rank's runnable time goes to who held the CPUs: here the hog and the other rank,
    not the rank's own gloo threads (which held a hundredth of a CPU: a rank's samples alone
    do not see the hog, and all its wait went to collectives). Held from above only: beside
    the hog, a step's synced-less-local backward swings by the hog's time slices both ways."""
    report, truth, run_dir = ddp_beside_a_hog
    windows = traced_windows(run_dir)
    by_rank = {int(v["scope"].split()[-1]): v for v in report["rank_verdicts"]}
    assert sorted(by_rank) == [0, 1], list(by_rank)
    for t in truth:
        v = by_rank[t["rank"]]
        _, hi = ddp_truth(t, windows.get(t["rank"], [])).bounds("collectives")
        assert v["shares"].get("collectives", 0.0) <= hi + TOLERANCE, (v, t["rank"])
        text = evidence_text(v)
        assert "other processes" in text and "its other ranks" in text, text
        assert v["host_parts"].get("CPU contention", 0.0) >= 0.05, v


# ---- 6. two unchanged runs, one on a contended core: compare ------------------------------------

@pytest.fixture(scope="module")
def gpt2_alone(tmp_path_factory):
    """The contended run's command, run alone on its core."""
    return profile(tmp_path_factory.mktemp("gpt2_alone"),
                   "taskset", "-c", "0", PYTHON, str(JOBS / "gpt2_train.py"), "--steps", "10", run_args=INTERVAL)


@NEEDS_TRANSFORMERS
def test_compare_of_unchanged_runs_names_the_contention(gpt2_alone, gpt2_contended):
    """What the README says: the machine moved, compare names the wait, and the gate passes on
    the unchanged job (and fails with --strict). The wait (~2/3 of the steps, two busy loops)
    implies about +200% step time; contention explains the change when what is left with the
    wait taken out is under half of that. Sharing a core also lengthens a GPT-2 step's on-CPU
    time (1.6-1.7x seen on this VM beside one loop, CI 2026-12-02 and -03: left as "partly"
    against the +100% one loop implies); against two loops' that stays under half. Both runs
    sample at -I 10: at the default -I 100 the 3 ms optimizer region's wait is its neighbours'
    (buckets pro-rated), and 2 of 5 runs here failed the gate on that region alone (8x its
    time, "partly"): a limitation of compare with regions shorter than the sampling interval."""
    base, cand = gpt2_alone[2], gpt2_contended[2]
    assert gpt2_contended[3].share >= CONTENDED_WAIT, "the busy loops did not contend"
    out = run_cli("compare", str(base), str(cand))
    assert out.returncode == 0, out.stderr
    text = out.stdout.lower()
    assert "contention" in text or "waiting for a cpu" in text, out.stdout
    j = json.loads(run_cli("compare", "--json", str(base), str(cand)).stdout)
    wb = j["machine"]["baseline"]["waits"]["step_time"]
    # the construction: a baseline that ran (here it waited 1-42% at load average 5, once 56%,
    # and then its steps were too slow for the contended ones to be a regression at all)
    assert wb < 0.5, f"the run alone waited {wb:.0%} of its steps for a CPU: other load, not the construction"
    gate = run_cli("compare", "--fail-on-regression", str(base), str(cand))
    assert gate.returncode == 0, f"the gate failed on an unchanged job:\n{gate.stdout}{gate.stderr}"
    assert "the machine was busier for the candidate" in gate.stdout, gate.stdout
    step = next(r for r in j["rows"] if r["key"] == "step_time")
    assert step["status"] == "regression" and step["contention"] == "explains", step
    assert j["failed"] is False and j["explained_by_contention"] == j["regressions"], j
    strict = run_cli("compare", "--fail-on-regression", "--strict", str(base), str(cand))
    assert strict.returncode == 1, strict.stdout + strict.stderr
