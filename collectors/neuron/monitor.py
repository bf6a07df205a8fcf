"""neuron-monitor: the config it is started with, and its JSON lines turned into rows.

neuron-monitor (aws-neuron-sdk, tools/neuron-sys-tools/neuron-monitor-user-guide.rst) writes
one complete JSON object per line to stdout each period: `neuron_runtime_data` (one entry per
Neuron runtime, i.e. per process using NeuronCores: pid, tag, error, report of metric groups),
`system_data` (system-wide groups), `neuron_hardware_info`. Each metric group carries its own
`period` (the captured period, s) and `error` (a string, empty when none).

Older releases (docs/neuron-tools/neuron-monitor-user-guide.md) name things differently; both
spellings are read: runtime_data, nc_counters/neuron_cores, inference_stats/inference_summary,
runtime_cpu_usage/cpu_usage, memory_used.runtime_memory, hw_counters (in a runtime's report)
with device_index; `device` where the guide writes `neuron_device`; `effective_flops` where
newer runtimes replace `flops`. A value that is null or not a number gives no row (a latency
is null when no model ran in the period: there is no latency, not an unknown one).
"""
from __future__ import annotations

import json
import math
from collections import namedtuple
from typing import Any
from collections.abc import Callable, Iterable

from .metrics import DEVICE_MEM_PARTS, ECC, ERROR_KINDS, HOST_MEM_PARTS, OUTCOMES
from .topology import MAX_DEVICE, Topology, core_number

# one reading: the caller stamps the time. pid: the runtime it came from (None: a device's);
# core: the NeuronCore it is about (None: not one core's)
Row = namedtuple("Row", "duration_ns metric entity value pid core")

MIN_PERIOD_S = 1.0       # neuron-monitor's periods are whole seconds in every example
MAX_PERIOD_S = 3600.0    # a group's "period" past this is not a captured period
MAX_PID = 1 << 22        # the kernel's pid_max ceiling
MAX_TEXT = 255           # an error string or tag kept (the guide's tags are at most 255)


def period_text(seconds: float) -> str:
    """A period as the config writes it: "1s", "2s"; fractions in ms ("1500ms")."""
    ms = int(round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def tag_filter(tag: str | None) -> str:
    """The runtimes to report: the workload's NEURON_PROCESS_TAG when it has one (exactly), else
    all of them (the collector keeps those of the workload's process tree)."""
    if not tag:
        return ".*"
    import re
    return f"^{re.escape(tag)}$"


def config(period_s: float, tag: str | None = None) -> dict[str, Any]:
    """The config file's object: every runtime-level group for the matching runtimes, ECC
    counters system-wide. vcpu_usage and memory_info (system CPU and memory) are left out:
    the host collector reads them from /proc at a finer interval."""
    return {
        "period": period_text(max(MIN_PERIOD_S, period_s)),
        "neuron_runtimes": [{
            "tag_filter": tag_filter(tag),
            "metrics": [{"type": t} for t in ("neuroncore_counters", "memory_used",
                                              "neuron_runtime_vcpu_usage", "execution_stats")],
        }],
        "system_metrics": [{"type": "neuron_hw_counters"}],
    }


def _num(v: Any) -> float | None:
    """A figure: every neuron-monitor value is a count, bytes, a percentage, a rate or seconds,
    so a negative, NaN, infinite or past-float one is not a reading (no row, as for null)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:          # JSON ints have no bound
        return None
    return f if math.isfinite(f) and f >= 0 else None


def _period_ns(g: dict[str, Any], default_s: float) -> int:
    """A group's captured period in ns; the default when it is missing or not a sane period."""
    p = _num(g.get("period"))
    return int((p if p and p <= MAX_PERIOD_S else default_s) * 1e9)


def _text(v: Any) -> str:
    return v[:MAX_TEXT] if isinstance(v, str) else ""


def _pid(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_PID else None


def _group(report: dict[str, Any], *names: str) -> tuple[str, dict[str, Any]] | tuple[None, None]:
    for n in names:
        g = report.get(n)
        if isinstance(g, dict):
            return n, g
    return None, None


def _first(d: dict[str, Any], *names: str) -> Any:
    for n in names:
        if n in d:
            return d[n]
    return None


def _core_keys(d: Any) -> list[tuple[int, str]]:
    """(core number, its key) for a dict keyed by NeuronCore index; other keys are skipped."""
    if not isinstance(d, dict):
        return []
    return sorted((n, k) for n, k in ((core_number(k), k) for k in d) if n is not None)


def decode(line: bytes | str) -> dict[str, Any]:
    """One output line as an object; ValueError saying what is wrong with it."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    text = text.strip()
    try:
        obj = json.loads(text)
    except RecursionError:             # "[[[[..." deeper than Python's stack
        raise ValueError(f"JSON nested too deep: {text[:40]!r}...") from None
    except ValueError as exc:
        cut = text[:80] + ("..." if len(text) > 80 else "")
        raise ValueError(f"not JSON ({exc.args[0] if exc.args else exc}): {cut!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a JSON {type(obj).__name__}, not the report object")
    return obj


class Parser:
    """Turns report objects into rows. Keeps what one line alone cannot say: the machine's
    layout (from neuron_hardware_info) and which devices the workload has used."""

    def __init__(self, topology: Topology | None = None):
        self.topology = topology or Topology()
        self.devices_used: set[int] = set()
        self.runtime_device: dict[int, int] = {}
        self.cores_seen: set[int] = set()

    def rows(self, obj: dict[str, Any], wanted: Callable[[int | None, str | None], bool],
             default_period_s: float = MIN_PERIOD_S) -> tuple[list[Row], dict[str, str]]:
        """(rows of the workload's runtimes and the devices it uses, {where: error string})."""
        topo = self.topology
        errors: dict[str, str] = {}
        hw = obj.get("neuron_hardware_info")
        if isinstance(hw, dict):
            if _text(hw.get("error")):
                errors["neuron_hardware_info"] = _text(hw["error"])
            topo.update(hw)
        out: list[Row] = []
        before = set(self.devices_used)
        self.devices_used = set()          # this line's; `before` keeps the run's
        runtimes = _first(obj, "neuron_runtime_data", "runtime_data")
        for rt in runtimes if isinstance(runtimes, list) else []:
            if not isinstance(rt, dict):
                continue
            pid = _pid(rt.get("pid"))
            tag = _text(rt.get("neuron_runtime_tag")) or None
            if not wanted(pid, tag):
                continue
            index = rt.get("runtime_index")
            where = (f"runtime pid {pid}" if pid is not None else
                     f"runtime {index if _pid(index) is not None else '?'}")
            if _text(rt.get("error")):
                errors[where] = _text(rt["error"])
            report = rt.get("report")
            if isinstance(report, dict):
                out.extend(self._runtime(report, pid, where, errors, default_period_s))
        system = obj.get("system_data")
        if isinstance(system, dict):
            name, g = _group(system, "neuron_hw_counters", "hw_counters")
            if g is not None:
                out.extend(self._ecc(g, name, errors, default_period_s))
        line_devices = set(self.devices_used)
        self.devices_used |= before
        for d in sorted(line_devices):
            if topo.device_memory:
                out.append(Row(None, "neuron.device_mem_total", f"neuron:{d}", float(topo.device_memory), None, None))
        return out, errors

    # -- groups ---------------------------------------------------------------------------

    def _runtime(self, report: dict[str, Any], pid: int | None, where: str, errors: dict[str, str],
                 default_period_s: float) -> Iterable[Row]:
        topo = self.topology
        rows: list[Row] = []

        def period(g: dict[str, Any]) -> int:
            return _period_ns(g, default_period_s)

        def note_error(name: str | None, g: dict[str, Any]) -> None:
            if _text(g.get("error")):
                errors[f"{where} {name}"] = _text(g["error"])

        # which cores and device this runtime is on (its rows that are not one core's go there)
        _, nc = _group(report, "neuroncore_counters", "nc_counters")
        _, mem = _group(report, "memory_used")
        cores = {n for n, _ in _core_keys((nc or {}).get("neuroncores_in_use") or (nc or {}).get("neuron_cores"))}
        used = (mem or {}).get("neuron_runtime_used_bytes")
        breakdown = used.get("usage_breakdown") if isinstance(used, dict) else None
        per_core_mem = breakdown.get("neuroncore_memory_usage") if isinstance(breakdown, dict) else None
        cores |= {n for n, _ in _core_keys(per_core_mem)}
        self.cores_seen |= cores
        dev: int | None
        if cores:
            dev = topo.device_of(min(cores))
            if pid is not None:
                self.runtime_device[pid] = dev
        else:
            dev = self.runtime_device.get(pid) if pid is not None else None
        self.devices_used |= {topo.device_of(c) for c in cores}
        rt_entity = f"neuron:{dev if dev is not None else '-'}/pid:{pid if pid is not None else '-'}"

        def add(dur: int | None, metric: str, entity: str, value: Any, core: int | None = None) -> None:
            v = _num(value)
            if v is not None:
                rows.append(Row(dur, metric, entity, v, pid, core))

        name, g = _group(report, "neuroncore_counters", "nc_counters")
        if g is not None:
            note_error(name, g)
            dur = period(g)
            per_core: Any = g.get("neuroncores_in_use")
            if not isinstance(per_core, dict):
                per_core = g.get("neuron_cores") if isinstance(g.get("neuron_cores"), dict) else {}
            for core, key in _core_keys(per_core):
                c = per_core[key]
                if not isinstance(c, dict):
                    continue
                ent = topo.core_entity(core)
                add(dur, "neuron.core_util", ent, c.get("neuroncore_utilization"), core)
                add(dur, "neuron.flops_rate", ent, _first(c, "flops", "effective_flops"), core)
                for sub in c.values():      # Trn2: {"v3d": {"nc_v3.N": {...}}}
                    if not isinstance(sub, dict):
                        continue
                    for phys, pc in sub.items():
                        num = str(phys).rpartition(".")[2]
                        if isinstance(pc, dict) and core_number(num) is not None:
                            add(dur, "neuron.phys_core_util", f"{ent}/phys:{num}",
                                pc.get("neuroncore_utilization"), core)

        name, g = _group(report, "memory_used")
        if g is not None:
            note_error(name, g)
            total = _first(g, "neuron_runtime_used_bytes", "runtime_memory")
            if isinstance(total, dict) and isinstance(total.get("current"), dict):
                total = total["current"]     # the beta guide's text nests the figures in "current"
            if isinstance(total, dict):
                host_ent = rt_entity
                add(None, "neuron.host_mem_used", host_ent, total.get("host"))
                bd: Any = total.get("usage_breakdown") if isinstance(total.get("usage_breakdown"), dict) else {}
                host: Any = bd.get("host") if isinstance(bd.get("host"), dict) else {}
                for p in HOST_MEM_PARTS:
                    add(None, f"neuron.host_mem_{p}", host_ent, host.get(p))
                ncm = bd.get("neuroncore_memory_usage")
                if isinstance(ncm, dict) and _core_keys(ncm):
                    for core, key in _core_keys(ncm):
                        parts = ncm[key]
                        if not isinstance(parts, dict):
                            continue
                        ent = topo.core_entity(core)
                        known = [v for v in (_num(parts.get(p)) for p in DEVICE_MEM_PARTS) if v is not None]
                        for p in DEVICE_MEM_PARTS:
                            add(None, f"neuron.device_mem_{p}", ent, parts.get(p), core)
                        if known:
                            add(None, "neuron.device_mem_used", ent, sum(known), core)
                elif dev is not None:      # no per-core breakdown: the runtime's total, on its device
                    add(None, "neuron.device_mem_used", f"neuron:{dev}", _first(total, "neuron_device", "device"))

        name, g = _group(report, "neuron_runtime_vcpu_usage", "runtime_cpu_usage")
        if g is not None:
            note_error(name, g)
            usage = _first(g, "vcpu_usage", "cpu_usage")
            if isinstance(usage, dict):
                add(period(g), "neuron.runtime_vcpu_user", rt_entity, usage.get("user"))
                add(period(g), "neuron.runtime_vcpu_system", rt_entity, usage.get("system"))

        name, g = _group(report, "execution_stats", "inference_stats")
        if g is not None:
            note_error(name, g)
            dur = period(g)
            errs: Any = g.get("error_summary") if isinstance(g.get("error_summary"), dict) else {}
            for k in ERROR_KINDS:
                add(dur, f"neuron.exec_errors_{k}", rt_entity,
                    errs.get(k) if k in errs else errs.get("numeric") if k == "numerical" else None)
            summ = _first(g, "execution_summary", "inference_summary")
            if isinstance(summ, dict):
                add(dur, "neuron.exec_completed", rt_entity, summ.get("completed"))
                for o in OUTCOMES:
                    add(dur, f"neuron.exec_{o}", rt_entity, summ.get(o))
            lat: Any = g.get("latency_stats") if isinstance(g.get("latency_stats"), dict) else {}
            for key, prefix in (("total_latency", "neuron.latency"), ("device_latency", "neuron.device_latency")):
                pcts = lat.get(key)
                if isinstance(pcts, dict):      # null when no model ran in the period
                    add(None, f"{prefix}_p50", rt_entity, pcts.get("p50"))
                    add(None, f"{prefix}_p99", rt_entity, pcts.get("p99"))

        name, g = _group(report, "hw_counters")     # older releases: ECC in each runtime's report
        if g is not None:
            rows.extend(self._ecc(g, f"{where} {name}", errors, default_period_s, force=True))
        return rows

    def _ecc(self, g: dict[str, Any], name: str | None, errors: dict[str, str], default_period_s: float,
             force: bool = False) -> list[Row]:
        """ECC events per device, for the devices the workload uses (force: a runtime's own)."""
        if _text(g.get("error")):
            errors[name or "neuron_hw_counters"] = _text(g["error"])
        dur = _period_ns(g, default_period_s)
        rows = []
        devices: Any = g.get("neuron_devices") if isinstance(g.get("neuron_devices"), list) else []
        for d in devices:
            if not isinstance(d, dict):
                continue
            idx = _first(d, "neuron_device_index", "device_index")
            if _pid(idx) is None or idx > MAX_DEVICE or (not force and idx not in self.devices_used):
                continue
            if force:
                self.devices_used.add(idx)
            for k in ECC:
                v = _num(d.get(k))
                if v is not None:
                    rows.append(Row(dur, f"neuron.ecc_{k.replace('_ecc', '')}", f"neuron:{idx}", v, None, None))
        return rows
