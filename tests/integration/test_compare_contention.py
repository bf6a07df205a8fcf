"""compare on a contended machine, with real runs: the same CPU-bound step workload profiled
twice, unchanged, both pinned to CPU 0 (`taskset -c 0`), the second while two busy loops pinned
to CPU 0 hold that CPU two thirds of the time. Its main thread waits for a CPU ~2/3 of its steps
against a few %; the gate must say the machine explains the longer steps, not fail without
--strict, and fail with it.

The workload keeps its own account of each step's CPU time (CLOCK_THREAD_CPUTIME_ID around it),
so what compare says is left with the wait taken out is held to what the job measured of itself:
on this shared VM the CPU time of the same work moves between two runs a minute apart (the vCPU's
speed), and the test must tell that from compare's own error, not widen a band to hide either.
"""
import json
import os
import shutil
import statistics
import subprocess
import textwrap
import time

import pytest

from helpers import PYTHON, run_cli

# 30 steps of a fixed Python loop (~25 ms alone here): CPU-bound, so a shared CPU lengthens them.
# Each step's wall time and CPU time (the thread's own clock) go to $STEP_TIMES as JSON pairs.
WORKLOAD = textwrap.dedent("""
    import json, os, sys, time
    import counterprof
    n, iters, steps = int(sys.argv[1]), int(sys.argv[2]) * 1000, []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        with counterprof.region("step", category="step"):
            with counterprof.region("compute"):
                x = 0
                for i in range(iters):
                    x += i * i
        steps.append((time.perf_counter() - t0, time.thread_time() - c0))
    with open(os.environ["STEP_TIMES"], "w") as f:
        json.dump(steps, f)
""")
COMMAND = ["taskset", "-c", "0", PYTHON, "-c", WORKLOAD, "30", "500"]
# Two loops leave the workload a third of CPU 0: a wait of ~2/3 of its steps implies +190% step
# time or so, and contention explains the change while what is left with the wait taken out is
# under half of that (contention_unexplained_share): the job's CPU time per step may move by up to
# ~1.9x before the gate may fail. (One loop implies ~+100%: a VM slower by 1.5x between the runs
# would leave the change "partly" explained, a real regression's look.)
CONTENDERS = 2
# What compare reads against the job's own clocks (the steps' wall time by perf_counter, their CPU
# time by the thread's CPU clock). Measured on this project's 2-core VM shared with other jobs
# (load average 4.5-7.1), 38 pairs of runs as the fixture makes them, 2026-12-06: the median step
# within 1.3% of the job's (STEP_MEDIAN 3%); each side's wait for a CPU within 0.75 points of
# 1 - CPU time / wall time (WAIT_POINTS 2 points); the change left with the wait taken out within
# -2.2..+3.2 points of the same formula on the job's own figures (ADJUSTED_VS_OWN 6 points: with
# the steps waiting 67-87% there, a point of wait is 3-8% of what is left; beside a baseline
# alone, wait ~5% against ~67%, it is ~3%). Over the same pairs the change left itself ranged
# -42%..+83% (the VM's speed per CPU-second moved between the runs, and the job's own CPU time
# per step with it): no band on it could be held, so none is; it is held to the job's clocks.
STEP_MEDIAN = 0.03
WAIT_POINTS = 0.02
ADJUSTED_VS_OWN = 0.06

pytestmark = [
    pytest.mark.required,
    pytest.mark.skipif(shutil.which("taskset") is None or 0 not in os.sched_getaffinity(0),
                       reason="needs taskset (util-linux) and CPU 0"),
]


def profile(path):
    env = dict(os.environ, STEP_TIMES=str(path) + ".steps.json")
    proc = run_cli("run", "-q", "-I", "10", "-o", str(path), "--", *COMMAND, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return path


class Own:
    """The job's own account of its steps: median wall time, and the share of the steps' time its
    main thread did not have a CPU (1 - CPU time / wall time: it never blocks)."""

    def __init__(self, path):
        steps = json.loads((path.parent / (path.name + ".steps.json")).read_text())
        self.median = statistics.median(w for w, _ in steps)
        self.wait = 1 - sum(c for _, c in steps) / sum(w for w, _ in steps)
        self.cpu = statistics.median(c for _, c in steps)


def own_adjusted(base: Own, cand: Own) -> float:
    """compare's change with the wait taken out, from the job's own clocks."""
    return cand.median * (1 - cand.wait) / (base.median * (1 - base.wait)) - 1


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("contention")
    base = profile(d / "base")
    busy = [subprocess.Popen(["taskset", "-c", "0", PYTHON, "-c", "while True: pass"])
            for _ in range(CONTENDERS)]
    try:
        time.sleep(0.2)                     # running before the candidate starts
        cand = profile(d / "busy")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return {"base": base, "busy": cand}


def test_the_contended_run_is_explained_by_the_machine_and_the_gate_passes(runs):
    """Measured here (the 38 pairs above): the gate passed on 36; the other 2 came at load average
    6.5-7, where the baseline itself waited 71-72% for a CPU, so the added wait implied only
    +50-65% and the job's own clocks left +36-42% of it: "partly", as the same formula on the
    job's figures says. That is a baseline that did not run alone, not this construction; the
    failure message gives the job's own figures to tell."""
    gate = run_cli("compare", str(runs["base"]), str(runs["busy"]), "--fail-on-regression")
    b, c = Own(runs["base"]), Own(runs["busy"])
    assert gate.returncode == 0, (f"the job's own CPU time per step moved {c.cpu / b.cpu - 1:+.0%} (its steps "
                                  f"waited {b.wait:.0%} -> {c.wait:.0%})\n" + gate.stdout + gate.stderr)
    out = gate.stdout
    assert "REGRESSION" not in out
    (machine,) = [x for x in out.splitlines() if x.startswith("machine: ")]    # by default, no --all
    assert "the machine was busier for the candidate" in machine
    assert "contention explains step time" in machine and "--strict does" in machine
    (step,) = [x for x in out.splitlines() if x.startswith("step time")]
    assert "slower (machine)" in step and "contention explains this" in step
    assert "regression(s) that contention on the machine explains: not failing" in gate.stderr
    assert "flagged" not in gate.stderr


def test_the_figures_behind_it(runs):
    proc = run_cli("compare", str(runs["base"]), str(runs["busy"]), "--json")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    m = j["machine"]
    # the threads collector is on by default
    assert m["scope"] == "step_time" and m["candidate"]["wait_source"] == "thread.main.runnable"
    wb, wc = m["baseline"]["waits"]["step_time"], m["candidate"]["waits"]["step_time"]
    # two always-runnable loops on CPU 0 take at least two thirds of it from the workload, whatever
    # else runs there (0.6: a margin under 2/3 for the wait's sampling); the baseline waits only
    # as long as other load on this machine makes it
    assert wc > 0.6 and wc - wb > 0.05, (wb, wc)
    assert m["own_change"] < 0                    # the workload got less CPU, not more
    assert m["moved"] is True
    step = next(r for r in j["rows"] if r["key"] == "step_time")
    assert step["status"] == "regression" and step["contention"] == "explains", step
    # with the wait taken out each side is its step time x (1 - wait): the change left is the
    # change in the time the main thread did not wait for a CPU ...
    b, c = step["base_median"] * (1 - step["wait"][0]), step["cand_median"] * (1 - step["wait"][1])
    assert step["adjusted_change"] == pytest.approx(c / b - 1, abs=0.02), step
    # ... and each figure behind it is the job's own: its median step and its steps' wait for a CPU
    # (1 - CPU time / wall time: it never blocks), so the change left is the one the job's clocks give
    ob, oc = Own(runs["base"]), Own(runs["busy"])
    assert step["base_median"] == pytest.approx(ob.median, rel=STEP_MEDIAN), (step["base_median"], ob.median)
    assert step["cand_median"] == pytest.approx(oc.median, rel=STEP_MEDIAN), (step["cand_median"], oc.median)
    assert abs(wb - ob.wait) <= WAIT_POINTS and abs(wc - oc.wait) <= WAIT_POINTS, ((wb, wc), (ob.wait, oc.wait))
    own = own_adjusted(ob, oc)
    assert abs(step["adjusted_change"] - own) <= ADJUSTED_VS_OWN, \
        f"wait taken out: {step['adjusted_change']:+.1%} by compare, {own:+.1%} by the job's own clocks"
    assert j["regressions"] >= 1 and j["explained_by_contention"] == j["regressions"]
    assert j["failed"] is False


def test_strict_fails_on_it(runs):
    gate = run_cli("compare", str(runs["base"]), str(runs["busy"]), "--fail-on-regression", "--strict")
    assert gate.returncode == 1, gate.stderr
    assert "REGRESSION" in gate.stdout
    assert "regression(s) flagged (--fail-on-regression --strict)" in gate.stderr
    md = run_cli("compare", str(runs["base"]), str(runs["busy"]), "--markdown")
    assert "🟠 slower (machine)" in md.stdout and "⚠️ machine: " in md.stdout
