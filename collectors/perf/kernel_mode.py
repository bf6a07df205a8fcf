"""The perf collector's kernel-side sampling (perf config "sampling": "kernel", `--sampling kernel`).

The tick sampler wakes a thread every -I interval to read each group: at -I 1 that wake-up alone
costs about what perf stat -I 1 costs (benchmarks/wakeup_floor.py). Here the kernel samples
instead: each group is opened on the launched command once per CPU (inherit, enable_on_exec)
behind a task-clock leader with sample_period = the interval, PERF_SAMPLE_TID | TIME | READ, and
the kernel writes each sampled thread's own cumulative counts into the leader's mmap ring; the
drain thread reads the rings twice a second (native/kernel_sampler.c).

What it measures differs from the tick: samples come per INTERVAL of each thread's CPU time,
not of wall time. They become the tick's rows (same series, one row per -I of wall time per
series, zero when no sample fell in it): each sample's change since that (CPU, thread)'s
previous one counts in the bucket of its sample's time, so a thread's counts since its last
sample show up at its next one (late by up to its sleep when it mostly sleeps). At stop, the
groups' final reads minus what the samples carried (each thread's tail, and exited threads')
go into the last bucket: the totals are the tick's.

Counts are not scaled by enabled/running: a thread's event on CPU i is enabled whenever the
thread runs and running only while it runs on CPU i, so the ratio is the thread's spread over
the CPUs, not multiplexing. Software events never multiplex; hardware ones can, and would then
be undercounted: the run warns when it samples any.

It needs Linux 6.12 (inherit with PERF_SAMPLE_READ) and a launched command; elsewhere (-a,
--pid, --per-thread, an older kernel, a refused ring) the tick runs, with a warning saying why.
"""
from __future__ import annotations

import errno
import os
from typing import Any

from counterprof.ground.errors import CounterprofError
from counterprof.ground.schema import Metric

from . import native
from .counters import CounterSet, OpenedGroup, Unit, online_cpus, open_counters
from .events import PERF_TYPE_SOFTWARE, EventGroup, EventSpec

TASK_CLOCK = 1                      # PERF_COUNT_SW_TASK_CLOCK
MIN_RING_PAGES, MAX_RING_PAGES = 4, 512
RING_DRAINS = 2.0                   # the ring holds this many drain periods of samples


class KernelModeRefused(Exception):
    """Kernel sampling cannot run for this target or on this kernel: the reason, for the warning."""


def refusal(ctx: Any, cfg: dict[str, Any]) -> str | None:
    """Why kernel sampling cannot count this target (None: it can try)."""
    target = ctx.target
    if target.system_wide:
        return "-a counts CPUs, and kernel sampling follows the launched command's threads"
    if target.kind != "launch":
        return "it samples a launched command only, not an attached process"
    if cfg.get("per_thread"):
        return "--per-thread is not offered with it"
    return None


def ring_pages(interval_ns: int, members: int, drain_period_s: float) -> int:
    """Data pages per CPU ring: a CPU runs at most one second of CPU per second, so a leader
    samples at most once per interval of wall time; the ring holds RING_DRAINS drains of that."""
    record = 8 + 8 + 8 + 8 * (3 + members)
    need = RING_DRAINS * drain_period_s * 1e9 / interval_ns * record / (os.sysconf("SC_PAGESIZE"))
    pages = MIN_RING_PAGES
    while pages < need and pages < MAX_RING_PAGES:
        pages *= 2
    return pages


def _leader_first(events: list[EventSpec]) -> tuple[list[EventSpec], bool]:
    """The group as sampled: task-clock leads it (moved to the front where the group is all
    software: software events never multiplex, so the order changes no count). Else a hidden
    task-clock leads; the bool says so (its counts are not reported)."""
    idx = next((i for i, e in enumerate(events)
                if e.type == PERF_TYPE_SOFTWARE and e.config == TASK_CLOCK), None)
    if idx == 0:
        return events, False
    if idx is not None and all(e.type == PERF_TYPE_SOFTWARE for e in events):
        return [events[idx]] + events[:idx] + events[idx + 1:], False
    return [EventSpec("task-clock", PERF_TYPE_SOFTWARE, TASK_CLOCK)] + events, True


def _open_error(rc: int, what: str, cpu: int) -> KernelModeRefused:
    e = -rc
    text = f"{what} on CPU {cpu}: {os.strerror(e)}"
    if e == errno.EINVAL:
        text += " (inherited counters with PERF_SAMPLE_READ need Linux 6.12 or later)"
    return KernelModeRefused(text)


class KernelSampling:
    """The rings and their per-CPU groups for one PerfCollector (its slots, batches, lock)."""

    def __init__(self, collector: Any):
        self.collector = collector
        self.handle: Any = None
        self.counters: CounterSet | None = None

    def open(self, groups: list[EventGroup], pid: int, interval_ns: int, cpus: list[int],
             drain_period_s: float) -> None:
        """Open every group on every CPU and map its ring; KernelModeRefused (with everything
        closed) where the kernel refuses. The events' status comes from the tick's own opening
        on the command (then closed), so unsupported events are dropped the same way."""
        ffi, lib = native.require_native()
        col = self.collector
        probe = open_counters(groups, [Unit(pid, -1, "process")], enable_on_exec=True,
                              system_wide=False)
        probe_groups = [list(og.events) for og in probe.groups]
        probe.close()
        cs = CounterSet(status=probe.status, units_gone=probe.units_gone)
        self.counters = cs
        if not probe_groups:
            raise KernelModeRefused("no event could be opened on the command")
        slot_index: dict[str, int] = {}
        layouts = []
        for events in probe_groups:
            for spec in events:
                slot_index.setdefault(spec.name, len(slot_index))
            sampled, hidden = _leader_first(events)
            slots = [-1 if (hidden and i == 0) else slot_index[sp.name] for i, sp in enumerate(sampled)]
            layouts.append((sampled, slots))
        try:
            for cpu in cpus:
                for sampled, _slots in layouts:
                    cs.groups.append(self._open_group(sampled, pid, cpu, interval_ns))
            # kernel_ring_pages: a fixed ring (a power of two), e.g. one small enough to lose records
            pages = int(col.config.get("kernel_ring_pages") or
                        ring_pages(interval_ns, max(len(s) for s, _ in layouts), drain_period_s))
            err = ffi.new("int *")
            self.handle = lib.cp_ks_new(len(slot_index), interval_ns, pages, err)
            if self.handle == ffi.NULL:
                self.handle = None
                raise KernelModeRefused(f"sampler: {os.strerror(-err[0])}")
            for og, (_sampled, slots) in zip(cs.groups, layouts * len(cpus)):
                rc = lib.cp_ks_add_group(self.handle, og.leader_fd, len(slots),
                                         ffi.new("int32_t[]", slots))
                if rc < 0:
                    raise _open_error(rc, f"mmap of the sample ring ({pages} pages)", og.unit.cpu)
        except BaseException:
            self.close()
            raise
        keys = [(name, "process") for name in slot_index]
        spec_by_name = {sp.name: sp for sp in cs.counted_events()}
        col._set_slots(keys, [spec_by_name[name].scale for name in slot_index])
        col.details.update({"units": len(cpus), "units_gone": cs.units_gone, "entity": "process",
                            "kernel_ring_pages": pages})

    def _open_group(self, sampled: list[EventSpec], pid: int, cpu: int, interval_ns: int) -> OpenedGroup:
        ffi, lib = native.require_native()
        fds: list[int] = []
        try:
            for i, spec in enumerate(sampled):
                flags = native.OpenFlags(leader=i == 0, enable_on_exec=True, inherit=True)
                fd = lib.cp_ks_event_open(native.make_spec(spec, flags), pid, cpu,
                                          fds[0] if fds else -1, interval_ns if i == 0 else 0)
                if fd < 0:
                    raise _open_error(fd, f"perf_event_open of {spec.name}", cpu)
                fds.append(fd)
        except BaseException:
            for fd in reversed(fds):
                native.close_fd(fd)
            raise
        return OpenedGroup(Unit(pid, cpu, f"cpu:{cpu}"), fds[0], fds, sampled)

    def start(self, offset_ns: int) -> None:
        _, lib = native.require_native()
        lib.cp_ks_set_time_offset(self.handle, offset_ns)
        lib.cp_ks_start(self.handle)

    def drain_once(self) -> int:
        """Rows ready in the rings, emitted as one batch; the count. Under the collector's lock:
        the drain thread and the stop both read the rings."""
        col = self.collector
        with col._lock:
            if self.handle is None:
                return 0
            ffi, lib = native.ffi, native.lib
            n = lib.cp_ks_poll(self.handle)
            if n == 0:
                return 0
            t, d, slot, val, q, valid = native.drain_buffers(ffi, n)
            got: int = lib.cp_ks_drain(self.handle, n, t, d, slot, val, q, valid)
            if got == 0:
                return 0
            batch = col._batch(ffi, got, t, d, slot, val, q, valid)
        col.ctx.emit("samples", batch)
        return got

    def finish(self) -> dict[str, Any]:
        """Stop counting, put the tails in the last bucket, drain everything; the stats."""
        col = self.collector
        lib = native.lib
        with col._lock:
            rc = lib.cp_ks_finish(self.handle)
        if rc < 0:
            col.ctx.warn(f"perf: the final read of a kernel-sampled group failed "
                         f"({errno.errorcode.get(-rc, -rc)}): the last bucket misses its tail")
        while self.drain_once():
            pass
        st = native.ffi.new("struct cp_ks_stats *")
        lib.cp_ks_get_stats(self.handle, st)
        stats = {"samples": st.samples, "lost": st.lost, "late_samples": st.late_samples,
                 "bad_records": st.bad_records, "dropped": st.dropped, "rows": st.rows,
                 "threads": st.threads, "read_errors": st.read_errors}
        if st.lost:
            col.ctx.warn(f"perf: the kernel lost {st.lost} sample records (its rings were full): "
                         "their counts reach the threads' next samples, only their times are lost")
        if st.dropped:
            col.ctx.warn(f"perf: {st.dropped} kernel samples were not counted (out of memory)")
        return stats

    def close(self) -> None:
        if self.handle is not None:
            native.lib.cp_ks_free(self.handle)
            self.handle = None
        if self.counters is not None:
            self.counters.close()


def start(col: Any, ctx: Any, groups: list[EventGroup], interval_ms: float,
          drain_period_s: float) -> KernelSampling | None:
    """Kernel sampling for `col`, running; None (warned why) where the tick must run instead."""
    cfg = col.config
    reason = refusal(ctx, cfg)
    ks = KernelSampling(col)
    if reason is None:
        # kernel_cpus: where to open the groups (default every online CPU); [-1] asks for the
        # one per-task group the kernel refuses to map, which is how the tests reach the fallback
        cpus = ([int(c) for c in cfg["kernel_cpus"]] if cfg.get("kernel_cpus") is not None
                else online_cpus(cfg["sysfs_root"]))
        try:
            ks.open(groups, ctx.target.pid, int(interval_ms * 1e6), cpus, drain_period_s)
        except KernelModeRefused as exc:
            reason = str(exc)
        except CounterprofError as exc:    # the tick opens the same events: it says it again
            reason = str(exc)
    if reason is not None:
        col.details["sampling_fallback"] = reason
        ctx.warn(f"perf: kernel sampling cannot run ({reason}); sampling on a tick instead")
        return None
    counters = ks.counters
    assert counters is not None       # set by a successful open
    col.counters = counters
    col._record_event_status(ctx)
    ctx.add_metrics([Metric(sp.name, sp.unit or "count", "delta", sp.description or sp.name, "perf")
                     for sp in counters.counted_events()])
    col.details["sampling"] = "kernel"
    hardware = [sp.name for sp in counters.counted_events() if sp.type != PERF_TYPE_SOFTWARE]
    if hardware:
        col.details["kernel_unscaled"] = hardware
        ctx.warn(f"perf: kernel sampling does not scale {', '.join(hardware)} for multiplexing "
                 "(per-CPU task groups cannot tell it from time on other CPUs): a group that shares "
                 "the PMU is undercounted; --sampling tick scales it")
    ks.start(ctx.clock.offset_ns)
    return ks
