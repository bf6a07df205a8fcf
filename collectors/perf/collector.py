"""perf collector: the Collector (package docstring: the data path)."""
from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from counterprof.collector import Availability, Collector, SessionContext
from counterprof.ground.errors import CounterprofError, PerfEventError, UsageError, perf_error
from counterprof.ground.schema import SAMPLES_SCHEMA, Metric

from . import kernel_mode, native
from .counters import CounterSet, Unit, cpu_units, open_counters, task_units
from .events import DEFAULT_EVENTS, PERF_TYPE_SOFTWARE, EventGroup, EventParser, EventSpec
from .options import PerfOptions
from .sysfs import Sysfs

# Each drain wakes a Python thread (and, in-process, takes the GIL from the workload):
# twice a second keeps that rare while a SIGKILLed profiler still loses under a second.
DRAIN_PERIOD_S = 0.5               # below -I 50
DRAIN_PERIOD_MAX_S = 1.0           # from -I 100 on
# From -I 100 on, unless a live view or --serve wants rows as they come: every tick (riders'
# rows included) goes to the spill as it is taken (spill.py), and the drain wakes every 10 s
# (its wake-up was ~0.11% of a core at once a second, the sampler's whole tick ~0.13%)
DRAIN_PERIOD_SPILL_S = 10.0
SPILL_FROM_MS = 100.0
RING_SECONDS = 4.0                 # how much the ring holds before ticks coalesce
RING_MAX_RECORDS = 4 * 1024 * 1024
LABEL_PATTERNS_KEPT = 8             # a drain's slot patterns whose label columns are kept
RIDERS_DRAIN_S = 1.0               # the riders' rows leave once a second, as on their own threads


class PerfCollector(Collector):
    name = "perf"
    options = PerfOptions
    per_rank = True
    start_late = True   # must see the profiler's own threads before listing the target's
    start_last = True   # its counters see every thread: nothing else's start or stop in them

    DEFAULTS = {"events": DEFAULT_EVENTS, "interval_ms": 100.0, "per_thread": False,
                "per_cpu": False, "sysfs_root": "/sys",
                # tick: a native thread reads every group each interval; kernel: the kernel
                # samples every interval of each thread's CPU time (kernel_mode.py)
                "sampling": "tick", "kernel_cpus": None, "kernel_ring_pages": None}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self.counters: CounterSet | None = None
        self.sampler = None
        self.slot_keys: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._go = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self._drain_cpu_s = 0.0
        self._riders: list[Any] = []
        self._kernel: kernel_mode.KernelSampling | None = None
        self._spill: Any = None            # spill.Spill while the sampler spills

    # -- availability ------------------------------------------------------------------

    @classmethod
    def availability(cls, config: dict[str, Any] | None = None) -> Availability:
        if native.lib is None:
            try:
                native.require_native()
            except CounterprofError as exc:
                return Availability(False, str(exc))
        probe = EventSpec("task-clock", PERF_TYPE_SOFTWARE, 1)
        flags = native.OpenFlags(leader=True, enable_on_exec=False, inherit=False)
        try:
            fd = native.open_event(probe, flags, 0, -1)
        except PerfEventError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                try:   # paranoid 2 and unprivileged: user-space counting still works
                    fd = native.open_event(probe.with_user_only(), flags, 0, -1)
                except PerfEventError as exc2:
                    return Availability(False, str(exc2))
            else:
                return Availability(False, str(exc))
        native.close_fd(fd)
        return Availability(True)

    @classmethod
    def inventory(cls, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        from .probe import inventory_tables
        return inventory_tables(cls.with_defaults(config)["sysfs_root"])

    @classmethod
    def recover(cls, run_path: Path) -> list[str]:
        """A killed profiler's spill: the rows its last drains had not taken."""
        from .spill import recover
        return recover(run_path)

    @staticmethod
    def parse(events: str, sysfs_root: str = "/sys") -> list[EventGroup]:
        return EventParser(Sysfs(sysfs_root)).parse(events)

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        cfg = cls.with_defaults(config)
        interval_ms = float(cfg["interval_ms"])
        if not 0.1 <= interval_ms <= 3_600_000:
            raise UsageError(f"interval {interval_ms:g} ms is out of range (0.1 ms to 1 h)")
        if cfg["sampling"] not in ("tick", "kernel"):
            raise UsageError(f"sampling {cfg['sampling']!r}: tick or kernel")
        cls.parse(cfg["events"], cfg["sysfs_root"])

    # -- start -------------------------------------------------------------------------

    def start(self, ctx: SessionContext) -> None:
        ffi, lib = native.require_native()
        self.ctx = ctx
        cfg = self.config
        interval_ms = float(cfg["interval_ms"])
        groups = self.parse(cfg["events"], cfg["sysfs_root"])
        target = ctx.target
        launch = target.kind == "launch" and not target.system_wide
        self.details["sampling"] = "tick"
        if cfg["sampling"] == "kernel":     # no tick: no riders (they keep their own threads)
            self._kernel = kernel_mode.start(self, ctx, groups, interval_ms, self._drain_period())
            if self._kernel is not None:
                self._start_drain_thread(ctx)
                self._start_rider_tick(ctx)
                self._go.set()
                return

        # Our threads exist before any counter is opened and before the target's threads
        # are listed: a thread created later by a counted thread would inherit counters.
        err = ffi.new("int *")
        self.sampler = lib.cp_sampler_new(err)
        if self.sampler == ffi.NULL:
            self.sampler = None
            raise perf_error(-err[0], "sampler thread")
        with ctx.lock:
            ctx.profiler_tids.add(lib.cp_sampler_thread_tid(self.sampler))
        self._start_drain_thread(ctx)

        if target.system_wide:
            units = cpu_units(cfg["sysfs_root"])
            aggregate = None if cfg["per_cpu"] else "system"
        elif launch:
            assert target.pid is not None          # a launched target is its child's pid
            units = [Unit(target.pid, -1, "process")]
            aggregate = "process"
        else:
            pid = target.pid if target.kind == "pid" else os.getpid()
            assert pid is not None                  # a pid target names its process
            with ctx.lock:
                exclude = set(ctx.profiler_tids) if target.kind == "self" else set()
            units = task_units(pid, exclude)
            aggregate = None if cfg["per_thread"] else "process"

        self.counters = cs = open_counters(groups, units, enable_on_exec=launch,
                                           system_wide=target.system_wide)
        self._record_event_status(ctx)
        counted = cs.counted_events()
        if not cs.groups:
            if all(st.status == "not supported" for st in cs.status.values()):
                raise PerfEventError("none of the events can be counted here (all <not supported>); "
                                     "`counterprof list` shows the ones that can")
            nobody = "no thread of the target was left to open it on (it exited, or is a zombie)"
            reasons = "; ".join(f"{n}: {_short_reason(st.reason) or nobody}"
                                for n, st in cs.status.items())
            raise PerfEventError(f"no event could be counted ({reasons})")

        # One output series (slot) per (event, entity); threads or CPUs summed unless asked.
        slot_index: dict[tuple[str, str], int] = {}
        for og in cs.groups:
            for spec in og.events:
                key = (spec.name, aggregate or og.unit.label)
                if key not in slot_index:
                    slot_index[key] = len(self.slot_keys)
                    self.slot_keys.append(key)
            slots = ffi.new("int32_t[]", [slot_index[(sp.name, aggregate or og.unit.label)]
                                          for sp in og.events])
            rc = lib.cp_sampler_add_group(self.sampler, og.leader_fd, len(og.events), slots)
            if rc < 0:
                raise perf_error(-rc, "sampler")

        spec_by_name = {sp.name: sp for sp in counted}
        self._set_slots(self.slot_keys, [spec_by_name[k[0]].scale for k in self.slot_keys])
        ctx.add_metrics([Metric(sp.name, sp.unit or "count", "delta", sp.description or sp.name,
                                "perf") for sp in counted])

        # A launched workload's counters enable themselves at exec; the rest start now.
        if not launch:
            for og in cs.groups:
                native.enable(og.leader_fd)
        nslots = len(self.slot_keys)
        self._open_spill(ctx, interval_ms)
        # the ring holds two drain periods at least: ticks coalesce only if a drain is late
        ring_s = max(RING_SECONDS, 2.5 * self._drain_period())
        ring = max(64, min(int(ring_s * 1000 / interval_ms), RING_MAX_RECORDS // nslots))
        lib.cp_sampler_set_time_offset(self.sampler, ctx.clock.offset_ns)
        rc = lib.cp_sampler_start(self.sampler, nslots, ring, int(interval_ms * 1e6))
        if rc < 0:
            raise perf_error(-rc, "sampler start")
        self.details.update({"units": len(units), "units_gone": cs.units_gone,
                             "entity": aggregate or ("cpu:N" if target.system_wide else "tid:N")})
        self._go.set()
        self._hand_riders(ctx, int(interval_ms * 1e6))

    def _open_spill(self, ctx: SessionContext, interval_ms: float) -> None:
        """The spill, where it lets the drain wake every 10 s: from -I 100, in a run directory,
        in counterprof's own process, with no live view or exporter waiting for rows. Without it
        (or where it could not be created), the drain wakes every second, as before."""
        # not in the workload's own process (profile()): a mapped file's page the disk cannot
        # back is a SIGBUS, and even with its blocks allocated first that is not the workload's risk
        if (interval_ms < SPILL_FROM_MS or ctx.run_path is None or ctx.fresh_rows
                or ctx.target.kind == "self"):
            return
        from .spill import Spill
        scales = None if self._scale is None else [float(x) for x in self._scale]
        try:
            self._spill = Spill.open(ctx.run_path, ctx.rank, self.slot_keys, scales)
        except Exception as exc:
            ctx.warn(f"perf: no spill ({exc}): the samples drain every second instead")
            return
        native.lib.cp_sampler_set_spill(self.sampler, self._spill.handle)
        ctx.spill = self._spill
        self.details["drain_every_s"] = DRAIN_PERIOD_SPILL_S

    def _close_spill(self) -> None:
        """After the last drain, the riders gone: every row is in the journal."""
        if self._spill is None:
            return
        if self.sampler is not None:
            native.lib.cp_sampler_set_spill(self.sampler, native.ffi.NULL)
        stats = self._spill.stats()
        self.details["spill"] = stats
        if "error" in stats:
            self.ctx.warn(f"perf: the spill stopped ({stats['error']}): a profiler killed after that "
                          f"would have lost up to {DRAIN_PERIOD_SPILL_S:g} s of samples")
        if self.ctx.spill is self._spill:
            self.ctx.spill = None
        try:
            self._spill.close()
        except OSError as exc:
            self.ctx.warn(f"perf: the spill's files could not be removed: {exc}")
        self._spill = None

    def _hand_riders(self, ctx: SessionContext, tick_ns: int) -> None:
        self._riders = list(ctx.tick_riders)
        for rider in self._riders:
            try:
                rider.ride(self.sampler, tick_ns)
            except Exception as exc:      # the rider keeps its own thread: not perf's failure
                ctx.warn(f"perf: {rider.name} could not read on the sampler's tick: {exc}")

    def _start_rider_tick(self, ctx: SessionContext) -> None:
        """Kernel sampling has no tick of its own: the riders (host, the threads walk and the
        critical thread's schedstat) get a C tick with no counter group, at the finest of their
        own intervals, so they still wake no Python thread. Without one, they keep their own."""
        intervals = [r.ride_interval_ns() for r in ctx.tick_riders if hasattr(r, "ride_interval_ns")]
        if not intervals:
            return
        ffi, lib = native.require_native()
        tick_ns = max(100_000, min(intervals))
        err = ffi.new("int *")
        sampler = lib.cp_sampler_new(err)
        if sampler == ffi.NULL:
            ctx.warn(f"perf: no tick for the riders ({os.strerror(-err[0])}): they keep their own threads")
            return
        with ctx.lock:
            ctx.profiler_tids.add(lib.cp_sampler_thread_tid(sampler))
        lib.cp_sampler_set_time_offset(sampler, ctx.clock.offset_ns)   # the schedstat readings' times
        rc = lib.cp_sampler_start(sampler, 0, 1, tick_ns)
        if rc < 0:
            lib.cp_sampler_free(sampler)
            ctx.warn(f"perf: no tick for the riders ({os.strerror(-rc)}): they keep their own threads")
            return
        self.sampler = sampler
        self.details["rider_tick_ms"] = tick_ns / 1e6
        self._hand_riders(ctx, tick_ns)

    def _set_slots(self, slot_keys: list[tuple[str, str]], scales: list[float]) -> None:
        """The output series: their dictionaries, and per slot its metric's and entity's index
        and its scale (numpy arrays: a drain indexes them by the slot column; pyarrow.compute
        would add ~50 ms to every run's start-up)."""
        self.slot_keys = slot_keys
        self._metric_names = list(dict.fromkeys(k[0] for k in slot_keys))
        self._entity_names = list(dict.fromkeys(k[1] for k in slot_keys))
        # typed: an untyped pa.array infers, and inferring loads dateutil (3 ms of start-up)
        self._source_dict = pa.array([self.name], pa.string())
        self._metric_dict = pa.array(self._metric_names, pa.string())
        self._entity_dict = pa.array(self._entity_names, pa.string())
        self._metric_idx = np.array([self._metric_names.index(k[0]) for k in slot_keys], np.int32)
        self._entity_idx = np.array([self._entity_names.index(k[1]) for k in slot_keys], np.int32)
        self._scale = np.array(scales, np.float64) if any(x != 1.0 for x in scales) else None
        self._labels: dict[bytes, list[pa.Array]] = {}

    def _record_event_status(self, ctx: SessionContext) -> None:
        cs = self.counters
        assert cs is not None                       # called once the counters are open
        events = {}
        unsupported = []
        for name, st in cs.status.items():
            entry = {"status": st.status}
            if st.reason:
                entry["reason"] = st.reason
            if st.user_only:
                entry["modifiers"] = "u"
            events[name] = entry
            if st.status != "counted":
                unsupported.append(name)
        self.details["events"] = events
        if unsupported:
            first = cs.status[unsupported[0]]
            ctx.warn(f"{', '.join(unsupported)}: <{first.status}> here: {_short_reason(first.reason)}")
        user_only = [n for n, st in cs.status.items() if st.user_only]
        if user_only:
            ctx.warn(f"{', '.join(user_only)}: counting user space only "
                     "(kernel.perf_event_paranoid forbids kernel counting for this user)")

    # -- the drain thread -------------------------------------------------------------

    def _start_drain_thread(self, ctx: SessionContext) -> None:
        self._thread = ctx.start_thread("counterprof-perf-drain", self._drain_loop)

    def _drain_loop(self) -> None:
        self._go.wait()
        if self._stop.is_set():
            return
        period = self._drain_period()
        riders_every = max(1, round(RIDERS_DRAIN_S / period))
        n = 0
        # the first drain after DRAIN_PERIOD_S whatever the period: the live view's first line
        # (at 1 s) then has the counters' first half second, as at finer intervals
        wait = DRAIN_PERIOD_S if self._spill is None else period
        try:
            while not self._stop.wait(wait):
                wait = period
                if self._spill is not None:
                    self._spill.rotate()     # before the rings are taken: see spill.c
                self._drain_once()
                n += 1
                if n % riders_every == 0:
                    self._drain_riders()
        except Exception as exc:   # never let the workload notice; say what broke
            self.ctx.fail(self.name, f"draining samples failed: {type(exc).__name__}: {exc}")
        finally:
            self._drain_cpu_s = time.thread_time()

    def _drain_riders(self) -> None:
        """The riders' rows, on this wake-up rather than on one of their own threads. A rider that
        fails here leaves the tick: its own thread takes over, and fails it with the reason."""
        for rider in list(self._riders):
            drain = getattr(rider, "drain_ridden", None)
            if drain is None:             # drains itself
                continue
            try:
                drain()
            except Exception as exc:
                self._riders.remove(rider)
                self.ctx.warn(f"perf: draining {rider.name} on the sampler's tick failed: {exc}")
                try:
                    rider.unride()
                except Exception:
                    pass

    def _drain_period(self) -> float:
        # A drain's Python wake-up costs about the same whatever it carries (~0.5 ms with cold
        # caches): from -I 100 (the default) on, one a second, on the riders' wake-up, instead
        # of two. The live view is no staler (it shows the last second every collector has
        # handed over, and host's rows come once a second); a killed profiler loses up to 1 s.
        # With the spill a killed profiler loses nothing the sampler read: every 10 s.
        if self._spill is not None:
            return DRAIN_PERIOD_SPILL_S
        return max(DRAIN_PERIOD_S, min(DRAIN_PERIOD_MAX_S, float(self.config["interval_ms"]) / 100))

    def _drain_once(self) -> int:
        if self._kernel is not None:
            return self._kernel.drain_once()
        with self._lock:
            if self.sampler is None:
                return 0
            ffi, lib = native.ffi, native.lib
            n = lib.cp_sampler_pending(self.sampler)
            if n == 0:
                return 0
            t, d, slot, val, q, valid = native.drain_buffers(ffi, n)
            got = lib.cp_sampler_drain(self.sampler, n, t, d, slot, val, q, valid)
            if got == 0:
                return 0
            batch = self._batch(ffi, got, t, d, slot, val, q, valid)
        self.ctx.emit("samples", batch)
        return got

    def _batch(self, ffi: Any, n: int, t: Any, d: Any, slot: Any, val: Any, q: Any, valid: Any) -> pa.RecordBatch:
        """Arrow columns over the C arrays (no copy, no per-row Python). Times are already
        on the session's epoch axis (the sampler adds the clock offset)."""
        def col(type_: pa.DataType, data: Any, validity: pa.Buffer | None = None) -> pa.Array:
            return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(data)])

        slots = np.frombuffer(ffi.buffer(slot, n * 4), np.int32)
        values = np.frombuffer(ffi.buffer(val, n * 8), np.float64)
        if self._scale is not None:
            values = values * self._scale[slots]   # null rows: scaled too, still masked
        validity = pa.py_buffer(ffi.buffer(valid, (n + 7) // 8))
        return pa.RecordBatch.from_arrays([
            col(SAMPLES_SCHEMA.field("time").type, ffi.buffer(t, n * 8)),
            col(pa.int64(), ffi.buffer(d, n * 8)),
            *self._label_columns(slots),
            col(pa.float64(), values, validity),
            col(pa.float32(), ffi.buffer(q, n * 4)),
        ], schema=SAMPLES_SCHEMA)

    def _label_columns(self, slots: np.ndarray) -> list[pa.Array]:
        """source, metric and entity for these slots. A steady run drains the same slots in the
        same order (a few patterns: ticks per drain vary by one): those columns are kept and reused
        (immutable arrays), not three dictionary arrays built anew on each drain."""
        key = slots.tobytes()
        cached = self._labels.get(key)
        if cached is not None:
            return cached
        n = len(slots)
        zeros = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(bytes(4 * n))])
        metric = self._metric_idx[slots]
        entity = self._entity_idx[slots]
        columns = [
            pa.DictionaryArray.from_arrays(zeros, self._source_dict),
            pa.DictionaryArray.from_arrays(pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(metric)]),
                                           self._metric_dict),
            pa.DictionaryArray.from_arrays(pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(entity)]),
                                           self._entity_dict),
        ]
        if len(self._labels) >= LABEL_PATTERNS_KEPT:
            self._labels.clear()
        self._labels[key] = columns
        return columns

    # -- stop ----------------------------------------------------------------------------

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._kernel is not None:
            self._stop_kernel(self._kernel)
            return
        lib = native.lib
        if self.sampler is not None:
            lib.cp_sampler_stop(self.sampler)     # one last tick: totals up to now
            for rider in self._riders:            # before the sampler is freed
                try:
                    rider.unride()
                except Exception as exc:
                    self.ctx.warn(f"perf: {rider.name} left the sampler's tick badly: {exc}")
        self._stop.set()
        self._go.set()
        if self._thread is not None:
            self._thread.join()
        if self.sampler is not None:
            try:
                while self._drain_once():
                    pass
            except Exception as exc:
                self.ctx.fail(self.name, f"final drain failed: {type(exc).__name__}: {exc}")
            stats = native.ffi.new("struct cp_sampler_stats *")
            lib.cp_sampler_get_stats(self.sampler, stats)
            self.details["sampler"] = {
                "ticks": stats.ticks, "coalesced": stats.coalesced, "late_ticks": stats.late_ticks,
                "read_errors": stats.read_errors, "thread_cpu_s": stats.cpu_ns / 1e9,
            }
            if stats.read_errors:
                code = stats.last_read_errno
                name = errno.errorcode.get(code, str(code))
                self.ctx.warn(
                    f"perf: {stats.read_errors} counter-group reads "
                    f"failed (last: {name}, {os.strerror(code) if isinstance(code, int) else code}): "
                    "each interval whose read failed has no counts of its own (a gap in the interval "
                    "rows); its counts went to the next read that succeeded, so the totals hold them, "
                    "except a failed last read, whose interval is missing from the totals")
            self.details["thread_cpu_s"] = stats.cpu_ns / 1e9 + self._drain_cpu_s
            slot = native.ffi.new("struct cp_slot_stats *")
            per_slot = {}
            for i in range(len(self.slot_keys)):
                if lib.cp_sampler_slot_stats(self.sampler, i, slot) == 0:
                    per_slot[i] = (slot.known, slot.unknown, slot.min_quality)
            self._close_spill()
            lib.cp_sampler_free(self.sampler)
            with self._lock:
                self.sampler = None
            self._finish_status(per_slot)
        if self.counters is not None:
            self.counters.close()

    def _stop_kernel(self, kernel: kernel_mode.KernelSampling) -> None:
        lib = native.lib
        if self.sampler is not None:              # the riders' tick: their last reads, then off
            lib.cp_sampler_stop(self.sampler)
            for rider in self._riders:
                try:
                    rider.unride()
                except Exception as exc:
                    self.ctx.warn(f"perf: {rider.name} left the riders' tick badly: {exc}")
        self._stop.set()
        self._go.set()
        if self._thread is not None:
            self._thread.join()
        tick_cpu_s = 0.0
        if self.sampler is not None:
            stats = native.ffi.new("struct cp_sampler_stats *")
            lib.cp_sampler_get_stats(self.sampler, stats)
            tick_cpu_s = stats.cpu_ns / 1e9
            self.details["rider_tick"] = {"ticks": stats.ticks, "thread_cpu_s": tick_cpu_s}
            lib.cp_sampler_free(self.sampler)
            with self._lock:
                self.sampler = None
        try:
            self.details["kernel_sampler"] = kernel.finish()
        except Exception as exc:
            self.ctx.fail(self.name, f"final drain failed: {type(exc).__name__}: {exc}")
        finally:
            kernel.close()
        self.details["thread_cpu_s"] = self._drain_cpu_s + tick_cpu_s

    def _finish_status(self, per_slot: dict[int, tuple[int, int, float]]) -> None:
        """Events whose every interval was unknown never got a counter: <not counted>.
        per_slot: slot -> (known ticks, unknown ticks, smallest share counted)."""
        events = self.details.get("events", {})
        by_event: dict[str, list[int]] = {}
        for i, (name, _entity) in enumerate(self.slot_keys):
            by_event.setdefault(name, []).append(i)
        for name, slots in by_event.items():
            entry = events.get(name)
            stats = [per_slot[s] for s in slots if s in per_slot]
            if entry is None or not stats:
                continue
            if sum(k for k, _, _ in stats) == 0 and sum(u for _, u, _ in stats) > 0:
                entry["status"] = "not counted"
                entry["reason"] = ("enabled but never scheduled on the PMU: the group has more "
                                   "events than the PMU has counters, or another user holds them; "
                                   "split the group")
            worst = min(q for _, _, q in stats)
            if worst < 1.0:
                entry["min_quality"] = round(worst, 4)


def _short_reason(reason: str) -> str:
    return reason.split(": ", 1)[1] if ": " in reason else reason
