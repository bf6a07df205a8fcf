"""The live window as OpenMetrics on /metrics, for Prometheus and Grafana
(`counterprof run --serve 127.0.0.1:9464`, `counterprof top --serve ...`).

The exposition is the official prometheus-client's (the `prometheus` extra), which also
negotiates the format: OpenMetrics for a scraper that asks for it (Prometheus does), else the
classic text format; the HTTP server is counterprof's own (serve_http.py: one thread, a read
timeout and a cap on open connections). Per scrape:
- one family per catalog metric, with `rank`, `entity` and `host` labels: a delta metric is a
  counter of its total since the profiler started (Prometheus takes rate() of it), a gauge or
  ratio its newest value. Names are `counterprof_<metric>` in base units, as Prometheus names
  them: `task-clock` (ns) is `counterprof_task_clock_seconds_total`, a percent a `_ratio`
  (0..1), MHz `_hertz`; bitmasks (throttle reasons) are left out, a number of them means nothing.
- `counterprof_verdict_info{verdict, evidence}`: the live line's bottleneck now, and
  `counterprof_time_share_ratio{class}` its classes' shares of the time, both from the same
  function the live view draws (live/frame.py: live_figures);
- `counterprof_run_info{command, run}`.

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

# catalog unit -> (factor to the base unit, name suffix); units not here keep a sanitized suffix
UNITS = {
    "ns": (1e-9, "seconds"), "us": (1e-6, "seconds"), "ms": (1e-3, "seconds"), "s": (1.0, "seconds"),
    "bytes": (1.0, "bytes"), "B": (1.0, "bytes"), "bytes/s": (1.0, "bytes_per_second"),
    "percent": (0.01, "ratio"), "ratio": (1.0, "ratio"),
    "J": (1.0, "joules"), "mJ": (1e-3, "joules"), "W": (1.0, "watts"), "mW": (1e-3, "watts"),
    "MHz": (1e6, "hertz"), "celsius": (1.0, "celsius"), "count": (1.0, ""), "": (1.0, ""),
}
SKIPPED_UNITS = ("bitmask",)
LABELS = ("rank", "entity", "host")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464        # the README's examples' port (OpenTelemetry's Prometheus exporter uses it too)


def metric_name(metric: str, unit: str) -> tuple[str, float]:
    """The family name (without _total) and the factor to base units."""
    factor, suffix = UNITS.get(unit, (1.0, re.sub(r"[^a-zA-Z0-9]+", "_", unit).strip("_").lower()))
    base = "counterprof_" + re.sub(r"[^a-zA-Z0-9_]+", "_", metric).strip("_").lower()
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    return base, factor


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
    """Threads and CPUs summed, as the live view shows them (labels must not grow per thread)."""
    for prefix in ("tid:", "cpu:"):
        if entity.startswith(prefix):
            return prefix + "*"
    return entity


class LiveCollector:
    """A prometheus_client collector over a session's totals and live window."""

    def __init__(self, totals: Totals, window: LiveWindow | None, host: str | None = None):
        self.totals, self.window = totals, window
        self.host = host or socket.gethostname()
        self.catalog: Callable[[], Mapping[str, Any]] = dict
        self.statuses: Callable[[], Mapping[str, Any]] = dict
        self.run_info: dict[str, str] = {}
        self.figure_options: dict[str, Any] = {}

    def describe(self) -> list[Metric]:
        return []           # families depend on the catalog, known only at scrape time

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            InfoMetricFamily)
        catalog = self.catalog()
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        merged: dict[tuple[str, int, str], tuple[float, str]] = {}      # -> (value, source)
        for (rank, source, metric, entity), (total, last, _t) in self.totals.rows().items():
            kind, unit = _kind_unit(catalog.get(metric, {}))
            if unit in SKIPPED_UNITS:
                continue
            if kind == "delta":
                key = (metric, rank, _entity(entity))
                acc, first_source = merged.get(key, (0.0, source))
                merged[key] = (acc + total, first_source)
            else:
                key = (metric, rank, entity)
                merged[key] = (last, source)
        for (metric, rank, entity), (value, source) in sorted(merged.items()):
            kind, unit = _kind_unit(catalog.get(metric, {}))
            name, factor = metric_name(metric, unit)
            fam = families.get(name)
            if fam is None:
                entry = catalog.get(metric)
                desc = (entry.get("description", "") if isinstance(entry, Mapping)
                        else getattr(entry, "description", ""))
                doc = f"{metric} ({source} collector, {kind}, {unit or 'count'}): {desc}".rstrip(": ")
                cls: type[CounterMetricFamily | GaugeMetricFamily] = (
                    CounterMetricFamily if kind == "delta" else GaugeMetricFamily)
                fam = families[name] = cls(name, doc, labels=LABELS)
            fam.add_metric([str(rank), entity, self.host], value * factor)
        yield from families.values()

        info = InfoMetricFamily("counterprof_run", "what this counterprof is profiling",
                                labels=("host",))
        info.add_metric([self.host], {k: str(v) for k, v in self.run_info.items()})
        yield info
        verdict = self._verdict()
        if verdict is not None:
            v = InfoMetricFamily("counterprof_verdict", "the live view's bottleneck verdict now "
                                 "(live/verdict.py)", labels=("host",))
            v.add_metric([self.host], {"verdict": verdict.label, "evidence": verdict.evidence})
            yield v
            shares = getattr(verdict, "shares", None) or {}
            s = GaugeMetricFamily("counterprof_time_share_ratio", "share of the recent time per "
                                  "bottleneck class (the live verdict's classifier)",
                                  labels=("class", "host"))
            for cls_name, share in sorted(shares.items()):
                s.add_metric([cls_name, self.host], float(share))
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
