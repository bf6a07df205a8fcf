"""Helpers shared by the tests (tests/ is on sys.path through pytest's pythonpath setting).

The repository root is deliberately not on sys.path: tests import the installed counterprof."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
PYTHON = sys.executable
COUNTERPROF = [PYTHON, "-m", "counterprof"]


def run_cli(*args: str, check: bool = False, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`counterprof ARGS...` as a user runs it, in a fresh interpreter."""
    proc = subprocess.run([*COUNTERPROF, *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"counterprof {' '.join(args)} -> {proc.returncode}\n{proc.stderr}")
    return proc


def _perf_counts(event: str) -> bool:
    perf = shutil.which("perf")
    if not perf:
        return False
    out = subprocess.run([perf, "stat", "-x,", "-e", event, "true"], capture_output=True, text=True)
    line = next((ln for ln in out.stderr.splitlines() if event in ln), "")
    return out.returncode == 0 and line != "" and "<not" not in line


HAS_PERF_TOOL = shutil.which("perf") is not None and _perf_counts("task-clock")
HAS_PMU = HAS_PERF_TOOL and _perf_counts("instructions")

# CI installs perf and sets this: there, a missing perf tool fails instead of skipping.
if os.environ.get("COUNTERPROF_REQUIRE_PERF_TOOL") and not HAS_PERF_TOOL:
    raise RuntimeError("COUNTERPROF_REQUIRE_PERF_TOOL is set but `perf stat -e task-clock true` "
                       "does not work: install linux-perf")
needs_perf_tool = pytest.mark.skipif(
    not HAS_PERF_TOOL, reason="the perf tool (Debian: linux-perf) is not installed; .ci/run installs it")
needs_pmu = pytest.mark.skipif(
    not HAS_PMU, reason="no hardware PMU here: `perf stat -e instructions true` says <not supported> "
                        "(usual in VMs); hardware-event tests run only where the PMU counts")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (or CAP_PERFMON)")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_samples(run_dir: Path, rows: int = 1, timeout: float = 60.0) -> int:
    """Wait until a running run's journal holds `rows` sample rows (a test that kills the
    profiler then knows there is data, whatever the machine's speed); their number."""
    import time
    import counterprof
    deadline = time.monotonic() + timeout
    while True:
        try:
            n = counterprof.load(run_dir).samples().num_rows
        except Exception:              # not created yet, or no segment written yet
            n = 0
        if n >= rows:
            return n
        if time.monotonic() > deadline:
            raise AssertionError(f"{run_dir}: {n} sample rows after {timeout} s, waited for {rows}")
        time.sleep(0.1)


def kill_profiler(proc: subprocess.Popen) -> list:
    """SIGKILL a `counterprof run` (no chance to finish anything); its workload goes on as an
    orphan: the processes are returned so that the test can end them (`end_processes`)."""
    import psutil
    workload = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    return workload


def end_processes(procs: list) -> None:
    import psutil
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass



class ClaimHeldElsewhere:
    """Another process holds a torch trace's conversion claim (as a second converter would)
    until `die()`: it then exits without marking the trace converted, like a killed one."""

    def __init__(self, trace):
        self.proc = subprocess.Popen(
            [PYTHON, "-c", "import os, sys; from pathlib import Path\n"
                           "from counterprof.collectors.torch_trace.claim import Claim\n"
                           f"c = Claim.take(Path({str(trace)!r})); print(c is not None, flush=True)\n"
                           "sys.stdin.readline(); os._exit(9)"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "True", "the claim was not free"

    def die(self) -> None:
        self.proc.communicate("\n", timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()
