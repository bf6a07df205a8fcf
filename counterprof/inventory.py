"""What `counterprof list` says: each registered collector, whether it works on this machine
(and why not), and the tables of what it offers here (events, devices, metrics)."""
from __future__ import annotations

from typing import Any


def collector_inventory() -> list[dict[str, Any]]:
    """One entry per collector, by name: name, available, reason, tables (each with title,
    columns, rows and an optional note). A collector whose check fails is said so in its
    reason; it never hides the others."""
    from .collector import registry
    collectors: list[dict[str, Any]] = []
    for name, cls in sorted(registry().items()):
        entry: dict[str, Any] = {"name": name, "available": False, "reason": "", "tables": []}
        collectors.append(entry)
        if isinstance(cls, Exception):
            entry["reason"] = str(cls)
            continue
        try:
            avail = cls.availability({})
            entry.update(available=avail.ok, reason=avail.reason)
            if avail.ok:
                entry["tables"] = cls.inventory({})
        except Exception as exc:   # one broken collector must not hide the others
            entry["reason"] = f"check failed: {type(exc).__name__}: {exc}"
    return collectors
