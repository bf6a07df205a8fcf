"""nvml collector: GPU metrics through nvidia-ml-py, GPM on Hopper and newer.

On by default wherever an NVIDIA driver answers; elsewhere "unavailable" with the reason
(no nvidia-ml-py, no driver, no GPU) and the run goes on without it.

Config (config["nvml"]):
  interval_ms      fast tick (the batched fields: power, energy, PCIe, NVLink...), default 100
  gpm_interval_ms  GPM window, default 100, at least 100
  sample_buffers   True (default): utilization and clocks from the driver's sample buffers,
                   read once a second, and the slow-moving readings once a second; False: all
                   polled every tick (the path before issue 35: 74 NVML calls per GPU per
                   second at 100 ms against 19, GPM's 20 aside)
  gpus             CUDA ordinals to sample ("0,1" or [0, 1]); default every visible GPU
  module           the NVML module or its import name (default "pynvml"); tests pass a fake

One thread samples every GPU; rows are kept in lists and emitted once a second (one Arrow
batch, one journal write). A lost GPU marks the collector failed with the reason and is
dropped; the other GPUs go on being sampled. A library-wide failure ends the sampling.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from counterprof.collector import Availability, PollingCollector, SessionContext
from counterprof.ground.errors import CounterprofError, GpuLost, NvmlError, NvmlUnavailable, UsageError
from counterprof.ground.schema import samples_batch

from . import devices
from .library import Nvml, open_nvml
from .metrics import METRICS
from .options import NvmlOptions
from counterprof.ground.proctree import tree_pids
from .sampler import MIN_GPM_WINDOW_MS, GpuSampler, Row, WallClock

# once a second: the driver's sample buffers, the slow-moving readings, per-process memory, and
# the emit (one batch a second: a killed profiler loses < 1 s)
SLOW_EVERY_NS = 1_000_000_000
MERGE_NS = 5_000_000            # deadlines this close together are met in one wake-up


def _open(config: dict[str, Any]) -> Nvml:
    """An initialized Nvml; a CounterprofError or ImportError saying why not."""
    return open_nvml(config.get("module"))


def _why_not(exc: Exception) -> str:
    if isinstance(exc, ImportError):
        return ("nvidia-ml-py is not installed (`pip install 'counterprof[nvml]'` or "
                "`pip install nvidia-ml-py`)")
    if isinstance(exc, CounterprofError):
        return str(exc)
    return f"NVML could not be opened: {type(exc).__name__}: {exc}"


class NvmlCollector(PollingCollector):
    name = "nvml"
    options = NvmlOptions
    DEFAULTS = {"interval_ms": 100.0, "gpm_interval_ms": 100.0, "gpus": None, "module": None,
                "sample_buffers": True}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self._rows: list[Row] = []
        self._failures: list[str] = []
        self._cataloged: set[str] = set()
        self.samplers: list[GpuSampler] = []
        self.nvml: Nvml | None = None

    # -- before the run ------------------------------------------------------------------

    @classmethod
    def availability(cls, config: dict[str, Any] | None = None) -> Availability:
        cfg = cls.with_defaults(config)
        try:
            nvml = _open(cfg)
        except Exception as exc:
            return Availability(False, _why_not(exc))
        try:
            physical = devices.physical_gpus(nvml)
            if not physical:
                why = "; ".join(nvml.errors.values())
                return Availability(False, "the NVIDIA driver is loaded but reports no GPU"
                                    + (f" ({why})" if why else ""))
            visible = devices.visible_gpus(nvml, physical, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if not visible:
                return Availability(False, f"CUDA_VISIBLE_DEVICES="
                                           f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r} hides every GPU "
                                           f"({len(physical)} present)")
            return Availability(True)
        except Exception as exc:
            return Availability(False, _why_not(exc))
        finally:
            nvml.close()

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        cfg = cls.with_defaults(config)
        try:
            interval, gpm = float(cfg["interval_ms"]), float(cfg["gpm_interval_ms"])
        except (TypeError, ValueError):
            raise UsageError(f"nvml intervals must be numbers of ms, not {cfg['interval_ms']!r} "
                             f"and {cfg['gpm_interval_ms']!r}") from None
        if not 1 <= interval <= 3_600_000:
            raise UsageError(f"nvml interval {interval:g} ms is out of range (1 ms to 1 h)")
        if not MIN_GPM_WINDOW_MS <= gpm <= 3_600_000:
            raise UsageError(f"GPM window {gpm:g} ms is out of range: NVML's GPM metrics need "
                             f"windows of at least {MIN_GPM_WINDOW_MS:g} ms (up to 1 h)")
        if not isinstance(cfg["sample_buffers"], bool):
            raise UsageError(f"nvml sample_buffers must be true or false, not {cfg['sample_buffers']!r}")
        wanted = devices.parse_gpus(cfg["gpus"])
        if wanted is None:
            return
        # --gpus names devices: check them now, before any workload starts
        try:
            nvml = _open(cfg)
        except Exception as exc:
            raise UsageError(f"--gpus {','.join(map(str, wanted))}: no GPU can be sampled here: "
                             f"{_why_not(exc)}") from None
        try:
            visible, _ = devices.discover(nvml)
            devices.select(visible, wanted, os.environ)
        finally:
            nvml.close()

    @classmethod
    def inventory(cls, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cfg = cls.with_defaults(config)
        nvml = _open(cfg)
        try:
            visible, warnings = devices.discover(nvml)
            driver = nvml.call("nvmlSystemGetDriverVersion")
            rows = []
            for g in visible:
                support = None if g.mig else nvml.call("nvmlGpmQueryDeviceSupport", g.handle,
                                                       where=g.entity)
                gpm = "MIG mode" if g.mig else ("yes" if support is not None and support.isSupportedDevice
                                                else "no")
                mem = f"{g.memory_total / 2**30:.1f} GiB" if g.memory_total else "?"
                rows.append([g.entity, g.name, g.uuid, g.pci_bus_id, mem, gpm])
            cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
            note = [f"driver {driver}; gpu:N is the CUDA ordinal (--gpus N)"]
            if cvd is not None:
                note.append(f"CUDA_VISIBLE_DEVICES={cvd!r}")
            note.extend(warnings)
            return [{"title": "GPUs", "columns": ["gpu", "name", "uuid", "pci bus id", "memory", "GPM"],
                     "rows": rows, "note": "; ".join(note)}]
        finally:
            nvml.close()

    def summary_config(self) -> dict[str, Any]:
        cfg = dict(self.config)
        if cfg.get("module") is not None and not isinstance(cfg["module"], str):
            cfg["module"] = type(cfg["module"]).__name__     # a test's fake: name it, do not embed it
        return cfg

    # -- the run ------------------------------------------------------------------------

    def start(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.nvml = nvml = _open(self.config)
        try:
            self._start(ctx, nvml)
        except BaseException:
            self._close()
            raise

    def _start(self, ctx: SessionContext, nvml: Nvml) -> None:
        visible, warnings = devices.discover(nvml)
        gpus = devices.select(visible, devices.parse_gpus(self.config["gpus"]), os.environ)
        for w in warnings:
            ctx.warn(f"nvml: {w}")
        driver = nvml.call("nvmlSystemGetDriverVersion")
        t = ctx.target
        self.root = os.getpid() if t.kind == "self" else t.pid
        self.wall = WallClock(ctx.clock)
        rows = self._rows
        for gpu in gpus:
            try:
                s = GpuSampler(nvml, gpu, self.wall, on_new_metrics=self._catalog,
                               interval_ns=int(float(self.config["interval_ms"]) * 1e6),
                               sample_buffers=bool(self.config["sample_buffers"]))
                s.probe(rows)
            except GpuLost as exc:
                self._lost(None, exc)
                continue
            self.samplers.append(s)
        self.run_facts["gpus"] = [g.facts(driver) for g in gpus]
        self._catalog(set().union(*(s.metrics() for s in self.samplers)) if self.samplers else set())
        self._update_details()
        self.start_polling(ctx)

    def _catalog(self, names: set[str]) -> None:
        """Catalog entries for metrics a GPU has shown it records (unsupported ones never are)."""
        new = names - self._cataloged
        if new:
            self._cataloged |= new
            self.ctx.add_metrics([m for m in METRICS if m.name in new])

    def poll(self) -> None:
        """Three deadlines: the fast tick, the GPM window, and once a second the slow part
        and the emit (so a batch leaves at least once a second whatever the intervals).

        The fast tick and GPM are each scheduled from the end of the work, not on a fixed
        grid: a late wake-up never makes a GPM window shorter than asked (NVML wants >= 100 ms),
        and with equal periods (the default) both fall due together, so the thread wakes once
        per period instead of twice. In-process every wake-up is a GIL hand-off with the
        workload. A fast tick or the slow part due within MERGE_NS is done at the same wake-up."""
        period = float(self.config["interval_ms"]) * 1e6
        gpm_period = float(self.config["gpm_interval_ms"]) * 1e6
        clock = self.ctx.clock
        now = clock.now_ns()
        next_tick, next_gpm, next_slow = now + period, now + gpm_period, now + SLOW_EVERY_NS
        while self.samplers:
            wait = (min(next_tick, next_gpm, next_slow) - clock.now_ns()) / 1e9
            if self._stop.wait(max(0.0, wait)):
                break
            now = clock.now_ns()
            soon = now + MERGE_NS
            ticked = windowed = False
            if next_gpm <= now:
                self._each(GpuSampler.gpm_tick)
                windowed = True
            if next_tick <= soon:
                self.wall.refresh()
                self._each(GpuSampler.tick)
                ticked = True
            if next_slow <= soon:
                self._slow()
                self.flush()
                next_slow = max(next_slow + SLOW_EVERY_NS, now)
            done = clock.now_ns()
            if ticked:
                next_tick = done + period
            if windowed:
                next_gpm = done + gpm_period

    def poll_failed(self, exc: Exception) -> None:
        self._fail(f"NVML stopped answering: {exc}" if isinstance(exc, NvmlUnavailable)
                   else f"{type(exc).__name__}: {exc}")

    def _slow(self) -> None:
        pids = tree_pids(self.root) if self.root is not None else None
        self.wall.refresh()         # the buffers' driver stamps are mapped with it
        for s in list(self.samplers):
            try:
                s.slow_tick(self._rows, pids)
            except GpuLost as exc:
                self._lost(s, exc)

    def _each(self, step: Callable[..., None], **kw: Any) -> None:
        for s in list(self.samplers):
            try:
                step(s, self._rows, **kw)
            except GpuLost as exc:
                self._lost(s, exc)

    def _lost(self, sampler: GpuSampler | None, exc: GpuLost) -> None:
        """A lost GPU: keep what it gave, stop sampling it, mark the collector failed."""
        if sampler is not None:
            self.samplers.remove(sampler)
            sampler.close()
        others = f"; the other {len(self.samplers)} GPU(s) are still sampled" if self.samplers else ""
        self._fail(f"{exc}{others}")

    def _fail(self, reason: str) -> None:
        self.flush()
        self._failures.append(reason)
        self.status, self.reason = "failed", " | ".join(self._failures)
        self._update_details()
        if hasattr(self, "ctx"):
            self.ctx.fail(self.name, self.reason)

    def flush(self) -> None:
        rows, self._rows = self._rows, []
        if rows:
            t, d, m, e, v = zip(*rows)
            self.ctx.emit("samples", samples_batch(list(t), list(d), self.name, list(m), list(e), list(v)))

    def _update_details(self) -> None:
        if self.nvml is None:
            return
        self.details["unsupported"] = {k: sorted(v) for k, v in sorted(self.nvml.unsupported.items())}
        self.details["errors"] = dict(self.nvml.errors)
        self.details["gpus_sampled"] = {s.where: {"gpm": s.gpm_status, "nvlinks": s.nvlinks,
                                                  "sample_buffers_ms": s.buffer_periods(),
                                                  **({"notes": s.gpu.notes} if s.gpu.notes else {})}
                                        for s in self.samplers}

    last_sample_errors = (NvmlError,)

    def last_sample(self) -> None:
        if self.samplers:
            self.wall.refresh()
            self._each(GpuSampler.tick, rare=True)
            self._slow()

    def release(self) -> None:
        self._update_details()
        self._close()

    def _close(self) -> None:
        for s in self.samplers:
            s.close()
        if self.nvml is not None:
            self.nvml.close()


__all__ = ["NvmlCollector"]
