"""The workers are judged, not the launcher (collectors/threads.py: a process that only waits for
its children gives way to them). A real `torch.multiprocessing.spawn` job (tests/jobs/spawn_ranks.py:
each rank multiplies matrices, the parent only joins) profiled WITHOUT --torch: nothing announces
its ranks and no rank is in any environment. Its critical threads must be the ranks' main threads
(meta.json's threads main names them, with the parent as their launcher), their rows their own
states (held to each rank's own schedstat over its compute window), and the report must not judge
the job by the parent's wait ("host-bound, blocked 81%" before). A process that computes while
its child idles stays the critical one."""
import json
import os

import pytest

from helpers import PYTHON, run_cli
from thread_runs import JOBS, frame, in_window, profile_cli

SPAWN = str(JOBS / "spawn_ranks.py")
STATES = ("thread.main.running", "thread.main.runnable", "thread.main.blocked")


def _env(tmp_path):
    return {**os.environ, "JOB_TRUTH": str(tmp_path / "truth.jsonl")}


def _check_ranks_are_the_critical_threads(run, out):
    parent, ranks = out["pid"], out["ranks"]
    assert len(ranks) == 2 and {r["pid"] for r in ranks}.isdisjoint({parent})
    main = run.meta["collectors"]["threads"]["main"]
    for r in ranks:
        chosen = [m for m in main if m["pid"] == r["pid"]]
        assert chosen and chosen[0]["tid"] == r["tid"] and chosen[0]["launcher"] == parent, main
    t = frame(run)
    entities = set(t[t["metric"].isin(STATES)]["entity"])
    assert {f"tid:{r['tid']}" for r in ranks} <= entities
    for r in ranks:
        mine = t[t["entity"] == f"tid:{r['tid']}"]
        _inside, sums, covered = in_window(mine, r)
        assert covered > 0.6 * (r["t1"] - r["t0"]) / 1e9, covered
        share = {m.split(".")[-1]: sums[m] / covered for m in STATES}
        assert abs(sum(share.values()) - 1) <= 0.02, share
        assert share["blocked"] <= 0.05, (share, r)
        assert abs(share["running"] - r["run_share"]) <= 0.10, (share, r)
        assert abs(share["runnable"] - r["wait_share"]) <= 0.10, (share, r)
        # while the ranks compute, the parent is not the critical thread
        parent_rows = t[(t["entity"] == f"tid:{parent}") & (t["start"] >= r["t0"]) & (t["end"] <= r["t1"])]
        assert parent_rows.empty, parent_rows[["metric", "value"]].head()
    return t


def _report(run_dir):
    proc = run_cli("report", "--json", str(run_dir), timeout=240)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["overall"]


def test_torch_spawn_ranks_are_judged_without_torch(run_dir, tmp_path):
    pytest.importorskip("torch")
    run, out = profile_cli(run_dir, PYTHON, SPAWN, "2.5", "2", collectors="threads,perf,host", env=_env(tmp_path))
    assert run.meta["collectors"]["threads"]["main_reads"] == "perf sampler tick"
    _check_ranks_are_the_critical_threads(run, out)
    overall = _report(run_dir)
    blocked = (overall.get("host_parts") or {}).get("blocked", 0.0)
    # the ranks never block: whatever the verdict (contention, on a busy machine), not the parent's wait
    assert blocked <= 0.15, overall
    assert not (overall["verdict"] == "host" and blocked >= max(overall["host_parts"].values())), overall


def test_a_shell_around_a_multiprocessing_job_whose_parent_joins(run_dir, tmp_path):
    pytest.importorskip("torch")
    run, out = profile_cli(run_dir, "sh", "-c", f"{PYTHON} {SPAWN} 2 2 --mp; true", collectors="threads",
                           env=_env(tmp_path))
    assert run.meta["collectors"]["threads"]["main_reads"] == "own thread"
    _check_ranks_are_the_critical_threads(run, out)


COMPUTES_BESIDE_AN_IDLE_CHILD = r"""
import json, os, subprocess, threading, time
child = subprocess.Popen(["sleep", "30"])
t0 = time.monotonic_ns()
slept = 0
while time.monotonic_ns() - t0 < 2.5e9:      # half computing, half sleeping: no wait for the child
    end = time.monotonic() + 0.05
    while time.monotonic() < end:
        pass
    s = time.monotonic_ns()
    time.sleep(0.05)
    slept += time.monotonic_ns() - s
t1 = time.monotonic_ns()
child.kill(); child.wait()
print(json.dumps({"pid": os.getpid(), "child": child.pid, "t0": t0, "t1": t1, "sleep_share": slept / (t1 - t0)}),
      flush=True)
"""


def test_a_process_that_works_while_its_child_idles_stays_the_critical_one(run_dir):
    run, w = profile_cli(run_dir, PYTHON, "-c", COMPUTES_BESIDE_AN_IDLE_CHILD, collectors="threads")
    main = run.meta["collectors"]["threads"]["main"]
    assert {m["pid"] for m in main} == {w["pid"]} and not any("launcher" in m for m in main), main
    t = frame(run)
    _inside, sums, covered = in_window(t[t["entity"] == f"tid:{w['pid']}"], w)
    assert covered > 2.0
    # its own states: blocked is its sleep (on a busy machine its computing half is part runnable)
    assert abs(sums["thread.main.blocked"] / covered - w["sleep_share"]) <= 0.10, (sums, w)
    assert sums["thread.main.running"] / covered >= 0.1
    assert set(t[t["metric"].isin(STATES)]["entity"]) == {f"tid:{w['pid']}"}
