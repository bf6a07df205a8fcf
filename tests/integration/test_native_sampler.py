"""The C sampling thread on real software counters: ticks, drains, no lost counts."""
import mmap
import os
import threading
import time

import pytest

from counterprof._native import ffi, lib
from counterprof.collectors.perf import native
from counterprof.collectors.perf.events import parse_events


def open_self(text: str) -> int:
    spec = parse_events(text)[0].leader
    fd = native.open_event(spec, native.OpenFlags(leader=True, enable_on_exec=False, inherit=True),
                           0, -1)
    native.enable(fd)
    return fd


def drain(s, n):
    t, d = ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
    slot, val = ffi.new("int32_t[]", n), ffi.new("double[]", n)
    q, valid = ffi.new("float[]", n), ffi.new("uint8_t[]", (n + 7) // 8)
    got = lib.cp_sampler_drain(s, n, t, d, slot, val, q, valid)
    rows = []
    for i in range(got):
        known = bool(valid[i // 8] >> (i % 8) & 1)
        rows.append((t[i], d[i], slot[i], val[i] if known else None, q[i]))
    return rows


def new_sampler():
    err = ffi.new("int *")
    s = lib.cp_sampler_new(err)
    assert s != ffi.NULL, err[0]
    return s


def test_sampler_thread_has_its_own_tid_and_blocks_signals():
    s = new_sampler()
    try:
        tid = lib.cp_sampler_thread_tid(s)
        assert tid > 0 and tid != threading.get_native_id()
        with open(f"/proc/self/task/{tid}/status") as f:
            blocked = next(ln for ln in f if ln.startswith("SigBlk:")).split()[1]
        assert int(blocked, 16) & (1 << 1), "SIGINT (bit 2) must be blocked in the sampler thread"
    finally:
        lib.cp_sampler_free(s)


def test_one_ms_ticks_and_totals_match_the_counter():
    fd = open_self("page-faults")
    s = new_sampler()
    try:
        assert lib.cp_sampler_add_group(s, fd, 1, ffi.new("int32_t[]", [0])) == 0
        before = native.read_group(fd, 1)[3]
        assert lib.cp_sampler_start(s, 1, 4096, 1_000_000) == 0
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            # a fresh anonymous mapping faults on every page touched (malloc'd memory may
            # reuse pages an earlier test already faulted in)
            with mmap.mmap(-1, 64 * 4096) as m:
                for off in range(0, 64 * 4096, 4096):
                    m[off] = 1
        lib.cp_sampler_stop(s)
        after = native.read_group(fd, 1)[3]
        rows = drain(s, lib.cp_sampler_pending(s))
    finally:
        lib.cp_sampler_free(s)
        native.close_fd(fd)
    assert len(rows) >= 150, "1 ms ticks over 0.3 s (a loaded machine delays a few)"
    total = sum(r[3] for r in rows)
    # the reads before start and after stop bracket the sampler's window by a few
    # interpreter steps, which fault a few pages of their own
    assert total > 10_000
    assert abs(total - (after - before)) <= 50
    times = [r[0] for r in rows]
    assert times == sorted(times)
    assert all(r[4] == 1.0 for r in rows)


def test_full_ring_coalesces_ticks_without_losing_counts():
    fd = open_self("task-clock")
    s = new_sampler()
    try:
        lib.cp_sampler_add_group(s, fd, 1, ffi.new("int32_t[]", [0]))
        before = native.read_group(fd, 1)[3]
        assert lib.cp_sampler_start(s, 1, 8, 1_000_000) == 0   # a ring of only 8 ticks
        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            pass
        first = drain(s, 1000)                 # the first 8 ticks
        time.sleep(0.05)
        lib.cp_sampler_stop(s)
        rest = drain(s, 1000)
        after = native.read_group(fd, 1)[3]
        stats = ffi.new("struct cp_sampler_stats *")
        lib.cp_sampler_get_stats(s, stats)
    finally:
        lib.cp_sampler_free(s)
        native.close_fd(fd)
    assert len(first) == 8
    assert stats.coalesced > 50
    # the tick after the ring freed up covers every coalesced interval
    assert max(r[1] for r in rest) > 20_000_000
    total = sum(r[3] for r in first + rest)
    assert total == pytest.approx(after - before, rel=0.02)


def test_drain_returns_whole_ticks_only():
    fds = [open_self("task-clock"), open_self("page-faults")]
    s = new_sampler()
    try:
        for i, fd in enumerate(fds):
            lib.cp_sampler_add_group(s, fd, 1, ffi.new("int32_t[]", [i]))
        lib.cp_sampler_start(s, 2, 64, 1_000_000)
        time.sleep(0.02)
        lib.cp_sampler_stop(s)
        rows = drain(s, 5)      # room for 2.5 ticks: only 2 whole ticks come out
        assert len(rows) == 4 and [r[2] for r in rows] == [0, 1, 0, 1]
        assert rows[0][0] == rows[1][0]
    finally:
        lib.cp_sampler_free(s)
        for fd in fds:
            native.close_fd(fd)


def test_bad_arguments_are_rejected():
    s = new_sampler()
    try:
        assert lib.cp_sampler_add_group(s, 0, 0, ffi.new("int32_t[]", [0])) < 0
        assert lib.cp_sampler_start(s, 1, 16, 1000) < 0           # under 0.1 ms
        lib.cp_sampler_add_group(s, 0, 1, ffi.new("int32_t[]", [3]))
        assert lib.cp_sampler_start(s, 2, 16, 1_000_000) < 0      # slot 3 >= 2 slots
    finally:
        lib.cp_sampler_free(s)


def test_per_series_stats_and_time_offset():
    fd = open_self("task-clock")
    s = new_sampler()
    try:
        lib.cp_sampler_add_group(s, fd, 1, ffi.new("int32_t[]", [0]))
        lib.cp_sampler_set_time_offset(s, 10**18)
        lib.cp_sampler_start(s, 1, 64, 1_000_000)
        time.sleep(0.02)
        lib.cp_sampler_stop(s)
        rows = drain(s, 1000)
        st = ffi.new("struct cp_slot_stats *")
        assert lib.cp_sampler_slot_stats(s, 0, st) == 0
        assert lib.cp_sampler_slot_stats(s, 1, st) < 0
        lib.cp_sampler_slot_stats(s, 0, st)
    finally:
        lib.cp_sampler_free(s)
        native.close_fd(fd)
    assert st.known == len(rows) and st.unknown == 0 and st.min_quality == 1.0
    assert all(r[0] > 10**18 for r in rows)


def drain_schedstat(s):
    n = lib.CP_SCHED_RING
    t, run, wait, epoch = (ffi.new("int64_t[]", n), ffi.new("int64_t[]", n), ffi.new("int64_t[]", n),
                           ffi.new("int32_t[]", n))
    got = lib.cp_sampler_drain_schedstat(s, n, t, run, wait, epoch)
    return [(t[i], run[i], wait[i], epoch[i]) for i in range(got)]


def read_schedstat(tid):
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return [int(x) for x in f.read().split()[:2]]


def test_schedstat_read_on_the_tick_every_n_ticks_and_its_epochs():
    """The threads collector's critical thread, read on the sampler's own tick: readings are
    the thread's own schedstat (cumulative, in order), every 3rd tick, tagged by watch."""
    fd = open_self("page-faults")
    s = new_sampler()
    spinning = threading.Event()
    done = threading.Event()
    tids = []

    def spin():
        tids.append(threading.get_native_id())
        spinning.set()
        while not done.is_set():
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    spinning.wait()
    stat = os.open(f"/proc/self/task/{tids[0]}/schedstat", os.O_RDONLY)
    try:
        assert lib.cp_sampler_add_group(s, fd, 1, ffi.new("int32_t[]", [0])) == 0
        assert lib.cp_sampler_watch_schedstat(s, stat, 0) < 0           # every 0 ticks: refused
        assert lib.cp_sampler_start(s, 1, 4096, 2_000_000) == 0
        before = read_schedstat(tids[0])
        epoch = lib.cp_sampler_watch_schedstat(s, stat, 3)
        drain(s, 1 << 16)          # the ticks before the watch took no reading: not counted
        time.sleep(0.3)
        ticks_before = len(drain(s, 1 << 16))
        got = drain_schedstat(s)
        after = read_schedstat(tids[0])
        assert got and all(e == epoch for *_, e in got)
        # every 3rd tick (the drains and the watch are not atomic: a tick or two of slack)
        assert abs(len(got) - ticks_before / 3) <= 2, (len(got), ticks_before)
        times = [g[0] for g in got]
        runs = [g[1] for g in got]
        assert times == sorted(times) and runs == sorted(runs)
        assert before[0] <= runs[0] and runs[-1] <= after[0]
        assert all(w >= 0 for _, _, w, _ in got)
        # a new watch: a new epoch, the old fd no longer read (it may be closed now)
        epoch2 = lib.cp_sampler_watch_schedstat(s, -1, 1)
        assert epoch2 > epoch
        time.sleep(0.02)
        assert all(e == epoch for *_, e in drain_schedstat(s))
        time.sleep(0.02)
        assert drain_schedstat(s) == []
    finally:
        done.set()
        worker.join()
        lib.cp_sampler_free(s)
        os.close(stat)
        native.close_fd(fd)


def test_schedstat_of_a_thread_that_exits_reads_once_as_gone_then_stops():
    fd = open_self("page-faults")
    s = new_sampler()
    tids = []
    go = threading.Event()
    worker = threading.Thread(target=lambda: (tids.append(threading.get_native_id()), go.wait()))
    worker.start()
    while not tids:
        time.sleep(0.001)
    stat = os.open(f"/proc/self/task/{tids[0]}/schedstat", os.O_RDONLY)
    try:
        assert lib.cp_sampler_add_group(s, fd, 1, ffi.new("int32_t[]", [0])) == 0
        assert lib.cp_sampler_start(s, 1, 4096, 2_000_000) == 0
        lib.cp_sampler_watch_schedstat(s, stat, 1)
        time.sleep(0.05)
        go.set()
        worker.join()
        time.sleep(0.05)
        got = drain_schedstat(s)
        gone = [g for g in got if g[1] < 0]
        assert len(gone) == 1 and got[-1] == gone[0]      # the last reading: the thread is gone
        assert got[0][1] >= 0
        time.sleep(0.02)
        assert drain_schedstat(s) == []                     # and the watch is off
    finally:
        lib.cp_sampler_free(s)
        os.close(stat)
        native.close_fd(fd)
