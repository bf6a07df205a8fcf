"""meta.json and catalog.json as a session writes them (store/meta.py reads them back, typed).

A session's meta.json is written at its start, whenever a collector's status changes (a failure,
a rank's collector started or stopped), and at its stop; a reader finds a "running" run until the
last one says "complete". MetaDocument owns that document: the fields set over the run, the
collectors' statuses (its "collectors", shared live with the view and --serve), and the per-rank
entries of a multi-rank job ("ranks", "rank_switch"). Catalog owns catalog.json: the metrics the
collectors declared.

Both are written atomically (store/rundir.write_json), under the session's lock, to the path the
session gives: the run's own, or, for a process that joined another's run, its rank partition's.
"""
from __future__ import annotations

import os
import platform
import resource
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import __version__
from .collector import Collector, Target
from .ground.errors import perf_event_paranoid
from .ground.gitrev import git_revision
from .ground.schema import Metric
from .store import rundir

# meta.json records these environment variables and no others: command lines and
# environments can hold secrets.
ENV_ALLOWLIST = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTORCH_CUDA_ALLOC_CONF",
)

Status = dict[str, Any]      # one collector's entry: status, reason, config, and its details


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    for key in ("model name", "Model", "cpu model"):
        for line in info.splitlines():
            if line.startswith(key) and ":" in line:
                return line.split(":", 1)[1].strip()
    parts: dict[str, str] = {}
    for line in info.splitlines():   # Arm: no model name, only implementer/part ids
        if ":" in line:
            k, v = (x.strip() for x in line.split(":", 1))
            parts.setdefault(k, v)
    if "CPU implementer" in parts:
        return f"arm implementer {parts['CPU implementer']} part {parts.get('CPU part', '?')}"
    return platform.processor() or platform.machine()


def _cached_ceilings() -> dict[str, Any] | None:
    """This host's `counterprof calibrate` results, copied into the run (the roofline's roofs)."""
    from .calibrate import cached
    return cached() or None


def host_facts() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "perf_event_paranoid": perf_event_paranoid(),
        "python": platform.python_version(),
    }


def self_cpu() -> float:
    """This process's CPU time so far, user and system, in seconds."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class MetaDocument:
    """One session's meta.json: its fields, in the order they were first set (json keeps it),
    and the collectors' statuses under "collectors". `lock` is the session's: the document
    changes from collectors' and the rank watcher's threads."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self.fields: dict[str, Any] = {}
        # name -> {"status", "reason", "config", ...}; read live by the view and --serve
        self.statuses: dict[str, Status] = {}
        self._facts: dict[str, Any] | None = None

    # -- reading ---------------------------------------------------------------------------

    def __contains__(self, name: str) -> bool:
        return name in self.fields

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    # -- the document ----------------------------------------------------------------------

    def initial(self, *, run_id: str, command: list[str] | None, start_ns: int, clock_offset_ns: int,
                rank: int, job: str | None, target: Target) -> dict[str, Any]:
        """meta.json as a session starts: what ran where, when, by whom, and the statuses so far."""
        env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
        return {
            "id": run_id,
            "counterprof_version": __version__,
            "status": "running",
            "command": command,
            "argv": list(sys.argv),
            **self.machine_facts(),
            "gpus": [],
            "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(start_ns / 1e9)),
            "start_ns": start_ns,
            "clock_offset_ns": clock_offset_ns,
            "rank": rank,
            "job": job,
            "env": env,
            "target": {"kind": target.kind, "pid": target.pid, "system_wide": target.system_wide},
            "profiler": {"pid": os.getpid(), "host": self.machine_facts()["host"]["hostname"]},
            "collectors": self.statuses,
        }

    def machine_facts(self) -> dict[str, Any]:
        """cwd, git revision, host facts and cached ceilings: read once (the creator's first
        meta.json and start()'s both carry them; /proc/cpuinfo alone is ~200 KB on a big node)."""
        if self._facts is None:
            cwd = os.getcwd()
            self._facts = {"cwd": cwd, "git_revision": git_revision(cwd), "host": host_facts(),
                           "ceilings": _cached_ceilings()}
        return self._facts

    def begin(self, fields: dict[str, Any]) -> None:
        """Start over from these fields (initial()'s): what was set before is dropped."""
        with self.lock:
            self.fields = fields

    def set(self, **fields: Any) -> None:
        """Set fields (a new one goes last), written with the document next."""
        with self.lock:
            self.fields.update(fields)

    def write(self, path: Path) -> None:
        """Write the document as it stands, atomically: a reader never sees half a file."""
        with self.lock:
            rundir.write_json(path, self.fields)

    # -- collectors' statuses --------------------------------------------------------------

    def collector_unavailable(self, name: str, reason: str, config: dict[str, Any]) -> None:
        with self.lock:
            self.statuses[name] = {"status": "unavailable", "reason": reason, "config": config}

    def collector_starting(self, col: Collector) -> None:
        with self.lock:
            self.statuses[col.name] = {"status": "ok", "reason": "", "config": col.summary_config()}

    def collector_details(self, col: Collector) -> None:
        """What a collector found, e.g. which events were unsupported (a failed start)."""
        with self.lock:
            self.statuses[col.name].update(col.details)

    def collector_failed(self, name: str, reason: str, config: dict[str, Any]) -> None:
        with self.lock:
            entry = self.statuses.setdefault(name, {"config": config})
            entry.update(status="failed", reason=reason)

    def refresh(self, collectors: Iterable[Collector]) -> None:
        """The running collectors' statuses, details and run facts (e.g. the GPUs seen), as they
        stand now; a failure said before stays."""
        with self.lock:
            for col in collectors:
                entry = self.statuses.setdefault(col.name, {})
                if entry.get("status") != "failed" and col.status != "ok":
                    entry.update(status=col.status, reason=col.reason)
                entry.update(col.details)
                self.fields.update(col.run_facts)
            self.fields["collectors"] = self.statuses

    # -- a multi-rank job ------------------------------------------------------------------

    def rank_switch(self, facts: dict[str, Any], start_ns: int, rank: int) -> None:
        """Per-rank auto mode switched to counting each rank (ranks.py): when, and why."""
        with self.lock:
            self.fields["rank_switch"] = {
                **facts, "after_s": round((facts["at_ns"] - start_ns) / 1e9, 3),
                "note": f"before at_ns, rank={rank}/ holds the whole process tree's counts "
                        "of the collectors stopped; after it, each rank's own"}
            self.fields.setdefault("ranks", {})

    def rank_collector(self, rank: int, found: Mapping[str, Any] | None, col: Collector, status: str,
                       reason: str) -> None:
        """A per-rank collector's state: under "ranks" (with the rank's pid and where its rank
        was read, from `found`, the watcher's entry), and mirrored in "collectors" for the first
        rank (so "collectors" says what ran, and summaries find perf's events)."""
        with self.lock:
            ranks = self.fields.setdefault("ranks", {})
            entry = ranks.setdefault(str(rank), {"collectors": {}})
            if found is not None:
                entry["pid"] = found["pid"]
                entry["source"] = found["source"]     # environment or torch.distributed
                for key in ("world_size", "gpu"):     # gpu: the CUDA ordinal it drives
                    if found.get(key) is not None:
                        entry[key] = found[key]
            entry["collectors"][col.name] = {"status": status, "reason": reason, **col.details}
            top = self.statuses.setdefault(col.name, {"config": col.summary_config()})
            if status == "failed" or "per_rank" not in top:
                top.update(status=status, reason=reason, per_rank=True, **col.details)


def profiler_usage(meta: MetaDocument, collectors: Iterable[Collector], *, in_process: bool,
                   start_cpu: float) -> dict[str, Any]:
    """meta.json's "profiler" at the end: its pid and host, with the CPU and memory it used."""
    usage = dict(meta.get("profiler", {}))
    if in_process:
        # In-process: the process's CPU is the workload's; count our threads only.
        usage["cpu_s"] = round(sum(float(c.details.get("thread_cpu_s", 0.0)) for c in collectors), 6)
        usage["cpu_scope"] = "profiler threads"
    else:
        usage["cpu_s"] = round(self_cpu() - start_cpu, 6)
        usage["cpu_scope"] = "profiler process, after start-up"
    usage["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return usage


class Catalog:
    """One session's catalog.json: the metrics its collectors declared, by name (read live by
    the view and --serve), written when it changed since it was last."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self.metrics: dict[str, Metric] = {}
        self._written: list[dict[str, Any]] | None = None

    def add(self, metrics: Iterable[Metric]) -> bool:
        """Declare metrics (one of the same name is replaced); whether one was new or changed."""
        with self.lock:
            new = [m for m in metrics if self.metrics.get(m.name) != m]
            for m in new:
                self.metrics[m.name] = m
            return bool(new)

    def write(self, path: Path) -> None:
        with self.lock:
            entries = [m.to_json() for m in sorted(self.metrics.values(), key=lambda m: (m.source, m.name))]
            if entries == self._written:
                return        # on disk already (stop's, when no metric came after start's)
            rundir.write_json(path, entries)
            self._written = entries
