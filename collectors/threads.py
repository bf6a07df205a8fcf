"""threads collector: what the workload's threads did each interval, by role.

Per interval (default 100 ms), for every thread of the tree rooted at the target, the time it
ran and the time it was runnable but waited for a CPU (/proc/PID/task/TID/schedstat), summed
by the thread's role:

    main     the critical thread: the one whose time is the step's wall time (the rank's main
             thread; for a launched command, the main thread of the first process below the
             wrappers that only wait for their child; in-process, the thread that entered
             counterprof.profile()). Also its blocked time: the rest of the interval, so that
             running + runnable + blocked is the interval (thread_rows.settle). Where that
             process only waits for its child processes (torch.multiprocessing.spawn's parent,
             a launcher: the waiter rule below), their main threads are, one each: several
             critical threads, each its own rows (entity tid:<tid>).
    intraop  the critical process's other threads (torch/OpenMP/MKL pools, autograd threads)
    loader   DataLoader worker processes (threads named pt_data_worker, and every thread of
             their processes) and the pin-memory thread (pt_data_pin)
    comm     gloo/NCCL/c10d threads of the critical process, by name (COMM_PREFIXES)
    other    every other thread of the tree (wrappers, launchers, helper processes)

The profiler's own threads (ctx.profiler_tids) are never counted. One call into
native/procstat.c per sample walks the tree with each thread's schedstat kept open (pread);
Python only sums by role, with numpy, and works out roles again when threads come, go or are
renamed. Rows are emitted once a second, as host's are.

The critical thread's schedstat is read every interval; the walk of the tree at most every 100 ms
(WALK_NS). When the perf collector runs (ticking at or finer than this interval), both run on its
C sampler's tick (it wakes every interval anyway: ctx.tick_riders): the schedstat read, and the
walk with its sums by role (native/procstat.c, from the roles Python set by tid). This thread then
wakes to drain once a second, and at once when a walk sees what only Python decides (threads
came, went or were renamed, the critical process's children moved, the root is gone): C keeps that
walk for it and stops walking until the roles are set again. The drain itself runs on perf's drain
thread (drain_ridden), so riding, this thread wakes for kept walks and the contenders only.
Without perf (absent, failed, or ticking coarser) this collector's own thread reads and walks, as
before.
"""
from __future__ import annotations

import os
import resource
import select
import threading
import time
from typing import Any
from collections.abc import Callable

import numpy as np

from counterprof.collector import Availability, PollingCollector, SessionContext, native_available
from counterprof.ground.errors import UsageError
from counterprof.ground.schema import Metric

from .thread_rows import COMM, EXCLUDED, INTRAOP, LOADER, MAIN, OTHER, ThreadRows
from .threads_options import ThreadsOptions
from counterprof.ground.proctree import cmdline, cpu_ticks, helper_kind
from counterprof.ground.record import record

SOURCE = "threads"


def _m(name: str, unit: str, kind: str, desc: str) -> Metric:
    return Metric(name, unit, kind, desc, SOURCE)


METRICS = [
    _m("thread.main.running", "s", "delta", "on-CPU time of the critical thread (the rank's main/training thread)"),
    _m("thread.main.runnable", "s", "delta",
       "time the critical thread was runnable but waited for a CPU (CPU contention)"),
    _m("thread.main.blocked", "s", "delta", "time the critical thread was off-CPU and not runnable: sleep, I/O, locks, "
                                            "waiting for workers, collectives or children"),
    _m("thread.intraop.running", "s", "delta", "on-CPU time of the critical process's other threads (intra-op/OpenMP "
                                               "pools, autograd threads), comm threads excluded"),
    _m("thread.intraop.runnable", "s", "delta", "run-queue wait of the critical process's other threads"),
    _m("thread.loader.running", "s", "delta", "on-CPU time of DataLoader worker processes (all their threads) and the "
                                              "pin-memory thread"),
    _m("thread.loader.runnable", "s", "delta", "run-queue wait of the DataLoader workers"),
    _m("thread.comm.running", "s", "delta", "on-CPU time of the critical process's gloo/NCCL/c10d threads"),
    _m("thread.other.running", "s", "delta", "on-CPU time of every other thread of the tree (wrappers, launchers, "
                                             "helper processes)"),
    _m("thread.other.runnable", "s", "delta", "run-queue wait of every other thread of the tree"),
    _m("thread.intraop.count", "threads", "gauge",
       "threads of the critical process besides the critical and comm threads"),
    _m("thread.loader.workers", "processes", "gauge", "DataLoader worker processes in the tree"),
]
EMIT_EVERY_NS = 1_000_000_000    # journal writes once a second: a killed profiler loses < 1 s
# The walk of the whole tree (every thread's schedstat, roles, the critical thread's choice)
# runs at most every WALK_NS; the critical thread's schedstat every sample. The helpers' CPU is
# evidence: 100 ms resolution is enough, and under -I 10 or -I 1 a walk (and its Python) every
# sample was most of the profiler's CPU. Up to WALK_SMALL_UP_TO threads a walk is cheap (~1 µs a
# thread): every 100 ms (short-lived helpers lose at most that when they exit); a bigger tree
# every 300 ms.
WALK_NS = 100_000_000
WALK_BIG_NS = 300_000_000
WALK_SMALL_UP_TO = 64
RIDDEN_CHECK_S = 3.0             # riding: how long without perf's drains before this thread drains
RIDDEN_SPILL_CHECK_S = 25.0      # the same when perf spills (its drain wakes every 10 s)
FULL_EVERY_NS = 1_000_000_000    # every thread's name and children list once a second (main threads': every sample)
# The other processes' CPU, read at start and stop and every CONTENDERS_EVERY_S between (a
# contender that lives between two reads is missed) -- less often on a machine with so many
# processes that a read costs more than CONTENDERS_CPU_SHARE of a core at that pace: ~9 µs a
# process here, so a GPU node's ~1500 (kernel threads included) take ~15 ms, 0.3% of a core
# every 5 s; paced, every ~30 s (benchmarks/contenders_cost.py).
CONTENDERS_EVERY_S = 5.0
CONTENDERS_CPU_SHARE = 0.0005

# A process that only waits for its child: the critical thread is further down.
WRAPPERS = frozenset({"sh", "bash", "dash", "zsh", "env", "time", "timeout", "taskset", "numactl", "nice",
                      "nohup", "stdbuf", "chrt", "setpriv", "sudo", "uv", "conda"})
# Thread names (comm, 15 characters) of communication threads, as torch 2.13 sets them: seen in a
# 2-rank gloo DDP job here (pt_gloo_runloop, gloo_tcp_loop, pt_tcpstore_uv), and from torch's
# sources for NCCL (pt_nccl_watchdg, pt_nccl_heartbt), the distributed autograd engine and the
# c10d control plane (pt_dist_engine, pt_workerserver); NCCL's own threads start with "NCCL".
COMM_PREFIXES = ("pt_gloo", "gloo", "pt_nccl", "nccl", "pt_tcpstore", "pt_dist", "pt_workerserver", "c10d")
LOADER_WORKER = "pt_data_worker"     # torch.utils.data's worker loop names its process's thread so
LOADER_PIN = "pt_data_pin"           # the pin-memory thread, in the main process

# A process below the wrappers that only waits for its child processes is not the work: its
# children are, each a critical process of its own (their main threads: the ranks of
# torch.multiprocessing.spawn, whose parent waits in multiprocessing.connection.wait, i.e.
# poll; the workers of a Python launcher or of a shell's `wait`). It waits for them when its main
# thread waits in do_wait (waitpid: at once), or when over a window of WAITER_WINDOW_NS at least,
# its main thread was on a CPU at most WAITER_MAIN_AT_MOST of the time while its children (their
# trees) used at least WAITER_KIDS_AT_LEAST CPUs and WAITER_KIDS_OVER_MAIN times as much; it works
# again once its main thread runs WAITER_BUSY_AGAIN of a window. Its children here: not
# DataLoader workers (loader), not multiprocessing's resource tracker; a fork server's children
# count as its starter's. Riding perf's tick (where this is looked at on the drains and kept
# walks), a process first seen with children, or whose children changed while its main thread
# idled, is looked at again every RECHECK_EVERY_S for RECHECK_FOR_NS (our thread's wake-ups).
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
WAITER_WINDOW_NS = 200_000_000
WAITER_MAIN_AT_MOST = 0.10
WAITER_KIDS_AT_LEAST = 0.25
WAITER_KIDS_OVER_MAIN = 4.0
WAITER_BUSY_AGAIN = 0.25
RECHECK_EVERY_S = 0.2
RECHECK_FOR_NS = 5_000_000_000



@record(frozen=True)
class Critical:
    pid: int
    tid: int


def is_comm_thread(comm: str) -> bool:
    return comm.lower().startswith(COMM_PREFIXES)


def loader_processes(threads: list[tuple[int, int, str]]) -> set[int]:
    """Processes that are DataLoader workers: one of their threads is named pt_data_worker.
    threads: (tid, pid, comm)."""
    return {pid for _tid, pid, comm in threads if comm == LOADER_WORKER}


def descend_wrappers(root: int, children: dict[int, list[int]], comm: dict[int, str],
                     wchan: Callable[[int], str | None]) -> int:
    """The process the critical thread lives in: from root down while a process has exactly one
    child and is a wrapper (a known wrapper's name, or its main thread waits in do_wait).
    comm: each process's main thread's name. wchan is read only where the name does not tell."""
    pid, seen = root, set()
    while pid not in seen:
        seen.add(pid)
        kids = children.get(pid, [])
        if len(kids) != 1:
            return pid
        if comm.get(pid, "") not in WRAPPERS and wchan(pid) != "do_wait":
            return pid
        pid = kids[0]
    return pid


def assign_roles(threads: list[tuple[int, int, str]], critical: Critical | tuple[Critical, ...] | None,
                 excluded: set[int]) -> list[int]:
    """The role of each thread (tid, pid, comm): MAIN, INTRAOP, LOADER, COMM, OTHER or EXCLUDED.
    critical: one critical thread, or several (a job's ranks: each its process's main)."""
    criticals = () if critical is None else (critical,) if isinstance(critical, Critical) else tuple(critical)
    mains = {c.tid for c in criticals}
    critical_pids = {c.pid for c in criticals}
    loaders = loader_processes(threads) - critical_pids
    roles = []
    for tid, pid, comm in threads:
        if tid in excluded:
            roles.append(EXCLUDED)
        elif tid in mains:
            roles.append(MAIN)
        elif pid in critical_pids:
            roles.append(COMM if is_comm_thread(comm) else LOADER if comm == LOADER_PIN else INTRAOP)
        elif pid in loaders:
            roles.append(LOADER)
        else:
            roles.append(OTHER)
    return roles


def main_run_ns(pid: int, proc: str = "/proc") -> int | None:
    """On-CPU ns of a process's main thread (schedstat field 1); None when it is gone."""
    try:
        with open(f"{proc}/{pid}/task/{pid}/schedstat", "rb") as f:
            return int(f.read(128).split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Waiter:
    """What is known of a process that has children: since when (t), its main thread's run ns
    then, its children's CPU ticks then (by pid; None: not read), whether it waits for them."""
    __slots__ = ("t", "run", "kids", "kids_cpu", "waiting", "busy")

    def __init__(self, t: int, run: int, kids: tuple[int, ...]):
        self.t, self.run, self.kids = t, run, kids
        self.kids_cpu: dict[int, int] | None = None
        self.waiting = False
        self.busy = False          # its main thread ran over WAITER_MAIN_AT_MOST of the last window


def read_wchan(pid: int, proc: str = "/proc") -> str | None:
    """Where the process's main thread sleeps in the kernel; None when unreadable (or "0" when
    the kernel hides it)."""
    try:
        with open(f"{proc}/{pid}/wchan") as f:
            return f.read().strip()
    except OSError:
        return None


class ThreadReader:
    """native/procstat.c's thread walk of one tree; close() when done."""

    def __init__(self, root: int, proc: str = "/proc", max_fds: int | None = None):
        from counterprof._native import ffi, lib
        self.ffi, self.lib = ffi, lib
        if max_fds is None:
            # the descriptors held are the workload's own in-process: a quarter of its limit at most
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            max_fds = 1024 if soft == resource.RLIM_INFINITY else max(0, min(1024, soft // 4))
        err = ffi.new("int *")
        self.handle = lib.cp_threads_open(os.fsencode(proc), root, max_fds, err)
        self._kept_time, self._kept_duration = ffi.new("int64_t *"), ffi.new("int64_t *")
        if self.handle == ffi.NULL:
            raise OSError(-err[0], os.strerror(-err[0]), f"{proc}/{root}")
        self._out = ffi.new("struct cp_threads_stats *")
        size = ffi.sizeof("struct cp_thread")
        off = {f: ffi.offsetof("struct cp_thread", f) for f in ("tid", "pid", "ppid", "fresh", "run_s", "wait_s",
                                                              "life_s", "comm")}
        self._dtype = np.dtype({"names": list(off), "offsets": list(off.values()), "itemsize": size,
                                "formats": ["<i4"] * 4 + ["<f8"] * 3 + ["S16"]})

    def sample(self, full: bool = False) -> tuple[bool, bool, float, np.ndarray]:
        """(root alive, threads changed, interval s, one record per thread: tid, pid, ppid, fresh,
        run_s, wait_s, life_s, comm). The array is a copy: valid after the next sample."""
        out = self._out
        rc = self.lib.cp_threads_sample(self.handle, int(full), out)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc), "/proc")
        return bool(out.root_alive), bool(out.changed), float(out.interval_s), self._array(out)

    def _array(self, out: Any) -> np.ndarray:
        n = out.n
        return (np.frombuffer(self.ffi.buffer(out.threads, n * self._dtype.itemsize), self._dtype).copy()
                if n else np.zeros(0, self._dtype))

    def kept_walk(self) -> tuple[int, int, bool, bool, np.ndarray] | None:
        """The walk the sampler's tick kept for Python: (time, duration ns, root alive, changed,
        threads); None when there is none."""
        rc = self.lib.cp_threads_kept_walk(self.handle, self._out, self._kept_time, self._kept_duration)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc), "/proc (on the perf sampler's tick)")
        if rc == 0:
            return None
        out = self._out
        return self._kept_time[0], self._kept_duration[0], bool(out.root_alive), bool(out.changed), self._array(out)

    def set_roles(self, tids: list[int], roles: list[int], loader_workers: int) -> None:
        ffi = self.ffi
        self.lib.cp_threads_set_roles(self.handle, len(tids), ffi.new("int32_t[]", tids),
                                      ffi.new("int32_t[]", roles), loader_workers)

    def drain_walks(self) -> tuple[np.ndarray, ...] | None:
        """The walks summed on the sampler's tick: (time, duration, run s by role, wait s by role,
        intraop count, loader workers), one entry per walk; None when there are none."""
        ffi, lib = self.ffi, self.lib
        n = lib.cp_threads_walks_pending(self.handle)
        if n == 0:
            return None
        k = lib.CP_ROLES
        t, d = ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
        run, wait = ffi.new("double[]", n * k), ffi.new("double[]", n * k)
        intraop, loaders = ffi.new("int32_t[]", n), ffi.new("int32_t[]", n)
        n = lib.cp_threads_drain_walks(self.handle, n, t, d, run, wait, intraop, loaders)

        def arr(buf: Any, dtype: type[np.generic], width: int = 1) -> np.ndarray:
            a: np.ndarray = np.frombuffer(ffi.buffer(buf, n * width * np.dtype(dtype).itemsize), dtype).copy()
            return a
        return (arr(t, np.int64), arr(d, np.int64), arr(run, np.float64, k).reshape(n, k),
                arr(wait, np.float64, k).reshape(n, k), arr(intraop, np.int32), arr(loaders, np.int32))

    def close(self) -> None:
        if self.handle is not None:
            self.lib.cp_threads_close(self.handle)
            self.handle = None


def process_table(proc: str = "/proc", cap: int = 4096) -> tuple[np.ndarray, ...]:
    """Every process under proc, read in C (~1500 on a big GPU node, kernel threads included: in
    Python that took ~18 µs each): pid, start ticks, ppid, utime+stime ticks, comm (bytes)."""
    from counterprof._native import ffi, lib
    while True:
        pid, ppid = ffi.new("int32_t[]", cap), ffi.new("int32_t[]", cap)
        start, cpu = ffi.new("int64_t[]", cap), ffi.new("int64_t[]", cap)
        comm = ffi.new("char[]", 16 * cap)
        n = lib.cp_process_table(proc.encode(), cap, pid, start, ppid, cpu, comm)
        if n < 0:
            raise OSError(-n, os.strerror(-n), proc)
        if n <= cap:
            break
        cap = 2 * n                        # more processes than room: again, with room for all

    def arr(buf: Any, dtype: type[np.generic] | str) -> np.ndarray:
        a: np.ndarray = np.frombuffer(ffi.buffer(buf, n * np.dtype(dtype).itemsize), dtype).copy()
        return a
    return (arr(pid, np.int32), arr(start, np.int64), arr(ppid, np.int32), arr(cpu, np.int64),
            arr(comm, "S16"))


def descendants(roots: list[int], pid: np.ndarray, ppid: np.ndarray) -> np.ndarray:
    """Which of the processes (pid, ppid) are the roots or descend from them."""
    ours = np.isin(pid, roots)
    while True:
        more = ~ours & np.isin(ppid, pid[ours])
        if not more.any():
            return ours
        ours |= more


# a process's key: its start ticks and pid in one int64 (a reused pid is another process)
_PID_BITS = 22                       # pid_max is at most 2**22


class Contenders:
    """CPU used by the processes outside the workload's tree (and outside the profiler's own
    descendants: sibling ranks are the job's) between the first and the last reading."""

    def __init__(self, roots: list[int], proc: str = "/proc"):
        self.roots, self.proc = roots, proc
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start_ticks = time.clock_gettime(time.CLOCK_BOOTTIME) * self.tick
        # every process seen outside our trees, by key (sorted): CPU ticks at the first and the
        # last reading that saw it, and its name then
        self.keys = np.zeros(0, np.int64)
        self.first = np.zeros(0, np.int64)
        self.last = np.zeros(0, np.int64)
        self.comm = np.zeros(0, "S16")
        self.reads = 0

    def read(self) -> None:
        pid, start, ppid, cpu, comm = process_table(self.proc)
        theirs = ~descendants(self.roots, pid, ppid)
        pid, start, cpu, comm = pid[theirs], start[theirs], cpu[theirs], comm[theirs]
        keys = (start << _PID_BITS) | pid.astype(np.int64)
        at = np.searchsorted(self.keys, keys)
        known = at < len(self.keys)
        known[known] = self.keys[at[known]] == keys[known]
        self.last[at[known]] = cpu[known]
        self.comm[at[known]] = comm[known]
        new = ~known
        # a process born during the run counts from its birth, one seen at the start from then
        born_since = (start[new] >= self.start_ticks) if self.reads else np.zeros(new.sum(), bool)
        keys_ = np.concatenate([self.keys, keys[new]])
        order = np.argsort(keys_, kind="stable")
        self.keys = keys_[order]
        self.first = np.concatenate([self.first, np.where(born_since, 0, cpu[new])])[order]
        self.last = np.concatenate([self.last, cpu[new]])[order]
        self.comm = np.concatenate([self.comm, comm[new]])[order]
        self.reads += 1

    def top(self, n: int = 5) -> list[dict[str, Any]]:
        used = self.last - self.first
        best = [i for i in np.argsort(-used, kind="stable")[:n] if used[i] > 0]
        return [{"pid": int(self.keys[i] & ((1 << _PID_BITS) - 1)),
                 "comm": self.comm[i].decode(errors="replace"),
                 "cpu_s": round(float(used[i]) / self.tick, 3)} for i in best]


class ThreadsCollector(PollingCollector):
    name = "threads"
    options = ThreadsOptions
    per_rank = True
    start_late = True   # the profiler's threads registered before the first sample
    DEFAULTS = {"interval_ms": 100.0, "proc": "/proc"}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self._rows = ThreadRows(SOURCE)
        self._contenders_lock = threading.Lock()   # our thread, or perf's drain while it spills
        self.reader: ThreadReader | None = None
        self.criticals: tuple[Critical, ...] = ()
        self.root_gone = False
        # riding the perf sampler's tick: (sampler, read every N of its ticks, rider id); under _lock
        self._ride: tuple[Any, int, int] | None = None
        self._epoch_tid: dict[int, int] = {}    # riding: each watch epoch's thread
        self._mains: dict[int, tuple[int, int | None]] = {}   # tid -> (pid, its schedstat fd)
        self._prevs: dict[int | None, tuple[int, int, int]] = {}   # tid -> (time, run ns, wait ns)
        self._anchor: int | None = None          # the process whose children the critical ones are (or it)
        self._children_fd: int | None = None     # its main thread's children file
        self._children_seen = b""
        self._waiters: dict[int, Waiter] = {}
        self._helpers: dict[int, str] = {}       # pid -> helper_kind of its command line
        self._launcher_of: dict[int, int] = {}   # a critical pid -> the process that waits for it
        self._loader_pids: set[int] = set()
        self._recheck_until = 0
        self._anchor_open: int | None = None
        self._recorded: list[tuple[int, int, str]] | None = None
        self._lock = threading.Lock()

    @property
    def critical(self) -> Critical | None:
        """The first critical thread (the only one, but for a job whose ranks are its children)."""
        return self.criticals[0] if self.criticals else None

    @critical.setter
    def critical(self, c: Critical | None) -> None:
        self.criticals = () if c is None else (c,)

    @property
    def _main_prev(self) -> tuple[int, int, int] | None:
        c = self.critical
        return self._prevs.get(None if c is None else c.tid)

    @_main_prev.setter
    def _main_prev(self, prev: tuple[int, int, int] | None) -> None:
        c = self.critical
        key = None if c is None else c.tid
        if prev is None:
            self._prevs.pop(key, None)
        else:
            self._prevs[key] = prev

    @classmethod
    def availability(cls, config: dict[str, Any] | None = None) -> Availability:
        if not (native := native_available()):
            return native
        proc = cls.with_defaults(config)["proc"]
        if not os.path.exists(f"{proc}/self/task/{threading.get_native_id()}/schedstat"):
            return Availability(False, f"{proc}/PID/task/TID/schedstat is missing: is /proc mounted, "
                                       "with a kernel built with CONFIG_SCHED_INFO?")
        return Availability(True)

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        try:
            interval = float(cls.with_defaults(config)["interval_ms"])
        except (TypeError, ValueError):
            raise UsageError(f"threads interval {config.get('interval_ms')!r} is not a number of ms") from None
        if not 1 <= interval <= 3_600_000:
            raise UsageError(f"threads interval {interval:g} ms is out of range (1 ms to 1 h)")

    def start(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.proc = self.config["proc"]
        t = ctx.target
        if t.kind != "self" and t.pid is None:
            self.status = "unavailable"
            self.reason = "no process to follow (a system-wide run without a command)"
            return
        self.in_process = t.kind == "self"
        root = os.getpid() if self.in_process else t.pid
        assert root is not None                 # (a target without one returned above)
        self.root: int = root
        # in-process, the critical thread is the one that entered profile(): the session's target
        self._self_tid = threading.get_native_id() if self.in_process else None
        ctx.add_metrics(METRICS)
        self.details["main"] = []
        self._before_exec = t.kind == "launch"
        self.reader = reader = ThreadReader(self.root, self.proc)
        self._excluded: set[int] = set()
        self._roles = np.zeros(0, np.int64)
        self._mains, self._prevs = {}, {}      # the critical threads' schedstat, read every sample
        self._interval_ns = int(float(self.config["interval_ms"]) * 1e6)
        self._procs_children: dict[int, list[int]] = {}
        self._procs_comm: dict[int, str] = {}
        self._loader_workers = 0
        alive, _changed, _interval, arr = reader.sample(full=True)
        self._prev_time = self._last_emit = self._last_full = ctx.clock.now_ns()
        self.root_gone = not alive
        self._restructure(arr)
        self._follow_main()
        self._sample_main(self._prev_time)       # the critical threads' baseline
        self.contenders = Contenders([self.root] if self.in_process else [self.root, os.getpid()], self.proc)
        self._contenders_every = CONTENDERS_EVERY_S
        self._last_contenders = time.monotonic()    # their first reading: poll()'s first act
        self.period_s = float(self.config["interval_ms"]) / 1000
        # (Arrow's first conversion, seconds on a loaded machine, was done by the session before
        # any collector started: session._warm_arrow)
        self.details["main_reads"] = self.details["walks"] = "own thread"
        ctx.tick_riders.append(self)
        self.start_polling(ctx)

    def _read_contenders(self) -> float:
        """Read them; the CPU seconds it took."""
        cpu = time.thread_time()
        try:
            self.contenders.read()
        except OSError as exc:       # evidence only: never a reason to stop sampling
            self.details["contenders_error"] = str(exc)
        return time.thread_time() - cpu

    def poll(self) -> None:
        # The contenders' first reading, here rather than in start(): the scan of every process
        # (in C, without the GIL) overlaps the session's start instead of adding to it (~1.5 ms
        # with 65 processes, 5-15 ms on a node listing 1500); the workload's first milliseconds
        # of their CPU are not counted. release() joins this thread before the last reading.
        self._read_contenders()
        reader = self.reader
        assert reader is not None               # polling starts once it is open
        wake_fd = reader.lib.cp_threads_wake_fd(reader.handle)
        while not self._stop.is_set():
            if self._ride is not None:
                # the sampler walks and perf's drain thread drains: wake for a walk kept for us, a
                # stop, the contenders, or to drain should perf's drains stop
                # perf spilling: the contenders are read on its drain's wake-up, not on one of ours
                spilling = self.ctx.spill is not None
                check_s = RIDDEN_SPILL_CHECK_S if spilling else RIDDEN_CHECK_S
                timeout = check_s if spilling else min(check_s, CONTENDERS_EVERY_S)
                # a parent whose children changed: looked at again soon (does it wait for them?)
                recheck = self.ctx.clock.now_ns() < self._recheck_until
                if select.select([wake_fd], [], [], min(timeout, RECHECK_EVERY_S) if recheck else timeout)[0]:
                    try:
                        os.read(wake_fd, 8)
                    except BlockingIOError:
                        pass
                if self._stop.is_set():
                    break
                self.drain_ride(kept_only=self.ctx.clock.now_ns() - self._last_emit < check_s * 1e9)
                if recheck:
                    self.recheck()
            elif self._stop.wait(self.period_s):
                break
            else:
                self.sample()
            self._contenders_due()

    def _contenders_due(self) -> None:
        """Read the contenders if their time has come, and pace the next read by what this one
        cost (the start's read is cold: not that one). Our thread, or perf's drain thread while
        perf spills (then the reads come with its wake-up, every 10 s)."""
        with self._contenders_lock:
            if time.monotonic() - self._last_contenders < self._contenders_every:
                return
            self._contenders_every = max(CONTENDERS_EVERY_S, self._read_contenders() / CONTENDERS_CPU_SHARE)
            self.details["contenders_every_s"] = round(self._contenders_every, 1)
            self._last_contenders = time.monotonic()

    def halt(self) -> None:
        self._stop.set()
        if self.reader is not None:
            self.reader.lib.cp_threads_wake(self.reader.handle)   # out of its select
        super().halt()

    # -- the perf sampler's tick -----------------------------------------------------------

    def ride_interval_ns(self) -> int:
        """How often this rider reads (a tick made for riders alone ticks at the finest)."""
        return self._interval_ns

    def ride(self, sampler: Any, interval_ns: int) -> None:
        """perf's sampler runs, ticking every interval_ns: read the critical thread's schedstat on
        its tick (every N ticks, N = our interval / its, never coarser than ours), and walk the
        tree there too (every WALK_NS or WALK_BIG_NS, as our own thread would)."""
        if interval_ns > self._interval_ns:
            return
        with self._lock:
            if self._stop.is_set() or self.reader is None or self.root_gone:
                return
            from counterprof._native import ffi, lib
            reader = self.reader
            h = reader.handle
            every = max(1, self._interval_ns // interval_ns)      # at our interval, as our own thread
            rc = lib.cp_threads_ride_setup(h, self.ctx.clock.offset_ns, self._prev_time, interval_ns * every,
                                           WALK_NS, WALK_BIG_NS, WALK_SMALL_UP_TO, FULL_EVERY_NS)
            if rc < 0:
                raise OSError(-rc, os.strerror(-rc), "threads rider")
            self._push_roles()
            lib.cp_threads_watch_children(h, -1 if self._children_fd is None else self._children_fd)
            lib.cp_threads_set_spill(h, lib.cp_sampler_spill(sampler))     # NULL: none
            rider = lib.cp_sampler_ride_threads(sampler, h, every)
            if rider < 0:
                lib.cp_threads_set_spill(h, ffi.NULL)
                lib.cp_threads_watch_children(h, -1)
                raise OSError(-rider, os.strerror(-rider), "sampler rider")
            n = lib.CP_SCHED_RING
            self._ring = (ffi.new("int64_t[]", n), ffi.new("int64_t[]", n), ffi.new("int64_t[]", n),
                          ffi.new("int32_t[]", n))
            self._ride = (sampler, every, rider)
            self.details["main_reads"] = self.details["walks"] = "perf sampler tick"
            self._watch()
        reader.lib.cp_threads_wake(reader.handle)   # our loop: from its own period to the drain's

    def unride(self) -> None:
        """perf stops its sampler: take the walks and readings left, walk and read on our own
        thread again."""
        with self._lock:
            if self._ride is None:
                return
            reader = self.reader
            assert reader is not None             # riding: it is open
            lib = reader.lib
            lib.cp_sampler_remove_rider(self._ride[0], self._ride[2])   # no walk runs once it returns
            self._drain_ride_locked()
            self._unwatch()
            self._prev_time = lib.cp_threads_last_walk_ns(reader.handle)
            if not self.root_gone:
                self.flush()          # the tick's rows out now: perf removes its spill once its riders left
            lib.cp_threads_wake(reader.handle)

    def _watch(self) -> None:
        """Point the sampler at the critical threads' schedstat files (none: no reads), each with
        an epoch of its own. Once this returns the sampler no longer reads the fds it read before."""
        from counterprof._native import ffi, lib
        assert self._ride is not None             # riding
        sampler, every, _rider = self._ride
        watched = [(tid, fd) for tid, (_pid, fd) in self._mains.items() if fd is not None][:lib.CP_SCHED_WATCH]
        first = lib.cp_sampler_watch_schedstats(sampler, len(watched), ffi.new("int[]", [fd for _t, fd in watched]),
                                                every)
        if first < 0:
            raise OSError(-first, os.strerror(-first), "schedstat watch")
        # the readings of an earlier watch still in the ring are those threads' too, while followed
        self._epoch_tid = {e: t for e, t in self._epoch_tid.items() if t in self._mains}
        self._epoch_tid.update({first + i: tid for i, (tid, _fd) in enumerate(watched)})
        spill = self.ctx.spill
        if spill is not None:     # what a killed profiler's readings are recovered as
            for i, (tid, _fd) in enumerate(watched):
                spill.note_epoch(first + i, f"tid:{tid}")

    def _unwatch(self) -> None:
        from counterprof._native import ffi, lib
        reader, ride = self.reader, self._ride
        assert reader is not None and ride is not None      # riding
        lib.cp_sampler_remove_rider(ride[0], ride[2])
        lib.cp_sampler_watch_schedstat(ride[0], -1, 1)
        lib.cp_threads_watch_children(reader.handle, -1)
        lib.cp_threads_set_spill(reader.handle, ffi.NULL)
        self._ride = None

    def _push_roles(self) -> None:
        """The roles by tid into C, for the walks on the tick; resumes them after a kept walk."""
        assert self.reader is not None            # riding
        self.reader.set_roles([t for t, _p, _c in self._threads], self._roles.tolist(), self._loader_workers)

    def drain_ridden(self) -> None:
        """Riding: the drain, on perf's drain thread (once a second; every 10 s when it spills,
        and then the contenders too: our thread need not wake for them)."""
        self.drain_ride()
        if self.ctx.spill is not None:
            self._contenders_due()

    def drain_ride(self, kept_only: bool = False) -> None:
        """The drain while riding: the walks and readings taken on the tick into rows, the walk
        kept for Python (if any) accounted, the excluded set and the critical thread checked.
        kept_only: only if a walk was kept (our thread's wake-up for it)."""
        with self._lock:
            if self.reader is None or self.root_gone or self._ride is None:
                return
            if kept_only and self.reader.lib.cp_threads_kept_walk(self.reader.handle, self.reader._out,
                                                                  self.reader._kept_time,
                                                                  self.reader._kept_duration) == 0:
                return
            self._drain_ride_locked()
            if self.root_gone:
                return
            if self.ctx.clock.now_ns() - self._last_emit >= EMIT_EVERY_NS * 9 // 10:   # the wait's jitter
                self.flush()

    def _drain_ride_locked(self) -> None:
        reader = self.reader
        assert reader is not None                 # riding
        walks = reader.drain_walks()
        if walks is not None:
            self._rows.walks(*walks)
        self._drain_main()
        kept = reader.kept_walk()
        if kept is not None:
            t, d, alive, _changed, arr = kept
            self._prev_time = t
            # roles afresh whatever the reason it was kept (a thread without one, too)
            if self._account(t, d, alive, True, arr):
                self._push_roles()
            return
        self._check_critical_locked()

    def _check_critical_locked(self) -> None:
        """Riding: the excluded set and the critical threads again (exec and `sh -c 'a; b'` change
        them between walks, and a parent comes to wait for its children); roles into C if so."""
        with self.ctx.lock:
            excluded = set(self.ctx.profiler_tids) if self.in_process else set()
        criticals = self._choose_criticals()
        if excluded != self._excluded or criticals != self.criticals:
            self._excluded = excluded
            self._assign(criticals)
            self._follow_main()
            self._push_roles()

    def recheck(self) -> None:
        """Riding, our thread's wake-up while a parent's new children are looked at again."""
        with self._lock:
            if self.reader is None or self.root_gone or self._ride is None:
                return
            self._check_critical_locked()

    def _drain_main(self) -> None:
        """The critical threads' readings taken on the sampler's tick, into rows."""
        from counterprof._native import ffi, lib
        t, run, wait, epoch = self._ring
        assert self._ride is not None             # riding
        n = lib.cp_sampler_drain_schedstat(self._ride[0], lib.CP_SCHED_RING, t, run, wait, epoch)
        if n == 0:
            return
        t_, run_, wait_ = (np.frombuffer(ffi.buffer(b, 8 * n), np.int64) for b in (t, run, wait))
        epochs = np.frombuffer(ffi.buffer(epoch, 4 * n), np.int32)
        # a thread no longer critical: its readings, taken before the switch, are not counted
        for e in np.unique(epochs).tolist():
            tid = self._epoch_tid.get(e)
            if tid is None or tid not in self._mains:
                continue
            mine = epochs == e
            tt, rr, ww = t_[mine], run_[mine], wait_[mine]
            gone = np.flatnonzero(rr < 0)
            end = gone[0] if len(gone) else len(tt)
            self._main_readings(tt[:end], rr[:end], ww[:end], tid)
            if len(gone):
                self._main_gone(tid)

    # -- roles ---------------------------------------------------------------------------

    def _choose_criticals(self) -> tuple[Critical, ...]:
        if self.in_process:
            self._anchor = self.root
            assert self._self_tid is not None     # in-process: the thread that entered profile()
            return (Critical(self.root, self._self_tid),)
        wchans: dict[int, str | None] = {}

        def wchan(pid: int) -> str | None:          # read once a choice
            if pid not in wchans:
                wchans[pid] = read_wchan(pid, self.proc)
            return wchans[pid]
        top = descend_wrappers(self.root, self._procs_children, self._procs_comm, wchan)
        self._anchor = top if top in self._procs_comm else None
        self._launcher_of = {}
        pids = self._work_processes(top, wchan, set())
        for pid in [p for p in self._waiters if p not in self._procs_comm]:
            del self._waiters[pid]                  # gone
        return tuple(Critical(p, p) for p in sorted(set(pids)) if p in self._procs_comm)

    def _work_processes(self, pid: int, wchan: Callable[[int], str | None], seen: set[int]) -> list[int]:
        """The critical processes from pid (a process below the wrappers) down: pid, or, when it
        only waits for its children, theirs, each looked at the same way."""
        if pid in seen:
            return []
        seen.add(pid)
        kids = self._children_at_work(pid)
        if not kids:
            self._waiters.pop(pid, None)
            return [pid]
        if not self._waits_for(pid, kids, wchan):
            return [pid]
        out: list[int] = []
        for kid in kids:
            below = descend_wrappers(kid, self._procs_children, self._procs_comm, wchan)
            for p in self._work_processes(below, wchan, seen):
                out.append(p)
                self._launcher_of.setdefault(p, pid)
        return out or [pid]

    def _children_at_work(self, pid: int) -> tuple[int, ...]:
        """pid's child processes that may be its work: not DataLoader workers (loader), not
        multiprocessing's resource tracker; a fork server's children instead of it."""
        out: list[int] = []
        for kid in self._procs_children.get(pid, []):
            if kid in self._loader_pids:
                continue
            kind = self._helpers.get(kid)
            if kind is None:     # started by fork and exec at once: its command line is final
                kind = self._helpers[kid] = helper_kind(cmdline(kid, self.proc))
            if kind == "forkserver":
                out.extend(k for k in self._procs_children.get(kid, []) if k not in self._loader_pids)
            elif not kind:
                out.append(kid)
        return tuple(sorted(out))

    def _waits_for(self, pid: int, kids: tuple[int, ...], wchan: Callable[[int], str | None]) -> bool:
        """Does pid only wait for its children `kids` (the rule above WAITER_WINDOW_NS)?"""
        now = self.ctx.clock.now_ns()
        run = main_run_ns(pid, self.proc)
        w = self._waiters.get(pid)
        if run is None:
            self._waiters.pop(pid, None)
            return False
        if w is None or (kids != w.kids and not w.waiting and not w.busy):
            self._recheck_until = now + RECHECK_FOR_NS     # riding: looked at again meanwhile
        if w is None:
            w = self._waiters[pid] = Waiter(now, run, kids)
            w.waiting = wchan(pid) == "do_wait"
            if not w.waiting:
                w.kids_cpu = self._tree_cpu(kids)
            return w.waiting
        w.kids = kids
        if not w.waiting and wchan(pid) == "do_wait":      # in waitpid: at once, a new window
            w.t, w.run, w.kids_cpu, w.waiting = now, run, None, True
            return True
        elapsed = now - w.t
        if elapsed < WAITER_WINDOW_NS:
            return w.waiting
        share = (run - w.run) / elapsed
        w.busy = share > WAITER_MAIN_AT_MOST
        cpu = None
        if w.waiting:
            w.waiting = share < WAITER_BUSY_AGAIN or wchan(pid) == "do_wait"
        elif share <= WAITER_MAIN_AT_MOST:
            cpu = self._tree_cpu(kids)
            if w.kids_cpu is not None:
                used = sum(v - w.kids_cpu.get(p, 0) for p, v in cpu.items()) / TICKS_PER_S / (elapsed / 1e9)
                w.waiting = used >= WAITER_KIDS_AT_LEAST and used >= WAITER_KIDS_OVER_MAIN * share
        # the next window; the children's CPU only where it may decide (the parent was idle)
        w.t, w.run = now, run
        w.kids_cpu = None if w.waiting else cpu
        return w.waiting

    def _tree_cpu(self, pids: tuple[int, ...]) -> dict[int, int]:
        """CPU ticks of these processes and their descendants, by pid (the gone left out)."""
        out: dict[int, int] = {}
        todo, seen = list(pids), set(pids)
        while todo:
            p = todo.pop()
            ticks = cpu_ticks(p, self.proc)
            if ticks is not None:
                out[p] = ticks
            below = [k for k in self._procs_children.get(p, []) if k not in seen]
            seen.update(below)
            todo.extend(below)
        return out

    def _restructure(self, arr: np.ndarray) -> None:
        """Threads came, went or were renamed: the process table and every role afresh."""
        tids, pids, ppids = arr["tid"].tolist(), arr["pid"].tolist(), arr["ppid"].tolist()
        # the name ends at its first NUL: a renamed thread's buffer can hold the old name's tail
        comms = [c.split(b"\0", 1)[0].decode(errors="replace") for c in arr["comm"].tolist()]
        children: dict[int, list[int]] = {}
        comm: dict[int, str] = {}
        for tid, pid, ppid, name in zip(tids, pids, ppids, comms):
            if tid == pid:
                comm[pid] = name
                if ppid:
                    children.setdefault(ppid, []).append(pid)
        self._procs_children, self._procs_comm = children, comm
        self._threads = list(zip(tids, pids, comms))
        self._loader_pids = loader_processes(self._threads)
        self._helpers = {p: k for p, k in self._helpers.items() if p in comm}
        self._assign(self._choose_criticals())

    def _assign(self, criticals: tuple[Critical, ...]) -> None:
        self._record(criticals)
        self.criticals = criticals
        roles = assign_roles(self._threads, criticals, self._excluded)
        self._roles = np.asarray(roles, np.int64)
        critical_pids = {c.pid for c in criticals}
        self._loader_workers = len({pid for (_, pid, _), r in zip(self._threads, roles)
                                    if r == LOADER and pid not in critical_pids})

    def _record(self, criticals: tuple[Critical, ...]) -> None:
        """details["main"]: each critical thread chosen, from when (one entry each when several
        are: a job's ranks, with the pid of the process that waits for them, `launcher`); an
        exec that renames one is a new entry, except the first change of a launched command:
        until its exec, the root was our paused fork."""
        if not criticals:
            return
        now = self.ctx.clock.now_ns()
        entries: list[dict[str, Any]] = []
        for c in criticals:
            entry = {"pid": c.pid, "tid": c.tid, "comm": self._comm_of(c.tid), "from_ns": now}
            if c.pid in self._launcher_of:
                entry["launcher"] = self._launcher_of[c.pid]
            entries.append(entry)
        chosen = self.details["main"]
        key = [(e["pid"], e["tid"], e["comm"]) for e in entries]
        current = self._recorded
        self._recorded = key
        if not chosen:
            chosen.extend(entries)
            return
        if key == current:
            return
        if self._before_exec and len(chosen) == 1:
            chosen[:] = [{**e, "from_ns": chosen[0]["from_ns"]} for e in entries]
        else:
            chosen.extend(e for e, k in zip(entries, key) if k not in (current or []))
        self._before_exec = False

    def _comm_of(self, tid: int) -> str:
        return next((c for t, _p, c in self._threads if t == tid), "")

    # -- sampling ------------------------------------------------------------------------

    def sample(self, walk: bool = False) -> None:
        """One sample into the pending rows; they are emitted once a second. The critical
        thread's schedstat is read every sample (one pread); the walk of the whole tree every WALK_NS
        (WALK_BIG_NS above WALK_SMALL_UP_TO threads): the helpers' CPU is evidence, so its
        resolution may be coarser (deltas are cumulative: nothing is lost, only resolution)."""
        with self._lock:
            if self.reader is None or self.root_gone:
                return
            if self._ride is not None:     # the sampler walks (perf did not stop first): drain only
                self._drain_ride_locked()
                return
            now = self.ctx.clock.now_ns()
            walk_ns = WALK_NS if len(self._roles) <= WALK_SMALL_UP_TO else WALK_BIG_NS
            # half an interval early: at -I 100 every sample walks despite the timer's jitter
            due = now - self._prev_time >= walk_ns - self._interval_ns // 2
            if walk or not any(fd is not None for _p, fd in self._mains.values()) or due or self._children_moved():
                if not self._walk(now):
                    return
            self._sample_main(now)
            if now - self._last_emit >= EMIT_EVERY_NS:
                self.flush()

    def _walk(self, now: int) -> bool:
        """The whole tree: helpers' rows over the time since the last walk; False once the
        root is gone."""
        full = now - self._last_full >= FULL_EVERY_NS
        if full:
            self._last_full = now
        assert self.reader is not None            # started
        alive, changed, _interval, arr = self.reader.sample(full)
        duration = now - self._prev_time
        self._prev_time = now
        return self._account(now, duration, alive, changed, arr)

    def _account(self, now: int, duration: int, alive: bool, changed: bool, arr: np.ndarray) -> bool:
        """One walk's threads (taken by our thread or kept by the sampler's tick) into rows: roles
        worked out again if threads changed, the critical thread checked; False once the root is
        gone."""
        if not alive:
            self.root_gone = True
            return False
        with self.ctx.lock:
            excluded = set(self.ctx.profiler_tids) if self.in_process else set()
        if changed or excluded != self._excluded:
            self._excluded = excluded
            self._restructure(arr)
        else:
            criticals = self._choose_criticals()    # exec and `sh -c 'a; b'` change it between walks
            if criticals != self.criticals:
                self._assign(criticals)
        n = len(self._roles)
        run_by = np.bincount(self._roles, weights=arr["run_s"], minlength=EXCLUDED + 1) if n else np.zeros(EXCLUDED + 1)
        wait_by = (np.bincount(self._roles, weights=arr["wait_s"], minlength=EXCLUDED + 1) if n
                   else np.zeros(EXCLUDED + 1))
        self._rows.walks(np.array([now]), np.array([duration]), run_by[None, :], wait_by[None, :],
                         np.array([np.count_nonzero(self._roles == INTRAOP)]), np.array([self._loader_workers]))
        self._follow_main()
        if self._children_fd is not None:
            try:
                self._children_seen = os.pread(self._children_fd, 4096, 0)
            except OSError:
                self._children_seen = b""
        return True

    def _follow_main(self) -> None:
        """Keep the critical threads' schedstat files open (a new one starts with a baseline) and
        the children file of the process they are (or whose children they are)."""
        want = {c.tid: c.pid for c in self.criticals}
        have = {tid: pid for tid, (pid, _fd) in self._mains.items()}
        anchor_key = self._anchor if self._anchor is not None and want else None
        if want == have and anchor_key == self._anchor_open:
            return
        dropped = [fd for tid, (pid, fd) in self._mains.items() if want.get(tid) != pid and fd is not None]
        for tid in [t for t, (pid, _fd) in self._mains.items() if want.get(t) != pid]:
            del self._mains[tid]
            self._prevs.pop(tid, None)
        for tid, pid in want.items():
            if tid in self._mains:
                continue
            path = (f"{self.proc}/self/task/{tid}/schedstat" if self.in_process
                    else f"{self.proc}/{pid}/task/{tid}/schedstat")
            try:
                fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = None
            self._mains[tid] = (pid, fd)
            self._prevs.pop(tid, None)
        old_children = None
        if anchor_key != self._anchor_open:
            old_children, self._children_fd, self._children_seen = self._children_fd, None, b""
            self._anchor_open = anchor_key
            if anchor_key is not None:
                path = (f"{self.proc}/self/task/{self._self_tid}/children" if self.in_process
                        else f"{self.proc}/{anchor_key}/task/{anchor_key}/children")
                try:
                    self._children_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    self._children_fd = None
        if self._ride is not None:
            assert self.reader is not None        # riding
            self._watch()                  # the sampler lets go of the dropped fds before they are closed
            self.reader.lib.cp_threads_watch_children(self.reader.handle,
                                                      -1 if self._children_fd is None else self._children_fd)
        for fd in dropped + ([old_children] if old_children is not None else []):
            os.close(fd)

    def _close_main(self) -> None:
        if self._ride is not None:
            assert self.reader is not None        # riding
            self.reader.lib.cp_sampler_watch_schedstat(self._ride[0], -1, 1)   # let go before closing
            self.reader.lib.cp_threads_watch_children(self.reader.handle, -1)
        for _pid, fd in self._mains.values():
            if fd is not None:
                os.close(fd)
        if self._children_fd is not None:
            os.close(self._children_fd)
        self._mains, self._prevs, self._children_fd, self._children_seen = {}, {}, None, b""
        self._anchor_open = None

    def _children_moved(self) -> bool:
        """Did the critical process (or the one whose children the critical ones are) start or
        lose a child since the last walk (a wrapper's command starting, `sh -c 'a; b'` moving on,
        a rank)? Then walk now: the critical threads may move."""
        if self._children_fd is None:
            return False
        try:
            return os.pread(self._children_fd, 4096, 0) != self._children_seen
        except OSError:
            return True

    def _sample_main(self, now: int) -> None:
        for tid, (_pid, fd) in list(self._mains.items()):
            if fd is None:
                continue
            try:
                run_ns, wait_ns = map(int, os.pread(fd, 128, 0).split()[:2])
            except (OSError, ValueError):
                self._main_gone(tid)
                continue
            self._main_readings(np.array([now]), np.array([run_ns]), np.array([wait_ns]), tid)

    def _main_gone(self, tid: int) -> None:
        """A critical thread is gone (the sampler no longer reads it): the next walk says what now."""
        pid, fd = self._mains.pop(tid, (None, None))
        if fd is not None:
            os.close(fd)
        self._prevs.pop(tid, None)

    def _main_readings(self, time_ns: np.ndarray, run_ns: np.ndarray, wait_ns: np.ndarray,
                       tid: int | None = None) -> None:
        """Readings of a critical thread (default: the first), oldest first, into rows: each
        the change since the reading before; the first of a new critical thread is its baseline
        only."""
        if tid is None and self.critical is not None:
            tid = self.critical.tid
        prev = self._prevs.get(tid)
        if prev is not None:               # the sampler's last tick and our own read may cross
            later = time_ns > np.maximum.accumulate(np.concatenate(([prev[0]], time_ns[:-1])))
            time_ns, run_ns, wait_ns = time_ns[later], run_ns[later], wait_ns[later]
        if len(time_ns) == 0:
            return
        if prev is None:
            prev = (int(time_ns[0]), int(run_ns[0]), int(wait_ns[0]))
            time_ns, run_ns, wait_ns = time_ns[1:], run_ns[1:], wait_ns[1:]
        entity = f"tid:{tid}" if tid is not None else "tid:?"
        self._rows.main_readings(time_ns, run_ns, wait_ns, prev, entity)
        self._prevs[tid] = ((int(time_ns[-1]), int(run_ns[-1]), int(wait_ns[-1])) if len(time_ns) else prev)

    def flush(self) -> None:
        self._last_emit = self.ctx.clock.now_ns()
        batch = self._rows.take()
        if batch is not None:
            self.ctx.emit("samples", batch)
            self._note_settled()

    def _note_settled(self) -> None:
        """Riding with perf's spill: where this take of the critical threads' rows ended, in the
        spill, so that a recovery settles the readings after it as the next take would have."""
        spill = self.ctx.spill if self._ride is not None else None
        if spill is None or not self._rows.settled:
            return
        epoch_of = {tid: e for e, tid in sorted(self._epoch_tid.items())}     # each thread's latest watch
        for entity, (last, carry) in self._rows.settled.items():
            tid = int(entity[4:]) if entity[4:].isdigit() else None
            if tid in epoch_of:
                spill.note_settled(epoch_of[tid], last, carry)

    def last_sample(self) -> None:
        self.sample(walk=True)         # with a walk: the helpers' last time too

    def release(self) -> None:
        with self._lock:
            self._close_main()
            if self._ride is not None:
                self._unwatch()
        assert self.reader is not None            # released only once polling started
        self.reader.close()
        self._read_contenders()
        self.details["contenders"] = self.contenders.top()
