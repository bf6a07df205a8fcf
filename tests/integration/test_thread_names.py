"""The profiler's threads carry their names in the kernel (top -H, ps -L, perf, py-spy read
comm): under profile() they live in the workload's process and must not pass for its own."""
import os
import subprocess
import time

import counterprof

from helpers import COUNTERPROF, wait_for_samples


def comms(pid: int | str = "self") -> list[str]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                out.append(f.read().strip())
        except OSError:
            pass                          # a thread that ended while listed
    return out


def test_profile_names_its_threads_in_the_workloads_process(tmp_path):
    before = comms()
    with counterprof.profile(events="task-clock", interval_ms=50, path=tmp_path / "run"):
        during = comms()
    assert not any(c.startswith("cp-") for c in before)
    assert {"cp-sampler", "cp-perf-drain"} <= set(during), during
    time.sleep(0.2)
    assert not any(c.startswith("cp-") for c in comms()), "a profiler thread outlived the run"


def test_run_names_the_profilers_threads(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*COUNTERPROF, "run", "-q", "-e", "task-clock", "-o", str(run_dir), "--", "sleep", "3"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_samples(run_dir, timeout=30)
        names = set(comms(proc.pid))
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert {"cp-sampler", "cp-perf-drain", "cp-host", "cp-threads"} <= names, names
