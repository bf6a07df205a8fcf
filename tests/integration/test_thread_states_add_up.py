"""The critical thread's states add up over a real run: a spin loop sharing its CPU with a busy loop
(both pinned to one CPU: contended by construction) never blocks, so running + runnable is its
whole time. Under `counterprof run`, the run's Parquet samples must say so: per row and in total
running + runnable + blocked = the rows' wall time, blocked at most 2%, and running and runnable
the shares the job read from its own /proc/self/task/TID/schedstat (tests/thread_workloads.py
contended). Before, blocked was max(0, length - run - wait) per row: 7% at 10 ms rows on a quiet
machine, 17-28% on a busy one, the states over 100% of the wall time."""
import subprocess
import time

import psutil
import pytest

from helpers import PYTHON
from thread_runs import WORKLOADS, frame, in_window, profile_cli

CPU = "1"
STATES = ("thread.main.running", "thread.main.runnable", "thread.main.blocked")


@pytest.mark.parametrize("collectors,extra,interval_ms", [
    pytest.param("threads", ("--threads-interval-ms", "10"), 10, id="own-thread-10ms"),
    pytest.param("threads,perf", ("-I", "10", "-e", "task-clock"), 10, id="perf-tick-10ms"),
    pytest.param("threads", (), 100, id="own-thread-100ms"),
])
def test_a_spin_loop_sharing_its_cpu_is_never_blocked_and_its_states_are_its_time(run_dir, collectors, extra,
                                                                                   interval_ms):
    hog = subprocess.Popen(["taskset", "-c", CPU, PYTHON, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        run, w = profile_cli(run_dir, "taskset", "-c", CPU, PYTHON, WORKLOADS, "contended", "2.5",
                             extra=extra, collectors=collectors)
        hog_cpu = sum(psutil.Process(hog.pid).cpu_times()[:2])
    finally:
        hog.kill()
        hog.wait()
    assert hog_cpu > 0.2 and w["wait_share"] > 0.2        # they did share the CPU
    assert w["run_share"] + w["wait_share"] > 0.98          # and the spin loop never blocked
    t = frame(run)
    main = t[t["metric"].isin(STATES)]
    assert set(main["entity"]) == {f"tid:{w['pid']}"}
    # every row: the three states are its interval (float seconds of integer ns)
    per_row = main.pivot_table(index="time", columns="metric", values="value", aggfunc="sum")
    spans = main[main["metric"] == "thread.main.running"].set_index("time")["duration_ns"] / 1e9
    assert abs(spans.median() * 1e3 - interval_ms) < interval_ms / 2
    total = per_row[list(STATES)].sum(axis=1)
    assert ((total - spans).abs() <= 0.02 * spans).all(), (total - spans).abs().max()
    # over the whole run (its start, python's exec and imports, may block: the spin loop's window below)
    assert abs(total.sum() - spans.sum()) <= 0.02 * spans.sum()
    # over the job's own window, against its own schedstat
    _inside, sums, covered = in_window(t, w)
    assert covered > 2.0
    states = {m: sums[m] / covered for m in STATES}
    assert abs(sum(states.values()) - 1) <= 0.02, states
    assert states["thread.main.blocked"] <= 0.02, states
    assert abs(states["thread.main.running"] - w["run_share"]) <= 0.05, (states, w)
    assert abs(states["thread.main.runnable"] - w["wait_share"]) <= 0.05, (states, w)
