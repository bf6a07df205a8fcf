"""Real perf_event_open counts, held to perf stat and to the kernel's own accounting.

Software events work everywhere; hardware events only where the PMU counts (skipped
with the reason elsewhere).
"""
from __future__ import annotations

import json
import subprocess
import time

import pyarrow.compute as pc
import pytest

import counterprof
from helpers import (EXAMPLES, PYTHON, REPO, needs_perf_tool, needs_pmu, needs_root,
                     run_cli)

WORKLOADS = str(REPO / "tests" / "workloads.py")


def perf_stat(events: str, *cmd: str) -> dict[str, float]:
    out = subprocess.run(["perf", "stat", "-x,", "-e", events, "--", *cmd],
                         capture_output=True, text=True, check=True)
    counts = {}
    for line in out.stderr.splitlines():
        parts = line.split(",")
        if len(parts) > 3 and parts[2] in events.split(","):
            counts[parts[2]] = float(parts[0]) if parts[0][:1].isdigit() else None
    return counts


def counterprof_totals(run_dir, events: str, *cmd: str, extra=()) -> tuple[dict, dict]:
    proc = run_cli("run", "-q", "-e", events, *extra, "-o", str(run_dir), "--", *cmd)
    assert proc.returncode == 0, proc.stderr
    summary = counterprof.load(run_dir).summary()
    totals = {e: summary.value(e) for e in events.split(",")}
    return totals, json.loads((run_dir / "meta.json").read_text())


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


@needs_perf_tool
def test_page_faults_of_touched_pages_agree_with_perf_stat(tmp_path):
    pages = "40000"
    ours = [counterprof_totals(tmp_path / f"r{i}", "page-faults", PYTHON, WORKLOADS, "touch", pages)[0]["page-faults"]
            for i in range(3)]
    theirs = [perf_stat("page-faults", PYTHON, WORKLOADS, "touch", pages)["page-faults"] for _ in range(3)]
    assert median(ours) >= 40000
    assert median(ours) == pytest.approx(median(theirs), rel=0.02)


@needs_perf_tool
def test_task_clock_of_a_busy_loop_agrees_with_perf_stat(tmp_path):
    ours = [counterprof_totals(tmp_path / f"r{i}", "task-clock", PYTHON, WORKLOADS, "burn", "0.5")[0]["task-clock"]
            for i in range(3)]
    theirs = [perf_stat("task-clock", PYTHON, WORKLOADS, "burn", "0.5")["task-clock"] for _ in range(3)]
    # perf stat -x prints task-clock in msec
    assert median(ours) / 1e6 == pytest.approx(median(theirs), rel=0.05)


def test_task_clock_matches_the_kernels_rusage_of_the_same_run(run_dir):
    totals, meta = counterprof_totals(run_dir, "task-clock", PYTHON, WORKLOADS, "burn", "0.5")
    rusage_s = meta["workload"]["user_s"] + meta["workload"]["system_s"]
    assert totals["task-clock"] / 1e9 == pytest.approx(rusage_s, rel=0.05)
    assert totals["task-clock"] / 1e9 >= 0.5


@needs_perf_tool
def test_counting_starts_at_exec_not_at_fork(run_dir):
    # `true` does almost nothing: if the forked copy of the profiler were counted, its
    # copy-on-write faults and time would show here.
    totals, _ = counterprof_totals(run_dir, "page-faults,task-clock", "true")
    theirs = perf_stat("page-faults", "true")["page-faults"]
    assert totals["page-faults"] <= theirs + 30
    assert totals["task-clock"] < 20e6     # under 20 ms of CPU


def test_paused_child_counts_nothing_until_released():
    """The handshake itself: counters opened on the paused child stay at zero until exec."""
    from counterprof.collectors.perf import native
    from counterprof.collectors.perf.events import parse_events
    from counterprof.workload import Workload

    wl = Workload([PYTHON, WORKLOADS, "burn", "0.2"])
    pid = wl.spawn()
    spec = parse_events("task-clock")[0].leader
    fd = native.open_event(spec, native.OpenFlags(leader=True, enable_on_exec=True, inherit=True), pid, -1)
    try:
        time.sleep(0.1)
        nr, enabled, running, value = native.read_group(fd, 1)
        assert (nr, enabled, running, value) == (1, 0, 0, 0)
        wl.release()
        result = wl.wait()
        assert result.exit_status == 0
        nr, enabled, running, value = native.read_group(fd, 1)
        assert value >= 0.2e9 and running == enabled > 0
    finally:
        native.close_fd(fd)


def test_children_and_threads_are_counted(run_dir):
    # 2 child processes and 1 extra thread, each burning 0.3 s of CPU
    totals, meta = counterprof_totals(run_dir, "task-clock", PYTHON, WORKLOADS, "tree", "2", "0.3")
    assert totals["task-clock"] / 1e9 >= 0.9
    rusage_s = meta["workload"]["user_s"] + meta["workload"]["system_s"]
    assert totals["task-clock"] / 1e9 == pytest.approx(rusage_s, rel=0.05)


def test_one_millisecond_intervals(run_dir):
    proc = run_cli("run", "-q", "-e", "task-clock,context-switches", "-I", "1", "-o", str(run_dir),
                   "--", PYTHON, str(EXAMPLES / "busy.py"), "0.5")
    assert proc.returncode == 0, proc.stderr
    run = counterprof.load(run_dir)
    t = run.samples()
    tc = t.filter(pc.equal(t["metric"].cast("string"), "task-clock"))
    assert tc.num_rows >= 350, "about 1 tick per ms over ~0.5 s"
    durations = sorted(tc["duration_ns"].to_pylist())
    assert durations[len(durations) // 2] == pytest.approx(1e6, rel=0.25)
    sampler = run.meta["collectors"]["perf"]["sampler"]
    assert sampler["coalesced"] == 0


def _spawn_threads(n=3, seconds=4.0, late_after=1.0):
    proc = subprocess.Popen([PYTHON, WORKLOADS, "threads_then_more", str(n), str(seconds), str(late_after)],
                            stdout=subprocess.PIPE, text=True)
    int(proc.stdout.readline())
    time.sleep(0.2)
    return proc


def test_attach_to_a_running_process_counts_all_its_threads(run_dir):
    # the target outlives the 2 s attached by far, whatever the CLI's start-up costs
    target = _spawn_threads(n=3, seconds=30.0, late_after=29.0)
    try:
        proc = run_cli("run", "-q", "--pid", str(target.pid), "--per-thread", "-e", "task-clock",
                       "-I", "50", "--duration", "2", "-o", str(run_dir))
        assert proc.returncode == 0, proc.stderr
    finally:
        target.kill()
        target.wait(timeout=30)
    run = counterprof.load(run_dir)
    t = run.samples()
    tc = t.filter(pc.equal(t["metric"].cast("string"), "task-clock"))
    entities = set(tc["entity"].cast("string").to_pylist())
    assert len(entities) >= 4 and all(e.startswith("tid:") for e in entities)   # main + 3 threads
    # the three spinners share one GIL: up to one CPU's worth over the 2 s attached
    total = pc.sum(tc["value"]).as_py() / 1e9
    assert 0.5 <= total <= 2.6
    assert run.meta["target"] == {"kind": "pid", "pid": target.pid, "system_wide": False}
    assert run.meta["stopped_because"] == "duration elapsed"


def test_attach_counts_threads_started_after_attaching(run_dir):
    # one thread spins for the first 2 s; attach within ~0.6 s (0.2 s + the CLI's start-up);
    # a thread born at 2 s spins to 6 s
    target = _spawn_threads(n=1, seconds=6.0, late_after=2.0)
    try:
        proc = run_cli("run", "-q", "--pid", str(target.pid), "-e", "task-clock", "-I", "100",
                       "-o", str(run_dir))   # no --duration: until the process exits
        assert proc.returncode == 0, proc.stderr
        cpu_s = json.loads(target.stdout.readline())["cpu_s"]
    finally:
        target.wait(timeout=30)
    run = counterprof.load(run_dir)
    assert run.meta["stopped_because"] == "target exited"
    counted = run.summary().value("task-clock") / 1e9
    # without inherit at most the first 2 s would be counted (a third); with it, all but the
    # time before the attach
    assert counted >= 0.6 * cpu_s
    assert counted <= cpu_s * 1.05


@needs_root
def test_system_wide_counts_every_cpu(run_dir):
    proc = run_cli("run", "-q", "-a", "-A", "-e", "cpu-clock", "-I", "100", "--duration", "1",
                   "-o", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    run = counterprof.load(run_dir)
    t = run.samples()
    cc = t.filter(pc.equal(t["metric"].cast("string"), "cpu-clock"))
    cpus = sorted(set(cc["entity"].cast("string").to_pylist()))
    from counterprof.collectors.perf.counters import online_cpus
    assert cpus == sorted(f"cpu:{c}" for c in online_cpus())
    # cpu-clock on each CPU runs with wall time
    assert pc.sum(cc["value"]).as_py() / 1e9 == pytest.approx(len(cpus) * 1.0, rel=0.15)


def test_context_manager_counts_existing_and_new_threads(tmp_path):
    from helpers import PYTHON as py
    code = f"""
import json, sys, threading, time
sys.path.insert(0, {str(REPO / 'tests')!r})
import counterprof, workloads
stop = threading.Event()
def spin_until_stopped():
    while not stop.is_set():
        sum(range(1000))
before = threading.Thread(target=spin_until_stopped); before.start()
time.sleep(0.1)
with counterprof.profile(events="task-clock,page-faults", interval_ms=10, path={str(tmp_path / 'r')!r}) as run:
    t0 = time.process_time()
    inside = threading.Thread(target=workloads._burn, args=(0.3,)); inside.start(); inside.join()
    workloads.touch("20000")
    used = time.process_time() - t0
stop.set(); before.join()
s = run.summary()
print(json.dumps({{"task": s.value("task-clock"), "faults": s.value("page-faults"), "used": used,
                  "meta": run.meta}}))
"""
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["faults"] >= 20000
    # everything the process used inside the block (the spinning thread included) is counted,
    # the profiler's own threads excluded
    assert res["task"] / 1e9 == pytest.approx(res["used"], rel=0.1)
    meta = res["meta"]
    assert meta["target"]["kind"] == "self"
    assert meta["profiler"]["cpu_scope"] == "profiler threads"
    assert meta["collectors"]["perf"]["units"] >= 2     # main thread and the spinning thread


@needs_pmu
def test_instructions_of_a_fixed_loop_agree_with_perf_stat(tmp_path):
    cmd = [PYTHON, "-c", "x=0\nfor i in range(3_000_000): x+=i"]
    ours = [counterprof_totals(tmp_path / f"r{i}", "instructions,cycles", *cmd)[0] for i in range(3)]
    theirs = [perf_stat("instructions,cycles", *cmd) for _ in range(3)]
    assert median([o["instructions"] for o in ours]) == pytest.approx(
        median([t["instructions"] for t in theirs]), rel=0.01)
    ipc_ours = median([o["instructions"] / o["cycles"] for o in ours])
    ipc_theirs = median([t["instructions"] / t["cycles"] for t in theirs])
    assert ipc_ours == pytest.approx(ipc_theirs, rel=0.05)


@needs_pmu
def test_hardware_group_is_scheduled_together(run_dir):
    totals, meta = counterprof_totals(run_dir, "{cycles,instructions}", PYTHON, str(EXAMPLES / "busy.py"), "0.3")
    assert totals["cycles"] > 0 and totals["instructions"] > 0
    assert meta["collectors"]["perf"]["events"]["cycles"]["status"] == "counted"
