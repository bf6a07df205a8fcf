"""Host and threads riding the perf sampler's tick (native/counterprof_native.c riders): the same
rows as on their own threads, from real processes, and the riders' contract in C."""
import json
import os
import signal
import subprocess
import threading
import time

import pytest

import counterprof
from counterprof._native import ffi, lib
from counterprof.collectors import threads as threads_mod
from counterprof.collectors.perf import native
from counterprof.collectors.perf.events import parse_events
from helpers import COUNTERPROF, PYTHON, REPO, journal_dir, run_cli

WORKLOADS = str(REPO / "tests" / "thread_workloads.py")
# perf ticks at the host's and threads' interval; rows not printed (printed, they drain each
# second, and the spill, which the killed-profiler test holds, is not used)
RIDING = ("-I", "100", "--no-interval-rows", "-e", "task-clock")


def open_self(text: str) -> int:
    spec = parse_events(text)[0].leader
    fd = native.open_event(spec, native.OpenFlags(leader=True, enable_on_exec=False, inherit=True), 0, -1)
    native.enable(fd)
    return fd


def new_sampler():
    err = ffi.new("int *")
    s = lib.cp_sampler_new(err)
    assert s != ffi.NULL, err[0]
    return s


def frame(run):
    """Samples with each row's interval in CLOCK_MONOTONIC ns (start, end)."""
    t = run.samples().to_pandas()
    t["metric"] = t["metric"].astype(str)
    t["entity"] = t["entity"].astype(str)
    t["end"] = t["time"].astype("int64") - run.meta["clock_offset_ns"]
    t["start"] = t["end"] - t["duration_ns"].fillna(0).astype("int64")
    return t


def in_window(t, w):
    inside = t[(t["start"] >= w["t0"]) & (t["end"] <= w["t1"])]
    sums = inside.groupby("metric")["value"].sum().to_dict()
    covered = inside[inside["metric"] == "thread.main.running"]["duration_ns"].sum() / 1e9
    return inside, sums, covered


def profile_cli(run_dir, *cmd, extra=(), collectors="threads"):
    proc = run_cli("run", "-q", "--collectors", collectors, *extra, "-o", str(run_dir), "--", *cmd, timeout=240)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return counterprof.load(run_dir), json.loads(lines[-1]) if lines else None


def test_role_numbers_are_the_c_ones():
    assert (threads_mod.MAIN, threads_mod.INTRAOP, threads_mod.LOADER, threads_mod.COMM, threads_mod.OTHER,
            threads_mod.EXCLUDED) == (lib.CP_ROLE_MAIN, lib.CP_ROLE_INTRAOP, lib.CP_ROLE_LOADER,
                                      lib.CP_ROLE_COMM, lib.CP_ROLE_OTHER, lib.CP_ROLE_EXCLUDED)
    assert lib.CP_ROLES == threads_mod.EXCLUDED + 1


def test_a_rider_records_every_n_ticks_and_once_removed_is_never_called_again():
    fd = open_self("task-clock")
    s = new_sampler()
    err = ffi.new("int *")
    h = lib.cp_procstat_open(b"/proc", os.getpid(), err)
    assert h != ffi.NULL, err[0]
    try:
        assert lib.cp_sampler_add_group(s, fd, 1, ffi.new("int32_t[]", [0])) == 0
        assert lib.cp_procstat_record(h) == 0                 # the baseline
        rider = lib.cp_sampler_ride_procstat(s, h, 5)
        assert rider > 0
        assert lib.cp_sampler_start(s, 1, 4096, 1_000_000) == 0
        time.sleep(0.3)
        ticks = lib.cp_sampler_pending(s)
        records = procstat_records(h)
        # every 5th tick records one sample
        assert abs(records - ticks / 5) <= 2, (records, ticks)
        assert lib.cp_sampler_remove_rider(s, rider) == 0
        assert lib.cp_sampler_remove_rider(s, rider) < 0     # once
        procstat_records(h)
        time.sleep(0.1)
        assert procstat_records(h) == 0                       # not called since
        lib.cp_procstat_close(h)    # its arg freed: a call after the removal would read freed memory
        h = ffi.NULL
        time.sleep(0.1)
        assert lib.cp_sampler_pending(s) > ticks + 50        # the sampler went on ticking
    finally:
        lib.cp_sampler_free(s)
        if h != ffi.NULL:
            lib.cp_procstat_close(h)
        os.close(fd)


def procstat_records(h) -> int:
    """Drain a procstat handle's rows: how many records made them (one memory gauge each)."""
    n = lib.cp_procstat_pending(h)
    t, d = ffi.new("int64_t[]", max(n, 1)), ffi.new("int64_t[]", max(n, 1))
    valid = ffi.new("uint8_t[]", n // 8 + 1)
    metric, value = ffi.new("int32_t[]", max(n, 1)), ffi.new("double[]", max(n, 1))
    got = lib.cp_procstat_drain(h, n, t, d, valid, metric, value)
    return sum(1 for i in range(got) if metric[i] == lib.CP_HOST_SYS_MEM_AVAILABLE)


def test_riders_are_bounded_and_bad_ones_refused():
    s = new_sampler()
    err = ffi.new("int *")
    h = lib.cp_procstat_open(b"/proc", 0, err)
    try:
        assert lib.cp_sampler_ride_procstat(s, h, 0) < 0
        ids = [lib.cp_sampler_ride_procstat(s, h, 1) for _ in range(lib.CP_MAX_RIDERS)]
        assert all(i > 0 for i in ids) and len(set(ids)) == len(ids)
        assert lib.cp_sampler_ride_procstat(s, h, 1) < 0
        for i in ids:
            assert lib.cp_sampler_remove_rider(s, i) == 0
    finally:
        lib.cp_sampler_free(s)
        lib.cp_procstat_close(h)


def test_the_walk_on_the_tick_sums_by_role_and_keeps_a_changed_walk_for_python():
    """cp_threads_tick over this process: rows summed from the roles set by tid; a thread that
    starts makes the next walk a kept one (the wake fd readable), and walks wait for the roles."""
    reader = threads_mod.ThreadReader(os.getpid())
    h = reader.handle
    fd = open_self("task-clock")
    s = new_sampler()
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))
    try:
        _alive, _changed, _i, arr = reader.sample(full=True)
        tids = arr["tid"].tolist()
        me = threading.get_native_id()
        roles = [threads_mod.MAIN if t == me else threads_mod.OTHER for t in tids]
        offset = time.time_ns() - time.monotonic_ns()
        assert lib.cp_threads_ride_setup(h, offset, time.monotonic_ns() + offset, 10_000_000, 50_000_000,
                                         150_000_000, 64, 1_000_000_000) == 0
        reader.set_roles(tids, roles, 3)
        assert lib.cp_sampler_add_group(s, fd, 1, ffi.new("int32_t[]", [0])) == 0
        assert lib.cp_sampler_ride_threads(s, h, 1) > 0
        assert lib.cp_sampler_start(s, 1, 4096, 10_000_000) == 0
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            sum(range(1000))
        walks = reader.drain_walks()
        assert walks is not None
        t, d, run, wait, intraop, loaders = walks
        assert 4 <= len(t) <= 10 and (abs(d / 1e6 - 50) < 25).all()         # every 50 ms
        assert (loaders == 3).all() and (intraop == 0).all()
        assert run[:, threads_mod.MAIN].sum() > 0.2                         # we spun most of it
        assert reader.kept_walk() is None
        wake_fd = lib.cp_threads_wake_fd(h)
        thread = threading.Thread(target=spin)
        thread.start()
        kept = None
        for _ in range(100):
            kept = reader.kept_walk()
            if kept is not None:
                break
            time.sleep(0.01)
        assert kept is not None
        assert os.read(wake_fd, 8)
        _t, _d, alive, changed, arr = kept
        assert alive and changed and thread.native_id in arr["tid"].tolist()
        reader.drain_walks()                         # those before the thread started
        time.sleep(0.15)
        assert reader.drain_walks() is None          # no walk until Python sets the roles
        tids = arr["tid"].tolist()
        reader.set_roles(tids, [threads_mod.MAIN if x == me else threads_mod.INTRAOP for x in tids], 0)
        time.sleep(0.2)
        t, d, run, wait, intraop, loaders = reader.drain_walks()
        # the first walk after covers the wait (deltas are cumulative), then every 50 ms again
        assert d[0] > 150e6 and (intraop == len(tids) - 1).all() and run[:, threads_mod.INTRAOP].sum() > 0.1
        assert reader.kept_walk() is None
    finally:
        stop.set()
        lib.cp_sampler_free(s)
        reader.close()
        os.close(fd)


def _cpu_per_s(t, w, metrics):
    """Sum of the metrics over the workload's window, per second of it (rows pro-rated)."""
    rows = t[t["metric"].isin(metrics)]
    ov = (rows["end"].clip(upper=w["t1"]) - rows["start"].clip(lower=w["t0"])).clip(lower=0)
    share = ov / rows["duration_ns"].clip(lower=1)
    return float((rows["value"] * share).sum()) / ((w["t1"] - w["t0"]) / 1e9)


@pytest.mark.parametrize("collectors,extra,mode", [
    pytest.param("host,threads", (), "own thread", id="own-thread"),
    pytest.param("host,threads,perf", RIDING, "perf sampler tick", id="perf-tick"),
])
def test_host_and_threads_rows_are_the_same_on_the_tick_as_on_their_threads(run_dir, collectors, extra, mode):
    run, w = profile_cli(run_dir, "sh", "-c", f"{PYTHON} {WORKLOADS} sleepy 2.5 60 40; true",
                         extra=extra, collectors=collectors)
    meta = run.meta["collectors"]
    assert meta["host"]["samples"] == mode
    assert meta["threads"]["walks"] == mode and meta["threads"]["main_reads"] == mode
    t = frame(run)
    _inside, sums, covered = in_window(t, w)
    assert covered > 1.5
    assert abs(sums["thread.main.blocked"] / covered - w["sleep_share"]) <= 0.10
    # one row per 100 ms, whoever takes it
    for metric in ("proc.cpu_user", "thread.intraop.running", "thread.main.running"):
        d = t[t["metric"] == metric]["duration_ns"]
        assert abs(d.median() / 1e6 - 100) < 30, (metric, d.median())
    # the tree's CPU by host (its processes' stat) and by threads (every thread's schedstat) agree
    host = _cpu_per_s(t, w, ["proc.cpu_user", "proc.cpu_system"])
    threads = _cpu_per_s(t, w, ["thread.main.running", "thread.intraop.running", "thread.other.running",
                                "thread.loader.running", "thread.comm.running"])
    assert threads > 0.5 and abs(host - threads) <= 0.15 * threads, (host, threads)
    assert set(t[t["metric"] == "thread.intraop.count"]["value"]) >= {2}
    assert run.meta["collectors"]["threads"]["main"][-1]["pid"] == w["pid"]


def test_dataloader_workers_get_their_role_on_the_tick(run_dir):
    pytest.importorskip("torch")
    run, w = profile_cli(run_dir, PYTHON, WORKLOADS, "loader", "48", extra=RIDING, collectors="threads,perf")
    assert run.meta["collectors"]["threads"]["walks"] == "perf sampler tick"
    t = frame(run)
    inside, _sums, _ = in_window(t, w)
    loader = _cpu_per_s(t, w, ["thread.loader.running"])
    assert loader > 0.2 and loader > 2 * _cpu_per_s(t, w, ["thread.main.running"])
    assert inside[inside["metric"] == "thread.loader.workers"]["value"].max() == 2
    # the workers' CPU is theirs from their first walk: never "other" for longer than that walk
    other = t[(t["metric"] == "thread.other.running") & (t["start"] >= w["t0"])]["value"]
    assert other.sum() < 0.1 * loader * (w["t1"] - w["t0"]) / 1e9


def test_in_process_with_perf_the_profilers_threads_stay_out(tmp_path):
    code = r"""
import hashlib, json, os, sys, threading, time
import counterprof
stop = threading.Event()
def helper():
    while not stop.is_set():
        hashlib.sha256(b"x" * (1 << 20)).digest()
h = threading.Thread(target=helper, daemon=True); h.start()
p = counterprof.profile(collectors=["host", "threads", "perf"], events="task-clock", interval_ms=50,
                        path=sys.argv[1])
with p:
    me = threading.get_native_id()
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        sum(range(1000))
    profiler = set(p.session._ctx.profiler_tids)
    tids = {int(t) for t in os.listdir("/proc/self/task")}
stop.set(); h.join()
print(json.dumps({"me": me, "others": len(tids - profiler - {me})}))
"""
    proc = subprocess.run([PYTHON, "-c", code, str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    run = counterprof.load(tmp_path / "r")
    meta = run.meta["collectors"]
    assert meta["threads"]["walks"] == "perf sampler tick" and meta["host"]["samples"] == "perf sampler tick"
    t = frame(run)
    main = t[t["metric"].str.startswith("thread.main.")]
    assert set(main["entity"]) == {f"tid:{seen['me']}"}
    assert t[t["metric"] == "thread.intraop.count"]["value"].iloc[-1] == seen["others"]
    # the helper hashes (as much as the GIL lets it)
    assert t[t["metric"] == "thread.intraop.running"]["value"].sum() > 0.05


def test_a_killed_profiler_loses_only_its_last_tick_of_host_and_threads_rows(tmp_path):
    run_dir = tmp_path / "r"
    proc = subprocess.Popen([*COUNTERPROF, "run", *RIDING, "-o", str(run_dir), "--", PYTHON, WORKLOADS,
                             "sleepy", "17", "60", "40"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not list(journal_dir(run_dir, 0).glob("*.arrows")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.5)         # the drain wakes every 10 s here: 2.5 s of rows only in the spill
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    journal_only = counterprof.load(run_dir).samples().to_pandas()      # before recovery
    assert run_cli("recover", "-q", str(run_dir)).returncode == 0
    t = counterprof.load(run_dir).samples().to_pandas()
    for df in (journal_only, t):
        df["metric"] = df["metric"].astype(str)
    for metric in ("proc.cpu_user", "thread.intraop.running", "thread.main.running"):
        times = t[t["metric"] == metric]["time"].astype("int64")
        before = journal_only[journal_only["metric"] == metric]["time"].astype("int64")
        assert len(before) >= 10, metric
        assert times.max() > before.max() + 1.5e9, f"{metric}: the spill's last seconds were recovered"
        # every tick is in the spill as it is taken: a tick's interval and the kill's latency lost
        assert killed_at - times.max() / 1e9 < 0.45, metric
        assert times.is_unique or t[t["metric"] == metric].duplicated(["entity", "time"]).sum() == 0, metric


_FORKER = r"""
import os, sys, time, subprocess
c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
print(c.pid, flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:          # children of ~20 ms of CPU each, reaped at once
    pid = os.fork()
    if pid == 0:
        t = time.process_time()
        while time.process_time() - t < 0.02:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
c.kill(); c.wait()
print("done", flush=True)
sys.stdin.readline()
"""


def _held(pid: int) -> int:
    """Our descriptors open on /proc/PID/..."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/proc/{pid}/")
        except OSError:
            pass
    return n


def test_host_holds_descendants_files_while_they_last_and_counts_reaped_children_once():
    """One reader over a tree whose children come and go (the host rider's case: its files stay
    open between samples): the tree's CPU never goes down, a live child's files are held, and a
    gone child's are closed at the next sample."""
    from counterprof.collectors.host import ProcReader
    tick = 1 / os.sysconf("SC_CLK_TCK")
    p = subprocess.Popen([PYTHON, "-c", _FORKER, "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    reader = ProcReader(p.pid)
    try:
        sleeper = int(p.stdout.readline())
        prev, dips, samples, held = None, [], 0, 0
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            tree, _sys = reader.sample()
            total = tree["user_s"] + tree["system_s"]
            if prev is not None and total < prev - 1.5 * tick:
                dips.append(round(prev - total, 3))
            prev, samples = total, samples + 1
            held = max(held, _held(sleeper))
        assert samples > 100 and dips == [], dips[:5]
        assert held >= 4                              # stat, io, status, schedstat (+ children)
        assert p.stdout.readline().strip() == "done"  # the sleeper is killed and reaped
        reader.sample()
        assert _held(sleeper) == 0
    finally:
        reader.close()
        p.kill()
        p.wait()
