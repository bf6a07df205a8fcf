"""The collector contract, what a collector is told about its target, and the registry.

The core knows no collector by name: built-in ones register through the same
entry-point group (`counterprof.collectors`) that third-party packages use.

A collector never writes files or prints. It emits Arrow record batches stamped
with the session's clock through `ctx.emit`, samples on its own thread at its own
cadence, and reports trouble through `ctx.fail` / `ctx.warn`.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
import threading
import time
from dataclasses import field
from functools import reduce
from pathlib import Path
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from .ground.clock import Clock
from .ground.errors import CounterprofError, UsageError, native_missing
from .ground.schema import Metric
from .ground.threadname import name_os_thread
from counterprof.ground.record import record

ENTRY_POINT_GROUP = "counterprof.collectors"



@record(frozen=True)
class Availability:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@record(frozen=True)
class Target:
    """What the session observes.

    kind: "launch" (a child paused before exec: counters start at exec),
          "pid"    (a running process, all of its threads),
          "self"   (the calling process, for the context manager),
    system_wide: also/instead count every CPU (perf -a).
    """

    kind: str
    pid: int | None = None
    system_wide: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("launch", "pid", "self"):
            raise ValueError(f"target kind {self.kind!r}")


@record
class SessionContext:
    """What a collector gets from the session in start()."""

    clock: Clock
    target: Target
    config: dict[str, Any]
    rank: int
    emit: Callable[..., None]             # (table name, batch[, rank]); rank defaults to ctx.rank
    add_metrics: Callable[[list[Metric]], None]
    fail: Callable[[str, str], None]                      # (collector name, reason)
    warn: Callable[[str], None]
    run_path: Path | None = None     # the run directory (None: a collector started on its own)
    # Native ids of threads the profiler itself runs. A collector that starts a
    # thread adds it here before the counting collectors start, so they can leave it out.
    profiler_tids: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Collectors that would rather have a file read on the perf sampler's native tick than wake
    # a thread of their own every interval (threads: the critical thread's schedstat). Once its
    # sampler runs, perf calls rider.ride(sampler, interval_ns); rider.unride() before it frees
    # it. A rider keeps its own thread for when no perf collector runs (or it failed).
    tick_riders: list[Any] = field(default_factory=list)
    # A sink shows rows as they come (the live view, --serve): drains stay at least once a second
    fresh_rows: bool = False
    # perf's spill (collectors/perf/spill.py) while riders ride a sampler that spills: the
    # threads collector names its critical thread's readings there
    spill: Any = None

    def start_thread(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Start a collector's daemon thread and register it as the profiler's, before
        returning (so counting collectors that start later leave it out)."""
        ready = threading.Event()
        ident: list[int] = []

        def run() -> None:
            ident.append(threading.get_native_id())
            name_os_thread(name)
            ready.set()
            target()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        ready.wait()
        with self.lock:
            self.profiler_tids.add(ident[0])
        return thread

    def start_collector(self, col: Collector) -> str | None:
        """Start `col` in this context: None once it runs, else why not (said so a user can act
        on it), with what it had opened released. The session's collectors and each rank's
        start here, so a failure reads the same for both."""
        try:
            col.start(self)
        except Exception as exc:
            try:
                col.stop()
            except Exception:
                pass
            return str(exc) if isinstance(exc, CounterprofError) else f"{type(exc).__name__}: {exc}"
        return None


class Collector:
    """Base class. Subclasses set `name`, implement availability/start/stop.

    start_late: started after the other collectors, because it counts threads and
    must see the profiler's own threads already registered in ctx.profiler_tids.
    """

    name: ClassVar[str] = ""
    start_late: ClassVar[bool] = False
    # counters that see every thread of the process (perf): started after every other collector
    # and stopped before them, so the others' start-up and stop (Python work that competes with
    # the workload's threads) are not in its counts
    start_last: ClassVar[bool] = False
    default_on: ClassVar[bool] = True
    # can attach to a running process (Target "pid"): started on each rank of a multi-rank job
    per_rank: ClassVar[bool] = False
    # the configuration keys it knows and their values when not given
    DEFAULTS: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = self.with_defaults(config)
        # a store.meta.CollectorState word: ok, failed, unavailable, or empty (ran, recorded
        # nothing); readers refuse any other (store/meta.py)
        self.status = "ok"
        self.reason = ""
        # Extra facts for meta.json: under this collector (events opened, fallbacks...) ...
        self.details: dict[str, Any] = {}
        # ... and at the top level of meta.json (e.g. "gpus": the devices seen).
        self.run_facts: dict[str, Any] = {}

    @classmethod
    def with_defaults(cls, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """config over DEFAULTS: what availability/validate/inventory read before an instance."""
        return {**cls.DEFAULTS, **(config or {})}

    @classmethod
    def availability(cls, config: dict[str, Any] | None = None) -> Availability:
        """Can it run here, and if not, why (said so a user can act on it). Cheap, no side effects."""
        return Availability(True)

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        """Raise UsageError for bad configuration, before any workload starts."""

    @classmethod
    def inventory(cls, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """What `counterprof list` shows beyond availability: tables of
        {"title", "columns", "rows", "note"} (events this machine counts, devices...)."""
        return []

    def launch_environment(self, run_path: Path) -> dict[str, str]:
        """Environment variables a launched workload needs for this collector (for example a
        bootstrap on PYTHONPATH for collectors that run inside the workload's processes).
        Called before the workload is spawned."""
        return {}

    @classmethod
    def recover(cls, run_path: Path) -> list[str]:
        """`counterprof recover`, after the journal is compacted: finish what a killed profiler
        left undone on disk for this collector (e.g. trace files not converted yet). Idempotent.
        Returns what it did, one line each."""
        return []

    def start(self, ctx: SessionContext) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Flush what is left and release resources. Must be idempotent."""

    def summary_config(self) -> dict[str, Any]:
        """The configuration as recorded in meta.json."""
        return dict(self.config)


class PollingCollector(Collector):
    """A collector whose own thread wakes every interval to sample (host, threads, nvml, torch).

    The subclass writes poll(), its loop (`while not self._stop.wait(period): ...`): the timing,
    the work per sample and the wake-ups are all its own, the base adds none. start() calls
    start_polling(ctx) last. The base runs the loop on a profiler thread, fails the collector
    with the reason when it raises (the rows taken so far flushed first), and stops it: the
    thread is told and joined, then the last partial interval is sampled (short runs would
    otherwise have no sample; a failure there is a warning only), flushed, and released.
    """

    # what a failed last sample may raise and only be warned about
    last_sample_errors: ClassVar[tuple[type[Exception], ...]] = (Exception,)
    ctx: SessionContext               # set by the subclass's start(), before start_polling

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_cpu_s = 0.0          # the sampling thread's CPU time, once it has ended

    def start_polling(self, ctx: SessionContext) -> None:
        self._thread = ctx.start_thread(f"counterprof-{self.name}", self._run)

    def _run(self) -> None:
        try:
            self.poll()
        except Exception as exc:
            self.poll_failed(exc)
        finally:
            self._thread_cpu_s = time.thread_time()

    def poll(self) -> None:
        """The sampling loop, on the collector's thread, until self._stop is set."""
        raise NotImplementedError

    def poll_failed(self, exc: Exception) -> None:
        """poll() raised: what was taken goes out, and the collector fails with the reason."""
        self.flush()
        self.ctx.fail(self.name, f"{type(exc).__name__}: {exc}")

    def flush(self) -> None:
        """Emit the rows kept since the last flush."""

    def last_sample(self) -> None:
        """The last partial interval, once the thread has ended."""

    def release(self) -> None:
        """Close what start() opened, after the last flush."""

    @property
    def polling(self) -> bool:
        """The thread was started and has not been told to stop."""
        return self._thread is not None and not self._stop.is_set()

    def halt(self) -> None:
        """Tell the thread to stop, and wait until it has."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        if not self.polling:
            return
        self.halt()
        try:
            self.last_sample()
        except self.last_sample_errors as exc:
            self.ctx.warn(f"{self.name}: final sample failed: {exc}")
        self.flush()
        self.release()
        self.details["thread_cpu_s"] = self._thread_cpu_s


def native_available() -> Availability:
    """For collectors that sample through the compiled part: unavailable where it is missing."""
    try:
        importlib.import_module("counterprof._native")
    except ImportError as exc:
        return Availability(False, str(native_missing(exc)))
    return Availability(True)


class _EntryPoint:
    """One `name = module:attr` line of an entry_points.txt: importlib.metadata.EntryPoint's
    name and load(), without importing importlib.metadata."""

    def __init__(self, name: str, value: str):
        self.name = name
        self.value = value

    def load(self) -> Any:
        module, _, attrs = self.value.partition(":")
        obj = importlib.import_module(module.strip())
        attrs = attrs.split("[", 1)[0].strip()          # "mod:Cls [extra]": extras load nothing
        return reduce(getattr, filter(None, attrs.split(".")), obj)


def _group_lines(text: str, group: str) -> list[_EntryPoint]:
    """The entries of `group` in an entry_points.txt (an INI file, as importlib reads it)."""
    found: list[_EntryPoint] = []
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, _, value = line.partition("=")
            found.append(_EntryPoint(name.strip(), value.strip()))
    return found


def _normalized(stem: str) -> str:
    """A distribution's name from its .dist-info / .egg-info directory's stem, as
    importlib.metadata compares them (first on sys.path wins)."""
    return re.sub(r"[-_.]+", "_", stem.partition("-")[0]).lower()


def _fast_entry_points(group: str) -> list[_EntryPoint] | None:
    """The group's entry points read straight from the .dist-info / .egg-info directories on
    sys.path, in importlib.metadata's order: its import alone (email, zipfile, csv...) is ~10
    ms of every run's start-up. None where only importlib.metadata knows how to look: a zip on
    sys.path, or an import hook that supplies distributions of its own."""
    from importlib.machinery import PathFinder
    for finder in sys.meta_path:
        if finder is not PathFinder and getattr(finder, "find_distributions", None) is not None:
            return None
    found: list[_EntryPoint] = []
    seen: set[str] = set()
    for entry in sys.path:
        base = entry or "."
        try:
            children = os.listdir(base)      # importlib's order too
        except NotADirectoryError:
            return None                # a zip (an egg): importlib.metadata reads those
        except OSError:
            continue                   # missing or unreadable: importlib skips it too
        for child in children:
            low = child.lower()
            if low.endswith(".egg"):
                return None            # an egg directory: importlib.metadata reads those
            if not (low.endswith(".dist-info") or low.endswith(".egg-info")):
                continue
            stem = child.rsplit(".", 1)[0]
            name = _normalized(stem)
            if name in seen:
                continue
            seen.add(name)
            try:
                with open(os.path.join(base, child, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            found.extend(_group_lines(text, group))
    return found


def _entry_points() -> Iterable[Any]:
    fast = _fast_entry_points(ENTRY_POINT_GROUP)
    if fast is not None:
        return fast
    from importlib import metadata
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


def registry() -> dict[str, type[Collector] | Exception]:
    """Every registered collector by name; a plugin that fails to import maps to its error."""
    found: dict[str, type[Collector] | Exception] = {}
    for ep in _entry_points():
        try:
            found[ep.name] = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            found[ep.name] = exc
    if not found:
        found["perf"] = UsageError(
            "no collectors are registered: counterprof is not installed as a package; "
            "run `pip install .` in the source tree")
    return found


def resolve(names: list[str] | None) -> dict[str, type[Collector] | Exception]:
    """The collectors to use: `names` in that order, or every default-on one."""
    reg = registry()
    if names is None:
        return {n: c for n, c in reg.items()
                if isinstance(c, Exception) or getattr(c, "default_on", True)}
    unknown = [n for n in names if n not in reg]
    if unknown:
        raise UsageError(
            f"unknown collector(s): {', '.join(unknown)}; known: {', '.join(sorted(reg))} "
            "(see `counterprof list`)")
    return {n: reg[n] for n in names}


# a collector class (a plan) or a started collector: both say start_late / start_last
_C = TypeVar("_C", bound="type[Collector] | Collector")


def start_order(collectors: Iterable[_C]) -> list[_C]:
    """The order collectors start in: plain ones, then those that count threads (start_late),
    those whose counters see every thread last (start_last)."""
    return sorted(collectors, key=lambda c: (c.start_late, c.start_last))


def stop_order(collectors: Iterable[_C]) -> list[_C]:
    """Stop in the reverse of start_order for the thread-counting ones (so counters stop first
    and see the end), then the rest in their start order."""
    started = list(collectors)
    late = [c for c in reversed(started) if c.start_late]
    return late + [c for c in started if not c.start_late]
