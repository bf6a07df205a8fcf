"""The session: starts and stops collectors, owns the clock, the sinks and meta.json.

collectors --batch--> Session.emit --fan-out--> sinks (the journal writer, then those given:
                                                       the live window, an exporter...)

A collector that fails, at start or mid-run, is marked failed in meta.json with
its reason; the other collectors and the workload carry on.
"""
from __future__ import annotations

import os
import platform
import resource
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pyarrow as pa

from . import __version__, regions
from .ground.clock import Clock
from .collector import Availability, Collector, SessionContext, Target, resolve, start_order, stop_order
from .ground.errors import CounterprofError, RunDirectoryError, os_error, perf_event_paranoid
from .ground.gitrev import git_revision
from .ground.proctree import rank_from_env
from .ground.schema import Metric
from .store import rundir, safepath
from .store.compact import BackgroundCompactor, CompactionReport, compact_rank
from .store.rundir import RESERVE
from .store.journal import JournalSet

# meta.json records these environment variables and no others: command lines and
# environments can hold secrets.
ENV_ALLOWLIST = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTORCH_CUDA_ALLOC_CONF",
)


def job_from_env(environ=os.environ) -> str | None:
    """Which job this process belongs to, so the processes of one multi-rank job share a run:
    COUNTERPROF_JOB if set (set it yourself, e.g. to the scheduler's job id, for a multi-node
    job on a shared filesystem), torchrun's TORCHELASTIC_RUN_ID, else, for a
    process with WORLD_SIZE > 1, its host and parent (torchrun's agent, one per node)."""
    if environ.get("COUNTERPROF_JOB"):
        return environ["COUNTERPROF_JOB"]
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"torchelastic:{run_id}"
    try:
        world = int(environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    if world > 1:
        return f"{socket.gethostname()}:{os.getppid()}"
    return None


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
    parts = {}
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


def _stderr_warning(message: str) -> None:
    print(f"counterprof: {message}", file=sys.stderr, flush=True)


def _warm_arrow() -> None:
    """pyarrow imports pandas (when installed) on its first array conversion in a process: ~0.3 s
    of CPU. Done here, before any counter is open and before the workload runs, it is in no
    figure; left to a collector's first flush it would land inside the user's `profile()` block
    or in a stop that counters still see."""
    import pyarrow as pa
    pa.array([0], pa.int64())


class Session:
    """One profiling session writing one rank of one run directory."""

    def __init__(self, path: str | os.PathLike | None = None, *,
                 collectors: list[str] | None = None,
                 config: dict[str, dict[str, Any]] | None = None,
                 target: Target = Target("self"),      # noqa: B008  a frozen dataclass, shared safely
                 command: list[str] | None = None,
                 rank: int | None = None,
                 replace: bool = False,
                 sinks: list[Any] | None = None,
                 per_rank: bool | str = False,
                 job: str | None = None,
                 on_warning: Callable[[str], None] = _stderr_warning):
        if path is not None and os.fspath(path) in ("", b""):
            # Path("") is the current directory: an unset variable (path=os.environ.get(...,""))
            # would write the run into it, as `-o ""` would (refused there by cli/arguments.py)
            from .ground.errors import UsageError
            raise UsageError('path "" was given (an empty string: an unset variable?): name the '
                             'run directory, "." for the current directory, or leave path unset '
                             "for a new timestamped one")
        self.path = Path(path) if path is not None else rundir.default_run_path()
        self.collector_names = collectors
        self.config = config or {}
        self.target = target
        self.command = command
        self.rank = rank_from_env() if rank is None else rank
        self.replace = replace
        self.on_warning = on_warning
        self.clock = Clock()
        self.writer_id = f"{os.getpid()}-{os.urandom(3).hex()}"   # secrets.token_hex, without its ~3 ms import
        self.collectors: list[Collector] = []
        self.statuses: dict[str, dict[str, Any]] = {}
        self.metrics: dict[str, Metric] = {}
        self.warnings: list[str] = []
        # sinks take write(table, batch, rank) and close(); the journal is always first
        self.extra_sinks: list[Any] = list(sinks or [])
        # a launched multi-rank job: attachable collectors run per rank (counterprof/ranks.py);
        # True: from the start; "auto": once ranks appear below the root (until then, the tree)
        self.per_rank = per_rank
        self.watcher = None
        self.job = job
        # entities a rank owns (its GPU): their samples go to that rank's partition
        self.entity_owner: dict[str, int] = {}
        self.joined = False     # another process of the job created the run: write our partition
        self.sinks: list[Any] = []
        self.launch_env: dict[str, str] = {}
        self.meta: dict[str, Any] = {}
        self.started = self.stopped = False
        # prepare()'s: the collectors resolved, those that will start, and where this rank writes
        self.prepared = False
        self.classes: dict[str, type[Collector] | Exception] = {}
        self.plan: list[Collector] = []
        self.rank_path: Path | None = None
        self.journals: JournalSet | None = None
        self.start_ns = self.end_ns = 0
        self.compaction: CompactionReport | None = None
        self.compactor: BackgroundCompactor | None = None   # rotated segments, as the run goes
        self._lock = threading.RLock()
        self._ctx: SessionContext | None = None
        self._start_cpu = 0.0
        self._facts: dict[str, Any] | None = None
        self._catalog_written: list[dict[str, Any]] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def prepare(self) -> None:
        """Everything that can fail on bad input, before any workload starts: resolve and
        validate collectors, check availability, create the run directory, and gather the
        environment a launched workload needs (e.g. a bootstrap for in-process collectors)."""
        self.classes = resolve(self.collector_names)
        self.plan = []
        for name, cls in self.classes.items():
            cfg = self.config.get(name, {})
            if isinstance(cls, Exception):
                self.statuses[name] = {"status": "unavailable", "reason": str(cls), "config": cfg}
                continue
            cls.validate(cfg)
            try:
                avail = cls.availability(cfg)
            except Exception as exc:   # availability must never take the run down
                avail = Availability(False, f"availability check failed: {exc}")
            if not avail.ok:
                self.statuses[name] = {"status": "unavailable", "reason": avail.reason, "config": cfg}
                if self.collector_names is not None:   # asked for by name: say so
                    self.warn(f"{name} collector unavailable: {avail.reason}")
                continue
            self.plan.append(cls(cfg))
        words = rundir.API_WORDS if self.target.kind == "self" else rundir.CLI_WORDS
        self.path, self.joined = rundir.claim(self.path, replace=self.replace, job=self.job,
                                              words=words, on_create=self._first_meta)
        self.rank_path = rundir.rank_dir(self.path, self.rank)
        if self.joined and (self.rank_path / rundir.META).exists():
            raise RunDirectoryError(f"rank {self.rank} of {self.path} is already written by another "
                                    "process (two processes with the same RANK?)")
        # counterprof.region() in a launched workload writes its spans into this run, on our clock
        self.launch_env.update({regions.ENV_RUN_DIR: str(self.path.resolve()),
                                regions.ENV_CLOCK_OFFSET: str(self.clock.offset_ns)})
        for col in self.plan:
            self.launch_env.update(col.launch_environment(self.path))
        self.prepared = True

    def _first_meta(self, path: Path) -> None:
        """The creator's meta.json, written while the run is still claimed: the job's other
        ranks, let in after it, find a run (start() rewrites it with the start time)."""
        self.path = path
        self.start_ns = self.clock.now_ns()
        rundir.write_json(path / rundir.META, self._initial_meta())

    def start(self, launched_pid: int | None = None) -> None:
        """Start the collectors. launched_pid: for a launch target, the workload's pid, known
        only once it is spawned (paused before exec) with prepare()'s launch_env."""
        if launched_pid is not None:
            if self.target.kind != "launch":
                raise ValueError(f"launched_pid given for a {self.target.kind!r} target")
            self.target = Target("launch", launched_pid, system_wide=self.target.system_wide)
        if not self.prepared:
            self.prepare()
        _warm_arrow()
        self._start_cpu = _self_cpu()
        self.start_ns = self.clock.now_ns()
        self.compactor = BackgroundCompactor()
        self.journals = JournalSet(self.path, self.writer_id, on_rotate=self.compactor.submit)
        self.sinks = [self.journals, *self.extra_sinks]
        self.meta = self._initial_meta()
        self._write_meta()
        self._reserve_space()

        if self.target.kind == "self":
            regions.recorder.attach(self.emit, self.clock.offset_ns)
        self._ctx = SessionContext(
            clock=self.clock, target=self.target, config=self.config, rank=self.rank,
            emit=self.emit, add_metrics=self.add_metrics, fail=self.fail, warn=self.warn,
            run_path=self.path, fresh_rows=self._fresh_rows())
        self._ctx.profiler_tids.add(self.compactor.native_id)
        plan = list(self.plan)
        per_rank_classes = []
        if self.per_rank and self.target.kind == "launch" and not self.target.system_wide:
            per_rank_classes = [type(c) for c in plan if c.per_rank]
            if self.per_rank != "auto":    # auto: the root counts the tree until ranks appear
                plan = [c for c in plan if not c.per_rank]
        plan = start_order(plan)
        for col in plan:
            self.statuses[col.name] = {"status": "ok", "reason": "", "config": col.summary_config()}
            reason = self._ctx.start_collector(col)
            if reason is not None:
                self.statuses[col.name].update(col.details)   # e.g. which events were unsupported
                self.fail(col.name, reason)
                continue
            self.collectors.append(col)
        if per_rank_classes:
            from .ranks import RankWatcher
            mode = "auto" if self.per_rank == "auto" else "on"
            self.meta["per_rank"] = "auto" if mode == "auto" else True
            if mode == "on":
                self.meta["ranks"] = {}
            self.watcher = RankWatcher(self, per_rank_classes, self.target.pid, mode=mode)
            self.watcher.start(self._ctx)
        self.started = True
        self._refresh_statuses()
        self._write_catalog()
        self._write_meta()

    def stop(self, workload: dict[str, Any] | None = None, compact: bool = True) -> None:
        """Stop collectors (counting ones first, so they see the end), close sinks,
        compact the journal into Parquet, write the final meta.json. Idempotent."""
        with self._lock:
            if self.stopped or not self.started:
                return
            self.stopped = True
        if self.watcher is not None:
            self.watcher.stop()
            if not self.watcher.ranks and self.watcher.mode == "on":
                counted = ", ".join(sorted(c.name for c in self.watcher.classes))
                self.warn("--per-rank: no process of the workload named a rank (COUNTERPROF_RANK, "
                          "RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID in the environment "
                          "it started with), nor announced one (under --torch, each process does "
                          f"once torch.distributed is initialised), so {counted} counted nothing; "
                          "set COUNTERPROF_RANK in each rank's environment, or run without --per-rank")
        for col in stop_order(self.collectors):
            try:
                col.stop()
            except Exception as exc:
                self.fail(col.name, f"stop failed: {type(exc).__name__}: {exc}")
        if self.target.kind == "self":
            regions.recorder.detach()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                if not (sink is self.journals and "journal_failed" in self.meta):  # said once
                    self.warn(f"closing {type(sink).__name__} failed: {exc}")
        # the segment in hand finished, the rest left to the compaction below
        background = self.compactor.stop() if self.compactor is not None else CompactionReport()
        self.end_ns = self.clock.now_ns()
        # the workload's exit first, into the space kept for it: a full disk costs samples, never
        # the exit status (a reader finds the run still "running" and recovers it)
        self._release_reserve()
        self.meta["workload"] = workload or self.meta.get("workload")
        self._write_meta_or_warn()
        complete = True
        if compact:
            # every partition: ours, and those the workload's processes wrote (regions, traces)
            self.compaction = background
            for _rank, rank_path in rundir.rank_dirs(self.path):
                try:
                    compact_rank(rank_path, self.compaction)
                except CounterprofError as exc:       # a full disk: the journal stays whole
                    self.warn(str(exc))
                    complete = False
            for problem in self.compaction.truncated:
                self.warn(f"journal damaged: {problem}")
            for problem in self.compaction.damaged:
                self.warn(f"journal damaged: {problem}")
        self._refresh_statuses()
        self.meta.update({
            "status": "complete" if complete else "running",
            "end_ns": self.end_ns,
            "duration_ns": self.end_ns - self.start_ns,
            "workload": workload or self.meta.get("workload"),
            "profiler": self._profiler_usage(),
            "warnings": self.warnings,
        })
        try:
            self._write_catalog()
        except OSError as exc:
            self.warn(str(os_error(exc, self.path, "writing catalog.json")))
        self._write_meta_or_warn()

    RESERVE = RESERVE             # space kept for the last meta.json (a full disk)
    RESERVE_BYTES = 256 * 1024

    def _reserve_space(self) -> None:
        try:
            fd = safepath.create_new(self._own(self.RESERVE))   # never fallocate through a link
            try:
                os.posix_fallocate(fd, 0, self.RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            pass          # no space even now, or a file system without fallocate: no reserve

    def _release_reserve(self) -> None:
        try:
            self._own(self.RESERVE).unlink()
        except OSError:
            pass

    def _write_meta_or_warn(self) -> None:
        try:
            self._write_meta()
        except OSError as exc:
            self.warn(str(os_error(exc, self.path, "writing meta.json")))

    def note(self, **fields: Any) -> None:
        """Add facts to meta.json (why it stopped, the live view's costs...), written with it
        next (stop() writes it)."""
        with self._lock:
            self.meta.update(fields)

    def update_meta(self, **fields: Any) -> None:
        """Add facts to meta.json after stop (the exit of a workload that outlived profiling)."""
        with self._lock:
            self.meta.update(fields)
        self._write_meta()

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what collectors call ----------------------------------------------------------

    def emit(self, table: str, batch: pa.RecordBatch, rank: int | None = None) -> None:
        """Fan a batch out to every sink. rank: the partition it belongs to (a collector that
        gathers other processes' data, e.g. torch traces from torchrun's ranks); default
        the session's own."""
        rank = self.rank if rank is None else rank
        if self.entity_owner and table == "samples" and "entity" in batch.schema.names:
            for owner, part in self._split_by_owner(batch, rank):
                self._fan_out(table, part, owner)
            return
        self._fan_out(table, batch, rank)

    def own_entity(self, entity: str, rank: int) -> None:
        """Samples of `entity` (e.g. gpu:1, sampled once for the whole machine) belong to `rank`."""
        with self._lock:
            self.entity_owner[entity] = rank

    def _split_by_owner(self, batch: pa.RecordBatch, default: int):
        import pyarrow.compute as pc
        entity = batch.column("entity").cast(pa.string())
        rest = None
        for name, owner in dict(self.entity_owner).items():
            mask = pc.equal(entity, name)
            if pc.any(mask).as_py():
                yield owner, batch.filter(mask)
                rest = pc.invert(mask) if rest is None else pc.and_(rest, pc.invert(mask))
        part = batch if rest is None else batch.filter(rest)
        if part.num_rows:
            yield default, part

    def _fan_out(self, table: str, batch: pa.RecordBatch, rank: int) -> None:
        for sink in self.sinks:
            try:
                sink.write(table, batch, rank)
            except Exception as exc:   # e.g. disk full: say so once per sink, keep going
                if sink is self.journals and "journal_failed" not in self.meta:
                    # what recovery says of the run: samples after this are not on disk
                    self.meta["journal_failed"] = {
                        "after_s": round((self.clock.now_ns() - self.start_ns) / 1e9, 3),
                        "reason": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
                key = (str(os_error(exc, self.path, "writing the journal",
                                    kept="what was written before; later samples are lost"))
                       if isinstance(exc, OSError) else f"sink {type(sink).__name__} failed: {exc}")
                if key not in self.warnings:
                    self.warn(key)

    def add_metrics(self, metrics: list[Metric]) -> None:
        with self._lock:
            new = [m for m in metrics if self.metrics.get(m.name) != m]
            for m in new:
                self.metrics[m.name] = m
            # added mid-run (a metric known only once it first has a value): on disk now,
            # so a run recovered after a crash has it in its catalog too
            if new and self.started and not self.stopped:
                self._write_catalog()

    def fail(self, name: str, reason: str) -> None:
        with self._lock:
            entry = self.statuses.setdefault(name, {"config": self.config.get(name, {})})
            entry.update(status="failed", reason=reason)
        self.warn(f"{name} collector failed: {reason}")
        if self.started and not self.stopped:
            self._refresh_statuses()
            self._write_meta()

    def warn(self, message: str) -> None:
        with self._lock:
            if message in self.warnings:     # e.g. the same unsupported events on every rank
                return
            self.warnings.append(message)
        self.on_warning(message)

    def rank_context(self, rank: int, target: Target) -> SessionContext:
        """A context for a collector counting one rank of the job: its batches land in that
        rank's partition."""
        base = self._ctx

        def emit(table, batch, rank_=None):
            self.emit(table, batch, rank if rank_ is None else rank_)

        return SessionContext(clock=self.clock, target=target, config=self.config, rank=rank,
                              emit=emit, add_metrics=self.add_metrics,
                              fail=lambda name, reason: self.warn(f"{name} on rank {rank} failed: {reason}"),
                              warn=self.warn, run_path=self.path, fresh_rows=self._fresh_rows(),
                              profiler_tids=base.profiler_tids, lock=base.lock)

    def _fresh_rows(self) -> bool:
        """A sink shows rows as they come (the live view, --serve): no collector may hold them
        back for seconds (perf's drain with its spill)."""
        return any(getattr(sink, "fresh_rows", False) for sink in self.extra_sinks)

    def stop_root_per_rank(self, classes: list[type[Collector]]) -> list[str]:
        """Per-rank auto mode, when ranks appear below the root: stop the root's collectors of
        these classes (what they counted stays, in this rank's partition); their names."""
        stopped = []
        for col in self.collectors:
            if type(col) in classes:
                try:
                    col.stop()
                except Exception as exc:
                    self.fail(col.name, f"stop failed: {type(exc).__name__}: {exc}")
                stopped.append(col.name)
        return stopped

    def rank_switched(self, facts: dict[str, Any]) -> None:
        """Per-rank auto mode switched to counting each rank: say so in meta.json."""
        with self._lock:
            self.meta["rank_switch"] = {
                **facts, "after_s": round((facts["at_ns"] - self.start_ns) / 1e9, 3),
                "note": f"before at_ns, rank={self.rank}/ holds the whole process tree's counts "
                        "of the collectors stopped; after it, each rank's own"}
            self.meta.setdefault("ranks", {})
        self._write_meta()

    def rank_status(self, rank: int, col: Collector, status: str, reason: str) -> None:
        """A per-rank collector's state in meta.json: under "ranks", and mirrored at the top for
        the first rank (so "collectors" says what ran, and summaries find perf's events)."""
        with self._lock:
            ranks = self.meta.setdefault("ranks", {})
            entry = ranks.setdefault(str(rank), {"collectors": {}})
            if self.watcher is not None and rank in self.watcher.ranks:
                found = self.watcher.ranks[rank]
                entry["pid"] = found["pid"]
                entry["source"] = found["source"]     # environment or torch.distributed
                for key in ("world_size", "gpu"):     # gpu: the CUDA ordinal it drives
                    if found.get(key) is not None:
                        entry[key] = found[key]
            entry["collectors"][col.name] = {"status": status, "reason": reason, **col.details}
            top = self.statuses.setdefault(col.name, {"config": col.summary_config()})
            if status == "failed" or "per_rank" not in top:
                top.update(status=status, reason=reason, per_rank=True, **col.details)
        if status == "failed":
            self.warn(f"{col.name} on rank {rank} failed: {reason}")
        self._write_meta()

    # -- meta ----------------------------------------------------------------------------

    def _initial_meta(self) -> dict[str, Any]:
        env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
        return {
            "id": self.path.name,
            "counterprof_version": __version__,
            "status": "running",
            "command": self.command,
            "argv": list(sys.argv),
            **self._machine_facts(),
            "gpus": [],
            "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.start_ns / 1e9)),
            "start_ns": self.start_ns,
            "clock_offset_ns": self.clock.offset_ns,
            "rank": self.rank,
            "job": self.job,
            "env": env,
            "target": {"kind": self.target.kind, "pid": self.target.pid,
                       "system_wide": self.target.system_wide},
            "profiler": {"pid": os.getpid(), "host": self._machine_facts()["host"]["hostname"]},
            "collectors": self.statuses,
        }

    def _machine_facts(self) -> dict[str, Any]:
        """cwd, git revision, host facts and cached ceilings: read once (the creator's first
        meta.json and start()'s both carry them; /proc/cpuinfo alone is ~200 KB on a big node)."""
        if self._facts is None:
            cwd = os.getcwd()
            self._facts = {"cwd": cwd, "git_revision": git_revision(cwd), "host": host_facts(),
                           "ceilings": _cached_ceilings()}
        return self._facts

    def _refresh_statuses(self) -> None:
        with self._lock:
            for col in self.collectors:
                entry = self.statuses.setdefault(col.name, {})
                if entry.get("status") != "failed" and col.status != "ok":
                    entry.update(status=col.status, reason=col.reason)
                entry.update(col.details)
                self.meta.update(col.run_facts)
            self.meta["collectors"] = self.statuses

    def _profiler_usage(self) -> dict[str, Any]:
        usage = dict(self.meta.get("profiler", {}))
        if self.target.kind == "self":
            # In-process: the process's CPU is the workload's; count our threads only.
            usage["cpu_s"] = round(sum(float(c.details.get("thread_cpu_s", 0.0))
                                       for c in self.collectors), 6)
            usage["cpu_scope"] = "profiler threads"
        else:
            usage["cpu_s"] = round(_self_cpu() - self._start_cpu, 6)
            usage["cpu_scope"] = "profiler process, after start-up"
        usage["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return usage

    def _own(self, name: str) -> Path:
        """Where this session's meta/catalog go: the run's, or, having joined another process's
        run, its rank partition's."""
        return (self.rank_path if self.joined else self.path) / name

    def _write_meta(self) -> None:
        with self._lock:
            rundir.write_json(self._own(rundir.META), self.meta)

    def _write_catalog(self) -> None:
        with self._lock:
            entries = [m.to_json() for m in sorted(self.metrics.values(), key=lambda m: (m.source, m.name))]
            if entries == self._catalog_written:
                return        # on disk already (stop's, when no metric came after start's)
            rundir.write_json(self._own(rundir.CATALOG), entries)
            self._catalog_written = entries


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime

