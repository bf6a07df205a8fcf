"""A real 2-rank gloo job through torchrun under `counterprof run --torch`: one partition per
rank with its own perf, host and torch data, per-rank verdicts, and the straggler found."""
import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

import counterprof
from counterprof.analysis.compare import THRESHOLD
from helpers import EXAMPLES, PYTHON, REPO, run_cli, rank_files, journal_dir

torch = pytest.importorskip("torch")
TORCHRUN = Path(PYTHON).parent / "torchrun"


def torchrun_gloo(run_dir, slow_ms):
    """20 steps of examples/gloo_allreduce.py on 2 ranks; rank 1 sleeps slow_ms in each."""
    if not TORCHRUN.exists():
        pytest.skip("torchrun is not installed next to this interpreter")
    # --standalone: torchrun picks a free port itself (the default 29500 may be taken)
    proc = run_cli("run", "-q", "--torch", "--torch-window", "10/20", "-o", str(run_dir), "--",
                   str(TORCHRUN), "--standalone", "--nproc_per_node", "2",
                   str(EXAMPLES / "gloo_allreduce.py"), "20", str(slow_ms), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("mr") / "r"
    return run_dir, torchrun_gloo(run_dir, 40)


def test_each_rank_has_its_own_partition(straggler_run):
    run_dir, proc = straggler_run
    run = counterprof.load(run_dir)
    assert run.ranks() == [0, 1]
    meta = run.meta
    assert meta["per_rank"] is True
    assert set(meta["ranks"]) == {"0", "1"}
    assert meta["ranks"]["0"]["pid"] != meta["ranks"]["1"]["pid"]
    assert meta["ranks"]["0"]["world_size"] == meta["ranks"]["1"]["world_size"] == 2
    assert meta["ranks"]["1"]["collectors"]["perf"]["status"] == "ok"
    for r in (0, 1):
        s = run.samples(rank=r)
        metrics = set(s["metric"].cast("string").to_pylist())
        assert {"task-clock", "proc.rss"} <= metrics
        tc = s.filter(pc.equal(s["metric"].cast("string"), "task-clock"))
        assert set(tc["entity"].cast("string").to_pylist()) == {"process"}
        assert pc.sum(tc["value"]).as_py() > 0.2e9        # each rank's own CPU, not the sum
        spans = run.table("spans", rank=r)
        assert spans.filter(pc.equal(spans["category"].cast("string"), "collective")).num_rows > 0
    # the unsupported events are said once, not once per rank
    assert proc.stderr.count("<not supported> here") <= 1


def test_report_finds_the_straggler_and_gives_a_verdict_per_rank(straggler_run):
    run_dir, _ = straggler_run
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    assert [v["scope"] for v in r["rank_verdicts"]] == ["rank 0", "rank 1"]
    # rank 0 waits in all_reduce for the straggler: more of its time is collectives than rank 1's;
    # over the whole run torch's start-up is most of a 20-step job, so the steps say collectives
    v0, v1 = r["rank_verdicts"]
    assert v0["shares"]["collectives"] > v1["shares"]["collectives"] + 0.05, (v0, v1)
    step = next(g for g in r["regions"] if g["kind"] == "step")
    assert step["verdict"]["verdict"] == "collectives", step
    ra = r["rank_analysis"]
    assert ra["straggler"] == 1 and ra["steps"] >= 8
    ranks = {f["rank"]: f for f in ra["ranks"]}
    assert ranks[1]["slowest_in"] >= 0.8 * ra["steps"]
    assert ranks[0]["waited_s_per_step"] == pytest.approx(0.040, rel=0.5)
    assert any("rank 1 is the straggler" in e["text"] for e in r["overall"]["secondary"])
    text = run_cli("report", str(run_dir))
    assert "ranks (per step" in text.stdout and "1 ◀" in text.stdout


def test_export_and_compare_of_the_torchrun_job(straggler_run, tmp_path):
    """The chain a user runs on a regression: export the slow job's timeline, compare it with a
    baseline (rank 1 not sleeping); two unchanged reruns of it compare as unchanged."""
    from perfetto_check import check
    slow, _ = straggler_run
    out = tmp_path / "t.json.gz"
    proc = run_cli("export", str(slow), "--perfetto", str(out))
    assert proc.returncode == 0, proc.stderr
    trace = check(out)
    assert sorted(trace.processes.values()) == ["rank 0", "rank 1"]
    for rank in (0, 1):    # each rank's own counters, on its own process
        assert any("task-clock" in n for n in trace.counter_names(trace.process(f"rank {rank}")))

    base = tmp_path / "base"
    torchrun_gloo(base, 0)
    refused = run_cli("compare", str(base), str(slow))         # the commands differ in SLOW_MS
    assert refused.returncode == 2 and "--force" in refused.stderr
    proc = run_cli("compare", str(base), str(slow), "--force", "--json", "--fail-on-regression")
    assert proc.returncode == 1, proc.stderr
    rows = {(r["key"], r["rank"]): r for r in json.loads(proc.stdout)["rows"]}
    assert rows[("step_time", None)]["status"] == "regression"
    assert rows[("step_time", None)]["change"] > 0.05
    # An unchanged rerun is not flagged. The job above is a poor subject for that: its 32 MB
    # all_reduce is CPU-bound, and on this shared 2-core VM identical runs' median steps differ
    # by up to ~20% (10 traced steps each). A sleep-bound gloo job (tests/step_workloads.py: a
    # 100 ms sleep and a 4 KB all_reduce per step, 2 ranks through torchrun; the all_reduce's
    # 1-2 ms of jitter is then ~1% of a step) is steady enough for the default 3% threshold.
    runs = []
    for name in ("steady", "steady-rerun"):
        runs.append(tmp_path / name)
        proc = run_cli("run", "-q", "-o", str(runs[-1]), "--", str(TORCHRUN), "--standalone",
                       "--nproc_per_node", "2",
                       str(REPO / "tests" / "step_workloads.py"), "gloo", "30", "100", timeout=300)
        assert proc.returncode == 0, proc.stderr
    # (the all_reduce region itself, a 1-3 ms wait for the other rank, swings by milliseconds
    # with scheduling from run to run: it is not held here)
    proc = run_cli("compare", *map(str, runs), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {(r["key"], r["rank"]): r for r in json.loads(proc.stdout)["rows"]}
    for key, name in (("step_time", "step"), ("region:work", "work")):
        # "steady enough" is the premise, held on the job's own clock (its step and region
        # marks): where each rerun pins its median to within half the threshold, the interval
        # of the change between them lies inside it and the row must say unchanged (quiet, the
        # steps' median to 0.3-0.7%). On a loaded machine the all_reduce's wait for the other
        # rank (woken late from its sleep) lengthens about half the steps by 1-12 ms (2026-12-07,
        # two busy loops: steps of 101-113 ms, the median at the knee between the two, pinned
        # to 2.5-3.6% only): the interval then reaches past 3% (-0.9% [-4.5%, +2.4%]) and
        # inconclusive is the true answer; flagged, never
        width = max(_median_width(r, name) for r in runs)
        allowed = {"unchanged"} if width < THRESHOLD / 2 else {"unchanged", "inconclusive"}
        assert rows[(key, None)]["status"] in allowed, (rows[(key, None)], f"median pinned to {width:.1%}")
        # each rank's own row has half the job's steps: its interval can straddle the threshold
        # on a busy 2-core machine (CI, 2026-12-05: rank 1's step_time), and then it says
        # inconclusive; never flagged either way
        for rank in (0, 1):
            assert rows[(key, rank)]["status"] in ("unchanged", "inconclusive"), rows[(key, rank)]


def _median_width(run_dir, name: str) -> float:
    """How well one run pins the median of its times of the region `name` (all ranks), on the
    job's own clock (its region marks): the width of the median's distribution-free 95%
    interval (the order statistics n/2 -+ 0.98 sqrt(n)) over the median."""
    spans = counterprof.load(run_dir).table("spans")
    spans = spans.filter(pc.equal(spans["name"], name))
    ns = pc.subtract(spans["end"].cast("int64"), spans["start"].cast("int64")).to_numpy()
    assert len(ns) >= 10, (run_dir, name, len(ns))
    k = 100 * 0.98 / np.sqrt(len(ns))
    lo, mid, hi = np.percentile(ns, [50 - k, 50, 50 + k])
    return (hi - lo) / mid


def test_per_rank_without_ranks_says_so(tmp_path):
    proc = run_cli("run", "-q", "--per-rank", "-o", str(tmp_path / "r"), "--", "true")
    assert proc.returncode == 0
    assert "no process of the workload named a rank" in proc.stderr


def _rank_script(run_dir, seconds, events="task-clock"):
    return (f"import counterprof, time\n"
            f"with counterprof.profile(events={events!r}, interval_ms=10, path={str(run_dir)!r}):\n"
            f"    with counterprof.region('work'):\n"
            f"        end = time.time() + {seconds}\n"
            f"        while time.time() < end: pass\n")


def test_context_managers_of_one_job_share_a_run(tmp_path):
    import os
    import subprocess
    run_dir = tmp_path / "shared"
    procs = []
    for rank in range(3):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="3", COUNTERPROF_JOB="job-42")
        procs.append(subprocess.Popen([PYTHON, "-c", _rank_script(run_dir, 0.5)], env=env,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    run = counterprof.load(run_dir)
    assert run.ranks() == [0, 1, 2]
    assert (run_dir / ".job").read_text().strip() == "job-42"
    creator = run.meta["rank"]
    for r in range(3):
        m = run.rank_meta(r)
        assert m["rank"] == r and m["job"] == "job-42" and m["status"] == "complete"
        assert (rank_files(run_dir, r) / "meta.json").exists() == (r != creator)
        assert run.samples(rank=r).num_rows > 0
        assert not list(journal_dir(run_dir, r).glob("*")), "every rank compacted its own journal"
    assert "task-clock" in run.catalog
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    assert len(json.loads(rep.stdout)["rank_verdicts"]) == 3


def test_ranks_with_different_metric_sets_are_named(tmp_path):
    import os
    import subprocess
    run_dir = tmp_path / "mixed"
    procs = []
    for rank, events in ((0, "task-clock,page-faults"), (1, "task-clock")):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", COUNTERPROF_JOB="job-mixed")
        procs.append(subprocess.Popen([PYTHON, "-c", _rank_script(run_dir, 0.3, events)], env=env,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    assert len(r["rank_verdicts"]) == 2
    assert any(n.startswith("rank 1 lacks page-faults") for n in r["rank_notes"]), r["rank_notes"]
    assert "rank 1 lacks page-faults" in run_cli("report", str(run_dir)).stdout


def test_a_rank_missing_from_the_job_is_named(tmp_path):
    import os
    import subprocess
    run_dir = tmp_path / "half"
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", COUNTERPROF_JOB="job-half")   # rank 1 never came
    p = subprocess.run([PYTHON, "-c", _rank_script(run_dir, 0.2)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    notes = json.loads(rep.stdout)["rank_analysis"]["notes"]
    assert any("ranks missing from this run: 1" in n for n in notes), notes


def test_a_run_of_another_job_is_not_joined(tmp_path):
    import os
    import subprocess
    run_dir = tmp_path / "taken"
    for job, expect in (("job-a", 0), ("job-b", 1)):
        env = dict(os.environ, RANK="0", WORLD_SIZE="2", COUNTERPROF_JOB=job)
        p = subprocess.run([PYTHON, "-c", _rank_script(run_dir, 0.1)], env=env, capture_output=True, text=True)
        assert p.returncode == expect, p.stderr
    assert "already holds a run of another job (job-a)" in p.stderr


def test_merge_runs_of_two_hosts(tmp_path):
    """Two single-rank runs stand in for two hosts of one job (rank 0 here, rank 1 'there')."""
    import os
    import subprocess
    parts = []
    for rank in (0, 1):
        run_dir = tmp_path / f"host{rank}"
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", COUNTERPROF_JOB=f"node{rank}")
        p = subprocess.run([PYTHON, "-c", _rank_script(run_dir, 0.2)], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        meta = json.loads((run_dir / "meta.json").read_text())
        meta["host"]["hostname"] = f"node{rank}"        # as if recorded on another machine
        (run_dir / "meta.json").write_text(json.dumps(meta))
        parts.append(run_dir)
    out = tmp_path / "merged"
    proc = run_cli("merge", *map(str, parts), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "merged 2 ranks from 2 runs on 2 host(s)" in proc.stderr
    run = counterprof.load(out)
    assert run.ranks() == [0, 1] and run.meta["status"] == "merged"
    assert run.rank_meta(1)["host"]["hostname"] == "node1"
    assert run.samples(rank=1).num_rows > 0
    assert run_cli("report", str(out)).returncode == 0
    again = run_cli("merge", str(parts[0]), str(parts[0]), "-o", str(tmp_path / "dup"))
    assert again.returncode == 2 and "rank 0 is in both" in again.stderr
