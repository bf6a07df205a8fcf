"""Reading meta.json and catalog.json: the one place their shape is checked.

A run directory is input like any other: a file of the wrong shape (`[]`, `"hello"`, a field of
the wrong type, written by hand or by another tool) must be one clear error, not a traceback
wherever the field is first used. Every reader of a run's metadata (Run.meta, Run.rank_meta,
Run.catalog, recovery, compaction) goes through read_meta / read_catalog, which check what the
rest of counterprof relies on and hand back the plain dict (list) it already uses.
"""
from __future__ import annotations

import json
import numbers
import os
from pathlib import Path
from typing import Any

from ..errors import RunDirectoryError, os_error
from . import safepath

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


def _fields(obj: dict, spec: dict[str, tuple[type, ...]], where: str) -> str:
    for name, types in spec.items():
        if name in obj and not _ok(obj[name], types):
            return f"{where}{name} is {_type_name(obj[name])}"
    return ""


def meta_problem(meta: Any) -> str:
    """Why meta is not a counterprof run's metadata ("" when it is)."""
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
    return ""


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
        raise os_error(exc, path, "read") from None
    except (ValueError, RecursionError) as exc:     # bad JSON, bad UTF-8, absurd nesting
        raise RunDirectoryError(f"{path} is corrupt: {str(exc)[:200]}") from None


def _checked(path: str | Path, problem_of, what: str, todo: str) -> Any:
    path = Path(path)
    doc = load_json(path)
    problem = problem_of(doc)
    if problem:
        raise RunDirectoryError(f"{path}: {path.name} is not {what} ({problem}); {todo}")
    return doc


def read_meta(path: str | Path) -> dict[str, Any]:
    """A meta.json, checked: a RunDirectoryError naming the file and the field when it is not
    a counterprof run's metadata."""
    return _checked(path, meta_problem, "a counterprof run's metadata",
                    "restore it from a copy, or move the directory aside")


def read_catalog(path: str | Path) -> list[dict[str, Any]]:
    """A catalog.json, checked like read_meta."""
    return _checked(path, catalog_problem, "a counterprof metric catalog",
                    "restore it from a copy, or move it aside (the run reads without it, its "
                    "units unknown)")
