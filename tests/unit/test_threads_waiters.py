"""Which processes' main threads are critical when the process below the wrappers only waits for its
children (collectors/threads.py: _choose_criticals, the waiter rule), on a fake /proc whose files
say what the kernel would: each main thread's wchan and schedstat, each process's stat (CPU ticks)
and command line. The clock is the test's."""
import os
from types import SimpleNamespace

from counterprof.collectors.threads import (TICKS_PER_S, WAITER_WINDOW_NS, Critical, ThreadsCollector)

MS = 1_000_000
SPAWN_CHILD = b"python\0-c\0from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4, pipe_handle=6)" \
              b"\0--multiprocessing-fork\0"
TRACKER = b"python\0-B\0-c\0from multiprocessing.resource_tracker import main;main(3)\0"
FORKSERVER = b"python\0-c\0from multiprocessing.forkserver import main; main(5, 6, ['__main__'])\0"


class Proc:
    """A fake /proc: set() writes a process's files; cpu and run accumulate."""

    def __init__(self, root):
        self.root = root
        self.run_ns, self.ticks = {}, {}

    def set(self, pid, wchan="0", cmdline=b"python\0job.py\0", run_ns=None, ticks=None):
        d = self.root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        (d / "wchan").write_text(wchan)
        (d / "cmdline").write_bytes(cmdline)
        if run_ns is not None:
            self.run_ns[pid] = run_ns
        if ticks is not None:
            self.ticks[pid] = ticks
        (d / "task" / str(pid) / "schedstat").write_text(f"{self.run_ns.get(pid, 0)} 0 1\n")
        stat = [str(pid), "(python)", "S"] + ["0"] * 10 + [str(self.ticks.get(pid, 0)), "0"] + ["0"] * 30
        (d / "stat").write_text(" ".join(stat) + "\n")

    def work(self, pid, run_ms=0, cpu_s=0.0, wchan=None):
        """pid's main thread ran run_ms more; the process used cpu_s more CPU seconds."""
        self.run_ns[pid] = self.run_ns.get(pid, 0) + run_ms * MS
        self.ticks[pid] = self.ticks.get(pid, 0) + round(cpu_s * TICKS_PER_S)
        d = self.root / str(pid)
        self.set(pid, wchan=wchan if wchan is not None else (d / "wchan").read_text(),
                 cmdline=(d / "cmdline").read_bytes())


def collector(tmp_path, children, loaders=()):
    clock = SimpleNamespace(t=1_000 * MS)
    clock.now_ns = lambda: clock.t
    col = ThreadsCollector()
    col.ctx = SimpleNamespace(clock=clock)
    col.proc, col.root, col.in_process = str(tmp_path), 1, False
    pids = {1} | {c for kids in children.values() for c in kids}
    col._procs_children = children
    col._procs_comm = {p: "python" for p in pids}
    col._loader_pids = set(loaders)
    return col, clock


def mains(criticals):
    return [c.pid for c in criticals]


def test_a_parent_that_polls_while_its_spawned_children_compute_gives_way_to_them(tmp_path):
    fp = Proc(tmp_path)
    fp.set(1, wchan="poll_schedule_timeout.constprop.0", run_ns=900 * MS)
    fp.set(2, cmdline=TRACKER)
    fp.set(3, cmdline=SPAWN_CHILD)
    fp.set(4, cmdline=SPAWN_CHILD)
    col, clock = collector(tmp_path, {1: [2, 3, 4]})
    assert mains(col._choose_criticals()) == [1]          # first look: a baseline, no window yet
    clock.t += WAITER_WINDOW_NS // 2
    fp.work(3, cpu_s=0.1)
    assert mains(col._choose_criticals()) == [1]          # a window too short to decide
    clock.t += WAITER_WINDOW_NS
    fp.work(1, run_ms=5)
    fp.work(3, cpu_s=0.2)
    fp.work(4, cpu_s=0.3)
    got = col._choose_criticals()
    assert got == (Critical(3, 3), Critical(4, 4))         # the resource tracker is never one
    assert col._launcher_of == {3: 1, 4: 1} and col._anchor == 1
    # it stays a waiter while its main thread stays mostly off-CPU, whatever the children do
    clock.t += 300 * MS
    fp.work(1, run_ms=60)                                  # 20%: under WAITER_BUSY_AGAIN
    assert mains(col._choose_criticals()) == [3, 4]
    # it works again: it is the critical one again
    clock.t += 300 * MS
    fp.work(1, run_ms=250)
    assert mains(col._choose_criticals()) == [1]
    # the children gone: the parent, and nothing kept about it
    col._procs_children = {1: [2]}
    assert mains(col._choose_criticals()) == [1] and 1 not in col._waiters


def test_a_parent_in_waitpid_gives_way_at_once_to_each_childs_work(tmp_path):
    fp = Proc(tmp_path)
    fp.set(1, wchan="do_wait")
    fp.set(3, wchan="do_wait", cmdline=b"sh\0-c\0python rank.py; true\0")
    fp.set(5)
    fp.set(4)
    col, _clock = collector(tmp_path, {1: [3, 4], 3: [5]})
    col._procs_comm[3] = "sh"
    # 3 is a shell waiting for its only child: looked through, as below the root
    assert mains(col._choose_criticals()) == [4, 5]
    assert col._launcher_of == {5: 1, 4: 1}


def test_a_parent_that_idles_beside_idle_children_or_works_beside_busy_ones_stays(tmp_path):
    fp = Proc(tmp_path)
    fp.set(1, wchan="hrtimer_nanosleep")
    fp.set(3)
    col, clock = collector(tmp_path, {1: [3]})
    assert mains(col._choose_criticals()) == [1]
    for _ in range(3):                                     # a throttled loop beside an idle helper
        clock.t += 300 * MS
        fp.work(1, run_ms=10)
        fp.work(3, cpu_s=0.01)
        assert mains(col._choose_criticals()) == [1]
    for _ in range(3):                                     # computing beside a busy helper
        clock.t += 300 * MS
        fp.work(1, run_ms=200, wchan="0")
        fp.work(3, cpu_s=0.3)
        assert mains(col._choose_criticals()) == [1]


def test_children_that_are_not_its_work(tmp_path):
    """DataLoader workers (known by their threads' name: loader) are what a main thread waits
    for, not its work; a fork server's children are its starter's workers."""
    fp = Proc(tmp_path)
    fp.set(1, wchan="do_wait")
    fp.set(2)
    fp.set(3)
    col, _clock = collector(tmp_path, {1: [2, 3]}, loaders=[2, 3])
    assert mains(col._choose_criticals()) == [1]
    fp.set(5, cmdline=TRACKER)
    fp.set(6, cmdline=FORKSERVER)
    fp.set(7)
    fp.set(8)
    col, _clock = collector(tmp_path, {1: [5, 6], 6: [7, 8]})
    fp.set(1, wchan="do_wait")
    assert mains(col._choose_criticals()) == [7, 8]
    assert col._helpers[6] == "forkserver"


def test_a_gone_parent_or_unreadable_files_keep_it_simple(tmp_path):
    fp = Proc(tmp_path)
    fp.set(3)
    col, clock = collector(tmp_path, {1: [3]})             # no files for 1: as if it just exited
    assert mains(col._choose_criticals()) == [1]
    os.makedirs(tmp_path / "1" / "task" / "1", exist_ok=True)
    clock.t += 300 * MS
    assert mains(col._choose_criticals()) == [1] and 1 not in col._waiters
