"""host collector over a real process tree."""
import os
import time

import pyarrow.compute as pc
import pytest

import counterprof
from counterprof.collectors.host import system_stats, tree_stats
from helpers import PYTHON, REPO, run_cli

WORKLOADS = str(REPO / "tests" / "workloads.py")


def metric(run, name):
    t = run.samples()
    return t.filter(pc.equal(t["metric"].cast("string"), name))


def test_tree_stats_agree_with_psutil_on_a_real_tree():
    import subprocess
    import psutil
    # the grandchild says when it has started; its parent passes that on with its pid
    p = subprocess.Popen([PYTHON, "-c", "import subprocess,sys,time;"
                          "c=subprocess.Popen([sys.executable,'-c','import time;print(1,flush=True);"
                          "time.sleep(5)'],stdout=subprocess.PIPE);c.stdout.readline();"
                          "print(c.pid, flush=True); time.sleep(5)"], stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        procs = [psutil.Process(p.pid), psutil.Process(child)]
        time.sleep(0.3)          # both are past their start-up: then nothing changes
        ours = tree_stats(p.pid)
        assert ours["processes"] == 2
        assert ours["threads"] == sum(x.num_threads() for x in procs)
        assert ours["rss_bytes"] == pytest.approx(sum(x.memory_info().rss for x in procs), rel=0.05)
        cpu = sum(x.cpu_times().user + x.cpu_times().children_user for x in procs)
        assert ours["user_s"] == pytest.approx(cpu, abs=0.05)
        assert ours["ctx_voluntary"] == pytest.approx(sum(x.num_ctx_switches().voluntary for x in procs), abs=5)
    finally:
        p.kill()
        p.wait()
    assert tree_stats(p.pid) is None      # reaped: gone


_REAPER = r"""
import os, sys, time
print("go", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:          # children of ~30 ms of CPU each, reaped at once
    pid = os.fork()
    if pid == 0:
        t = time.process_time()
        while time.process_time() - t < 0.03:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
"""


def test_a_child_reaped_during_a_sample_is_counted_once():
    """The root reaping a child between reading its own stat and reaching the child left the
    child's CPU out of one sample (seen here: ~30 dips in 6 s); the next sample then counted
    it again through cutime. The tree's CPU total must never go down."""
    import subprocess
    tick = 1 / os.sysconf("SC_CLK_TCK")
    p = subprocess.Popen([PYTHON, "-c", _REAPER, "3"], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    prev, dips, samples = None, [], 0
    while (s := tree_stats(p.pid)) is not None and s["processes"]:
        total = s["user_s"] + s["system_s"]
        if prev is not None and total < prev - 1.5 * tick:    # a tick of rounding is not a dip
            dips.append(round(prev - total, 3))
        prev, samples = total, samples + 1
    p.wait(timeout=30)
    assert samples > 1000
    assert dips == [], f"the tree's CPU went down {len(dips)} times in {samples} samples: {dips[:5]}"


def test_system_stats_agree_with_psutil():
    import psutil
    ours = system_stats()
    assert ours["mem_total_bytes"] == psutil.virtual_memory().total
    assert ours["cpu_total_s"] == pytest.approx(sum(psutil.cpu_times()) - psutil.cpu_times().guest
                                               - psutil.cpu_times().guest_nice, rel=0.01)


def test_host_metrics_of_a_process_tree(run_dir):
    proc = run_cli("run", "-q", "--collectors", "host", "--host-interval-ms", "50", "-o", str(run_dir),
                   "--", PYTHON, WORKLOADS, "tree", "2", "0.4")
    assert proc.returncode == 0, proc.stderr
    run = counterprof.load(run_dir)
    cpu = pc.sum(metric(run, "proc.cpu_user")["value"]).as_py() + \
        pc.sum(metric(run, "proc.cpu_system")["value"]).as_py()
    # 3 x 0.4 s burned; held to the kernel's own rusage of the tree, less the last interval
    # before exit (the root is reaped before a final sample can read it)
    ru = run.meta["workload"]["user_s"] + run.meta["workload"]["system_s"]
    assert cpu >= 1.2 * 0.8
    assert 0.75 * ru <= cpu <= ru * 1.02
    assert pc.max(metric(run, "proc.processes")["value"]).as_py() >= 3
    assert pc.max(metric(run, "proc.rss")["value"]).as_py() > 5e6
    gauges = metric(run, "proc.rss")
    assert gauges["duration_ns"].null_count == gauges.num_rows     # gauges have no duration
    util = metric(run, "system.cpu_util")["value"].to_pylist()
    assert all(0 <= u <= 100 for u in util)
    assert run.catalog["proc.cpu_user"]["unit"] == "s"


def test_context_manager_gets_a_final_host_sample(tmp_path):
    with counterprof.profile(collectors=["host"], host_interval_ms=1000, path=tmp_path / "r") as run:
        pass      # far shorter than one interval
    assert metric(run, "proc.rss").num_rows == 1


def test_system_rows_once_a_second_and_a_final_one(run_dir):
    """The tree's rows every 100 ms, the system's (/proc/stat, the dearest read) once a second,
    each spanning its true duration, plus one at the end: a run under a second still has them."""
    proc = run_cli("run", "-q", "-o", str(run_dir), "--", "sleep", "2.5")
    assert proc.returncode == 0, proc.stderr
    run = counterprof.load(run_dir)
    util, user = metric(run, "system.cpu_util"), metric(run, "proc.cpu_user")
    assert user.num_rows >= 15
    assert 2 <= util.num_rows <= 4                       # ~1 s, ~2 s and the final one
    spans = sorted(util["duration_ns"].to_pylist())
    assert spans[-1] >= 0.9e9 and max(user["duration_ns"].to_pylist()) < 0.5e9
    short = run_cli("run", "-q", "-o", str(run_dir.parent / "short"), "--", "sleep", "0.3")
    assert short.returncode == 0, short.stderr
    assert metric(counterprof.load(run_dir.parent / "short"), "system.cpu_util").num_rows >= 1
