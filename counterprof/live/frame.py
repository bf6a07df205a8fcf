"""One frame of the live view as figures: every panel (perf, host, threads, one per device,
the torch traces' MFU) and the bottleneck line, from a Snapshot of the live window."""
from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from .buckets import Snapshot
from .devices import device_panels
from .figures import Absent, LiveFigures, PanelContext, PanelFigures, short_reason
from .mfu import mfu_panel
from .panels import host_panel, perf_panel, threads_panel
from .verdict import verdict


def live_figures(snap: Snapshot, catalog: Mapping[str, Any], statuses: Mapping[str, Any],
                 points: int, scope: str = "process", cpus: int | None = None,
                 perf_system_wide: bool = False) -> LiveFigures:
    """Panels (perf, host, then one per GPU or other device) and the verdict.
    points: sparkline width; statuses: meta.json's per-collector entries; scope: "process"
    (the workload) or "machine" (counterprof top)."""
    c = PanelContext(snap, catalog, points, perf_system_wide)
    panels = []
    if snap.keys("perf") or "perf" in statuses:
        panels.append(perf_panel(c, statuses))
    if snap.keys("host") or "host" in statuses:
        panels.append(host_panel(c, statuses))
    if snap.keys("threads") or "threads" in statuses:
        panels.append(threads_panel(c, statuses))
    panels.extend(device_panels(c))
    if snap.mfu:
        panels.append(mfu_panel(c))
    for name, st in statuses.items():      # a device collector that failed before any sample
        if name in ("perf", "host", "threads") or st.get("status") in ("ok", "unavailable"):
            continue
        if not any(p.title.endswith(name) for p in panels):
            panels.append(PanelFigures(name, status=st.get("status", "failed"),
                                       reason=st.get("reason", "")))
    # what is not on this machine (no driver, no device, no process to follow): one line, as
    # nvitop and htop leave out what is not there, never a panel of rows saying so
    absent = [Absent(name, short_reason(st.get("reason", ""))) for name, st in statuses.items()
              if st.get("status") == "unavailable" and not _has_rows(panels, name)]
    panels = [p for p in panels if not (p.status == "unavailable" and not p.figures)]
    return LiveFigures(panels, verdict(c, scope, cpus, statuses), absent)


def _has_rows(panels: list[PanelFigures], name: str) -> bool:
    """A panel of this collector shows figures (an unavailable collector's samples from before:
    its panel stays)."""
    return any(p.figures and (p.title == name or p.title.endswith(f" {name}")) for p in panels)
