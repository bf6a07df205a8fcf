"""The session: starts and stops collectors, owns the clock and the sinks.

collectors --batch--> Session.emit --fan-out--> sinks (the journal writer, then those given:
                                                       the live window, an exporter...)

A collector that fails, at start or mid-run, is marked failed in meta.json with
its reason; the other collectors and the workload carry on.

The session's other jobs each have their module:
  run_meta.py       meta.json and catalog.json as the session builds them up and writes them
  sinks.py          what a sink is (the Sink protocol)
  store/reserve.py  the disk space kept for the last meta.json; store/compact.py: the end's compaction
  ranks.py          a launched job's ranks, each counted on its own (the session implements its
                    RankSession: the rank bookkeeping below)
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from . import regions
from .collector import Availability, Collector, SessionContext, Target, resolve, start_order, stop_order
from .ground.clock import Clock
from .ground.errors import RunDirectoryError, os_error
from .ground.proctree import rank_from_env
from .ground.schema import Metric
from .run_meta import Catalog, MetaDocument, profiler_usage, self_cpu
from .sinks import Sink, wants_fresh_rows
from .store import reserve, rundir
from .store.compact import BackgroundCompactor, CompactionReport, compact_run
from .store.journal import JournalSet

if TYPE_CHECKING:
    from .ranks import RankWatcher


def job_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
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

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 collectors: list[str] | None = None,
                 config: dict[str, dict[str, Any]] | None = None,
                 target: Target = Target("self"),      # noqa: B008  a frozen dataclass, shared safely
                 command: list[str] | None = None,
                 rank: int | None = None,
                 replace: bool = False,
                 sinks: Iterable[Sink] | None = None,
                 per_rank: bool | str = False,
                 job: str | None = None,
                 on_warning: Callable[[str], None] = _stderr_warning,
                 named: Iterable[str] | None = None):
        if path is not None and os.fspath(path) in ("", b""):
            # Path("") is the current directory: an unset variable (path=os.environ.get(...,""))
            # would write the run into it, as `-o ""` would (refused there by cli/arguments.py)
            from .ground.errors import UsageError
            raise UsageError('path "" was given (an empty string: an unset variable?): name the '
                             'run directory, "." for the current directory, or leave path unset '
                             "for a new timestamped one")
        self.path = Path(path) if path is not None else rundir.default_run_path()
        self.collector_names = collectors
        # the collectors said when they cannot run here: those asked for (default: all of
        # `collectors` when given; `run --torch` names the defaults beside torch, and a CPU
        # machine's user did not ask to hear about its missing GPU)
        self.named_collectors: set[str] | None = set(named) if named is not None else None
        self.config = config or {}
        self.target = target
        self.command = command
        self.rank = rank_from_env() if rank is None else rank
        self.replace = replace
        self.on_warning = on_warning
        self.clock = Clock()
        self.writer_id = f"{os.getpid()}-{os.urandom(3).hex()}"   # secrets.token_hex, without its ~3 ms import
        self.collectors: list[Collector] = []
        self._lock = threading.RLock()
        self.meta = MetaDocument(self._lock)       # meta.json, with the collectors' statuses
        self.catalog = Catalog(self._lock)         # catalog.json: the metrics declared
        self.warnings: list[str] = []
        # sinks take write(table, batch, rank) and close(); the journal is always first
        self.extra_sinks: list[Sink] = list(sinks or [])
        # a launched multi-rank job: attachable collectors run per rank (counterprof/ranks.py);
        # True: from the start; "auto": once ranks appear below the root (until then, the tree)
        self.per_rank = per_rank
        self.watcher: RankWatcher | None = None
        self.job = job
        # entities a rank owns (its GPU): their samples go to that rank's partition
        self.entity_owner: dict[str, int] = {}
        self.joined = False     # another process of the job created the run: write our partition
        self.sinks: list[Sink] = []
        self.launch_env: dict[str, str] = {}
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
        self._ctx: SessionContext | None = None
        self._start_cpu = 0.0

    @property
    def statuses(self) -> dict[str, dict[str, Any]]:
        """The collectors' statuses (meta.json's "collectors"), by name: read live by the view."""
        return self.meta.statuses

    @property
    def metrics(self) -> dict[str, Metric]:
        """The metrics the collectors declared (catalog.json), by name: read live by the view."""
        return self.catalog.metrics

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
                self.meta.collector_unavailable(name, str(cls), cfg)
                continue
            cls.validate(cfg)
            try:
                avail = cls.availability(cfg)
            except Exception as exc:   # availability must never take the run down
                avail = Availability(False, f"availability check failed: {exc}")
            if not avail.ok:
                self.meta.collector_unavailable(name, avail.reason, cfg)
                if self.collector_names is not None and (self.named_collectors is None
                                                         or name in self.named_collectors):   # asked for: say so
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
        self._start_cpu = self_cpu()
        self.start_ns = self.clock.now_ns()
        self.compactor = BackgroundCompactor()
        self.journals = JournalSet(self.path, self.writer_id, on_rotate=self.compactor.submit)
        self.sinks = [self.journals, *self.extra_sinks]
        self.meta.begin(self._initial_meta())
        self._write_meta()
        reserve.keep(self._own(rundir.RESERVE))

        if self.target.kind == "self":
            regions.recorder.attach(self.emit, self.clock.offset_ns)
        self._ctx = ctx = SessionContext(
            clock=self.clock, target=self.target, config=self.config, rank=self.rank,
            emit=self.emit, add_metrics=self.add_metrics, fail=self.fail, warn=self.warn,
            run_path=self.path, fresh_rows=wants_fresh_rows(self.extra_sinks))
        ctx.profiler_tids.add(self.compactor.native_id)
        plan = list(self.plan)
        per_rank_classes = []
        if self.per_rank and self.target.kind == "launch" and not self.target.system_wide:
            per_rank_classes = [type(c) for c in plan if c.per_rank]
            if self.per_rank != "auto":    # auto: the root counts the tree until ranks appear
                plan = [c for c in plan if not c.per_rank]
        plan = start_order(plan)
        for col in plan:
            self.meta.collector_starting(col)
            reason = ctx.start_collector(col)
            if reason is not None:
                self.meta.collector_details(col)   # e.g. which events were unsupported
                self.fail(col.name, reason)
                continue
            self.collectors.append(col)
        if per_rank_classes:
            self._watch_ranks(per_rank_classes, ctx)
        self.started = True
        self.meta.refresh(self.collectors)
        self._write_catalog()
        self._write_meta()

    def _watch_ranks(self, classes: list[type[Collector]], ctx: SessionContext) -> None:
        """A launched multi-rank job: the rank watcher starts `classes` on each rank it finds."""
        from .ranks import RankWatcher
        mode = "auto" if self.per_rank == "auto" else "on"
        self.meta.set(per_rank="auto" if mode == "auto" else True)
        if mode == "on":
            self.meta.set(ranks={})
        self.watcher = RankWatcher(self, classes, self.target.pid, mode=mode)
        self.watcher.start(ctx)

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
        reserve.release(self._own(rundir.RESERVE))
        self.meta.set(workload=workload or self.meta.get("workload"))
        self._write_meta_or_warn()
        complete = True
        if compact:
            # every partition: ours, and those the workload's processes wrote (regions, traces)
            self.compaction = background
            complete = compact_run(self.path, self.compaction, self.warn)
        self.meta.refresh(self.collectors)
        self.meta.set(
            status="complete" if complete else "running",
            end_ns=self.end_ns,
            duration_ns=self.end_ns - self.start_ns,
            workload=workload or self.meta.get("workload"),
            profiler=profiler_usage(self.meta, self.collectors, in_process=self.target.kind == "self",
                                    start_cpu=self._start_cpu),
            warnings=self.warnings,
        )
        try:
            self._write_catalog()
        except OSError as exc:
            self.warn(str(os_error(exc, self.path, "writing catalog.json")))
        self._write_meta_or_warn()

    def note(self, **fields: Any) -> None:
        """Add facts to meta.json (why it stopped, the live view's costs...), written with it
        next (stop() writes it)."""
        self.meta.set(**fields)

    def update_meta(self, **fields: Any) -> None:
        """Add facts to meta.json after stop (the exit of a workload that outlived profiling)."""
        self.meta.set(**fields)
        self._write_meta()

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
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

    def _fan_out(self, table: str, batch: pa.RecordBatch, rank: int) -> None:
        for sink in self.sinks:
            try:
                sink.write(table, batch, rank)
            except Exception as exc:   # e.g. disk full: say so once per sink, keep going
                if sink is self.journals and "journal_failed" not in self.meta:
                    # what recovery says of the run: samples after this are not on disk
                    self.meta.set(journal_failed={
                        "after_s": round((self.clock.now_ns() - self.start_ns) / 1e9, 3),
                        "reason": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
                key = (str(os_error(exc, self.path, "writing the journal",
                                    kept="what was written before; later samples are lost"))
                       if isinstance(exc, OSError) else f"sink {type(sink).__name__} failed: {exc}")
                if key not in self.warnings:
                    self.warn(key)

    def add_metrics(self, metrics: list[Metric]) -> None:
        with self._lock:
            # added mid-run (a metric known only once it first has a value): on disk now,
            # so a run recovered after a crash has it in its catalog too
            if self.catalog.add(metrics) and self.started and not self.stopped:
                self._write_catalog()

    def fail(self, name: str, reason: str) -> None:
        self.meta.collector_failed(name, reason, self.config.get(name, {}))
        self.warn(f"{name} collector failed: {reason}")
        if self.started and not self.stopped:
            self.meta.refresh(self.collectors)
            self._write_meta()

    def warn(self, message: str) -> None:
        with self._lock:
            if message in self.warnings:     # e.g. the same unsupported events on every rank
                return
            self.warnings.append(message)
        self.on_warning(message)

    # -- the ranks of a launched job: what the rank watcher calls (ranks.RankSession) -------

    def own_entity(self, entity: str, rank: int) -> None:
        """Samples of `entity` (e.g. gpu:1, sampled once for the whole machine) belong to `rank`."""
        with self._lock:
            self.entity_owner[entity] = rank

    def _split_by_owner(self, batch: pa.RecordBatch, default: int) -> Iterator[tuple[int, pa.RecordBatch]]:
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

    def rank_context(self, rank: int, target: Target) -> SessionContext:
        """A context for a collector counting one rank of the job: its batches land in that
        rank's partition."""
        base = self._ctx
        assert base is not None, "rank_context() before start()"

        def emit(table: str, batch: pa.RecordBatch, rank_: int | None = None) -> None:
            self.emit(table, batch, rank if rank_ is None else rank_)

        return SessionContext(clock=self.clock, target=target, config=self.config, rank=rank,
                              emit=emit, add_metrics=self.add_metrics,
                              fail=lambda name, reason: self.warn(f"{name} on rank {rank} failed: {reason}"),
                              warn=self.warn, run_path=self.path,
                              fresh_rows=wants_fresh_rows(self.extra_sinks),
                              profiler_tids=base.profiler_tids, lock=base.lock)

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
        self.meta.rank_switch(facts, self.start_ns, self.rank)
        self._write_meta()

    def rank_status(self, rank: int, col: Collector, status: str, reason: str,
                    found: dict[str, Any] | None) -> None:
        """A per-rank collector's state in meta.json: under "ranks", and mirrored at the top for
        the first rank (so "collectors" says what ran, and summaries find perf's events)."""
        self.meta.rank_collector(rank, found, col, status, reason)
        if status == "failed":
            self.warn(f"{col.name} on rank {rank} failed: {reason}")
        self._write_meta()

    # -- meta.json and catalog.json (run_meta.py) ------------------------------------------

    def _initial_meta(self) -> dict[str, Any]:
        return self.meta.initial(run_id=self.path.name, command=self.command, start_ns=self.start_ns,
                                 clock_offset_ns=self.clock.offset_ns, rank=self.rank, job=self.job,
                                 target=self.target)

    def _own(self, name: str) -> Path:
        """Where this session's meta/catalog go: the run's, or, having joined another process's
        run, its rank partition's."""
        if self.joined:
            assert self.rank_path is not None      # prepare()'s, which joined
            return self.rank_path / name
        return self.path / name

    def _write_meta(self) -> None:
        self.meta.write(self._own(rundir.META))

    def _write_meta_or_warn(self) -> None:
        try:
            self._write_meta()
        except OSError as exc:
            self.warn(str(os_error(exc, self.path, "writing meta.json")))

    def _write_catalog(self) -> None:
        self.catalog.write(self._own(rundir.CATALOG))
