"""analysis/workers.py: parts done in worker subprocesses come back as this process would make
them, in order; a part that fails there is done here (its error raised here); a worker never
outlives its caller."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial

import pytest

from counterprof.analysis import workers
from worker_parts import fails_on_seven, hangs_in_a_worker, noisy, square_sum


def test_parts_come_back_in_order_from_other_processes():
    parts = [list(range(k, k + 10)) for k in range(0, 50, 10)]
    before = workers.fallbacks
    got = workers.spread(partial(square_sum, 3), parts)
    assert workers.fallbacks == before
    assert [s for _, s in got] == [sum(x * x for x in p) + 3 for p in parts]
    pids = [pid for pid, _ in got]
    assert pids[0] == os.getpid() and len(set(pids)) == len(parts)     # one worker a part


def test_a_worker_that_never_answers_is_killed_at_the_deadline_and_its_part_done_here(monkeypatch):
    monkeypatch.setattr(workers, "MIN_WAIT_S", 1.0)
    before, t0 = workers.fallbacks, time.monotonic()
    assert workers.spread(partial(hangs_in_a_worker, os.getpid()), [[1, 2], [3], [4, 5]]) == [3, 3, 9]
    assert workers.fallbacks == before + 2
    assert time.monotonic() - t0 < 20          # the hung workers wait an hour
    # (each hung worker was killed: no worker is left a child of this process)
    children = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "workers import _worker"],
                              capture_output=True, text=True).stdout.split()
    assert children == [], children


def test_a_part_that_fails_in_its_worker_fails_here():
    with pytest.raises(ValueError, match="seven"):
        workers.spread(fails_on_seven, [[1], [2, 7], [3]])
    assert workers.spread(fails_on_seven, [[1], [2, 3], []]) == [1, 2, 0]


def test_what_cannot_be_pickled_is_done_here():
    before = workers.fallbacks
    assert workers.spread(lambda part: sum(part), [[1], [2, 3]]) == [1, 5]
    assert workers.fallbacks == before + 1


def test_what_a_worker_prints_does_not_spoil_its_result():
    before = workers.fallbacks
    assert workers.spread(noisy, [[1], [2, 3]]) == [1, 5]
    assert workers.fallbacks == before


@pytest.mark.parametrize("shadow", ["counterprof", "numpy"])
def test_a_working_directory_holding_other_packages_is_not_imported(tmp_path, monkeypatch, shadow):
    """The worker imports what its caller imported, not a folder of the same name where it runs."""
    fake = tmp_path / shadow
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('the wrong one')\n")
    monkeypatch.chdir(tmp_path)
    before = workers.fallbacks
    got = workers.spread(partial(square_sum, 0), [[1], [2]])
    assert workers.fallbacks == before and got[1][0] != os.getpid()


def test_a_worker_stops_when_its_caller_is_killed():
    parent = textwrap.dedent("""
        import time
        from counterprof.analysis import workers
        child = workers._start(time.sleep, 600)
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    # started ignoring SIGTERM, as a caller under some supervisors is (inherited by its workers)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        time.sleep(1.5)                # its part begun (it takes ~0.1 s): prctl has taken
        assert _alive(child)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.05)
        assert not _alive(child), "the worker outlived its killed caller"
    finally:
        proc.kill()
        proc.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

