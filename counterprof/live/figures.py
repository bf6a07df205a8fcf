"""What one frame of the live view shows, as numbers: panels of `Figure`s (a current value, a
history for the sparkline, a unit key; ground/units.py writes them as text) and the
`LiveVerdict` line; and `PanelContext`, what every panel builder reads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping

from .buckets import CURRENT_S, Bucket, LiveSeries, Snapshot, binned, common_end, recent
from ..ground.units import DetailPart, live_detail


@dataclass
class Figure:
    key: str                       # stable id, e.g. "perf.cpus", "gpu:0.gpu.util"
    label: str                     # "CPU utilization"
    short: str                     # for the one-line form: "CPUs"
    value: float | None            # None: unknown now
    unit: str                      # cpus | ratio | percent | bytes | bytes/s | /s | a catalog unit
    history: list[float | None] = field(default_factory=list)   # oldest first, one per point
    scale: float | None = None     # the sparkline's top at least this (100 for percent)
    # extra words and numbers: ("sys ", (0.2, "percent")), ("of ", (700.0, "W"))
    detail_parts: tuple[DetailPart, ...] = ()
    alert: bool = False            # worth a colour: throttling, multiplexing
    headline: bool = False         # shown in the compact and one-line forms

    @property
    def detail(self) -> str:
        """The detail as text: "sys 0.2%", "of 700 W"."""
        return live_detail(self.detail_parts)


@dataclass
class PanelFigures:
    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = "ok"             # ok | failed | unavailable | waiting
    reason: str = ""


@dataclass
class LiveVerdict:
    """The live view's bottleneck line over its last seconds (analysis.classify.Verdict is
    the classifier's own, which this one is made from in the workload scope)."""

    label: str                     # "host-bound (87% of the time)", "CPU-bound", "idle", ...
    evidence: str                  # "1.00 CPUs busy, no GPU"
    shares: dict[str, float] = field(default_factory=dict)   # the classifier's time share per class (workload scope)
    # the verdict alone, from a fixed set (no figures in it: --serve puts it in a label):
    # compute-bound | memory-bound | collectives-bound | host-bound | unknown for the workload;
    # the machine's verdicts (CPU-bound, GPU busy, busy, idle, waiting for I/O, unknown) are
    # their label already, so empty there means the label
    kind: str = ""

    @property
    def name(self) -> str:
        return self.kind or self.label

    def __str__(self) -> str:
        return f"{self.label}: {self.evidence}" if self.evidence else self.label


@dataclass
class Absent:
    """A collector with nothing to show on this machine (unavailable: no NVIDIA driver, no
    Neuron device, no process to follow): one entry of the view's "not here" line, never a panel."""

    name: str                      # the collector: nvml, neuron, threads
    why: str                       # its reason, short: "no NVIDIA driver"


@dataclass
class LiveFigures:
    panels: list[PanelFigures]
    verdict: LiveVerdict
    absent: list[Absent] = field(default_factory=list)


class PanelContext:
    """What every panel builder needs: the snapshot, catalog and the sparkline width.
    perf_system_wide: perf counts every CPU (-a, top): its task-clock is then the CPUs'
    whole time, idle included, and says nothing about how busy anything is."""

    def __init__(self, snap: Snapshot, catalog: Mapping[str, Any], points: int,
                 perf_system_wide: bool = False):
        self.snap, self.catalog, self.points = snap, catalog, points
        self.perf_system_wide = perf_system_wide
        self.end = common_end(snap)

    def bins(self, series: LiveSeries | None) -> list[Bucket | None]:
        """The sparkline's points: the history buckets up to "now", in equal bins."""
        h = self.snap.history_ticks
        end = None if self.end is None else self.end // h
        return binned(series.coarse if series else None, end, self.snap.window_ticks // h, self.points)

    def now(self, series: LiveSeries | None, seconds: float = CURRENT_S) -> Bucket | None:
        return recent(series.fine if series else None, self.snap.tick_ns, seconds, self.end)


def short_reason(reason: str) -> str:
    """An unavailable collector's reason, its first clause: "no NVIDIA driver here:
    libnvidia-ml.so.1 was not found (install ...)" -> "no NVIDIA driver"."""
    text = " ".join(str(reason).split())
    for stop in (": ", " (", "; ", ". "):
        text = text.split(stop, 1)[0]
    text = text.removesuffix(" here").strip()
    return text or "unavailable"


def panel_status(panel: PanelFigures, st: Mapping[str, Any]) -> None:
    """A panel's status from its collector's meta.json entry: failed and unavailable say so;
    a working collector with nothing yet is waiting."""
    status = st.get("status", "ok")
    if status in ("failed", "unavailable"):
        panel.status, panel.reason = status, st.get("reason", "")
    elif not panel.figures:
        panel.status = "waiting"
