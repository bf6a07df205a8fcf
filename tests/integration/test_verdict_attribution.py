"""Where the time of a step goes, held to jobs that time their own phases (tests/jobs/):
Python on the main thread between torch ops is host, however busy the CPU was; a region is
judged by what ran inside it; the headline is the steps', with start-up apart; no share can
exceed the whole.

The job's truth: it times its tokenization and its model's part (forward, backward, AdamW)
with perf_counter around each, every step. Tokenization is pure Python (no torch op), so all
of it is host; the model's part holds every torch op, so compute|memory can be at most its
share (the rest of it is the framework's Python between ops: host too, which the job cannot
time apart, so host is bounded below by tokenization and compute|memory above by the model).
"""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers import COUNTERPROF, PYTHON, REPO, free_port, run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is not installed (pip install -e .[test])")
pytestmark = pytest.mark.slow

JOBS = REPO / "tests" / "jobs"
TOLERANCE = 0.15         # the band: shares within 15 points of the job's own accounting
BUSY = ("compute", "memory", "compute|memory")


def profile(out: Path, *job_args: str) -> tuple[dict, dict, str]:
    out.mkdir(parents=True, exist_ok=True)
    run_dir, truth = out / "run", out / "truth.jsonl"
    env = dict(os.environ, JOB_TRUTH=str(truth))
    args = [*COUNTERPROF, "run", "--torch", "-q", "-o", str(run_dir), "--",
            PYTHON, str(JOBS / "gpt2_tokenize.py"), *job_args]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    text = run_cli("report", str(run_dir))
    assert text.returncode == 0, text.stderr
    (t,) = [json.loads(ln) for ln in truth.read_text().splitlines()]
    return json.loads(rep.stdout), t, text.stdout


@pytest.fixture(scope="module")
def tokenize_in_loop(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("tokenize"), "--steps", "30", "--region")


@pytest.fixture(scope="module")
def tokenize_unmarked(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("tokenize_plain"), "--steps", "30")


def busy(shares: dict) -> float:
    return sum(shares.get(k, 0.0) for k in BUSY)


def region(report: dict, name: str) -> dict:
    found = [r for r in report["regions"] if r["name"] == name]
    assert found, [r["name"] for r in report["regions"]]
    return found[0]


def assert_can_exist(v: dict) -> None:
    """Every share in [0, 1], the shares adding up to the whole at most, the host's parts
    adding up to the host share."""
    shares = v["shares"]
    assert all(0.0 <= s <= 1.0 for s in shares.values()), shares
    assert sum(shares.values()) <= 1.0 + 1e-6, shares
    if v["host_parts"]:
        assert sum(v["host_parts"].values()) == pytest.approx(shares.get("host", 0.0), abs=1e-4), v


def phase_truth(t: dict) -> dict:
    """From the job's clock, shares of its loop: host at least (tokenization, and the model's
    part's run delay: a busy machine's), compute|memory at most (the model's part on a CPU)."""
    loop = t["loop_s"]
    return {"host_min": (t["tokenize_s"] + t["model_run_delay_s"]) / loop,
            "busy_max": (t["model_s"] - t["model_run_delay_s"]) / loop,
            "tokenize": t["tokenize_s"] / loop}


@pytest.mark.parametrize("fixture", ["tokenize_in_loop", "tokenize_unmarked"])
def test_python_tokenization_in_the_step_is_host(fixture, request):
    report, t, _ = request.getfixturevalue(fixture)
    truth = phase_truth(t)
    o = report["overall"]
    assert o["scope"] == "steps", o["scope"]    # the headline is the steps', not the imports
    assert o["shares"]["host"] >= truth["host_min"] - TOLERANCE, (o["shares"], truth, t)
    assert busy(o["shares"]) <= truth["busy_max"] + TOLERANCE, (o["shares"], truth, t)
    assert_can_exist(o)
    # tokenization is most of the loop by construction (12k words a document in Python); on a
    # machine busy enough to slow the model's part past it, host still leads through the
    # model's run delay, which the bounds above hold
    assert truth["host_min"] >= 0.6, t
    assert o["verdict"] == "host", (o["verdict"], o["shares"], truth)
    # tokenization on a CPU is Python outside ops (the part of it spent runnable without a CPU
    # is contention, which the job measured too)
    tok_on_cpu = (t["tokenize_s"] - t["tokenize_run_delay_s"]) / t["loop_s"]
    parts = o["host_parts"]
    assert parts.get("Python outside torch ops", 0.0) >= tok_on_cpu - TOLERANCE, (parts, tok_on_cpu, t)
    # the advice follows the host's leading part: that Python (not tensor cores), or on a
    # machine this busy, the CPUs it waited for
    lead = max(parts, key=parts.get)
    words = {"Python outside torch ops": "tokeniz", "CPU contention": "other processes",
             "oversubscribed by its own threads": "OMP_NUM_THREADS"}
    assert lead in words, parts
    assert report["next_steps"] and words[lead] in report["next_steps"][0], (lead, report["next_steps"])


def test_the_evidence_says_where_the_host_time_went(tokenize_in_loop):
    report, _, text = tokenize_in_loop
    ev = [e for e in report["overall"]["evidence"] if e["metric"] == "main_in_ops"]
    assert ev, report["overall"]["evidence"]
    assert "outside torch ops" in ev[0]["text"] and "tokenize" in ev[0]["text"], ev[0]["text"]
    # the user's region that held it comes first
    after = ev[0]["text"].split("of that time, ", 1)[1]
    assert after.startswith("tokenize"), ev[0]["text"]
    assert "judged over its steps" in text and "start-up" in text, text[:2000]


def test_without_regions_the_sampled_python_stack_says_where(tokenize_unmarked):
    """No region, no record_function: the main thread's sampled Python stack names the
    function that held the time outside ops, at its hottest line, with its share of it."""
    report, t, _ = tokenize_unmarked
    ev = [e for e in report["overall"]["evidence"] if e["metric"] == "main_in_ops"]
    assert ev, report["overall"]["evidence"]
    after = ev[0]["text"].split("of that time, ", 1)[1]
    m = re.match(r"tokenize \(gpt2_tokenize\.py:(\d+)\) (\d+)%", after)
    assert m, ev[0]["text"]
    # the job's tokenization on its own clock against the time outside ops it leads: it is most
    # of the loop (truth) and so most of that time
    line = int(m.group(1))
    src = (JOBS / "gpt2_tokenize.py").read_text().splitlines()
    start = next(i for i, ln in enumerate(src, 1) if ln.startswith("def tokenize("))
    end = next(i for i, ln in enumerate(src, 1) if i > start and ln.startswith("def "))
    assert start < line < end, (line, start, end)           # a line of that function
    assert int(m.group(2)) >= 50, (after, t["tokenize_s"] / t["loop_s"])


def test_each_region_is_judged_by_what_ran_inside_it(tokenize_in_loop):
    report, t, _ = tokenize_in_loop
    tok = region(report, "tokenize")["verdict"]
    assert tok["verdict"] == "host", tok
    assert tok["shares"]["host"] >= 0.85, tok["shares"]       # no torch op runs in it
    model = region(report, "model")["verdict"]
    # the model's part holds the ops: judged by them and its own run delay, not the run's ratio
    delay, tok_delay = t["model_run_delay_s"] / t["model_s"], t["tokenize_run_delay_s"] / t["tokenize_s"]
    assert busy(model["shares"]) <= 1 - delay + TOLERANCE, (model["shares"], delay)
    # and busier than the tokenization by 20 points of each region's time on a CPU (its own
    # clock less its run delay, which is host in either region): on a quiet machine 20 points
    # of the region; on a loaded one, where the model's part waited 80% of its time for a CPU
    # (load 6, 2026-12-07: busy 19%, the rest host as contention), 20 points of what is left.
    # Judged by the run's ratio instead, both regions would be as busy per second on a CPU.
    on_cpu, tok_on_cpu = 1 - delay, 1 - tok_delay
    assert busy(model["shares"]) >= on_cpu * (busy(tok["shares"]) / tok_on_cpu + 0.2), \
        (model["shares"], tok["shares"], delay, tok_delay)
    for r in report["regions"]:
        assert_can_exist(r["verdict"])


def test_start_up_is_its_own_line(tokenize_in_loop):
    report, t, _ = tokenize_in_loop
    phases = {p["scope"]: p for p in report["phases"]}
    assert "start-up" in phases, report["phases"]
    # torch marks a step at each optimizer.step(): the first step ends where the job's first
    # loop iteration does, so start-up ends between the job's first and second iterations
    (first, _, _, _), (second, _, _, _) = t["step_log"][:2]
    end = phases["start-up"]["end_ns"]
    assert first - 0.3e9 <= end <= second + 0.3e9, (end, first, second)


# ---- DDP over gloo whose gradient sync is the cost ----------------------------------------------

def ddp_truth(lines: list[dict]) -> float:
    """The collectives' share of the loop by the job's own no_sync() comparison, over ranks."""
    assert len(lines) == 2, lines
    return sum(t["collectives_s"] / t["loop_s"] for t in lines) / len(lines)


def profile_ddp(out: Path, launcher: str) -> tuple[dict, list[dict]]:
    out.mkdir(parents=True, exist_ok=True)
    run_dir, truth = out / "run", out / "truth.jsonl"
    env = dict(os.environ, JOB_TRUTH=str(truth))
    job = str(JOBS / "ddp_big_grads.py")
    cmd = ([str(Path(PYTHON).parent / "torchrun"), "--standalone", "--nproc_per_node", "2", job]
           if launcher == "torchrun" else [PYTHON, job, "--spawn", "2", "--port", str(free_port())])
    proc = subprocess.run([*COUNTERPROF, "run", "--torch", "-q", "-o", str(run_dir), "--", *cmd],
                          env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    return json.loads(rep.stdout), [json.loads(ln) for ln in truth.read_text().splitlines()]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
# The collectives' share includes what the sync costs inside the main thread's own ops
# (analysis/comm_cost.py): before it, on a quiet machine (CI, 2026-12-06) the job's no_sync truth
# was 44-49% and the collectives 29-36%.
@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_ddp_whose_gradient_sync_costs_a_third_is_collectives(launcher, tmp_path):
    report, lines = profile_ddp(tmp_path, launcher)
    truth = ddp_truth(lines)
    assert truth >= 0.2, lines         # by construction: 67 MB of gradients for a batch of 4 rows
    o = report["overall"]
    got = o["shares"].get("collectives", 0.0)
    assert abs(got - truth) <= TOLERANCE, (o["shares"], truth, o["host_parts"])
    assert_can_exist(o)
    # the job's own threads are not "other processes"
    ev = " ".join(e["text"] for e in o["evidence"])
    if o["host_parts"].get("CPU contention", 0.0) >= 0.05:
        assert "other processes" in ev, ev
    # the verdict follows the job's own truth, unless other processes held the machine (then that
    # is said, with figures): the sync is about half of this job's loop (44-49% on a quiet
    # machine) and the ops the rest, so collectives lead by the 10-point margin only where the
    # job says they do; on a near tie the verdict is collectives or unknown, never another class
    # "collectives" is owed only where the job's own lead of the sync over the rest survives the
    # shares' allowed error: a lead of the verdict's 10-point margin plus TOLERANCE (truth 0.625);
    # at truth 0.558 the report's 0.48 against 0.45 (within 15 points of the truth) was a near tie
    others = o["host_parts"].get("CPU contention", 0.0)
    if others < 0.1:
        if 2 * truth - 1 >= 0.10 + TOLERANCE:
            assert o["verdict"] == "collectives", (o["verdict"], o["shares"], truth)
        else:
            assert o["verdict"] in ("collectives", "unknown"), (o["verdict"], o["shares"], truth)
