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
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import COUNTERPROF, PYTHON, REPO, free_port, run_cli

pytest.importorskip("torch")

JOBS = REPO / "tests" / "jobs"
TOLERANCE = 0.10           # class shares: within 10 points of the job's own accounting
BUSY = ("compute", "memory", "compute|memory")
XFAIL = "issue 10: the classifier counts every thread of the tree as the rank being busy"
NEEDS_TRANSFORMERS = pytest.mark.skipif(
    __import__("importlib").util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e .[test])")
NEEDS_DIST = pytest.mark.skipif(
    not __import__("torch").distributed.is_available(), reason="this torch build has no torch.distributed")
pytestmark = pytest.mark.slow


# ---- running a job and reading what it and the report say ---------------------------------

def profile(out: Path, *cmd: str, prefix: tuple[str, ...] = (), watch=None) -> tuple[dict, list[dict], Path]:
    """`[prefix] counterprof run --torch -o OUT/run -- CMD`, then `report --json`: (the report,
    the job's truth lines, the run directory). `watch(proc)` runs while the job runs."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir, truth = out / "run", out / "truth.jsonl"
    env = dict(os.environ, JOB_TRUTH=str(truth))
    args = [*prefix, *COUNTERPROF, "run", "--torch", "-q", "-o", str(run_dir), "--", *cmd]
    with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
        proc = subprocess.Popen(args, env=env, stdout=so, stderr=se)
        if watch is not None:
            watch(proc)
        proc.wait(timeout=240)
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


def allowed_verdicts(truth: dict[str, float]) -> set[str]:
    """The verdicts a true share-out allows: the leader when it leads by 20 points; the leader
    or unknown by 10 to 20; closer, the two leaders or unknown."""
    (top, a), (second, b) = sorted(truth.items(), key=lambda kv: kv[1], reverse=True)[:2]
    if a - b >= 0.2:
        return {top}
    return {top, "unknown"} if a - b >= 0.1 else {top, second, "unknown"}


def hold_to_truth(v: dict, truth: dict[str, float]) -> None:
    """A verdict's shares within TOLERANCE of the truth per class, its verdict allowed by it."""
    got = {"host": v["shares"].get("host", 0.0), "collectives": v["shares"].get("collectives", 0.0),
           "busy": busy(v["shares"])}
    for cls, want in truth.items():
        assert abs(got[cls] - want) <= TOLERANCE, \
            f"{v['scope']}: {cls} {got[cls]:.0%}, the job's own accounting {want:.0%} (shares {v['shares']})"
    assert verdict_class(v) in allowed_verdicts(truth), \
        f"{v['scope']}: verdict {v['verdict']} {v['undecided']}, truth {truth}"


def with_busy(**shares: float) -> dict[str, float]:
    """Host and collectives as measured; busy CPU the rest."""
    shares = {k: min(1.0, max(0.0, x)) for k, x in shares.items()}
    return {**shares, "busy": max(0.0, 1.0 - sum(shares.values()))}


def region(report: dict, *words: str) -> dict | None:
    return next((r for r in report["regions"] if all(w in r["name"] for w in words)), None)


class BusyLoop:
    """A process spinning on CPU `cpu` (as another job sharing a core would) until closed."""

    def __init__(self, cpu: int = 0):
        self.proc = subprocess.Popen(["taskset", "-c", str(cpu), PYTHON, "-c", "while True: pass"])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


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


def host_share(t: dict, *waits: str) -> float:
    """The job's main thread's host time over its wall: its own waits plus its run delay."""
    return (sum(t[w] for w in waits) + t["main_run_delay_s"]) / t["wall_s"]


# ---- 1. GPT-2 training that sleeps 40% of every step ------------------------------------------

@pytest.fixture(scope="module")
def gpt2_sleepy(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("gpt2_sleepy"), PYTHON, str(JOBS / "gpt2_train.py"),
                   "--steps", "30", "--sleep-share", "0.4")


@NEEDS_TRANSFORMERS
@pytest.mark.xfail(strict=False, reason=f"{XFAIL}: the sleep's host share is under-counted")
def test_gpt2_asleep_40pct_of_each_step_is_that_much_host(gpt2_sleepy):
    report, (t,), _ = gpt2_sleepy
    assert 0.3 <= t["sleep_s"] / t["loop_s"] <= 0.5, t        # the job did what it says
    hold_to_truth(report["overall"], with_busy(host=host_share(t, "sleep_s")))


@NEEDS_TRANSFORMERS
@pytest.mark.xfail(strict=False, reason=f"{XFAIL}: traced steps are also under-counted as host")
def test_gpt2_traced_steps_share_as_the_loop_does(gpt2_sleepy):
    report, (t,), _ = gpt2_sleepy
    steps = [r for r in report["regions"] if r["kind"] == "step"]
    assert steps and steps[0]["count"] >= 1, [r["name"] for r in report["regions"]]
    loop_host = (t["sleep_s"] + t["loop_run_delay_s"]) / t["loop_s"]
    hold_to_truth(steps[0]["verdict"], with_busy(host=loop_host))


# ---- 2. a DataLoader whose 2 workers tokenize in pure Python ----------------------------------

@pytest.fixture(scope="module")
def dataloader_bound(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("dataloader"), PYTHON, str(JOBS / "dataloader_bound.py"))


@pytest.mark.xfail(strict=False, reason=f"{XFAIL}: the workers' CPU hides the loop's wait for them")
def test_loop_waiting_for_its_dataloader_workers_is_host(dataloader_bound):
    report, (t,), _ = dataloader_bound
    assert t["next_wait_s"] > 0.5 * t["loop_s"], t            # input-bound by construction
    hold_to_truth(report["overall"], with_busy(host=host_share(t, "next_wait_s")))


@pytest.mark.xfail(strict=False, reason=f"{XFAIL}: time in DataLoader.__next__ is called busy CPU")
def test_the_dataloader_next_region_is_host(dataloader_bound):
    report, _, _ = dataloader_bound
    nxt = region(report, "DataLoader", "__next__")
    if nxt is None:
        pytest.skip("the torch trace holds no DataLoader __next__ span: " +
                    ", ".join(r["name"] for r in report["regions"]))
    # inside __next__ the loop only waits for a worker's batch (and unpickles it)
    assert nxt["verdict"]["verdict"] == "host", nxt["verdict"]
    assert nxt["verdict"]["shares"].get("host", 0.0) >= 0.7, nxt["verdict"]["shares"]


# ---- 3. the GPT-2 loop sharing its core with a busy process ----------------------------------

@pytest.fixture(scope="module")
def gpt2_contended(tmp_path_factory):
    watcher = RunDelayWatcher("gpt2_train.py")
    with BusyLoop(cpu=0):
        report, truth, run_dir = profile(
            tmp_path_factory.mktemp("gpt2_contended"),
            "taskset", "-c", "0", PYTHON, str(JOBS / "gpt2_train.py"), "--steps", "10", watch=watcher)
    return report, truth, run_dir, watcher


@NEEDS_TRANSFORMERS
@pytest.mark.xfail(strict=False, reason=f"{XFAIL}: run delay (CPU contention) is called busy CPU")
def test_gpt2_sharing_its_core_is_host_contention(gpt2_contended):
    report, (t,), _, watcher = gpt2_contended
    # the test's reading of /proc and the job's own agree (one thread, one kernel counter)
    assert abs(watcher.share - t["main_run_delay_s"] / t["wall_s"]) < 0.1, (watcher.share, t)
    assert watcher.share > 0.25, f"the busy loop did not contend: run delay {watcher.share:.0%}"
    o = report["overall"]
    hold_to_truth(o, with_busy(host=watcher.share))
    texts = " ".join(e["text"] for e in o["evidence"]).lower()
    assert "contention" in texts or "waiting for a cpu" in texts, o["evidence"]


# ---- 4. resnet-style inference: no optimizer, no step marks -----------------------------------

@pytest.fixture(scope="module")
def resnet_infer(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("resnet"), PYTHON, str(JOBS / "resnet_infer.py"), "--batches", "40")


def test_resnet_inference_is_busy_cpu(resnet_infer):
    report, (t,), _ = resnet_infer
    o = report["overall"]
    truth = with_busy(host=host_share(t))
    if truth["host"] > 0.35:
        pytest.skip(f"the machine is oversubscribed: the main thread waited {truth['host']:.0%} for a CPU")
    hold_to_truth(o, truth)


@pytest.mark.xfail(strict=False, reason="issue 10: without optimizer.step() nothing is traced")
def test_resnet_inference_without_step_marks_is_traced(resnet_infer):
    report, _, run_dir = resnet_infer
    import counterprof
    import pyarrow.compute as pc
    spans = counterprof.load(run_dir).table("spans")
    ops = pc.sum(pc.equal(spans["category"].cast("string"), "cpu_op")).as_py() if spans.num_rows else 0
    assert ops, f"--torch recorded no op of the inference loop (torch collector: {report['collectors']['torch']})"


@pytest.mark.xfail(strict=False, reason="issue 10: the torch collector says ok with 0 traces")
def test_torch_collector_never_says_ok_with_nothing_recorded(resnet_infer):
    report, _, run_dir = resnet_infer
    traced = any((run_dir / "rank=0" / "traces").glob("*")) if (run_dir / "rank=0" / "traces").exists() else False
    if not traced:
        assert report["collectors"]["torch"]["status"] != "ok", report["collectors"]["torch"]


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


def exposed_collectives(t: dict) -> float:
    return t["reducer_wait_s"] / t["wall_s"]


def check_ddp(report: dict, truth: list[dict]) -> None:
    assert sorted(t["rank"] for t in truth) == [0, 1], truth
    o = report["overall"]
    mean = sum(exposed_collectives(t) for t in truth) / len(truth)
    assert o["shares"].get("collectives", 0.0) <= mean + TOLERANCE, \
        f"collectives {o['shares'].get('collectives', 0):.0%}, the ranks waited {mean:.0%} for the reducer"
    assert o["verdict"] != "collectives", o
    by_rank = {int(v["scope"].split()[-1]): v for v in report["rank_verdicts"]}
    assert sorted(by_rank) == [0, 1], [v["scope"] for v in report["rank_verdicts"]]
    for t in truth:
        v = by_rank[t["rank"]]
        assert sum(v["shares"].values()) > 0.9, v            # the rank is not empty
        assert abs(v["shares"].get("collectives", 0.0) - exposed_collectives(t)) <= TOLERANCE, (v, t)


@NEEDS_DIST
@pytest.mark.xfail(strict=False, reason="issue 10: collectives are the union of every gloo span of all ranks")
def test_ddp_under_torchrun_collectives_are_a_minor_share(ddp_torchrun):
    report, truth, _ = ddp_torchrun
    check_ddp(report, truth)


@NEEDS_DIST
@pytest.mark.xfail(strict=False, reason="issue 10: ranks made by mp.spawn have no RANK: one rank seen")
def test_ddp_under_mp_spawn_has_both_ranks(ddp_spawn):
    report, truth, _ = ddp_spawn
    check_ddp(report, truth)


# ---- 6. two unchanged runs, one on a contended core: compare ------------------------------------

@pytest.fixture(scope="module")
def gpt2_alone(tmp_path_factory):
    """The contended run's command, run alone on its core."""
    return profile(tmp_path_factory.mktemp("gpt2_alone"),
                   "taskset", "-c", "0", PYTHON, str(JOBS / "gpt2_train.py"), "--steps", "10")


@NEEDS_TRANSFORMERS
@pytest.mark.xfail(strict=False, reason="issue 10: compare says REGRESSION; run delay only with --all")
def test_compare_of_unchanged_runs_names_the_contention(gpt2_alone, gpt2_contended):
    base, cand = gpt2_alone[2], gpt2_contended[2]
    assert gpt2_contended[3].share > 0.25, "the busy loop did not contend"
    out = run_cli("compare", str(base), str(cand))
    assert out.returncode == 0, out.stderr
    text = out.stdout.lower()
    assert "contention" in text or "waiting for a cpu" in text, out.stdout
    gate = run_cli("compare", "--fail-on-regression", str(base), str(cand))
    assert gate.returncode == 0, f"the gate failed on an unchanged job on a contended core:\n{gate.stdout}"
