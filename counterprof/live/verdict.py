"""The live view's bottleneck line (`LiveVerdict`) over its last VERDICT_S seconds: for the
workload, the report's classifier (analysis.classify) on the report's signal table read from
the live window (`WindowMetricView`); for the machine (counterprof top without --pid), plain
system figures."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast
from collections.abc import Iterable, Mapping

from .buckets import (VERDICT_S, Bucket, Key, LiveSeries, combined, current_value, gauge_mean,
                      kind_of, per_ns, sum_side_by_side, weighted)
from .devices import device_sort
from .figures import LiveVerdict, PanelContext
from .panels import event_base

if TYPE_CHECKING:   # analysis.signals loads pyarrow and numpy: imported where it is used
    from ..analysis.signals import MetricView, Signal

def _gpu_util(c: PanelContext, seconds: float) -> list[tuple[str, float]]:
    """Per GPU: the busiest utilization-like percent metric (name holds 'util')."""
    out: dict[str, float] = {}
    for key, fine in c.snap.series.items():
        source, metric, entity = key
        if not entity.startswith("gpu") or "util" not in metric.lower() or "mem" in metric.lower():
            continue
        kind, unit = kind_of(c.catalog, metric, fine)
        b = c.snap.get(key)
        if unit != "percent":
            continue
        v, _ = current_value(kind, unit, c.now(b, seconds))
        if v is not None:
            out[entity] = max(out.get(entity, 0.0), v)
    return sorted(out.items(), key=lambda kv: device_sort(kv[0]))


class WindowMetricView:
    """The live window's last `seconds` as the signal table reads a scope (signals.MetricView):
    every entity of a metric summed side by side, deltas as value per ns of covered time x
    the window, so the same formulas give the report's and the live line's signals."""

    def __init__(self, c: PanelContext, seconds: float):
        self.c, self.seconds = c, seconds
        self.wall_ns = seconds * 1e9
        self._keys: dict[str, list[Key]] = {}
        for key in c.snap.series:
            source, metric, _entity = key
            if source == "perf":
                if c.perf_system_wide:   # every CPU's time, idle included: says nothing of the workload
                    continue
                metric = event_base(metric)
            self._keys.setdefault(metric, []).append(key)

    def _now(self, metric: str) -> Bucket | None:
        keys = self._keys.get(metric)
        if not keys:
            return None
        return self.c.now(LiveSeries(sum_side_by_side([self.c.snap.series[k] for k in keys]), {}),
                          self.seconds)

    def _kind(self, metric: str) -> str:
        keys = self._keys.get(metric) or []
        name = keys[0][1] if keys else metric
        return kind_of(self.c.catalog, name, self.c.snap.series.get(keys[0]) if keys else None)[0]

    def delta(self, metric: str) -> float | None:
        if metric not in self._keys or self._kind(metric) != "delta":
            return None
        v = per_ns(self._now(metric))
        return None if v is None else v * self.wall_ns

    def mean(self, metric: str) -> float | None:
        if metric not in self._keys:
            return None
        kind = self._kind(metric)
        b = self._now(metric)
        return weighted(b) if kind == "ratio" else gauge_mean(b) if kind == "gauge" else None

    def source(self, metric: str) -> str:
        keys = self._keys.get(metric)
        return keys[0][0] if keys else ""

    def device_mean(self, metric: str) -> float | None:
        """The mean over entities of each one's own value (NeuronCores), not of their sum."""
        kind = self._kind(metric)
        if kind not in ("ratio", "gauge"):
            return None
        each = [v for k in self._keys.get(metric) or []
                if (v := (weighted if kind == "ratio" else gauge_mean)(self.c.now(self.c.snap.get(k), self.seconds)))
                is not None]
        return sum(each) / len(each) if each else None

    def first(self, names: Iterable[str]) -> str | None:
        return next((n for n in names if n in self._keys), None)


def live_signals(c: PanelContext, seconds: float, cpus: int | None = None) -> dict[str, Signal]:
    """The classifier's signals over the last `seconds` of the window: the report's signal
    table (analysis.signals.counter_signals) over the live window, and the CPUs other
    processes held (cpus: the machine's)."""
    from ..analysis.signals import Signal, counter_signals, others_cpus
    out: dict[str, Signal] = {"wall_s": Signal(seconds, "live", "the last seconds")}
    # a MetricView by its methods (analysis.signals, loaded lazily, is not its base class)
    view = cast("MetricView", WindowMetricView(c, seconds))
    out.update(counter_signals(view))
    out.update(others_cpus(view, cpus, out))
    out.update(_traced_main_ops(c))
    return out


def _traced_main_ops(c: PanelContext) -> dict[str, Signal]:
    """The newest trace window's share of the main thread's time inside its own ops (and
    in op time the collectives caused), per rank, averaged (live/traces.py measures it as the
    report does over a traced step): carried to the live seconds, so the live line says
    "Python outside torch ops" as the report does."""
    from ..analysis.signals import Signal
    newest: dict[int, dict[str, Any]] = {}
    for w in getattr(c.snap, "mfu", ()) or ():
        if "main_in_ops" in w:
            newest[w.get("rank") or 0] = w
    if not newest:
        return {}
    out: dict[str, Signal] = {}
    for key in ("main_in_ops", "main_in_comm_ops"):
        vals = [w.get(key, 0.0) for w in newest.values()]
        if key == "main_in_ops" or any(vals):
            out[key] = Signal(sum(vals) / len(vals), "spans",
                              f"{key} of the newest trace window, carried to now")
    return out


def verdict(c: PanelContext, scope: str = "process", cpus: int | None = None,
            statuses: Mapping[str, Any] | None = None) -> LiveVerdict:
    """The current bottleneck over the last VERDICT_S seconds: the classifier (analysis.classify)
    for the workload; for the machine (counterprof top without --pid), plain system figures."""
    from ..ground.thresholds import value
    sec = VERDICT_S
    gpus = _gpu_util(c, sec)
    gpu_text = ", ".join(f"{e} {v:.0f}% busy" for e, v in gpus) if gpus else "no GPU"
    if scope == "machine":
        util = combined(c.snap, "host", "system.cpu_util", ["system"])
        iow = combined(c.snap, "host", "system.cpu_iowait", ["system"])
        sys_util = weighted(c.now(util, sec)) if util else None
        iowait = weighted(c.now(iow, sec)) if iow else None
        if sys_util is None:
            return LiveVerdict("unknown", "no system CPU figures yet")
        n = cpus or 1
        busy = sys_util * n / 100.0
        if gpus and max(v for _, v in gpus) >= value("machine_gpu_busy"):
            return LiveVerdict("GPU busy", f"{gpu_text}; {busy:.1f} of {n} CPUs busy")
        if iowait is not None and iowait >= value("machine_iowait"):
            return LiveVerdict("waiting for I/O", f"iowait {iowait:.0f}%, {busy:.1f} of {n} CPUs busy")
        if sys_util < value("machine_idle"):
            return LiveVerdict("idle", f"{busy:.1f} of {n} CPUs busy, {gpu_text}")
        label = "CPU-bound" if sys_util >= value("machine_busy") else "busy"
        return LiveVerdict(label, f"{busy:.1f} of {n} CPUs busy ({sys_util:.0f}%), {gpu_text}")

    from ..analysis.classify import classify, describe
    sig = live_signals(c, sec, cpus)
    if "cpu_busy" not in sig and "gpu_util" not in sig:
        return LiveVerdict("unknown", "no CPU-time figures yet" + ("" if not gpus else f"; {gpu_text}"))
    threads = (statuses or {}).get("threads") or {}
    v = classify(sig, "now", {"main_threads": threads.get("main") or [],
                              "contenders": threads.get("contenders") or [], "cpus": cpus})
    evidence = "; ".join(e.text for e in v.evidence[:2])
    return LiveVerdict(describe(v), evidence, dict(v.shares),
                       kind="unknown" if v.verdict == "unknown" else f"{v.verdict}-bound")


