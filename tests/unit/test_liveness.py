"""store/liveness.py: who counts as still writing a run, and the rank=<r> paths built in one
place (rundir) and, in the workload, by the torch driver that cannot import counterprof."""
import os
import socket
import subprocess
import sys

from counterprof.store import liveness, rundir

HERE = socket.gethostname()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_profiler_is_alive_while_running_here_or_on_another_host():
    me = {"status": "running", "profiler": {"pid": os.getpid(), "host": HERE}}
    assert liveness.profiler_alive(me) and liveness.profiler_on_this_host(me)
    assert liveness.profiler_elsewhere(me) is None
    assert not liveness.profiler_alive({**me, "status": "finished"})
    gone = {"status": "running", "profiler": {"pid": _dead_pid(), "host": HERE}}
    assert not liveness.profiler_alive(gone)
    assert not liveness.profiler_alive({"status": "running", "profiler": {"pid": "1"}})
    far = {"status": "running", "profiler": {"pid": 1, "host": HERE + "-other"}}
    assert liveness.profiler_alive(far) and liveness.profiler_elsewhere(far) == HERE + "-other"
    assert not liveness.profiler_on_this_host(far)
    assert liveness.profiler_elsewhere({**far, "status": "recovered"}) is None


def test_a_journal_writer_is_judged_by_the_pid_in_its_id():
    parent = os.getppid()
    assert liveness.journal_writer_alive(f"{parent}-abcdef")
    assert liveness.journal_writer_alive(f"regions{parent}-ab")
    assert not liveness.journal_writer_alive(f"{os.getpid()}-abcdef")     # ours: we stopped
    assert not liveness.journal_writer_alive(f"{_dead_pid()}-abcdef")
    assert not liveness.journal_writer_alive("w1")


def test_a_claimer_on_another_host_or_not_saying_counts_as_alive():
    assert liveness.claimer_alive({"pid": 1, "host": HERE + "-other"})
    assert liveness.claimer_alive({})
    assert liveness.claimer_alive({"pid": os.getppid(), "host": HERE})
    assert not liveness.claimer_alive({"pid": os.getpid(), "host": HERE})
    assert not liveness.claimer_alive({"pid": _dead_pid(), "host": HERE})


def test_rank_folders_are_named_and_read_back_in_one_place(tmp_path):
    d = rundir.rank_dir(tmp_path, 7)
    assert d == tmp_path / rundir.RANKS / "rank=7" and rundir.rank_of_dir(d) == 7
    assert rundir.run_of_rank(d) == tmp_path


def test_the_torch_driver_writes_where_rundir_says_traces_go(tmp_path, monkeypatch):
    from counterprof.collectors.torch_trace import load_driver
    monkeypatch.delenv("RANK", raising=False)
    driver = load_driver().Driver(str(tmp_path), rank=3)
    assert driver._traces_folder() == str(rundir.traces_dir(tmp_path, 3))
