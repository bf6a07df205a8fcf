"""host collector: the workload's process tree and the system, through psutil.

Per interval (default 100 ms): CPU user/system seconds, RSS, storage I/O bytes,
context switches, threads and processes of the tree rooted at the target, and the
system's CPU utilization and memory.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from counterprof.collector import Availability, Collector, SessionContext
from counterprof.errors import UsageError
from counterprof.schema import Metric, samples_batch

METRICS = [
    Metric("proc.cpu_user", "s", "delta", "user CPU time of the process tree (reaped children included)", "host"),
    Metric("proc.cpu_system", "s", "delta", "system CPU time of the process tree (reaped children included)", "host"),
    Metric("proc.rss", "bytes", "gauge", "resident memory summed over the tree (shared pages counted in each process)", "host"),
    Metric("proc.read_bytes", "bytes", "delta", "bytes the tree caused to be read from storage", "host"),
    Metric("proc.write_bytes", "bytes", "delta", "bytes the tree caused to be written to storage", "host"),
    Metric("proc.ctx_switches_voluntary", "count", "delta", "voluntary context switches of each process's main thread (perf's context-switches counts every thread)", "host"),
    Metric("proc.ctx_switches_involuntary", "count", "delta", "involuntary context switches of each process's main thread", "host"),
    Metric("proc.threads", "count", "gauge", "threads in the tree", "host"),
    Metric("proc.processes", "count", "gauge", "processes in the tree", "host"),
    Metric("system.cpu_util", "percent", "ratio", "busy share of all CPUs over the interval", "host"),
    Metric("system.cpu_iowait", "percent", "ratio", "share of all CPUs idle waiting for I/O over the interval", "host"),
    Metric("system.mem_used", "bytes", "gauge", "memory in use system-wide (total - available)", "host"),
    Metric("system.mem_available", "bytes", "gauge", "memory available to start new work without swapping", "host"),
]
_PROC_DELTAS = ("proc.cpu_user", "proc.cpu_system", "proc.read_bytes", "proc.write_bytes",
                "proc.ctx_switches_voluntary", "proc.ctx_switches_involuntary")


def tree_pids(root: int, proc: str = "/proc") -> list[int]:
    """root and its descendants, from /proc/PID/task/TID/children (no scan of all of /proc)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"{proc}/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                continue
    return out


class HostCollector(Collector):
    name = "host"
    DEFAULTS = {"interval_ms": 100.0}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__({**self.DEFAULTS, **(config or {})})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[int, Any] = {}
        self._prev: dict[str, float] | None = None
        self._prev_cpu = None
        self._prev_time = 0
        self._thread_cpu_s = 0.0
        self.root_gone = False

    @classmethod
    def availability(cls, config=None) -> Availability:
        try:
            import psutil  # noqa: F401
        except ImportError:
            return Availability(False, "psutil is not installed (pip install psutil)")
        return Availability(True)

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        interval = float({**cls.DEFAULTS, **config}["interval_ms"])
        if not 1 <= interval <= 3_600_000:
            raise UsageError(f"host interval {interval:g} ms is out of range (1 ms to 1 h)")

    def start(self, ctx: SessionContext) -> None:
        import psutil
        self.psutil = psutil
        self.ctx = ctx
        interval_ms = float(self.config["interval_ms"])
        t = ctx.target
        self.root = os.getpid() if t.kind == "self" else t.pid
        ctx.add_metrics(METRICS if self.root is not None else
                        [m for m in METRICS if m.name.startswith("system.")])
        self._prev_cpu = psutil.cpu_times()
        self._prev_time = ctx.clock.now_ns()
        if self.root is not None:
            self._prev = self._tree_totals()
        ready = threading.Event()
        tid: list[int] = []

        def run():
            tid.append(threading.get_native_id())
            ready.set()
            self._loop(interval_ms / 1000)

        self._thread = threading.Thread(target=run, name="counterprof-host", daemon=True)
        self._thread.start()
        ready.wait()
        with ctx.lock:
            ctx.profiler_tids.add(tid[0])

    def _loop(self, period: float) -> None:
        try:
            while not self._stop.wait(period):
                self.sample()
        except Exception as exc:
            self.ctx.fail(self.name, f"{type(exc).__name__}: {exc}")
        finally:
            self._thread_cpu_s = time.thread_time()

    def _process(self, pid: int):
        p = self._procs.get(pid)
        if p is None:
            p = self.psutil.Process(pid)
            self._procs[pid] = p
        return p

    def _tree_totals(self) -> dict[str, float] | None:
        """Cumulative figures of the live tree; None once the root is gone."""
        psutil = self.psutil
        totals = dict.fromkeys(_PROC_DELTAS, 0.0)
        totals.update({"proc.rss": 0.0, "proc.threads": 0.0, "proc.processes": 0.0})
        pids = tree_pids(self.root)
        live = set()
        for pid in pids:
            try:
                p = self._process(pid)
                with p.oneshot():
                    cpu = p.cpu_times()
                    mem = p.memory_info()
                    ctx_sw = p.num_ctx_switches()
                    threads = p.num_threads()
                    try:
                        io = p.io_counters()
                    except (psutil.AccessDenied, AttributeError):
                        io = None
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                if pid == self.root:
                    return None
                continue
            except psutil.AccessDenied:
                continue
            live.add(pid)
            # children_* hold reaped children, whose time left the live tree with them
            totals["proc.cpu_user"] += cpu.user + cpu.children_user
            totals["proc.cpu_system"] += cpu.system + cpu.children_system
            totals["proc.rss"] += mem.rss
            totals["proc.ctx_switches_voluntary"] += ctx_sw.voluntary
            totals["proc.ctx_switches_involuntary"] += ctx_sw.involuntary
            totals["proc.threads"] += threads
            totals["proc.processes"] += 1
            if io is not None:
                totals["proc.read_bytes"] += io.read_bytes
                totals["proc.write_bytes"] += io.write_bytes
        for gone in set(self._procs) - live:
            del self._procs[gone]
        return totals

    def sample(self) -> None:
        psutil = self.psutil
        now = self.ctx.clock.now_ns()
        duration = now - self._prev_time
        self._prev_time = now
        metrics, entities, values, durations = [], [], [], []

        def add(metric, entity, value, dur):
            metrics.append(metric)
            entities.append(entity)
            values.append(value)
            durations.append(dur)

        if self.root is not None and not self.root_gone:
            cur = self._tree_totals()
            if cur is None:
                self.root_gone = True
            else:
                for m in _PROC_DELTAS:
                    # a process that exits unreaped takes its counts along: never go negative
                    add(m, "process", max(0.0, cur[m] - self._prev[m]), duration)
                for m in ("proc.rss", "proc.threads", "proc.processes"):
                    add(m, "process", cur[m], None)
                self._prev = cur
        cpu = psutil.cpu_times()
        prev = self._prev_cpu
        self._prev_cpu = cpu
        total = sum(cpu) - sum(prev)
        if total > 0:
            idle = (cpu.idle - prev.idle) + (getattr(cpu, "iowait", 0) - getattr(prev, "iowait", 0))
            iowait = getattr(cpu, "iowait", 0) - getattr(prev, "iowait", 0)
            add("system.cpu_util", "system", 100.0 * max(0.0, total - idle) / total, duration)
            add("system.cpu_iowait", "system", 100.0 * max(0.0, iowait) / total, duration)
        vm = psutil.virtual_memory()
        add("system.mem_used", "system", float(vm.total - vm.available), None)
        add("system.mem_available", "system", float(vm.available), None)
        self.ctx.emit("samples", samples_batch([now] * len(metrics), durations, self.name,
                                               metrics, entities, values))

    def stop(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        try:   # the last partial interval: short regions would otherwise have no sample
            self.sample()
        except Exception as exc:
            self.ctx.warn(f"host: final sample failed: {exc}")
        self.details["thread_cpu_s"] = self._thread_cpu_s
