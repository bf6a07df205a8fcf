"""Which events this machine counts: each one opened (disabled) on this process and closed."""
from __future__ import annotations

from typing import Any

import errno

from counterprof.ground.errors import EventNotSupported, PerfEventError, PerfPermissionError

from . import native
from .events import HARDWARE, SOFTWARE, EventParser, EventSpec, cache_event_names
from .sysfs import Sysfs

_ALIASES = {"cpu-cycles", "branch-instructions", "idle-cycles-frontend", "idle-cycles-backend",
            "faults", "cs", "migrations"}


def probe_one(spec: EventSpec) -> tuple[str, str]:
    flags = native.OpenFlags(leader=True, enable_on_exec=False, inherit=False)
    try:
        fd = native.open_event(spec, flags, 0, -1)
    except PerfPermissionError:
        try:
            fd = native.open_event(spec.with_user_only(), flags, 0, -1)
        except PerfEventError as exc:
            return "unavailable", str(exc)
        native.close_fd(fd)
        return "user only", "kernel.perf_event_paranoid allows user-space counting only"
    except EventNotSupported as exc:
        return "not supported", f"no PMU here counts it ({errno.errorcode.get(exc.errno, exc.errno)})"
    except PerfEventError as exc:
        return "unavailable", str(exc)
    native.close_fd(fd)
    return "supported", ""


def probe_events(sysfs_root: str = "/sys") -> dict[str, Any]:
    sysfs = Sysfs(sysfs_root)
    parser = EventParser(sysfs)
    rows = []
    for kind, names in (("hardware", [n for n in HARDWARE if n not in _ALIASES]),
                        ("software", [n for n in SOFTWARE if n not in _ALIASES and n != "dummy"]),
                        ("hw-cache", cache_event_names())):
        for name in names:
            spec = parser.parse_one(name)
            status, reason = probe_one(spec)
            rows.append({"name": name, "kind": kind, "status": status,
                         "reason": reason, "description": spec.description})
    pmus = []
    for pmu in sysfs.pmus.values():
        pmus.append({"name": pmu.name, "type": pmu.type, "terms": sorted(pmu.formats),
                     "core": pmu.is_core, "events": sorted(pmu.events)})
    return {"events": rows, "pmus": pmus}


def inventory_tables(sysfs_root: str = "/sys") -> list[dict[str, Any]]:
    found = probe_events(sysfs_root)
    events = {
        "title": "perf events (each tried on this process)",
        "columns": ["event", "kind", "here", "description / why not"],
        "rows": [[e["name"], e["kind"], e["status"], e["reason"] or e["description"]]
                 for e in found["events"]],
    }
    if any(e["status"] == "not supported" for e in found["events"]):
        events["note"] = ("not supported: the kernel exposes no PMU for these (usual in virtual "
                          "machines and containers without PMU passthrough); they are reported "
                          "as <not supported>, never as 0")
    pmus = {
        "title": "PMUs in sysfs (use as pmu/term=value,../ or by a named event)",
        "columns": ["pmu", "type", "terms", "named events"],
        "rows": [[p["name"], str(p["type"]), ",".join(p["terms"]),
                  _names(p["events"])] for p in found["pmus"]],
        "note": "raw events: rNNNN; groups: {a,b}; modifiers: :u :k :h :G :H :I :D :e :p",
    }
    return [events, pmus]


def _names(events: list[str], limit: int = 12) -> str:
    if len(events) <= limit:
        return ", ".join(events)
    return ", ".join(events[:limit]) + f", ... ({len(events)} in all)"

