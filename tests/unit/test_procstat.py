"""The /proc readers (native/procstat.c) on fake proc trees, as psutil tests its parsers."""
import os

import pytest

from counterprof.collectors.host import system_stats, tree_stats

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGESIZE")


def stat_line(pid, comm, state="S", utime=0, stime=0, cutime=0, cstime=0, threads=1, rss=0):
    # fields 1..24 of /proc/PID/stat; comm may hold spaces and parentheses
    f = [str(pid), f"({comm})", state, "1", str(pid), str(pid), "0", "-1", "4194304", "0", "0", "0", "0",
         str(utime), str(stime), str(cutime), str(cstime), "20", "0", str(threads), "0", "100", "1000", str(rss)]
    return " ".join(f) + " 0 0 0\n"


def add_proc(root, pid, *, tids=None, children=None, io=None, switches=(0, 0), **stat):
    d = root / str(pid)
    (d / "task").mkdir(parents=True)
    (d / "stat").write_text(stat_line(pid, stat.pop("comm", "python3"), **stat))
    if io is not None:
        (d / "io").write_text(f"rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: {io[0]}\n"
                              f"write_bytes: {io[1]}\ncancelled_write_bytes: 999\n")
    (d / "schedstat").write_text(f"{stat.get('utime', 0) * 1000} {switches[0] * 1000000} 7\n")
    (d / "status").write_text(f"Name:\tpython3\nThreads:\t1\nvoluntary_ctxt_switches:\t{switches[0]}\n"
                              f"nonvoluntary_ctxt_switches:\t{switches[1]}\n")
    children = children or {}
    for tid in tids or [pid]:
        t = d / "task" / str(tid)
        t.mkdir()
        (t / "children").write_text(" ".join(str(c) for c in children.get(tid, [])) + " ")


def fake_system(proc):
    (proc / "stat").write_text("cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 3 0\n")
    (proc / "meminfo").write_text("MemTotal:       1000 kB\nMemFree:         100 kB\n"
                                  "MemAvailable:    600 kB\n")


def test_tree_sums_live_processes_and_reaped_children(tmp_path):
    proc = tmp_path
    fake_system(proc)
    # 100 -> 101 (from its main thread); 101's second thread 1011 -> 102; 103 listed but gone
    add_proc(proc, 100, children={100: [101, 103]}, utime=100, stime=20, cutime=50, cstime=5,
             threads=1, rss=1000, io=(4096, 8192), switches=(10, 2), comm="my (weird) cmd")
    add_proc(proc, 101, tids=[101, 1011], children={1011: [102]}, utime=200, stime=10, threads=2,
             rss=500, io=(1, 2), switches=(5, 1))
    add_proc(proc, 102, utime=1, rss=10, switches=(1, 0))          # /proc/102/io unreadable
    s = tree_stats(100, str(proc))
    assert s["processes"] == 3
    assert s["threads"] == 1 + 2 + 1
    assert s["user_s"] == pytest.approx((100 + 50 + 200 + 1) / TICK)
    assert s["system_s"] == pytest.approx((20 + 5 + 10) / TICK)
    assert s["rss_bytes"] == (1000 + 500 + 10) * PAGE
    assert (s["read_bytes"], s["write_bytes"]) == (4097, 8194)
    assert (s["ctx_voluntary"], s["ctx_involuntary"]) == (16, 3)
    assert s["run_delay_s"] == pytest.approx((10 + 5 + 1) * 1e-3)   # schedstat's 2nd field, ns


def test_a_zombie_child_keeps_its_cpu_time_until_reaped(tmp_path):
    """live child -> zombie -> reaped into the parent's cutime: the tree's CPU never dips, so the
    collector's per-interval deltas never count the child twice."""
    fake_system(tmp_path)
    add_proc(tmp_path, 100, children={100: [101]}, utime=10, rss=100, io=(0, 0))
    add_proc(tmp_path, 101, utime=40, rss=50, io=(4096, 0))
    live = tree_stats(100, str(tmp_path))
    (tmp_path / "101" / "stat").write_text(stat_line(101, "python3", state="Z", utime=40))
    zombie = tree_stats(100, str(tmp_path))
    (tmp_path / "100" / "stat").write_text(stat_line(100, "python3", utime=10, cutime=40, rss=100))
    (tmp_path / "100" / "io").write_text("read_bytes: 4096\nwrite_bytes: 0\n")
    (tmp_path / "100" / "task" / "100" / "children").write_text(" ")
    reaped = tree_stats(100, str(tmp_path))
    assert live["user_s"] == zombie["user_s"] == reaped["user_s"] == pytest.approx(50 / TICK)
    assert live["read_bytes"] == zombie["read_bytes"] == reaped["read_bytes"] == 4096
    assert (live["processes"], zombie["processes"]) == (2, 1)     # a zombie is not a process any more
    assert zombie["rss_bytes"] == 100 * PAGE


def test_root_gone_or_zombie_is_none(tmp_path):
    fake_system(tmp_path)
    assert tree_stats(100, str(tmp_path)) is None
    add_proc(tmp_path, 100, state="Z")
    assert tree_stats(100, str(tmp_path)) is None


def test_system_stats_from_fake_stat_and_meminfo(tmp_path):
    fake_system(tmp_path)
    s = system_stats(str(tmp_path))
    assert s["cpu_total_s"] == pytest.approx((100 + 5 + 50 + 800 + 40 + 3 + 2 + 0) / TICK)
    assert s["cpu_idle_s"] == pytest.approx(800 / TICK)
    assert s["cpu_iowait_s"] == pytest.approx(40 / TICK)
    assert (s["mem_total_bytes"], s["mem_available_bytes"]) == (1000 * 1024, 600 * 1024)


def test_missing_proc_is_an_error(tmp_path):
    with pytest.raises(OSError):
        system_stats(str(tmp_path / "nope"))


def test_open_files_are_reread_each_sample(tmp_path):
    """The root's files stay open and are re-read from offset 0 at every sample."""
    from counterprof.collectors.host import ProcReader
    fake_system(tmp_path)
    add_proc(tmp_path, 100, utime=10)
    reader = ProcReader(100, str(tmp_path))
    try:
        assert reader.sample()[0]["user_s"] == pytest.approx(10 / TICK)
        (tmp_path / "100" / "stat").write_text(stat_line(100, "python3", utime=30))  # same inode
        assert reader.sample()[0]["user_s"] == pytest.approx(30 / TICK)
        (tmp_path / "100" / "stat").write_text(stat_line(100, "python3", state="Z"))
        assert reader.sample()[0] is None
    finally:
        reader.close()


def rows(reader):
    """The rows the reader recorded, drained as the host collector drains them."""
    import pyarrow as pa
    from counterprof.collectors.host import METRICS
    batch = reader.drain(pa.array(["host"]), pa.array([m.name for m in METRICS]),
                         pa.array(["process", "system"]))
    if batch is None:
        return {}
    return {(r["metric"], r["entity"]): r for r in batch.to_pylist()}


def test_record_turns_samples_into_rows_in_c(tmp_path):
    """cp_procstat_record: the first sample is the baseline; then deltas (with the interval's
    duration, never negative), gauges (no duration) and the system's shares, per sample."""
    from counterprof.collectors.host import METRICS, ProcReader
    fake_system(tmp_path)
    add_proc(tmp_path, 100, utime=10, stime=5, rss=100, io=(10, 20), switches=(3, 1))
    reader = ProcReader(100, str(tmp_path))
    try:
        assert reader.record() == 0 and rows(reader) == {}
        (tmp_path / "100" / "stat").write_text(stat_line(100, "python3", utime=30, stime=2, rss=300))  # stime back
        (tmp_path / "stat").write_text("cpu  150 5 50 830 60 3 2 0 7 0\n")     # +50 busy, +30 idle, +20 iowait
        assert reader.record() == len(METRICS)
        got = rows(reader)
        assert {m for m, _ in got} == {m.name for m in METRICS}
        assert got[("proc.cpu_user", "process")]["value"] == pytest.approx(20 / TICK)
        assert got[("proc.cpu_system", "process")]["value"] == 0.0
        assert got[("proc.rss", "process")]["value"] == 300 * PAGE
        assert got[("proc.rss", "process")]["duration_ns"] is None
        assert got[("proc.cpu_user", "process")]["duration_ns"] > 0
        assert got[("system.cpu_util", "system")]["value"] == pytest.approx(50.0)
        assert got[("system.cpu_iowait", "system")]["value"] == pytest.approx(20.0)
        assert got[("system.mem_used", "system")]["value"] == 400 * 1024
        assert rows(reader) == {}                                  # drained
        (tmp_path / "100" / "stat").write_text(stat_line(100, "python3", state="Z"))
        reader.record()
        assert reader.root_gone
        # the tree's rows stop; /proc/stat did not move, so no CPU shares either
        assert set(rows(reader)) == {("system.mem_used", "system"), ("system.mem_available", "system")}
    finally:
        reader.close()


def test_a_child_of_another_thread_counts_between_full_walks(tmp_path):
    """Between the once-a-second full walks only main threads' children files are read, plus
    the children the last full walk found: a child of a second thread keeps counting, and once
    reaped (its time now in the parent's cutime) it is counted once, not twice nor lost."""
    from counterprof.collectors.host import ProcReader
    fake_system(tmp_path)
    add_proc(tmp_path, 100, tids=[100, 1001], children={1001: [101]}, utime=10, threads=2)
    add_proc(tmp_path, 101, utime=5)
    reader = ProcReader(100, str(tmp_path))
    try:
        reader.record()                                            # full walk: finds 101
        (tmp_path / "101" / "stat").write_text(stat_line(101, "python3", utime=25))
        reader.record()
        assert rows(reader)[("proc.cpu_user", "process")]["value"] == pytest.approx(20 / TICK)
        assert rows(reader) == {}
        # 101 reaped by 100: gone from /proc and from the children file, in 100's cutime
        import shutil
        shutil.rmtree(tmp_path / "101")
        (tmp_path / "100" / "task" / "1001" / "children").write_text(" ")
        (tmp_path / "100" / "stat").write_text(stat_line(100, "python3", utime=12, cutime=25, threads=2))
        reader.record()
        got = rows(reader)
        assert got[("proc.cpu_user", "process")]["value"] == pytest.approx(2 / TICK)
        assert got[("proc.processes", "process")]["value"] == 1
    finally:
        reader.close()


def test_system_figures_read_once_per_system_period(tmp_path):
    """cp_procstat_set_system_period: the tree's rows every record, the system's only once the
    period has passed, with the true span since the last system reading as their duration. The
    context switches (the only figures of /proc/PID/status, its costliest file) come with them."""
    import time
    from counterprof.collectors.host import SYSTEM_FROM, METRICS, ProcReader
    fake_system(tmp_path)
    add_proc(tmp_path, 100, utime=10, rss=100, io=(10, 20), switches=(7, 1))
    reader = ProcReader(100, str(tmp_path))
    ctx = {"proc.ctx_switches_voluntary", "proc.ctx_switches_involuntary"}
    try:
        reader.lib.cp_procstat_set_system_period(reader.handle, 200_000_000)   # 200 ms
        reader.record()                                            # the baseline reads both
        (tmp_path / "stat").write_text("cpu  150 5 50 830 60 3 2 0 7 0\n")
        status = tmp_path / "100" / "status"
        status.write_text("Name:\tpython3\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t1\n")
        assert reader.record() == SYSTEM_FROM - len(ctx)           # too soon: the tree, less status
        first = rows(reader)
        assert {e for _, e in first} == {"process"} and not ctx & {m for m, _ in first}
        status.write_text("Name:\tpython3\nvoluntary_ctxt_switches:\t15\nnonvoluntary_ctxt_switches:\t2\n")
        time.sleep(0.25)
        assert reader.record() == len(METRICS)
        got = rows(reader)
        assert got[("system.cpu_util", "system")]["value"] == pytest.approx(50.0)
        # the system rows span both records since the baseline, the tree's only the last
        assert (got[("system.cpu_util", "system")]["duration_ns"]
                > got[("proc.cpu_user", "process")]["duration_ns"])
        # the switches of both records since the baseline, over the system rows' span
        vol = got[("proc.ctx_switches_voluntary", "process")]
        assert vol["value"] == 8 and got[("proc.ctx_switches_involuntary", "process")]["value"] == 1
        assert vol["duration_ns"] == got[("system.cpu_util", "system")]["duration_ns"]
    finally:
        reader.close()
