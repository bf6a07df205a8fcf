"""Reading meta.json and catalog.json: the one place their shape is checked.

A run directory is input like any other: a file of the wrong shape (`[]`, `"hello"`, a field of
the wrong type, written by hand or by another tool) must be one clear error, not a traceback
wherever the field is first used. Every reader of a run's metadata (Run.meta, Run.rank_meta,
Run.catalog, recovery, compaction) goes through read_meta / read_catalog, which check what the
rest of counterprof relies on and hand back the plain dict (list) it already uses.

RunMeta is the typed reading side: read_run_meta (or RunMeta.of over a dict already read) checks
the shape and the statuses once, and the code after it reads attributes. meta.json itself is
still written as a dict (run_meta.MetaDocument, built up over a session), and RunMeta.raw hands it back
to code that copies it through (merge, a rank copied in).
"""
from __future__ import annotations

import json
import numbers
import os
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args
from collections.abc import Callable

from ..ground.errors import RunDirectoryError, os_error
from . import safepath
from counterprof.ground.record import record

_INT = (int,)
_NUM = (int, float)
_STR = (str,)
_NONE = (type(None),)

# top-level fields the code reads: the types each may have (None is always allowed: older runs)
META_FIELDS: dict[str, tuple[type, ...]] = {
    "id": _STR, "counterprof_version": _STR, "status": _STR, "command": (list,), "argv": (list,),
    "cwd": _STR, "host": (dict,), "gpus": (list,), "start_time": _STR, "start_ns": _INT,
    "clock_offset_ns": _INT, "end_ns": _INT, "duration_ns": _INT, "rank": _INT, "job": _STR,
    "env": (dict,), "target": (dict,), "profiler": (dict,), "collectors": (dict,),
    "ceilings": (dict,), "workload": (dict,), "warnings": (list,),
    "merged_from": (str, list),        # a merged run: its sources; a rank copied in: its source
    "git_revision": (str, dict),
}
# fields of the nested objects the code reads
NESTED: dict[str, dict[str, tuple[type, ...]]] = {
    "profiler": {"pid": _INT, "host": _STR, "cpu_s": _NUM, "max_rss_bytes": _INT},
    "host": {"hostname": _STR, "cpus": _INT, "kernel": _STR, "machine": _STR, "cpu_model": _STR},
    "target": {"kind": _STR, "pid": _INT, "system_wide": (bool,)},
    "workload": {"status": _STR, "pid": _INT, "exit_status": _INT, "exit_code": _INT,
                 "signal": (int, str), "elapsed_s": _NUM, "user_s": _NUM, "system_s": _NUM,
                 "max_rss_bytes": _INT, "forwarded_signals": (list,), "started_ns": _INT,
                 "ended_ns": _INT},
}
COLLECTOR_FIELDS: dict[str, tuple[type, ...]] = {"status": _STR, "reason": _STR, "config": (dict,)}
CATALOG_FIELDS: dict[str, tuple[type, ...]] = {"name": _STR, "unit": _STR, "kind": _STR,
                                               "description": _STR, "source": _STR}


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number" if isinstance(v, numbers.Number)
                                    else type(v).__name__)


def _ok(value: Any, types: tuple[type, ...]) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) and bool not in types:
        return False              # JSON true is not a pid
    return isinstance(value, types)


def _fields(obj: dict[str, Any], spec: dict[str, tuple[type, ...]], where: str) -> str:
    for name, types in spec.items():
        if name in obj and not _ok(obj[name], types):
            return f"{where}{name} is {_type_name(obj[name])}"
    return ""


# Ranges of the numbers the code computes with: a time is ns since the epoch between 1970 and
# 2200 (so that it, less or plus the readers' margins, stays an int64 and a date time.gmtime
# can print); a duration or clock offset no longer than that; a rank or a count of CPUs an int32.
# Any other number anywhere in the document is an int64 (or uint64: perf's configs) or a finite
# float. JSON holds numbers of any size (10**400, 1e400 read as inf): one must not become an
# OverflowError wherever it is first used.
TIME_MAX_NS = 7_258_118_400 * 10**9          # 2200-01-01
_TIME = (0, TIME_MAX_NS, "a time (ns since the epoch, 1970 to 2200)")
_SPAN = (-TIME_MAX_NS, TIME_MAX_NS, "a duration in ns (under 230 years)")
_INT32 = (0, 2**31 - 1, "0 to 2,147,483,647")
RANGES: dict[str, tuple[int, int, str]] = {
    "start_ns": _TIME, "end_ns": _TIME, "duration_ns": _SPAN, "clock_offset_ns": _SPAN,
    "rank": _INT32, "host.cpus": _INT32, "workload.started_ns": _TIME, "workload.ended_ns": _TIME,
}
_INT_LO, _INT_HI = -2**63, 2**64 - 1


def _number_text(v: Any) -> str:
    """A number for a message: a huge one by its size (str() of a 10**5000 is an error)."""
    if isinstance(v, int) and abs(v) >= 10**20:
        return f"a number of {v.bit_length()} bits"
    return repr(v)


def _range_problem(meta: dict[str, Any]) -> str:
    """The first number of meta out of its range (RANGES; int64 / finite elsewhere), said."""
    for where, (lo, hi, what) in RANGES.items():
        head, _, tail = where.partition(".")
        obj = meta.get(head) if tail else meta
        v = obj.get(tail or head) if isinstance(obj, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi:
            return f"{where} is {_number_text(v)}, not {what}"
    stack: list[tuple[str, Any]] = [("", meta)]
    while stack:          # every other number, however deep (no recursion: json caps the depth)
        path, doc = stack.pop()
        items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
        for k, v in items:
            here = f"{path}.{k}" if path and isinstance(k, str) else f"{path}[{k}]" if path else str(k)
            if isinstance(v, (dict, list)):
                stack.append((here, v))
            elif isinstance(v, bool):
                continue
            elif isinstance(v, int) and not _INT_LO <= v <= _INT_HI:
                return f"{here} is {_number_text(v)}, larger than any value counterprof writes"
            elif isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
                return f"{here} is {v!r}, not a number counterprof writes"
    return ""


def meta_problem(meta: Any) -> str:
    """Why meta is not a counterprof run's metadata ("" when it is): its shape, then its
    numbers' ranges."""
    if not isinstance(meta, dict):
        return f"it holds {_type_name(meta)}, not an object"
    problem = _fields(meta, META_FIELDS, "")
    if problem:
        return problem
    for name, spec in NESTED.items():
        if isinstance(meta.get(name), dict) and (problem := _fields(meta[name], spec, f"{name}.")):
            return problem
    for name, entry in (meta.get("collectors") or {}).items():
        if not isinstance(entry, dict):
            return f"collectors.{name} is {_type_name(entry)}"
        if problem := _fields(entry, COLLECTOR_FIELDS, f"collectors.{name}."):
            return problem
    for name in ("command", "argv", "warnings"):
        if any(not isinstance(x, str) for x in meta.get(name) or []):
            return f"{name} holds something other than strings"
    return _range_problem(meta)


def catalog_problem(catalog: Any) -> str:
    """Why catalog is not a counterprof metric catalog ("" when it is)."""
    if not isinstance(catalog, list):
        return f"it holds {_type_name(catalog)}, not an array"
    for i, entry in enumerate(catalog):
        if not isinstance(entry, dict):
            return f"entry {i} is {_type_name(entry)}"
        if not isinstance(entry.get("name"), str):
            return f"entry {i} has no name"
        if problem := _fields(entry, CATALOG_FIELDS, f"entry {i}'s "):
            return problem
    return ""


def load_json(path: Path) -> Any:
    """A JSON file of the run, shape unchecked, never read through a symbolic link."""
    try:
        with os.fdopen(safepath.open_read(path), "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        raise RunDirectoryError(f"{path.parent} is not a counterprof run (no {path.name})") from None
    except OSError as exc:
        raise os_error(exc, path, "reading it") from None
    except (ValueError, RecursionError) as exc:     # bad JSON, bad UTF-8, absurd nesting
        raise RunDirectoryError(f"{path} is corrupt: {str(exc)[:200]}") from None


META_WHAT = "a counterprof run's metadata"
META_TODO = "restore it from a copy, or move the directory aside"


def _wrong(where: str | Path, name: str, what: str, problem: str, todo: str) -> RunDirectoryError:
    return RunDirectoryError(f"{where}: {name} is not {what} ({problem}); {todo}")


def _checked(path: str | Path, problem_of: Callable[[Any], str], what: str, todo: str) -> Any:
    path = Path(path)
    doc = load_json(path)
    problem = problem_of(doc)
    if problem:
        raise _wrong(path, path.name, what, problem, todo)
    return doc


def read_meta(path: str | Path) -> dict[str, Any]:
    """A meta.json, checked: a RunDirectoryError naming the file and the field when it is not
    a counterprof run's metadata."""
    return cast("dict[str, Any]", _checked(path, meta_problem, META_WHAT, META_TODO))


def read_run_meta(path: str | Path) -> RunMeta:
    """A meta.json as a RunMeta: a RunDirectoryError naming the file and the field (or the
    status) when it is not a counterprof run's metadata."""
    path = Path(path)
    return RunMeta.from_dict(load_json(path), where=path)


def read_catalog(path: str | Path) -> list[dict[str, Any]]:
    """A catalog.json, checked like read_meta."""
    return cast("list[dict[str, Any]]", _checked(
        path, catalog_problem, "a counterprof metric catalog",
        "restore it from a copy, or move it aside (the run reads without it, its units unknown)"))


# -- the typed reading side ----------------------------------------------------------------

# the words meta.json's statuses may hold: a word outside them is a run this version cannot read
RunStatus = Literal["running", "complete", "recovered", "merged"]
# "empty": it ran and recorded nothing (torch: --torch asked, no trace came), with the reason
CollectorState = Literal["ok", "failed", "unavailable", "empty"]
EventState = Literal["counted", "not supported", "not counted", "failed"]    # perf's events
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
COLLECTOR_STATES: tuple[str, ...] = get_args(CollectorState)
EVENT_STATES: tuple[str, ...] = get_args(EventState)


def _word(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value is None or value in allowed:
        return ""
    return f"{where} is {value!r}, not one of {', '.join(allowed)}"


def status_problem(meta: dict[str, Any]) -> str:
    """Why meta's statuses are not words counterprof writes ("" when they are); meta has
    passed meta_problem."""
    problem = _word(meta.get("status"), RUN_STATUSES, "status")
    for name, entry in (meta.get("collectors") or {}).items():
        if problem:
            break
        problem = _word(entry.get("status"), COLLECTOR_STATES, f"collectors.{name}.status")
        events = entry.get("events")
        if events is None or problem:
            continue
        if not isinstance(events, dict):
            return f"collectors.{name}.events is {_type_name(events)}"
        for event, st in events.items():
            if not isinstance(st, dict):
                return f"collectors.{name}.events.{event} is {_type_name(st)}"
            if problem := _word(st.get("status"), EVENT_STATES, f"collectors.{name}.events.{event}.status"):
                break
    return problem


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


@record(frozen=True)
class PerfEventStatus:
    """One perf event's entry: counted, or why not."""
    status: EventState = "counted"      # an entry without one: counted (what summaries assume)
    reason: str = ""


@record(frozen=True)
class CollectorStatus:
    """One collector's entry under meta.json's "collectors": whether it ran, and why not."""
    name: str
    status: CollectorState | None       # None: an older entry that says nothing
    reason: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)    # the entry: the collector's own facts too

    @classmethod
    def from_entry(cls, name: str, entry: dict[str, Any]) -> CollectorStatus:
        config = entry.get("config")
        return cls(name, entry.get("status"), entry.get("reason") or "",
                   config if isinstance(config, dict) else {}, entry)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ran(self) -> bool:
        """It ran: ok, or an older entry that does not say."""
        return self.status in (None, "ok")

    @property
    def interval_ms(self) -> float | None:
        """Its sampling interval as configured (None: not a sampling collector, or unset)."""
        v = self.config.get("interval_ms")
        return float(v) if v else None

    @property
    def events(self) -> dict[str, PerfEventStatus]:
        """perf's events in the order they were asked for ({} for other collectors)."""
        return {name: PerfEventStatus(st.get("status") or "counted", st.get("reason") or "")
                for name, st in (self.raw.get("events") or {}).items()}

    def detail(self, key: str) -> Any:
        """A fact the collector itself recorded (threads: "main", "contenders")."""
        return self.raw.get(key)


@record(frozen=True)
class HostFacts:
    """meta.json's "host": the machine the run was recorded on."""
    hostname: str | None = None
    cpus: int | None = None
    kernel: str | None = None
    machine: str | None = None
    cpu_model: str | None = None


@record(frozen=True)
class ProfilerFacts:
    """meta.json's "profiler": the process that wrote the run, and its cost."""
    pid: int | None = None
    host: str | None = None
    cpu_s: float | None = None
    max_rss_bytes: int | None = None


@record(frozen=True)
class WorkloadFacts:
    """meta.json's "workload": the launched workload's life (absent for profile() runs)."""
    status: str | None = None           # "exited", "not started", "exec failed", ...: words for people
    pid: int | None = None
    exit_status: int | None = None
    exit_code: int | None = None
    signal: int | str | None = None
    elapsed_s: float | None = None
    user_s: float | None = None
    system_s: float | None = None
    max_rss_bytes: int | None = None
    started_ns: int | None = None
    ended_ns: int | None = None


_Facts = TypeVar("_Facts", "HostFacts", "ProfilerFacts", "WorkloadFacts")


def _facts(cls: type[_Facts], doc: Any) -> _Facts:
    """A facts dataclass from a nested object already checked by meta_problem (its own
    fields only; missing or absent: None)."""
    if not isinstance(doc, dict):
        return cls()
    return cls(**{k: doc.get(k) for k in cls.__dataclass_fields__})


@record(frozen=True)
class RunMeta:
    """A run's meta.json, checked once: the fields counterprof reads, typed. Build it with
    read_run_meta(path) or RunMeta.of(dict); `raw` is the document itself."""
    raw: dict[str, Any]
    id: str | None
    status: RunStatus | None
    command: list[str] | None
    start_time: str | None
    start_ns: int | None
    end_ns: int | None
    duration_ns: int | None
    rank: int | None
    job: str | None
    counterprof_version: str | None
    cwd: str | None
    env: dict[str, Any]
    host: HostFacts
    profiler: ProfilerFacts
    workload: WorkloadFacts
    collectors: dict[str, CollectorStatus]
    ranks: dict[str, Any]               # per-rank runs and merges: rank -> its entry
    ceilings: dict[str, Any] | None
    git_revision: str | dict[str, Any] | None
    warnings: list[str]

    @classmethod
    def from_dict(cls, doc: Any, where: str | Path = "meta.json") -> RunMeta:
        """doc checked: a RunDirectoryError naming `where` and the wrong field (or status)."""
        problem = meta_problem(doc) or status_problem(doc)
        if problem:
            raise _wrong(where, "meta.json", META_WHAT, problem, META_TODO)
        ranks, env = doc.get("ranks"), doc.get("env")
        return cls(
            raw=doc, id=doc.get("id"), status=doc.get("status"), command=doc.get("command"),
            start_time=doc.get("start_time"), start_ns=doc.get("start_ns"), end_ns=doc.get("end_ns"),
            duration_ns=doc.get("duration_ns"), rank=doc.get("rank"), job=doc.get("job"),
            counterprof_version=doc.get("counterprof_version"), cwd=doc.get("cwd"),
            env=env or {}, host=_facts(HostFacts, doc.get("host")),
            profiler=_facts(ProfilerFacts, doc.get("profiler")),
            workload=_facts(WorkloadFacts, doc.get("workload")),
            collectors={name: CollectorStatus.from_entry(name, entry)
                        for name, entry in (doc.get("collectors") or {}).items()},
            ranks=ranks if isinstance(ranks, dict) else {}, ceilings=doc.get("ceilings"),
            git_revision=doc.get("git_revision"), warnings=list(doc.get("warnings") or []))

    @classmethod
    def of(cls, meta: RunMeta | dict[str, Any]) -> RunMeta:
        """meta as a RunMeta: itself, or a dict checked (callers still holding Run.meta's dict)."""
        return meta if isinstance(meta, RunMeta) else cls.from_dict(meta)

    def collector(self, name: str) -> CollectorStatus | None:
        return self.collectors.get(name)

    @property
    def records_git_revision(self) -> bool:
        """The run recorded its git revision (None there: not a checkout); runs from before
        counterprof recorded it lack the key."""
        return "git_revision" in self.raw

    @property
    def path(self) -> str:
        """The run's path, where an older meta.json recorded it ("" otherwise)."""
        return _str(self.raw.get("path")) or ""
