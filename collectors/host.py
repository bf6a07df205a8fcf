"""host collector: the workload's process tree and the system.

Per interval (default 100 ms): CPU user/system seconds, RSS, storage I/O bytes,
context switches, threads and processes of the tree rooted at the target, and the
system's CPU utilization and memory.

A sample is one call into native/procstat.c (cp_procstat_record) rather than psutil: in-process
(the context manager) this thread shares the GIL with the workload, and a Python-level sample
hands it back and forth around each of a dozen syscalls. The C side also keeps the previous
sample and turns each into rows (deltas, gauges, the system's CPU shares) in column arrays,
drained once a second into one Arrow batch (buffers straight from C): one journal write per
second, and no Python per row or per figure.

When the perf collector's C sampler ticks at or finer than this interval, the record runs on its
tick (a rider, every N ticks: ctx.tick_riders), and perf's drain thread flushes the rows once a
second (drain_ridden); this thread only waits, and flushes should those flushes stop. Without perf
(absent, failed, coarser) this thread records, as before.
"""
from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from counterprof.collector import Availability, PollingCollector, SessionContext, native_available
from counterprof.ground.errors import UsageError
from counterprof.ground.schema import Metric, samples_from_columns
from .host_options import HostOptions

if TYPE_CHECKING:
    import pyarrow as pa

METRICS = [
    Metric("proc.cpu_user", "s", "delta", "user CPU time of the process tree (reaped children included)", "host"),
    Metric("proc.cpu_system", "s", "delta", "system CPU time of the process tree (reaped children included)", "host"),
    Metric("proc.rss", "bytes", "gauge",
           "resident memory summed over the tree (shared pages counted in each process)", "host"),
    Metric("proc.read_bytes", "bytes", "delta", "bytes the tree caused to be read from storage", "host"),
    Metric("proc.write_bytes", "bytes", "delta", "bytes the tree caused to be written to storage", "host"),
    Metric("proc.ctx_switches_voluntary", "count", "delta",
           "voluntary context switches of each process's main thread (perf's context-switches counts "
           "every thread)", "host"),
    Metric("proc.ctx_switches_involuntary", "count", "delta",
           "involuntary context switches of each process's main thread", "host"),
    Metric("proc.run_delay", "s", "delta",
           "time each process's main thread was runnable but waiting for a CPU (/proc/PID/schedstat): "
           "CPU contention", "host"),
    Metric("proc.threads", "count", "gauge", "threads in the tree", "host"),
    Metric("proc.processes", "count", "gauge", "processes in the tree", "host"),
    Metric("system.cpu_util", "percent", "ratio", "busy share of all CPUs over the interval", "host"),
    Metric("system.cpu_iowait", "percent", "ratio", "share of all CPUs idle waiting for I/O over the interval", "host"),
    Metric("system.mem_used", "bytes", "gauge", "memory in use system-wide (total - available)", "host"),
    Metric("system.mem_available", "bytes", "gauge", "memory available to start new work without swapping", "host"),
]
# METRICS is in the order of procstat's CP_HOST_* indexes; the system's come last
SYSTEM_FROM = [m.name for m in METRICS].index("system.cpu_util")
EMIT_EVERY_S = 1.0   # journal writes once a second: a killed profiler loses < 1 s
RIDDEN_CHECK_S = 3.0   # riding: how long without perf's flushes before this thread flushes
RIDDEN_SPILL_CHECK_S = 25.0   # the same when perf spills (its drain wakes every 10 s)
_DELTAS = ("user_s", "system_s", "read_bytes", "write_bytes", "ctx_voluntary", "ctx_involuntary",
           "run_delay_s")     # the cumulative fields of struct cp_tree_stats ...
_GAUGES = ("rss_bytes", "threads", "processes")    # ... and the others


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

    def record(self) -> int:
        """One sample turned into rows, kept in C (the first is the baseline: no rows)."""
        rc: int = self.lib.cp_procstat_record(self.handle)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc), "/proc")
        return rc

    @property
    def root_gone(self) -> bool:
        return bool(self.lib.cp_procstat_root_gone(self.handle))

    def drain(self, source_dict: pa.Array, metric_dict: pa.Array, entity_dict: pa.Array) -> pa.RecordBatch | None:
        """The rows recorded so far as one samples batch (None when there are none)."""
        import numpy as np
        ffi, lib = self.ffi, self.lib
        n = lib.cp_procstat_pending(self.handle)
        if n == 0:
            return None
        t, d = ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
        valid = ffi.new("uint8_t[]", (n + 7) // 8)
        metric, value = ffi.new("int32_t[]", n), ffi.new("double[]", n)
        n = lib.cp_procstat_drain(self.handle, n, t, d, valid, metric, value)

        metric_idx = np.frombuffer(ffi.buffer(metric, 4 * n), np.int32)
        entity_idx = (metric_idx >= SYSTEM_FROM).astype(np.int32)   # 0 process, 1 system
        return samples_from_columns(n, ffi.buffer(t, 8 * n), ffi.buffer(d, 8 * n), ffi.buffer(valid, (n + 7) // 8),
                                    source_dict, metric_idx, metric_dict, entity_idx, entity_dict,
                                    ffi.buffer(value, 8 * n))

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


class HostCollector(PollingCollector):
    name = "host"
    options = HostOptions
    per_rank = True
    # system.* once a second: /proc/stat is the dearest read of a record, and the system's
    # figures move slowly next to the tree's
    DEFAULTS = {"interval_ms": 100.0, "system_interval_ms": 1000.0, "proc": "/proc"}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self._flush_lock = threading.Lock()
        self._ride: tuple[Any, int] | None = None    # (perf's sampler, rider id); under _flush_lock
        self._mode = threading.Event()                # ride, unride or stop: the loop looks again
        self._last_flush = 0.0                        # time.monotonic()

    @classmethod
    def availability(cls, config: dict[str, Any] | None = None) -> Availability:
        proc = cls.with_defaults(config)["proc"]
        if not (native := native_available()):
            return native
        try:
            system_stats(proc)
        except OSError as exc:
            return Availability(False, f"cannot read {proc}/stat and {proc}/meminfo ({exc.strerror}): "
                                       "is /proc mounted?")
        return Availability(True)

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        interval = float(cls.with_defaults(config)["interval_ms"])
        if not 1 <= interval <= 3_600_000:
            raise UsageError(f"host interval {interval:g} ms is out of range (1 ms to 1 h)")
        system = float(cls.with_defaults(config)["system_interval_ms"])
        if not 0 <= system <= 3_600_000:
            raise UsageError(f"host system interval {system:g} ms is out of range (0 to 1 h)")

    def start(self, ctx: SessionContext) -> None:
        import pyarrow as pa
        self.ctx = ctx
        self.proc = self.config["proc"]
        self.period_s = float(self.config["interval_ms"]) / 1000
        t = ctx.target
        self.root = os.getpid() if t.kind == "self" else t.pid
        ctx.add_metrics(METRICS if self.root is not None else
                        [m for m in METRICS if m.name.startswith("system.")])
        # typed: an untyped pa.array infers, and inferring loads dateutil (3 ms of start-up)
        self._dicts = (pa.array([self.name], pa.string()),
                       pa.array([m.name for m in METRICS], pa.string()),
                       pa.array(["process", "system"], pa.string()))
        self.reader = ProcReader(self.root, self.proc)
        self.reader.lib.cp_procstat_set_time_offset(self.reader.handle, ctx.clock.offset_ns)
        self.reader.lib.cp_procstat_set_system_period(
            self.reader.handle, int(float(self.config["system_interval_ms"]) * 1e6))
        self.reader.record()          # the baseline
        self.details["samples"] = "own thread"
        ctx.tick_riders.append(self)
        self.start_polling(ctx)

    @property
    def root_gone(self) -> bool:
        return self.reader.root_gone

    def poll(self) -> None:
        period = self.period_s
        flush_every = max(1, round(EMIT_EVERY_S / period))
        n = 0
        while not self._stop.is_set():
            if self._ride is not None:
                # the sampler records, perf's drain thread flushes; flush here only if it stopped
                check_s = RIDDEN_CHECK_S if self.ctx.spill is None else RIDDEN_SPILL_CHECK_S
                self._mode.wait(check_s)
                self._mode.clear()
                if self._ride is not None and time.monotonic() - self._last_flush > check_s:
                    self.drain_ridden()
                continue
            if self._stop.wait(period):
                break
            self.reader.record()
            n += 1
            if n % flush_every == 0:
                self._tick_error()
                self.flush()

    # -- the perf sampler's tick -----------------------------------------------------------

    def ride_interval_ns(self) -> int:
        """How often this rider reads (a tick made for riders alone ticks at the finest)."""
        return round(self.period_s * 1e9)

    def ride(self, sampler: Any, interval_ns: int) -> None:
        """perf's sampler runs, ticking every interval_ns: record on its tick, every N ticks
        (N = our interval / its; never when it ticks coarser than ours)."""
        period_ns = round(self.period_s * 1e9)
        if interval_ns > period_ns:
            return
        with self._flush_lock:
            if self._stop.is_set() or self.reader.handle is None:
                return
            lib = self.reader.lib
            lib.cp_procstat_set_spill(self.reader.handle, lib.cp_sampler_spill(sampler))  # NULL: none
            rider = lib.cp_sampler_ride_procstat(sampler, self.reader.handle, max(1, period_ns // interval_ns))
            if rider < 0:
                lib.cp_procstat_set_spill(self.reader.handle, self.reader.ffi.NULL)
                raise OSError(-rider, os.strerror(-rider), "sampler rider")
            self._ride = (sampler, rider)
            self.details["samples"] = "perf sampler tick"
            self._last_flush = time.monotonic()
        self._mode.set()

    def unride(self) -> None:
        """perf stops its sampler: record on our own thread again (deltas carry on from the
        sampler's last record: nothing is lost)."""
        with self._flush_lock:
            if self._ride is None:
                return
            sampler, rider = self._ride
            self.reader.lib.cp_sampler_remove_rider(sampler, rider)   # no call runs once it returns
            self.reader.lib.cp_procstat_set_spill(self.reader.handle, self.reader.ffi.NULL)
            self._ride = None
        # the tick's rows out now: perf removes its spill once its riders have left
        self.flush()
        self._mode.set()

    def drain_ridden(self) -> None:
        """Riding: the rows the sampler's tick recorded, out (perf's drain thread, once a second)."""
        if self._ride is None:
            return
        self._tick_error()
        self.flush()

    def halt(self) -> None:
        self._stop.set()
        self._mode.set()
        super().halt()

    def _tick_error(self) -> None:
        rc = self.reader.lib.cp_procstat_tick_error(self.reader.handle)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc), "/proc (on the perf sampler's tick)")

    def sample(self) -> None:
        """One sample into the pending rows (kept in C until the next flush)."""
        self.reader.record()

    def last_sample(self) -> None:
        # short regions would otherwise have no sample; the system's figures too, up to the end
        self.reader.lib.cp_procstat_set_system_period(self.reader.handle, 0)
        self.sample()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        with self._flush_lock:
            batch = self.reader.drain(*self._dicts)
        if batch is not None:
            self.ctx.emit("samples", batch)

    def release(self) -> None:
        self.unride()                 # perf still running (it failed to stop): leave its tick first
        self.reader.close()
