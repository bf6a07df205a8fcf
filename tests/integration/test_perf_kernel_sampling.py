"""The perf collector's kernel sampling (`--sampling kernel`) on real software counters.

The kernel samples each thread every -I of its CPU time; the rows must still be the tick's: the
same totals (the groups' final reads give back each thread's tail), one row per -I of wall time
per series (zero, not missing, where nothing ran), and the tick, with a warning, wherever the
mode cannot run. Needs Linux 6.12 (inherit with PERF_SAMPLE_READ): skipped, with the fallback's
reason, on an older kernel; on 6.12 or later a fallback to the tick is a failure with its reason
(the mode should run there), and in CI the tests are `required`, so an old kernel there fails too.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys

import pyarrow.compute as pc
import pytest

import counterprof
from helpers import PYTHON, REPO, needs_perf_tool, run_cli, wait_for_samples

WORKLOADS = str(REPO / "tests" / "workloads.py")
SW = "task-clock,page-faults,context-switches"
pytestmark = pytest.mark.required


def _kernel_version(release: str) -> tuple[int, int]:
    parts = release.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


RELEASE = os.uname().release
HAS_KERNEL_SAMPLING = _kernel_version(RELEASE) >= (6, 12)


def kernel_sampling_ran(perf: dict) -> None:
    """Returns when kernel sampling ran; skips on a kernel older than 6.12 (it cannot run there);
    fails on 6.12 or later, where it should have run, with the fallback's reason."""
    if perf["sampling"] == "kernel":
        return
    reason = perf.get("sampling_fallback")
    if not HAS_KERNEL_SAMPLING:
        pytest.skip(f"kernel sampling cannot run on Linux {RELEASE} (needs 6.12): {reason}")
    pytest.fail(f"kernel sampling fell back to the tick on Linux {RELEASE}, where it runs: {reason}")


def run(run_dir, *cmd, interval="1", sampling="kernel", events=SW):
    proc = run_cli("run", "-q", "-e", events, "-I", interval, "--sampling", sampling,
                   "--collectors", "perf", "-o", str(run_dir), "--", *cmd)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((run_dir / "meta.json").read_text())
    perf = meta["collectors"]["perf"]
    if sampling == "kernel":
        kernel_sampling_ran(perf)
    return counterprof.load(run_dir), meta, proc.stderr


def rows(r, metric):
    t = r.samples()
    return t.filter(pc.and_(pc.equal(t["source"].cast("string"), "perf"),
                            pc.equal(t["metric"].cast("string"), metric))).sort_by("time")


def total(r, metric):
    return pc.sum(rows(r, metric)["value"]).as_py()


def perf_stat(events: str, *cmd: str) -> dict[str, float]:
    out = subprocess.run(["perf", "stat", "-x,", "-e", events, "--", *cmd],
                         capture_output=True, text=True, check=True)
    return {p[2]: float(p[0]) for p in (ln.split(",") for ln in out.stderr.splitlines())
            if len(p) > 3 and p[2] in events.split(",") and p[0][:1].isdigit()}


def starts_and_durations(t):
    ends = t["time"].cast("int64").to_pylist()
    durs = t["duration_ns"].to_pylist()
    return [e - d for e, d in zip(ends, durs)], durs


def test_busy_command_totals_match_the_kernels_rusage_and_the_tick(tmp_path):
    k, kmeta, _ = run(tmp_path / "k", PYTHON, WORKLOADS, "burn", "0.6")
    t, _, _ = run(tmp_path / "t", PYTHON, WORKLOADS, "burn", "0.6", sampling="tick")
    rusage_s = kmeta["workload"]["user_s"] + kmeta["workload"]["system_s"]
    assert total(k, "task-clock") / 1e9 == pytest.approx(rusage_s, rel=0.05)
    assert total(k, "task-clock") / 1e9 >= 0.6
    # the same program faults the same pages under either mode
    assert total(k, "page-faults") == pytest.approx(total(t, "page-faults"), rel=0.03)
    stats = kmeta["collectors"]["perf"]["kernel_sampler"]
    assert stats["samples"] >= 300          # one per ms of CPU: the kernel sampled
    assert stats["lost"] == 0
    assert kmeta["collectors"]["perf"]["thread_cpu_s"] < 0.5


def test_the_tails_after_the_last_samples_come_from_the_final_read(tmp_path):
    # -I 250 over 0.4 s of CPU: one sample per thread, the rest (~40%) only the final read has
    r, meta, _ = run(tmp_path / "r", PYTHON, WORKLOADS, "burn", "0.4", interval="250")
    t, _, _ = run(tmp_path / "t", PYTHON, WORKLOADS, "burn", "0.4", interval="250", sampling="tick")
    rusage_s = meta["workload"]["user_s"] + meta["workload"]["system_s"]
    assert meta["collectors"]["perf"]["kernel_sampler"]["samples"] <= 3
    assert total(r, "task-clock") / 1e9 == pytest.approx(rusage_s, rel=0.05)
    assert total(r, "page-faults") == pytest.approx(total(t, "page-faults"), rel=0.03)
    last = rows(r, "task-clock")["value"].to_pylist()[-1]
    assert last > 0.05e9          # the tail landed in the last interval


@needs_perf_tool
def test_page_faults_agree_with_perf_stat(tmp_path):
    ours = [total(run(tmp_path / f"r{i}", PYTHON, WORKLOADS, "touch", "20000")[0], "page-faults")
            for i in range(3)]
    theirs = [perf_stat("page-faults", PYTHON, WORKLOADS, "touch", "20000")["page-faults"]
              for _ in range(3)]
    assert statistics.median(ours) >= 20000
    assert statistics.median(ours) == pytest.approx(statistics.median(theirs), rel=0.02)


def test_two_threads_and_one_that_exits_mid_run_are_counted(tmp_path):
    # two threads spin until 0.4 s and exit; a third spins until 0.8 s
    r, meta, _ = run(tmp_path / "r", PYTHON, WORKLOADS, "threads_then_more", "2", "0.8", "0.4")
    rusage_s = meta["workload"]["user_s"] + meta["workload"]["system_s"]
    assert total(r, "task-clock") / 1e9 == pytest.approx(rusage_s, rel=0.05)
    assert meta["collectors"]["perf"]["kernel_sampler"]["threads"] >= 3


def test_child_processes_that_exit_are_counted(tmp_path):
    r, meta, _ = run(tmp_path / "r", PYTHON, WORKLOADS, "tree", "2", "0.3")
    rusage_s = meta["workload"]["user_s"] + meta["workload"]["system_s"]
    assert total(r, "task-clock") / 1e9 == pytest.approx(rusage_s, rel=0.05)
    assert total(r, "task-clock") / 1e9 >= 0.9


def test_rows_lie_on_the_interval_grid_one_per_interval_per_series(tmp_path):
    r, meta, _ = run(tmp_path / "r", PYTHON, WORKLOADS, "burn", "0.3", interval="5")
    series = {}
    for metric in SW.split(","):
        t = rows(r, metric)
        starts, durs = starts_and_durations(t)
        assert set(t["entity"].cast("string").to_pylist()) == {"process"}
        assert all(d == 5_000_000 for d in durs[:-1]) and 0 < durs[-1] <= 5_000_000
        # contiguous: each interval starts where the previous one ended, none missing
        assert all(b - a == 5_000_000 for a, b in zip(starts, starts[1:]))
        assert t["value"].null_count == 0
        series[metric] = starts
    assert len({tuple(s) for s in series.values()}) == 1     # every series on the same grid
    elapsed_ns = meta["workload"]["elapsed_s"] * 1e9
    assert len(series["task-clock"]) >= elapsed_ns / 5e6 - 2


def test_a_sleeping_command_gives_zero_rows_not_gaps(tmp_path):
    r, _, _ = run(tmp_path / "r", "sleep", "0.5", interval="10")
    t = rows(r, "task-clock")
    starts, _ = starts_and_durations(t)
    assert t.num_rows >= 45
    assert all(b - a == 10_000_000 for a, b in zip(starts, starts[1:]))
    values = t["value"].to_pylist()
    # sleep runs for well under a millisecond: nearly every interval is a zero row
    assert sum(1 for v in values if v == 0) >= t.num_rows - 3
    assert sum(values) < 20e6


def session_run(run_dir, perf_config, *cmd):
    from counterprof import profile_run
    from counterprof.collector import Target
    from counterprof.session import Session
    warnings: list[str] = []
    session = Session(run_dir, collectors=["perf"], target=Target("launch", None), command=list(cmd),
                      on_warning=warnings.append, config={"perf": {"events": SW, **perf_config}})
    session.prepare()
    assert profile_run.launch(session, list(cmd)).exit_status == 0
    return json.loads((run_dir / "meta.json").read_text()), warnings


def test_fallback_when_the_kernel_refuses_warns_and_runs_the_tick(tmp_path):
    # cpu -1: a per-task inherited sampling event the kernel refuses to mmap, a real refusal
    meta, warnings = session_run(tmp_path / "r", {"interval_ms": 5.0, "sampling": "kernel",
                                                  "kernel_cpus": [-1]}, PYTHON, WORKLOADS, "burn", "0.3")
    perf = meta["collectors"]["perf"]
    assert perf["sampling"] == "tick"
    assert "CPU -1" in perf["sampling_fallback"]
    assert any("kernel sampling cannot run" in w and "tick" in w for w in warnings), warnings
    r = counterprof.load(tmp_path / "r")
    assert total(r, "task-clock") / 1e9 >= 0.3
    assert perf["sampler"]["ticks"] >= 40       # the tick ran


def test_lost_records_are_counted_and_said_and_their_counts_kept(tmp_path):
    # one page of ring at -I 0.1 holds ~50 samples of a drain's ~5000: the kernel drops the rest
    meta, warnings = session_run(tmp_path / "r", {"interval_ms": 0.1, "sampling": "kernel",
                                                  "kernel_ring_pages": 1}, PYTHON, WORKLOADS, "burn", "0.6")
    perf = meta["collectors"]["perf"]
    kernel_sampling_ran(perf)
    assert perf["kernel_sampler"]["lost"] > 0
    assert any("lost" in w and "sample records" in w for w in warnings), warnings
    # a lost sample's counts reach the thread's next sample (cumulative): the total stays whole
    r = counterprof.load(tmp_path / "r")
    rusage_s = meta["workload"]["user_s"] + meta["workload"]["system_s"]
    assert total(r, "task-clock") / 1e9 == pytest.approx(rusage_s, rel=0.05)


def test_an_attached_process_falls_back_to_the_tick_saying_why(tmp_path):
    sleeper = subprocess.Popen(["sleep", "5"])
    try:
        proc = run_cli("run", "-q", "-e", SW, "--sampling", "kernel", "--collectors", "perf",
                       "-p", str(sleeper.pid), "--duration", "0.3", "-o", str(tmp_path / "r"))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proc.returncode == 0, proc.stderr
    assert "kernel sampling cannot run" in proc.stderr and "attached process" in proc.stderr
    perf = json.loads((tmp_path / "r" / "meta.json").read_text())["collectors"]["perf"]
    assert perf["sampling"] == "tick"


def test_sigkill_of_the_workload_keeps_the_data(tmp_path):
    run_dir = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "counterprof", "run", "-q", "-e", SW, "-I", "10",
                             "--sampling", "kernel", "--collectors", "perf", "-o", str(run_dir), "--",
                             PYTHON, WORKLOADS, "burn", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_samples(run_dir, rows=60)
        import psutil
        psutil.Process(proc.pid).children()[0].kill()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGKILL, err
    r = counterprof.load(run_dir)
    perf = r.meta["collectors"]["perf"]
    kernel_sampling_ran(perf)
    assert r.meta["status"] == "complete"
    assert rows(r, "task-clock").num_rows >= 20
    rusage_s = r.meta["workload"]["user_s"] + r.meta["workload"]["system_s"]
    assert total(r, "task-clock") / 1e9 == pytest.approx(rusage_s, rel=0.05)


def test_the_riders_get_a_tick_of_their_own_at_their_finest_interval(tmp_path):
    """Kernel sampling wakes no thread per -I, but host and threads still read in C: on a tick
    with no counter group, at the finest of their intervals (threads: 100 ms by default in this
    mode, 10 ms when asked), never on a Python thread of theirs; their rows are the tick mode's
    (whose threads follow -I down to 10 ms)."""
    got = {}
    for mode, threads_ms, tick_ms in (("kernel", None, 100.0), ("kernel", "10", 10.0), ("tick", None, None)):
        out = tmp_path / f"{mode}-{threads_ms}"
        extra = ("--threads-interval-ms", threads_ms) if threads_ms else ()
        proc = run_cli("run", "-q", "-e", SW, "-I", "1", "--sampling", mode, "--collectors", "perf,host,threads",
                       *extra, "-o", str(out), "--", PYTHON, WORKLOADS, "burn", "0.6")
        assert proc.returncode == 0, proc.stderr
        cols = json.loads((out / "meta.json").read_text())["collectors"]
        if mode == "kernel":
            kernel_sampling_ran(cols["perf"])
        got[(mode, threads_ms)] = (cols["threads"]["main_reads"], cols["threads"]["walks"], cols["host"]["samples"])
        t = counterprof.load(out).samples()
        main = t.filter(pc.equal(t["metric"].cast("string"), "thread.main.running"))
        assert pc.sum(main["value"]).as_py() == pytest.approx(0.6, rel=0.35)   # it burns 0.6 s of CPU
        if tick_ms is not None:
            assert cols["perf"]["rider_tick_ms"] == pytest.approx(tick_ms)
            assert cols["perf"]["rider_tick"]["ticks"] >= 0.6 / (tick_ms / 1000) / 2   # start-up aside
            assert cols["threads"]["config"]["interval_ms"] == pytest.approx(tick_ms)
        # the critical thread every threads interval: 10 ms (tick at -I 1; kernel when asked), 100 ms
        assert main.num_rows >= (4 if tick_ms == 100.0 else 20)
    assert set(got.values()) == {("perf sampler tick",) * 3}
