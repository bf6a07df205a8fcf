"""The live window as OpenMetrics on /metrics, for Prometheus and Grafana
(`counterprof run --serve 127.0.0.1:9464`, `counterprof top --serve ...`).

The exposition is the official prometheus-client's (the `prometheus` extra), which also
negotiates the format: OpenMetrics for a scraper that asks for it (Prometheus does), else the
classic text format; the HTTP server is counterprof's own (serve_http.py: one thread, a read
timeout and a cap on open connections). Per scrape:
- one family per catalog metric: a delta metric is a counter of its total since the profiler
  started (Prometheus takes rate() of it), a gauge or ratio its newest value. Names are
  `counterprof_<metric>_<unit>` in base units with an OpenMetrics `# UNIT` (metric_name):
  `task-clock` (ns) is `counterprof_task_clock_seconds_total`, a percent a `_ratio` (0..1),
  MHz `_hertz`; what counts things has no unit; bitmasks (throttle reasons) are left out.
- labels, every one from a bounded set (no pid, tid, CPU number or figure in a label): `rank`
  and `Hostname` on every series; a GPU's series are named as DCGM-exporter names them (`gpu`:
  NVML's index, `UUID`, `pci_bus_id`, and `nvlink` for one link), so a PromQL join with DCGM's
  series on (Hostname, gpu, UUID) works; others have `entity` (process, system, the threads and
  CPUs summed as tid:* and cpu:*, a NeuronCore...). `counterprof_gpu_info` gives each GPU's
  model_name and CUDA ordinal (DCGM's camelCase `modelName` is a lint problem to promtool).
- `counterprof_verdict_info{verdict, Hostname}`: the live line's bottleneck now, the verdict
  alone (host-bound, compute-bound, ..., a fixed set), and `counterprof_time_share_ratio{class}`
  its classes' shares of the time as gauges (0..1), both from the same function the live view
  draws (live/frame.py: live_figures);
- `counterprof_run_info{command, run}`: what this target profiles (join it on `instance`).

Why a sink of its own rather than the live window alone: the window keeps one minute and mixes
ranks; counters need totals since the start, per rank. The verdict still comes from a window.
Loopback by default: the endpoint says what runs and how fast; binding another address is the
user's explicit choice (documented, and said on stderr).
"""
from __future__ import annotations

import re
import socket
import threading
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa

if TYPE_CHECKING:   # prometheus_client and the live window load when a server starts
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.metrics_core import Metric

    from .live.figures import LiveVerdict
    from .live.window import LiveWindow
    from .serve_http import MetricsServer
    from .session import Session

# catalog unit -> (factor to the base unit, OpenMetrics unit: the name's last words)
UNITS = {
    "ns": (1e-9, "seconds"), "us": (1e-6, "seconds"), "ms": (1e-3, "seconds"), "s": (1.0, "seconds"),
    "bytes": (1.0, "bytes"), "B": (1.0, "bytes"), "bytes/s": (1.0, "bytes_per_second"),
    "percent": (0.01, "ratio"), "ratio": (1.0, "ratio"),
    "J": (1.0, "joules"), "Joules": (1.0, "joules"), "mJ": (1e-3, "joules"),
    "W": (1.0, "watts"), "mW": (1e-3, "watts"),
    "MHz": (1e6, "hertz"), "celsius": (1.0, "celsius"), "FLOP/s": (1.0, "flops_per_second"),
}
# units that count things: no unit in the name; a name ending in `_count` ends in what is
# counted instead (thread.intraop.count -> counterprof_thread_intraop_threads)
COUNTED = {"count": "", "": "", "threads": "threads", "processes": "processes", "FLOP": "flops"}
# a gauge over several entities merged into one series (the processes of a Neuron device):
# these units add up, others are averaged
ADDITIVE = {"bytes", "B", "count", "", "threads", "processes", "W", "mW"}
SKIPPED_UNITS = ("bitmask",)
# the classifier's classes (analysis.classify): each always served, 0 when it has no share
SHARE_CLASSES = ("compute", "memory", "compute|memory", "collectives", "host")
HOST_LABEL = "Hostname"                       # as DCGM-exporter names it
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464        # the README's examples' port (OpenTelemetry's Prometheus exporter uses it too)

_GPU_ENTITY = re.compile(r"gpu:(\d+)(?:/nvlink:(\d+))?")
_NUMBERED = re.compile(r"(tid|cpu|pid):\d+")


def _words(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "_", text).strip("_").lower()


def metric_name(metric: str, unit: str) -> tuple[str, float, str]:
    """(the family name without _total, the factor to base units, the OpenMetrics unit or "")."""
    base = "counterprof_" + _words(metric)
    if unit in COUNTED:
        noun = COUNTED[unit]
        if noun and base.endswith("_count"):
            base = base[:-len("_count")]
            singular = "_" + noun[:-1]
            if base.endswith(singular):                  # neuron.flop_count -> ..._neuron_flops
                base = base[:-len(singular)]
            base += "_" + noun
        return base, 1.0, ""
    factor, om_unit = UNITS.get(unit, (1.0, _words(unit)))
    if om_unit.endswith("_per_second") and base.endswith("_rate"):
        base = base[:-len("_rate")]                      # gpm.pcie_tx_rate -> ..._pcie_tx_bytes_per_second
        thing = om_unit[:-len("_per_second")]
        if base.endswith("_" + thing):                   # neuron.flops_rate -> ..._flops_per_second
            base = base[:-len("_" + thing)]
    if om_unit and not base.endswith("_" + om_unit):
        base += "_" + om_unit
    return base, factor, om_unit if unit in UNITS else ""


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or a bare PORT (on loopback). Raises ValueError with what to give."""
    text = text.strip()
    if text.isdigit():
        host, port = DEFAULT_HOST, text
    elif text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"{text!r}: give [IPv6]:PORT, e.g. [::1]:{DEFAULT_PORT}")
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r}: give HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}, or a PORT")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535")
    return host, int(port)


def is_loopback(host: str) -> bool:
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Totals:
    """A session sink: per (rank, source, metric, entity), the sum of every known value and the
    newest value with its time. Thread-safe (collectors' threads write)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[int, str, str, str], list[float]] = {}   # key -> [sum, last, last_time]

    def write(self, table: str, batch: pa.RecordBatch, rank: int = 0) -> None:
        if table != "samples" or batch.num_rows == 0:
            return
        # dictionary columns are grouped as they come (a cast to strings costs more)
        t = pa.table({"source": batch.column("source"), "metric": batch.column("metric"),
                      "entity": batch.column("entity"),
                      "value": batch.column("value").cast(pa.float64()),
                      "time": batch.column("time").cast(pa.int64())})
        t = t.filter(t.column("value").is_valid())
        if t.num_rows == 0:
            return
        agg = t.group_by(["source", "metric", "entity"], use_threads=False).aggregate(
            [("value", "sum"), ("value", "last"), ("time", "max")]).to_pylist()
        with self._lock:
            for r in agg:
                key = (rank, r["source"], r["metric"], r["entity"])
                cur = self._rows.get(key)
                if cur is None:
                    self._rows[key] = [r["value_sum"], r["value_last"], r["time_max"]]
                else:
                    cur[0] += r["value_sum"]
                    if r["time_max"] >= cur[2]:
                        cur[1], cur[2] = r["value_last"], r["time_max"]

    def rows(self) -> dict[tuple[int, str, str, str], tuple[float, float, float]]:
        """key -> (sum, last, last_time)."""
        with self._lock:
            return {k: (v[0], v[1], v[2]) for k, v in self._rows.items()}

    def close(self) -> None:
        pass


def _kind_unit(entry: Any) -> tuple[str, str]:
    if isinstance(entry, Mapping):
        return entry.get("kind", "gauge"), entry.get("unit", "")
    return getattr(entry, "kind", "gauge"), getattr(entry, "unit", "")


def _entity(entity: str) -> str:
    """Threads, CPUs and processes summed, as the live view shows them (labels must not grow per
    thread or pid): tid:123 -> tid:*, neuron:0/pid:77 -> neuron:0/pid:*."""
    return _NUMBERED.sub(lambda m: m.group(1) + ":*", entity)


def _description(entry: Any) -> str:
    if isinstance(entry, Mapping):
        return str(entry.get("description", ""))
    return str(getattr(entry, "description", ""))


class LiveCollector:
    """A prometheus_client collector over a session's totals and live window."""

    def __init__(self, totals: Totals, window: LiveWindow | None, host: str | None = None):
        self.totals, self.window = totals, window
        self.host = host or socket.gethostname()
        self.catalog: Callable[[], Mapping[str, Any]] = dict
        self.statuses: Callable[[], Mapping[str, Any]] = dict
        self.gpus: Callable[[], list[Mapping[str, Any]]] = list     # meta.json's "gpus"
        self.run_info: dict[str, str] = {}
        self.figure_options: dict[str, Any] = {}

    def describe(self) -> list[Metric]:
        return []           # families depend on the catalog, known only at scrape time

    def labels(self, rank: int, entity: str, gpus: Mapping[int, Mapping[str, Any]]) -> dict[str, str]:
        """A series' labels: a GPU's as DCGM-exporter's (gpu is NVML's index, which DCGM's
        is too; the CUDA ordinal in gpu:N is the workload's view, in counterprof_gpu_info), else
        `entity`. No modelName here: the model is counterprof_gpu_info's model_name (a camelCase
        label name is a lint problem to promtool; a join takes DCGM's with group_left)."""
        m = _GPU_ENTITY.fullmatch(entity)
        if m is None:
            return {"rank": str(rank), "entity": entity, HOST_LABEL: self.host}
        facts = gpus.get(int(m.group(1)), {})
        index = facts.get("nvml_index")
        out = {"rank": str(rank), "gpu": str(index if index is not None else m.group(1)),
               "UUID": str(facts.get("uuid") or ""), "pci_bus_id": str(facts.get("pci_bus_id") or "")}
        if m.group(2) is not None:
            out["nvlink"] = m.group(2)
        out[HOST_LABEL] = self.host
        return out

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            InfoMetricFamily)
        catalog = self.catalog()
        gpus: dict[int, Mapping[str, Any]] = {}
        for g in self.gpus() or ():
            if isinstance(g, Mapping) and isinstance(g.get("index"), int):
                gpus[g["index"]] = g
        # (metric, rank, entity) -> [value, how many merged, source]
        merged: dict[tuple[str, int, str], list[Any]] = {}
        for (rank, source, metric, entity), (total, last, _t) in self.totals.rows().items():
            kind, unit = _kind_unit(catalog.get(metric, {}))
            if unit in SKIPPED_UNITS:
                continue
            acc = merged.setdefault((metric, rank, _entity(entity)), [0.0, 0, source])
            acc[0] += total if kind == "delta" else last
            acc[1] += 1
        # family name -> (class, help, unit, {label values: value})
        families: dict[str, tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str,
                                  dict[tuple[tuple[str, str], ...], float]]] = {}
        for (metric, rank, entity), (value, n, source) in sorted(merged.items()):
            kind, unit = _kind_unit(catalog.get(metric, {}))
            if kind != "delta" and n > 1 and unit not in ADDITIVE:
                value /= n
            name, factor, om_unit = metric_name(metric, unit)
            cls: type[CounterMetricFamily | GaugeMetricFamily] = (
                CounterMetricFamily if kind == "delta" else GaugeMetricFamily)
            fam = families.get(name)
            if fam is None:
                scale = " as a ratio 0-1 (the run's percent / 100)" if unit == "percent" else ""
                doc = (f"{metric} ({source} collector, {kind}, {unit or 'count'}{scale}): "
                       f"{_description(catalog.get(metric))}").rstrip(": ")
                fam = families[name] = (cls, doc, om_unit, {})
            elif fam[0] is not cls:
                continue          # two catalog names that sanitize alike: the first one keeps it
            key = tuple(self.labels(rank, entity, gpus).items())
            fam[3].setdefault(key, value * factor)      # a duplicate series would fail the scrape
        for name, (cls, doc, om_unit, series) in families.items():
            names: list[str] = []
            for key in series:
                names.extend(k for k, _ in key if k not in names)
            family = cls(name, doc, labels=names, unit=om_unit)
            for key, value in series.items():
                values = dict(key)
                family.add_metric([values.get(k, "") for k in names], value)
            yield family

        if gpus:
            gi = InfoMetricFamily("counterprof_gpu", "the GPUs sampled: gpu (NVML's index, as "
                                  "DCGM-exporter's), UUID and pci_bus_id as on every GPU series; "
                                  "cuda_device: the workload's CUDA ordinal",
                                  labels=("gpu", "UUID", "pci_bus_id", HOST_LABEL))
            for ordinal, facts in sorted(gpus.items()):
                labels = self.labels(0, f"gpu:{ordinal}", gpus)
                gi.add_metric([labels["gpu"], labels["UUID"], labels["pci_bus_id"], self.host],
                              {"model_name": str(facts.get("name") or ""),
                               "cuda_device": str(ordinal)})
            yield gi

        info = InfoMetricFamily("counterprof_run", "what this counterprof is profiling (one series "
                                "per target: join it on instance)")
        info.add_metric([], {k: str(v) for k, v in self.run_info.items()})
        yield info
        verdict = self._verdict()
        if verdict is not None:
            v = InfoMetricFamily("counterprof_verdict", "the live view's bottleneck verdict now, "
                                 "from a fixed set: compute-bound, memory-bound, collectives-bound, "
                                 "host-bound, unknown; top's machine view: CPU-bound, GPU busy, busy, "
                                 "idle, waiting for I/O (live/verdict.py)", labels=(HOST_LABEL,))
            v.add_metric([self.host], {"verdict": verdict.name})
            yield v
            shares = getattr(verdict, "shares", None) or {}
            if shares:
                s = GaugeMetricFamily("counterprof_time_share_ratio", "share of the recent time "
                                      "per bottleneck class, 0-1 (the live verdict's classifier)",
                                      labels=("class", HOST_LABEL), unit="ratio")
                for cls_name in sorted(set(SHARE_CLASSES) | set(shares)):
                    s.add_metric([cls_name, self.host], float(shares.get(cls_name, 0.0)))
                yield s

    def _verdict(self) -> LiveVerdict | None:
        if self.window is None:
            return None
        from .live.frame import live_figures
        try:
            figs = live_figures(self.window.snapshot(), self.catalog(), self.statuses(), 1,
                                **self.figure_options)
        except Exception:        # a scrape must never take the profiler down
            return None
        return figs.verdict


class Exporter:
    """A session sink that serves /metrics while the session runs; close() stops serving.
    Binds at construction, so a port in use is an error before anything starts."""

    fresh_rows = True          # a scrape wants the last seconds

    def __init__(self, host: str, port: int, window: LiveWindow | None = None):
        from prometheus_client import CollectorRegistry
        from .live.window import LiveWindow
        from .serve_http import MetricsServer
        self.totals = Totals()
        self.own_window = window is None         # else the session already writes to it
        self.window = LiveWindow() if window is None else window
        self.collector = LiveCollector(self.totals, self.window)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        # one thread, idle connections closed after a timeout, a cap on open ones (serve_http.py)
        server = MetricsServer(host, port, self.registry)
        self.server: MetricsServer | None = server
        self.host = host
        self.port = server.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def attach(self, session: Session, **figure_options: Any) -> None:
        """Read the session's catalog and collector statuses live; figure_options go to
        live_figures (scope, cpus, perf_system_wide)."""
        from .ground.redact import command_line
        self.collector.catalog = lambda: dict(session.metrics)
        self.collector.statuses = lambda: dict(session.statuses)
        self.collector.gpus = lambda: list(session.meta.get("gpus") or [])
        self.collector.figure_options = figure_options
        self.collector.run_info = {"command": command_line(session.command) or "(none)",
                                   "run": str(session.path)}

    def write(self, table: str, batch: pa.RecordBatch, rank: int = 0) -> None:
        self.totals.write(table, batch, rank)
        if self.own_window:
            self.window.write(table, batch, rank)

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()
