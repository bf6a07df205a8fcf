"""The threads collector's rules and arithmetic: roles, wrapper descent, and the native walk's
per-thread deltas on fake /proc trees (native/procstat.c reads whatever `proc` points at)."""
import os
import time

import pytest
from hypothesis import given, settings, strategies as st

from counterprof.ground.clock import Clock
from counterprof.collector import SessionContext, Target
from counterprof.collectors.threads import (COMM, EXCLUDED, INTRAOP, LOADER, MAIN, OTHER, Contenders, Critical,
                                            ThreadReader, ThreadsCollector, assign_roles, descend_wrappers,
                                            is_comm_thread)

TICK = os.sysconf("SC_CLK_TCK")


# -- roles ------------------------------------------------------------------------------------

def test_roles_of_a_training_process_its_workers_and_a_helper():
    threads = [(100, 100, "python"), (101, 100, "python"), (102, 100, "pt_autograd_0"),
               (103, 100, "pt_gloo_runloop"), (104, 100, "gloo_tcp_loop"), (105, 100, "pt_tcpstore_uv"),
               (106, 100, "pt_data_pin"), (107, 100, "counterprof-thr"),
               (200, 200, "pt_data_worker"), (201, 200, "pt_data_worker"),
               (300, 300, "python"), (301, 300, "python")]
    roles = assign_roles(threads, Critical(100, 100), excluded={107})
    assert roles == [MAIN, INTRAOP, INTRAOP, COMM, COMM, COMM, LOADER, EXCLUDED,
                     LOADER, LOADER, OTHER, OTHER]


def test_a_worker_process_counts_whole_even_where_a_thread_is_not_renamed():
    threads = [(100, 100, "python"), (200, 200, "pt_data_worker"), (201, 200, "python")]
    assert assign_roles(threads, Critical(100, 100), set()) == [MAIN, LOADER, LOADER]


def test_the_critical_process_is_never_a_loader_and_without_one_all_is_other():
    threads = [(100, 100, "pt_data_worker"), (101, 100, "python")]
    assert assign_roles(threads, Critical(100, 100), set()) == [MAIN, INTRAOP]
    assert assign_roles([(5, 5, "python")], None, set()) == [OTHER]


def test_in_process_the_calling_thread_is_main_not_the_process_leader():
    threads = [(100, 100, "python"), (101, 100, "python")]
    assert assign_roles(threads, Critical(100, 101), set()) == [INTRAOP, MAIN]


@pytest.mark.parametrize("name,comm", [("pt_nccl_watchdg", True), ("NCCL Progress0", True),
                                       ("pt_tcpstore_uv", True), ("python", False), ("pt_autograd_0", False),
                                       ("pt_data_worker", False)])
def test_comm_thread_names(name, comm):
    assert is_comm_thread(name) is comm


def test_descent_through_wrappers_that_wait_for_their_only_child():
    children = {1: [2], 2: [3], 3: [4, 5]}
    comm = {1: "timeout", 2: "sh", 3: "python", 4: "pt_data_worker", 5: "pt_data_worker"}
    waits = []
    assert descend_wrappers(1, children, comm, lambda p: waits.append(p)) == 3
    assert waits == []                       # names told; 3 has two children: it is the one
    # a python that waits (do_wait) for its only child is a wrapper too; one that computes is not
    comm2 = {1: "python", 2: "python"}
    assert descend_wrappers(1, {1: [2]}, comm2, lambda p: "do_wait") == 2
    assert descend_wrappers(1, {1: [2]}, comm2, lambda p: "hrtimer_nanosleep") == 1
    assert descend_wrappers(1, {1: [2]}, comm2, lambda p: None) == 1     # unreadable: stay
    assert descend_wrappers(1, {}, {1: "sh"}, lambda p: "do_wait") == 1  # nothing below


# -- the native walk on fake trees -------------------------------------------------------------

def _boot_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * TICK)


def stat_line(pid, comm, threads=1, start=0, state="S"):
    f = [str(pid), f"({comm})", state] + ["0"] * 16 + [str(threads), "0", str(start)] + ["0"] * 30
    return " ".join(f) + "\n"


class FakeProc:
    """A /proc tree: processes with threads, each with stat, comm, schedstat and children."""

    def __init__(self, root):
        self.root = root

    def thread(self, pid, tid, comm="python", run=0, wait=0, start=0, children=()):
        d = self.root / str(pid) / "task" / str(tid)
        d.mkdir(parents=True, exist_ok=True)
        self.schedstat(pid, tid, run, wait)
        (d / "comm").write_text(comm + "\n")
        (d / "stat").write_text(stat_line(tid, comm, start=start))
        (d / "children").write_text("".join(f"{c} " for c in children))
        self.restat(pid)

    def schedstat(self, pid, tid, run, wait):
        # same inode rewritten: held descriptors read the new text, as /proc regenerates it
        (self.root / str(pid) / "task" / str(tid) / "schedstat").write_text(f"{int(run * 1e9)} {int(wait * 1e9)} 3\n")

    def restat(self, pid, state="S"):
        tids = sorted(int(t) for t in os.listdir(self.root / str(pid) / "task"))
        comm = (self.root / str(pid) / "task" / str(pid) / "comm").read_text().strip() \
            if (self.root / str(pid) / "task" / str(pid) / "comm").exists() else "?"
        (self.root / str(pid) / "stat").write_text(stat_line(pid, comm, threads=len(tids), state=state))

    def remove_thread(self, pid, tid):
        d = self.root / str(pid) / "task" / str(tid)
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
        self.restat(pid)


def by_tid(arr):
    return {int(t["tid"]): t for t in arr}


def test_first_sample_is_a_baseline_then_deltas(tmp_path):
    fp = FakeProc(tmp_path)
    fp.thread(100, 100, run=5.0, wait=1.0)
    fp.thread(100, 101, run=2.0, wait=0.5)
    r = ThreadReader(100, str(tmp_path))
    try:
        alive, changed, interval, arr = r.sample(full=True)
        assert alive and changed and interval == 0
        assert [t["run_s"] for t in arr] == [0, 0]        # an attached tree's history is not ours
        fp.schedstat(100, 100, 5.25, 1.0)
        fp.schedstat(100, 101, 2.0, 0.75)
        alive, changed, interval, arr = r.sample()
        t = by_tid(arr)
        assert not changed and interval > 0
        assert (t[100]["run_s"], t[100]["wait_s"]) == (pytest.approx(0.25), 0)
        assert (t[101]["run_s"], t[101]["wait_s"]) == (0, pytest.approx(0.25))
        assert not t[100]["fresh"]
    finally:
        r.close()


def test_a_thread_born_since_the_last_sample_counts_from_birth_an_old_one_first_seen_does_not(tmp_path):
    fp = FakeProc(tmp_path)
    fp.thread(100, 100, run=1.0)
    r = ThreadReader(100, str(tmp_path))
    try:
        r.sample(full=True)
        time.sleep(0.05)
        fp.thread(100, 102, run=0.03, wait=0.01, start=_boot_ticks())          # born now
        fp.thread(100, 103, run=9.0, wait=2.0, start=_boot_ticks() - 100 * TICK)   # born 100 s ago
        alive, changed, interval, arr = r.sample()
        t = by_tid(arr)
        assert changed
        assert t[102]["fresh"] and (t[102]["run_s"], t[102]["wait_s"]) == (pytest.approx(0.03), pytest.approx(0.01))
        assert 0 <= t[102]["life_s"] <= interval
        assert t[103]["fresh"] and (t[103]["run_s"], t[103]["wait_s"]) == (0, 0)
        fp.schedstat(100, 103, 9.5, 2.0)
        t = by_tid(r.sample()[3])
        assert t[103]["run_s"] == pytest.approx(0.5)
    finally:
        r.close()


def test_a_thread_that_exits_is_dropped_and_a_reused_tid_never_goes_negative(tmp_path):
    fp = FakeProc(tmp_path)
    fp.thread(100, 100, run=1.0)
    fp.thread(100, 101, run=4.0, wait=1.0)
    r = ThreadReader(100, str(tmp_path))
    try:
        r.sample(full=True)
        fp.remove_thread(100, 101)
        alive, changed, _, arr = r.sample()
        assert changed and sorted(by_tid(arr)) == [100]
        fp.schedstat(100, 100, 0.5, 0.0)                   # smaller than before (a reused tid)
        t = by_tid(r.sample()[3])
        assert t[100]["run_s"] == 0 and t[100]["wait_s"] == 0
    finally:
        r.close()


def test_children_processes_with_parents_and_names(tmp_path):
    fp = FakeProc(tmp_path)
    fp.thread(100, 100, comm="sh", children=[200])
    fp.thread(200, 200, comm="python", children=[300])
    fp.thread(200, 201, comm="python", children=[301])      # forked from a non-main thread
    fp.thread(300, 300, comm="pt_data_worker")
    fp.thread(301, 301, comm="helper")
    r = ThreadReader(100, str(tmp_path))
    try:
        arr = r.sample(full=True)[3]
        t = by_tid(arr)
        assert sorted(t) == [100, 200, 201, 300, 301]
        assert {k: (int(v["pid"]), int(v["ppid"])) for k, v in t.items()} == \
            {100: (100, 0), 200: (200, 100), 201: (200, 100), 300: (300, 200), 301: (301, 200)}
        assert t[300]["comm"] == b"pt_data_worker"
        # between full samples other threads' children lists are not read: 301 is still followed
        fp.schedstat(301, 301, 0.2, 0.1)
        _, changed, _, arr = r.sample()
        t = by_tid(arr)
        assert not changed and sorted(t) == [100, 200, 201, 300, 301]
        assert (t[301]["run_s"], t[301]["wait_s"], t[301]["ppid"]) == (pytest.approx(0.2), pytest.approx(0.1), 200)
        # and when it is reaped it is dropped (descriptors held on /proc files then read
        # nothing, ESRCH: emptied in place here)
        for f in (tmp_path / "301").rglob("*"):
            if f.is_file():
                f.write_text("")
        (tmp_path / "200" / "task" / "201" / "children").write_text("")
        _, changed, _, arr = r.sample()
        assert changed and sorted(by_tid(arr)) == [100, 200, 201, 300]
        # a rename of a worker thread is seen on the next full sample (each second), not before
        (tmp_path / "300" / "task" / "300" / "comm").write_text("renamed\n")
        fp.thread(200, 202, comm="python")
        (tmp_path / "200" / "task" / "202" / "comm").write_text("late_name\n")
        assert by_tid(r.sample()[3])[202]["comm"] == b"late_name"       # new: named at first sight
        (tmp_path / "200" / "task" / "202" / "comm").write_text("pt_gloo_runloop\n")
        assert by_tid(r.sample()[3])[202]["comm"] == b"late_name"
        _, changed, _, arr = r.sample(full=True)
        assert changed and by_tid(arr)[202]["comm"] == b"pt_gloo_runloop"
    finally:
        r.close()


def test_root_zombie_or_gone(tmp_path):
    fp = FakeProc(tmp_path)
    fp.thread(100, 100)
    r = ThreadReader(100, str(tmp_path))
    try:
        assert r.sample(full=True)[0]
        fp.restat(100, state="Z")
        alive, _, _, arr = r.sample()
        assert not alive and len(arr) == 0
    finally:
        r.close()
    with pytest.raises(OSError):
        ThreadReader(999, str(tmp_path))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.5), st.floats(0, 0.5)), min_size=1, max_size=8))
def test_deltas_sum_to_the_growth_whatever_the_steps(tmp_path_factory, steps):
    """Summed deltas equal the counters' growth since the baseline, never negative, with a
    descriptor budget of 0 (files opened each read) as with a large one."""
    for max_fds in (0, 64):
        root = tmp_path_factory.mktemp("proc")
        fp = FakeProc(root)
        fp.thread(100, 100, run=1.0, wait=1.0)
        r = ThreadReader(100, str(root), max_fds=max_fds)
        try:
            r.sample(full=True)
            run = wait = 1.0
            total_run = total_wait = 0.0
            for dr, dw in steps:
                run, wait = run + dr, wait + dw
                fp.schedstat(100, 100, run, wait)
                t = by_tid(r.sample()[3])[100]
                assert t["run_s"] >= 0 and t["wait_s"] >= 0
                total_run += t["run_s"]
                total_wait += t["wait_s"]
            assert total_run == pytest.approx(run - 1.0, abs=1e-6)
            assert total_wait == pytest.approx(wait - 1.0, abs=1e-6)
        finally:
            r.close()


# -- the collector's rows on a fake tree --------------------------------------------------------

def test_collector_rows_main_blocked_is_the_rest_of_the_interval(tmp_path):
    fp = FakeProc(tmp_path)
    fp.thread(100, 100, comm="python")
    fp.thread(100, 101, comm="python")
    fp.thread(100, 102, comm="pt_gloo_runloop")
    batches = []
    ctx = SessionContext(clock=Clock(), target=Target("pid", 100), config={}, rank=0,
                         emit=lambda table, batch, rank=None: batches.append(batch),
                         add_metrics=lambda m: None, fail=lambda n, r: None, warn=lambda m: None)
    col = ThreadsCollector({"proc": str(tmp_path), "interval_ms": 3_600_000})   # sampled by hand
    col.start(ctx)
    try:
        fp.schedstat(100, 100, 0.02, 0.01)
        fp.schedstat(100, 101, 0.3, 0.1)
        fp.schedstat(100, 102, 0.05, 0.0)
        time.sleep(0.1)
        col.sample(walk=True)     # the critical thread every sample; the whole tree on walks
        col.flush()
    finally:
        col._stop.set()
        col._thread.join()
    rows = {(m, e): (v, d) for b in batches for m, e, v, d in zip(
        b["metric"].to_pylist(), b["entity"].to_pylist(), b["value"].to_pylist(), b["duration_ns"].to_pylist())}
    dur = rows[("thread.main.running", "tid:100")][1] / 1e9
    assert dur >= 0.1                     # since the baseline sample in start()
    assert rows[("thread.main.running", "tid:100")][0] == pytest.approx(0.02)
    assert rows[("thread.main.runnable", "tid:100")][0] == pytest.approx(0.01)
    assert rows[("thread.main.blocked", "tid:100")][0] == pytest.approx(dur - 0.03)
    assert rows[("thread.intraop.running", "process")][0] == pytest.approx(0.3)
    assert rows[("thread.intraop.runnable", "process")][0] == pytest.approx(0.1)
    assert rows[("thread.comm.running", "process")][0] == pytest.approx(0.05)
    assert rows[("thread.intraop.count", "process")] == (1, None)
    assert rows[("thread.loader.workers", "process")] == (0, None)
    assert col.details["main"][0]["tid"] == 100 and col.details["main"][0]["comm"] == "python"


def test_validate_rejects_bad_intervals():
    from counterprof.ground.errors import UsageError
    for bad in (0, -5, 1e9, "fast"):
        with pytest.raises(UsageError, match="threads interval"):
            ThreadsCollector.validate({"interval_ms": bad})
    ThreadsCollector.validate({"interval_ms": 10})


def test_contenders_count_cpu_used_during_the_run_outside_our_trees(tmp_path):
    def proc(pid, ppid, comm, ticks, start=0):
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        f = [str(pid), f"({comm})", "S", str(ppid)] + ["0"] * 9 + [str(ticks), "0"] + ["0"] * 6 + [str(start)]
        (tmp_path / str(pid) / "stat").write_text(" ".join(f + ["0"] * 20) + "\n")
    proc(1, 0, "init", 10)
    proc(50, 1, "busy", 100)
    proc(100, 1, "workload", 500)
    proc(101, 100, "worker", 500)
    c = Contenders([100], str(tmp_path))
    c.read()
    proc(50, 1, "busy", 100 + 3 * TICK)
    proc(101, 100, "worker", 900)
    proc(60, 1, "newcomer", TICK, start=_boot_ticks() + 1)     # born during the run: from birth
    c.read()
    assert c.top() == [{"pid": 50, "comm": "busy", "cpu_s": 3.0}, {"pid": 60, "comm": "newcomer", "cpu_s": 1.0}]


def test_process_table_reads_every_process_and_skips_what_is_not_one(tmp_path):
    from counterprof.collectors.threads import process_table

    def stat(pid, comm, ppid, utime, stime, start):
        return " ".join([str(pid), f"({comm})", "S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)]
                        + ["0"] * 6 + [str(start)] + ["0"] * 20) + "\n"
    for pid, comm, ppid, u, s_, start in ((1, "init", 0, 5, 5, 1), (7, "a) (b c", 1, 30, 12, 99),
                                          (9, "x" * 15, 7, 0, 0, 123456789012)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat(pid, comm, ppid, u, s_, start))
    (tmp_path / "self").mkdir()                                     # not a process
    (tmp_path / "42").mkdir()                                       # gone: no stat
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "stat").write_text("43 (cut) S 1 0 0")        # cut short
    for cap in (4096, 1):                                           # room for all, or too little
        pid, start, ppid, cpu, comm = process_table(str(tmp_path), cap=cap)
        got = sorted(zip(pid.tolist(), comm.tolist(), ppid.tolist(), cpu.tolist(), start.tolist()))
        assert got == [(1, b"init", 0, 10, 1), (7, b"a) (b c", 1, 42, 99), (9, b"x" * 15, 7, 0, 123456789012)]


def test_process_table_agrees_with_proc_for_this_process():
    from counterprof.collectors.threads import process_table
    pid, start, ppid, cpu, comm = process_table()
    mine = pid == os.getpid()
    assert mine.sum() == 1
    with open(f"/proc/{os.getpid()}/stat") as f:
        head, _, rest = f.read().rpartition(")")
    fields = rest.split()
    assert ppid[mine][0] == int(fields[1]) and start[mine][0] == int(fields[19])
    assert comm[mine][0].decode() == head.partition("(")[2][:15]
    assert abs(cpu[mine][0] - (int(fields[11]) + int(fields[12]))) <= 2      # it ran between the reads
    assert {1, os.getppid()} <= set(pid.tolist())


def test_contenders_are_read_less_often_where_a_read_costs_more_than_its_share():
    from counterprof.collectors import threads as mod

    class Costly:
        def __init__(self, cpu_s):
            self.cpu_s, self.reads = cpu_s, 0

        def read(self):                       # burns CPU like a scan of that many processes
            end = time.thread_time() + self.cpu_s
            while time.thread_time() < end:
                pass
            self.reads += 1

    col = ThreadsCollector()
    col.details = {}
    for cost, every in ((0.0001, mod.CONTENDERS_EVERY_S), (0.01, 0.01 / mod.CONTENDERS_CPU_SHARE)):
        col.contenders = Costly(cost)
        col._contenders_every, col._last_contenders = mod.CONTENDERS_EVERY_S, time.monotonic()
        col._contenders_due()                 # not due yet: no read
        assert col.contenders.reads == 0
        col._last_contenders -= mod.CONTENDERS_EVERY_S
        col._contenders_due()
        assert col.contenders.reads == 1
        assert col._contenders_every == pytest.approx(every, rel=0.3)
        assert col.details["contenders_every_s"] == pytest.approx(every, rel=0.3)
