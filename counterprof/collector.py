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
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .ground.clock import Clock
from .ground.errors import CounterprofError, UsageError, native_missing
from .ground.threadname import name_os_thread
from counterprof.ground.record import record

if TYPE_CHECKING:        # `counterprof run` builds its parser from this module, before pyarrow may load
    import argparse

    from .ground.schema import Metric

ENTRY_POINT_GROUP = "counterprof.collectors"
# each collector's command-line options (CollectorOptions), by the collector's name: modules that
# import nothing heavy, loaded for `counterprof run`'s parser without the collectors themselves
OPTIONS_ENTRY_POINT_GROUP = "counterprof.collector_options"



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


class CollectorOptions:
    """A collector's part of `counterprof run`'s command line: its flags, and its configuration
    from them. `run` names no collector: it adds every registered collector's flags to the
    parser, a group each, and asks each for its configuration from the parsed namespace.

    A collector sets its subclass as its `options` and registers it under the collector's name
    in the `counterprof.collector_options` entry-point group, in a module that imports nothing
    heavy (no pyarrow, numpy, torch): `counterprof run --help` loads it, and a run parses its
    command line before pyarrow loads. A collector registered without that entry still has its
    options: `run` then loads the collector class for them.

    The namespace holds every collector's options and run's own: `args.interval_ms` is -I,
    `args.pid`, `args.command` and `args.collectors` (--collectors, see named_collectors) are
    what they are on `counterprof run`. A collector reads another's option with getattr and a
    default (that collector may not be installed).
    """

    # the group's heading in `counterprof run --help` (None: "<name> collector")
    title: ClassVar[str | None] = None
    # where the group comes in `counterprof run --help` (and a collector it turns on in the
    # run's list), lowest first: counterprof's own from 10 (perf) to 70 (jax), others after
    help_order: ClassVar[int] = 100
    # with the collector turned on, a launched Python job's ranks announce themselves as they
    # init (torch, jax): --per-rank then defaults to auto (the tree is one until ranks appear)
    finds_ranks: ClassVar[bool] = False

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add the collector's flags to its group of `counterprof run`'s parser. Each dest is
        the namespace's, shared with every other collector's: name them after the collector."""

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any] | None:
        """The collector's configuration from the parsed command line (None: none, its DEFAULTS
        apply). Raise UsageError for a bad value or a bad combination: said with run's usage,
        exit status 2, before anything starts."""
        return None

    @classmethod
    def turned_on(cls, args: argparse.Namespace) -> bool:
        """The command line asks for this collector, beside the default ones or the ones
        --collectors names (--torch, --jax)."""
        return False


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
    # its flags on `counterprof run` and its configuration from them (none by default)
    options: ClassVar[type[CollectorOptions]] = CollectorOptions

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
    texts = _entry_point_texts()
    if texts is None:
        return None
    return [ep for text in texts for ep in _group_lines(text, group)]


# (sys.path's directories and their mtimes, the entry_points.txt texts found there): a run asks
# three times (its parser, its configuration, its collectors), and one look is ~2 ms
_seen_texts: tuple[tuple[tuple[str, int | None], ...], list[str] | None] | None = None


def _entry_point_texts() -> list[str] | None:
    """The entry_points.txt of every distribution on sys.path, the first of a name only, in
    importlib.metadata's order; None where only importlib.metadata knows how to look. Looked
    for again once sys.path or a directory on it changes (an install adds or removes a
    distribution's directory: its directory's mtime changes)."""
    global _seen_texts
    from importlib.machinery import PathFinder
    for finder in sys.meta_path:
        if finder is not PathFinder and getattr(finder, "find_distributions", None) is not None:
            return None
    key = tuple((os.path.abspath(entry or "."), _mtime_ns(entry or ".")) for entry in sys.path)
    seen = _seen_texts
    if seen is not None and seen[0] == key:
        return seen[1]
    texts = _read_entry_point_texts()
    _seen_texts = (key, texts)
    return texts


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _read_entry_point_texts() -> list[str] | None:
    texts: list[str] = []
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
                    texts.append(f.read())
            except OSError:
                continue
    return texts


def _entry_points(group: str = ENTRY_POINT_GROUP) -> Iterable[Any]:
    fast = _fast_entry_points(group)
    if fast is not None:
        return fast
    from importlib import metadata
    return metadata.entry_points(group=group)


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


def options_registry() -> dict[str, type[CollectorOptions] | Exception]:
    """Every registered collector's command-line options by its name, in registry()'s order,
    loaded without the collector where it registers them (OPTIONS_ENTRY_POINT_GROUP), else its
    class's `options`; an entry that fails to load maps to its error."""
    declared = {ep.name: ep for ep in _entry_points(OPTIONS_ENTRY_POINT_GROUP)}
    found: dict[str, type[CollectorOptions] | Exception] = {}
    for ep in _entry_points():
        try:
            if ep.name in declared:
                found[ep.name] = declared[ep.name].load()
            else:
                found[ep.name] = ep.load().options
        except Exception as exc:  # a broken plugin must not take the others (or --help) down
            found[ep.name] = exc
    return found


def named_collectors(text: str | None) -> list[str] | None:
    """The collectors `--collectors LIST` names, in its order (None: not given)."""
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


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
