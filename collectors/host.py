"""host collector: the workload's process tree and the system.

Per interval (default 100 ms): CPU user/system seconds, RSS, storage I/O bytes,
context switches, threads and processes of the tree rooted at the target, and the
system's CPU utilization and memory.

The /proc reads are one call into native/procstat.c per sample rather than psutil:
in-process (the context manager) this thread shares the GIL with the workload, and a
Python-level sample hands it back and forth around each of a dozen syscalls. Rows are
kept in Python lists and emitted once a second: one Arrow batch and one journal write
per second, not per sample.
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
    Metric("proc.run_delay", "s", "delta", "time each process's main thread was runnable but waiting for a CPU (/proc/PID/schedstat): CPU contention", "host"),
    Metric("proc.threads", "count", "gauge", "threads in the tree", "host"),
    Metric("proc.processes", "count", "gauge", "processes in the tree", "host"),
    Metric("system.cpu_util", "percent", "ratio", "busy share of all CPUs over the interval", "host"),
    Metric("system.cpu_iowait", "percent", "ratio", "share of all CPUs idle waiting for I/O over the interval", "host"),
    Metric("system.mem_used", "bytes", "gauge", "memory in use system-wide (total - available)", "host"),
    Metric("system.mem_available", "bytes", "gauge", "memory available to start new work without swapping", "host"),
]
EMIT_EVERY_NS = 1_000_000_000   # journal writes once a second: a killed profiler loses < 1 s
# cumulative fields of struct cp_tree_stats -> the delta metric they feed
_DELTAS = {"user_s": "proc.cpu_user", "system_s": "proc.cpu_system", "read_bytes": "proc.read_bytes",
           "write_bytes": "proc.write_bytes", "ctx_voluntary": "proc.ctx_switches_voluntary",
           "ctx_involuntary": "proc.ctx_switches_involuntary", "run_delay_s": "proc.run_delay"}
_GAUGES = {"rss_bytes": "proc.rss", "threads": "proc.threads", "processes": "proc.processes"}


_SYSTEM = ("cpu_total_s", "cpu_idle_s", "cpu_iowait_s", "mem_total_bytes", "mem_available_bytes")


class ProcReader:
    """native/procstat.c for one root (None: system figures only); close() when done."""

    def __init__(self, root: int | None, proc: str = "/proc"):
        from counterprof._native import ffi, lib
        self.ffi, self.lib = ffi, lib
        err = ffi.new("int *")
        self.handle = lib.cp_procstat_open(os.fsencode(proc), root or 0, err)
        if self.handle == ffi.NULL:
            raise OSError(-err[0], os.strerror(-err[0]), proc)
        self._tree = ffi.new("struct cp_tree_stats *")
        self._sys = ffi.new("struct cp_system_stats *")

    def sample(self) -> tuple[dict[str, float] | None, dict[str, float]]:
        """(cumulative figures of the live tree, None once the root is gone; system figures)."""
        rc = self.lib.cp_procstat_sample(self.handle, self._tree, self._sys)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc), "/proc")
        t = self._tree
        tree = {f: float(getattr(t, f)) for f in (*_DELTAS, *_GAUGES)} if t.root_alive else None
        return tree, {f: float(getattr(self._sys, f)) for f in _SYSTEM}

    def close(self) -> None:
        if self.handle is not None:
            self.lib.cp_procstat_close(self.handle)
            self.handle = None


def tree_stats(root: int, proc: str = "/proc") -> dict[str, float] | None:
    """Cumulative figures of the live tree under root; None when root is gone."""
    reader = ProcReader(root, proc)
    try:
        return reader.sample()[0]
    finally:
        reader.close()


def system_stats(proc: str = "/proc") -> dict[str, float]:
    reader = ProcReader(None, proc)
    try:
        return reader.sample()[1]
    finally:
        reader.close()


class HostCollector(Collector):
    name = "host"
    per_rank = True
    DEFAULTS = {"interval_ms": 100.0, "proc": "/proc"}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__({**self.DEFAULTS, **(config or {})})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prev: dict[str, float] | None = None
        self._prev_sys: dict[str, float] | None = None
        self._prev_time = 0
        self._thread_cpu_s = 0.0
        self._rows: list[tuple] = []
        self._last_emit = 0
        self.root_gone = False

    @classmethod
    def availability(cls, config=None) -> Availability:
        proc = {**cls.DEFAULTS, **(config or {})}["proc"]
        try:
            import counterprof._native  # noqa: F401
        except ImportError as exc:
            return Availability(False, f"counterprof's compiled part is missing ({exc}); "
                                       "reinstall with `pip install .`")
        try:
            system_stats(proc)
        except OSError as exc:
            return Availability(False, f"cannot read {proc}/stat and {proc}/meminfo ({exc.strerror}): "
                                       "is /proc mounted?")
        return Availability(True)

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        interval = float({**cls.DEFAULTS, **config}["interval_ms"])
        if not 1 <= interval <= 3_600_000:
            raise UsageError(f"host interval {interval:g} ms is out of range (1 ms to 1 h)")

    def start(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.proc = self.config["proc"]
        interval_ms = float(self.config["interval_ms"])
        t = ctx.target
        self.root = os.getpid() if t.kind == "self" else t.pid
        ctx.add_metrics(METRICS if self.root is not None else
                        [m for m in METRICS if m.name.startswith("system.")])
        self.reader = ProcReader(self.root, self.proc)
        self._prev, self._prev_sys = self.reader.sample()
        self._prev_time = self._last_emit = ctx.clock.now_ns()
        self.root_gone = self._prev is None
        self._thread = ctx.start_thread("counterprof-host", lambda: self._loop(interval_ms / 1000))

    def _loop(self, period: float) -> None:
        try:
            while not self._stop.wait(period):
                self.sample()
        except Exception as exc:
            self.flush()
            self.ctx.fail(self.name, f"{type(exc).__name__}: {exc}")
        finally:
            self._thread_cpu_s = time.thread_time()

    def sample(self) -> None:
        """One sample into the pending rows; they are emitted once a second."""
        now = self.ctx.clock.now_ns()
        duration = now - self._prev_time
        self._prev_time = now
        rows = self._rows
        cur, sys_now = self.reader.sample()
        if self.root is not None and not self.root_gone:
            if cur is None:
                self.root_gone = True
            else:
                for field, metric in _DELTAS.items():
                    # a process that exits unreaped takes its counts along: never go negative
                    rows.append((now, duration, metric, "process", max(0.0, cur[field] - self._prev[field])))
                for field, metric in _GAUGES.items():
                    rows.append((now, None, metric, "process", cur[field]))
                self._prev = cur
        prev, self._prev_sys = self._prev_sys, sys_now
        total = sys_now["cpu_total_s"] - prev["cpu_total_s"]
        if total > 0:
            idle = sys_now["cpu_idle_s"] - prev["cpu_idle_s"]
            iowait = sys_now["cpu_iowait_s"] - prev["cpu_iowait_s"]
            rows.append((now, duration, "system.cpu_util", "system",
                         100.0 * max(0.0, total - idle - iowait) / total))
            rows.append((now, duration, "system.cpu_iowait", "system", 100.0 * max(0.0, iowait) / total))
        rows.append((now, None, "system.mem_used", "system",
                     sys_now["mem_total_bytes"] - sys_now["mem_available_bytes"]))
        rows.append((now, None, "system.mem_available", "system", sys_now["mem_available_bytes"]))
        if now - self._last_emit >= EMIT_EVERY_NS:
            self.flush()

    def flush(self) -> None:
        rows, self._rows = self._rows, []
        self._last_emit = self.ctx.clock.now_ns()
        if rows:
            t, d, m, e, v = zip(*rows)
            self.ctx.emit("samples", samples_batch(list(t), list(d), self.name, list(m), list(e), list(v)))

    def stop(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        try:   # the last partial interval: short regions would otherwise have no sample
            self.sample()
        except Exception as exc:
            self.ctx.warn(f"host: final sample failed: {exc}")
        self.flush()
        self.reader.close()
        self.details["thread_cpu_s"] = self._thread_cpu_s
