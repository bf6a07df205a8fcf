"""A run set: the N runs of one `counterprof run -r N`, kept together as one directory.

    SET/runset.json        what was repeated, the members in order, each one's exit status,
                           and the summary over them (means and standard deviations)
    SET/run-1/ ... run-N/  ordinary run directories, each readable on its own

Why this shape: every member stays a complete run (report, export, Run() take it as it is,
whatever layout runs have), and one path names the whole set, so `compare SET_A SET_B` takes
each set as the runs of one side and `history add SET` adds its runs in order. The set file
has its own name, not meta.json, so nothing mistakes a set for one run.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from collections.abc import Iterable

SET_FILE = "runset.json"
MEMBER_PREFIX = "run-"


def is_set(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / SET_FILE).is_file()


def member_name(i: int) -> str:
    """The directory of the i-th repetition (1-based)."""
    return f"{MEMBER_PREFIX}{i}"


def read_set(path: str | os.PathLike[str]) -> dict[str, Any]:
    from .ground.errors import RunDirectoryError
    from .store.safepath import open_read
    f = Path(path) / SET_FILE
    try:
        with os.fdopen(open_read(f), "rb") as fh:     # never through a link
            data = json.loads(fh.read())
    except FileNotFoundError:
        raise RunDirectoryError(f"{path} is not a run set (no {SET_FILE})") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirectoryError(f"{f} is unreadable: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise RunDirectoryError(f"{f} is not a counterprof run set (no list of runs)")
    return data


def members(path: str | os.PathLike[str]) -> list[Path]:
    """The set's runs in the order they ran (only those that exist: a set cut short by
    Ctrl-C lists the runs it finished)."""
    from .store.rundir import is_run
    base = Path(path)
    return [base / name for name in read_set(base)["runs"] if is_run(base / name)]


def expand(paths: Iterable[str]) -> list[str]:
    """Run directories from paths that may name sets: each set becomes its runs, in order."""
    out: list[str] = []
    for p in paths:
        out.extend(str(m) for m in members(p)) if is_set(p) else out.append(p)
    return out


def write_set(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write SET/runset.json atomically (a reader never sees half of it)."""
    from .store.rundir import write_json
    write_json(Path(path) / SET_FILE, data)


def prepare_dir(path: str | os.PathLike[str], replace: bool) -> Path:
    """Create the set's directory. An existing set is replaced only with replace=True (its
    member runs and set file, nothing else); a run or any other non-empty directory is refused."""
    from .ground.errors import RunDirectoryError
    from .store import safepath
    from .store.rundir import is_run, remove_run
    base = Path(path)
    if base.exists():
        if not base.is_dir():
            raise RunDirectoryError(f"{base} exists and is not a directory; choose another -o")
        if is_run(base):
            raise RunDirectoryError(f"{base} holds a single run, not a run set; choose another -o")
        if is_set(base):
            if not replace:
                raise RunDirectoryError(f"{base} already holds a run set; choose another -o, "
                                        "or pass --force to replace it")
            # a member is deleted only as a finished run of counterprof's own (rundir.remove_run:
            # never through a link, never a directory counterprof did not make)
            for child in sorted(base.iterdir()):
                if child.name.startswith(MEMBER_PREFIX) and safepath.is_link(child):
                    raise safepath.LinkInRun(child, "nothing was replaced")
            for child in sorted(base.iterdir()):
                if child.name.startswith(MEMBER_PREFIX) and safepath.plain_dir(child) and is_run(child):
                    remove_run(child)
            (base / SET_FILE).unlink()
        if any(base.iterdir()):
            raise RunDirectoryError(f"{base} is not empty and is not a run set; choose another -o")
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise RunDirectoryError(f"cannot create run set directory {base}: {exc.strerror}") from exc
    return base
