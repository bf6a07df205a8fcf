"""How loaded the machine was while `counterprof calibrate` measured it.

A ceiling measured while other processes hold the CPUs is too low (a matmul on every core
gets the cores' leftover time), and every run held to it then looks nearer its roof than it
is. So calibrate measures, for each of its steps, the CPU time other processes took on the
CPUs it may run on: the busy time of those CPUs (/proc/stat: user, nice, system, irq,
softirq) less its own (os.times: this process and the children it waited for, the
collectives' ranks), and the time the hypervisor gave to other guests (steal). As shares of
those CPUs over the step's wall time. With the load average and the runnable threads around
it, this is recorded in each ceilings document ("load") and decides whether calibrate saves
(thresholds.calibrate_others_share).

    meter = LoadMeter()
    with meter.phase("matmul fp32"):
        ...
    meter.summary()     # {"others_share", "worst": {...}, "phases": {...}, "loaded", ...}

Linux only (/proc/stat); elsewhere summary() says the load was not measured.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Sample:
    wall: float                # time.monotonic()
    busy_s: float | None       # busy CPU seconds of the CPUs we may run on, since boot
    steal_s: float | None
    own_s: float               # this process's CPU seconds plus its waited-for children's
    procs_running: int | None  # runnable threads on the machine (ours included)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), else all."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _proc_stat(cpus: set[int]) -> tuple[float | None, float | None, int | None]:
    """(busy s, steal s) summed over `cpus`, and procs_running, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            text = f.read()
    except OSError:
        return None, None, None
    busy = steal = 0
    seen = False
    running = None
    for line in text.splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *fields = line.split()
            if int(name[3:]) not in cpus:
                continue
            v = [int(x) for x in fields] + [0] * 10
            # user nice system idle iowait irq softirq steal (guest is inside user)
            busy += v[0] + v[1] + v[2] + v[5] + v[6]
            steal += v[7]
            seen = True
        elif line.startswith("procs_running"):
            try:
                running = int(line.split()[1])
            except (IndexError, ValueError):
                pass
    if not seen:
        return None, None, running
    return busy / _TICK, steal / _TICK, running


def sample(cpus: set[int]) -> Sample:
    t = os.times()
    busy, steal, running = _proc_stat(cpus)
    return Sample(time.monotonic(), busy, steal, t.user + t.system + t.children_user + t.children_system,
                  running)


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def between(a: Sample, b: Sample, ncpus: int) -> dict[str, Any]:
    """Others' CPU use between two samples: CPUs held and the share of the `ncpus` CPUs."""
    wall = b.wall - a.wall
    out: dict[str, Any] = {"wall_s": round(wall, 3), "own_cpus": None, "others_cpus": None,
                           "others_share": None, "steal_share": None}
    if wall <= 0:
        return out
    own = max(b.own_s - a.own_s, 0.0)
    out["own_cpus"] = round(own / wall, 3)
    if a.busy_s is None or b.busy_s is None or a.steal_s is None or b.steal_s is None:
        return out
    # ticks and os.times() count a little apart: never below 0, never above the CPUs there are
    others = min(max(b.busy_s - a.busy_s - own, 0.0), ncpus * wall)
    steal = max(b.steal_s - a.steal_s, 0.0)
    out["others_cpus"] = round(others / wall, 3)
    out["steal_share"] = round(min(steal / (ncpus * wall), 1.0), 4)
    # a stolen tick is one another guest held: it counts as others' too
    out["others_share"] = round(min((others + steal) / (ncpus * wall), 1.0), 4)
    return out


class LoadMeter:
    """Others' share of this process's CPUs per phase of a calibration, and over all of it."""

    def __init__(self) -> None:
        self.cpus = allowed_cpus()
        self._set = set(self.cpus)
        self.loadavg_before = _loadavg()
        self.first = sample(self._set)
        self.phases: dict[str, dict[str, Any]] = {}
        self.running_max = self.first.procs_running

    @contextmanager
    def phase(self, label: str) -> Iterator[None]:
        a = sample(self._set)
        try:
            yield
        finally:
            b = sample(self._set)
            for s in (a, b):
                if s.procs_running is not None:
                    self.running_max = max(self.running_max or 0, s.procs_running)
            d = between(a, b, len(self.cpus))
            d["procs_running"] = [a.procs_running, b.procs_running]
            self.phases[label] = d

    def summary(self, threshold: float | None = None) -> dict[str, Any]:
        """The load record saved with the ceilings. threshold: the others' share of the CPUs
        from which the machine counts as loaded (default: thresholds.calibrate_others_share)."""
        if threshold is None:
            from ..ground.thresholds import value
            threshold = value("calibrate_others_share")
        last = sample(self._set)
        whole = between(self.first, last, len(self.cpus))
        measured = {k: v for k, v in self.phases.items() if v.get("others_share") is not None}
        worst = max(measured, key=lambda k: measured[k]["others_share"]) if measured else None
        out: dict[str, Any] = {
            "cpus": len(self.cpus), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **{k: whole[k] for k in ("others_cpus", "others_share", "steal_share", "own_cpus", "wall_s")},
            "worst": ({"phase": worst, "others_share": measured[worst]["others_share"],
                       "others_cpus": measured[worst]["others_cpus"]} if worst else None),
            "phases": self.phases,
            "loadavg_before": self.loadavg_before, "loadavg_after": _loadavg(),
            "procs_running_max": self.running_max,
            "threshold": threshold,
        }
        if worst is None:
            out["loaded"] = None
            out["why"] = "not measured: no /proc/stat (Linux only)"
        else:
            out["loaded"] = bool(measured[worst]["others_share"] >= threshold)
        return out


def words(load: dict[str, Any] | None) -> str:
    """How loaded the machine was, in words: "other processes held 48% of its 2 CPUs
    (0.96 CPUs; the fp32 matmul step 61%), load average 3.1 -> 3.4"."""
    if not load:
        return "how loaded the machine was is not recorded (calibrated before counterprof recorded it)"
    if load.get("others_share") is None:
        return f"how loaded the machine was is not known ({load.get('why', 'not measured')})"
    text = (f"other processes held {100 * load['others_share']:.0f}% of its {load.get('cpus', '?')} CPU(s) "
            f"({load.get('others_cpus', 0):.2f} CPUs")
    w = load.get("worst") or {}
    if w.get("phase") and w.get("others_share") is not None:
        text += f"; {100 * w['others_share']:.0f}% during {w['phase']}"
    text += ")"
    if load.get("steal_share"):
        text += f", {100 * load['steal_share']:.0f}% of them held by other guests (steal)"
    la, lb = load.get("loadavg_before"), load.get("loadavg_after")
    if la and lb:
        text += f", load average {la[0]:.1f} -> {lb[0]:.1f}"
    return text
