"""host collector over a real process tree."""
import json
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
    p = subprocess.Popen([PYTHON, "-c", "import subprocess,sys,time;"
                          "c=subprocess.Popen([sys.executable,'-c','import time;time.sleep(5)']);"
                          "print(c.pid, flush=True); time.sleep(5)"], stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        procs = [psutil.Process(p.pid), psutil.Process(child)]
        time.sleep(0.3)          # let the grandchild finish starting: then nothing changes
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
