"""The live view's device panels: one per GPU (entity gpu:N), per Neuron device (its cores
and runtimes inside) or per (source, entity) of any other collector; one row per metric, a
limit or total shown beside its metric ("of 700 W")."""
from __future__ import annotations

from collections.abc import Iterable

from .buckets import Key, current_value, gauge_last, history_value, kind_of
from .figures import Figure, PanelContext, PanelFigures

# rows ordered by how the name (without its gpu./gpm. prefix) starts
_ORDER = ("util", "core_util", "flops", "flop_count", "nc_time",   # (NeuronCores: neuron.*)
          "sm", "occupancy", "tensor", "fp", "dram", "mem", "device_mem", "host_mem", "power", "energy",
          "temp", "clock", "throttle", "pcie", "nvlink",
          # a Neuron runtime's executions and CPU
          "exec", "latency", "device_latency", "runtime_vcpu")
_ALERT_WORDS = ("throttle", "clock_event", "clocks_event", "xid", "ecc", "exec_errors", "exec_timed_out",
                "exec_failed_to_queue", "exec_completed_with", "exec_incorrect_input")
# a Neuron device's panel: the figures per core and runtime; the memory breakdowns and Trn2's
# physical cores stay in the run, and error counts show when there are some
_NEURON_DETAIL = ("neuron.device_mem_", "neuron.host_mem_", "neuron.sysfs_device_mem_used")
_NEURON_USED = ("neuron.device_mem_used", "neuron.host_mem_used", "neuron.device_mem_total")


def _hidden(metric: str, entity: str, value: float | None) -> bool:
    if not metric.startswith("neuron."):
        return False
    if "/phys:" in entity or (metric.startswith(_NEURON_DETAIL) and metric not in _NEURON_USED):
        return True
    return any(w in metric for w in _ALERT_WORDS) and not value


def _order(metric: str) -> tuple[int, str]:
    short = _short_name(metric).lower()
    for i, w in enumerate(_ORDER):
        if short.startswith(w):
            return i, short
    return len(_ORDER), short


def _short_name(metric: str) -> str:
    for prefix in ("gpu.", "gpm.", "nvml.", "neuron."):
        if metric.startswith(prefix):
            return metric[len(prefix):]
    return metric


def device_panels(c: PanelContext, exclude: Iterable[str] = ("perf", "host", "threads")) -> list[PanelFigures]:
    groups: dict[str, list[Key]] = {}
    skip = set(exclude)
    for key in c.snap.series:
        source, metric, entity = key
        if source in skip:
            continue
        groups.setdefault(_panel_title(source, entity), []).append(key)
    panels = []
    for title in sorted(groups, key=device_sort):
        keys = sorted(groups[title], key=lambda k: (_order(k[1]), _entity_sort(k[2])))
        metrics = {k[1] for k in keys}
        panel = PanelFigures(title)
        shown_beside = {_companion(m) for m in metrics} & metrics
        for key in keys:
            source, metric, entity = key
            if metric in shown_beside:
                continue                        # a limit or total: "of N" beside its metric
            b = c.snap.get(key)
            kind, unit = kind_of(c.catalog, metric, b.fine)
            value, ukey = current_value(kind, unit, c.now(b))
            if _hidden(metric, entity, value):
                continue
            # a part of the device (neuron:0/core:1): its rows carry the part's name
            part = entity[len(title) + 1:] if entity.startswith(title + "/") else ""
            label = _part_label(part, metric) if part else _short_name(metric)
            fig = Figure(f"{entity if part else title}.{metric}", label, label, value, ukey,
                         [history_value(kind, unit, x) for x in c.bins(b)],
                         scale=100.0 if ukey == "percent" else None)
            limit_key = (source, _companion(metric), entity)
            if limit_key not in c.snap.series:       # a core's memory, of its device's size
                limit_key = (source, _companion(metric), title)
            if limit_key in c.snap.series:
                lim = gauge_last(c.now(c.snap.get(limit_key)))
                if lim:
                    fig.detail_parts = ("of ", (lim, unit))
                    fig.scale = lim
            if any(w in metric.lower() for w in _ALERT_WORDS) and value:
                fig.alert = True
            panel.figures.append(fig)
        for f in panel.figures[:2]:
            f.headline = True
        panels.append(panel)
    return panels


def _companion(metric: str) -> str:
    """The metric shown as "of N" beside this one: power -> power_limit, mem_used -> mem_total."""
    if metric.endswith("_used"):
        return metric[: -len("_used")] + "_total"
    return metric + "_limit"


# a Neuron device's rows in the panel's narrow label column: the part (nc1 = NeuronCore 1,
# p123 = the workload's runtime in process 123) and a short name
_NEURON_LABELS = {"core_util": "util", "flops_rate": "FLOP/s", "device_mem_used": "mem",
                  "flop_count": "FLOPs", "nc_time_in_use": "busy", "host_mem_used": "host mem",
                  "runtime_vcpu_user": "vCPU user", "runtime_vcpu_system": "vCPU sys",
                  "exec_completed": "execs", "latency_p50": "lat p50", "latency_p99": "lat p99",
                  "device_latency_p50": "dev p50", "device_latency_p99": "dev p99"}


def _part_label(part: str, metric: str) -> str:
    short = _short_name(metric)
    if part.startswith("core:"):
        return f"nc{part[5:]} {_NEURON_LABELS.get(short, short)}"
    if part.startswith("pid:"):
        return f"p{part[4:]} {_NEURON_LABELS.get(short, short)}"
    return f"{part} {short}"


def _panel_title(source: str, entity: str) -> str:
    """A GPU's panel is its entity; a Neuron device's holds its cores and runtimes
    (neuron:0/core:1 -> neuron:0); other collectors' entities are named with the source."""
    if entity.startswith("gpu"):
        return entity
    if entity.startswith("neuron:"):
        return entity.split("/", 1)[0]
    return f"{source} {entity}"


def _entity_sort(entity: str) -> list[tuple[int, int, str]]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p)
            for p in entity.replace(":", "/").split("/")]


def device_sort(title: str) -> tuple[int, int, str]:
    if title.startswith("gpu:") and title[4:].isdigit():
        return (0, int(title[4:]), title)
    if title.startswith("neuron:") and title[7:].isdigit():
        return (1, int(title[7:]), title)
    return (2, 0, title)


