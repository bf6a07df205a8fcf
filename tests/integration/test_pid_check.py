"""--pid is checked with psutil before anything starts: a missing pid and a zombie are one
line and exit 2 (a zombie still has /proc/PID, but nothing runs there to count)."""
from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from helpers import PYTHON, run_cli


@pytest.mark.parametrize("sub", [["run"], ["top"]])
def test_a_zombie_pid_is_refused_with_what_it_is(sub):
    child = subprocess.Popen([PYTHON, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:   # exited, not reaped
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc = run_cli(*sub, "--pid", str(child.pid), "--duration", "1")
        assert proc.returncode == 2, proc.stderr
        assert f"pid {child.pid} has exited" in proc.stderr
    finally:
        child.wait()


def test_a_missing_pid_is_refused():
    proc = run_cli("run", "--pid", "999999999", "--duration", "1")
    assert proc.returncode == 2 and "no process with pid 999999999" in proc.stderr
