"""Which directories are Neuron Explorer profiles, and their tables' files: the standard
library only, so that `counterprof import` of a Kineto trace loads nothing of the Neuron
reader (explorer.py, pyarrow's compute and parquet) to find that none was given."""
from __future__ import annotations

import os
import re
from pathlib import Path


def is_profile_dir(path: str | Path) -> bool:
    """A directory Neuron Explorer wrote: its Metadata table and one of its timelines."""
    p = Path(path)
    if not p.is_dir():
        return False
    names = {_table_of(f.name) for f in p.glob("*.parquet")}
    return "Metadata" in names and bool(names & {"Instruction", "DmaPacket", "CcOp", "Summary"})


def _table_of(filename: str) -> str:
    stem = filename[:-len(".parquet")]
    m = re.fullmatch(r"(.+?)_(\d+)", stem)
    return m.group(1) if m else stem


def table_files(path: Path) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for f in sorted(path.glob("*.parquet"), key=lambda f: (_table_of(f.name), _part(f.name))):
        out.setdefault(_table_of(f.name), []).append(f)
    return out


def _part(filename: str) -> int:
    m = re.fullmatch(r".+?_(\d+)\.parquet", filename)
    return int(m.group(1)) if m else -1



def find_profiles(paths: list[str | os.PathLike[str]]) -> tuple[list[Path], list[str | os.PathLike[str]]]:
    """(Neuron Explorer profile directories among paths, or one level below a directory given;
    the other paths)."""
    found: list[Path] = []
    rest: list[str | os.PathLike[str]] = []
    for p in paths:
        path = Path(p)
        if is_profile_dir(path):
            found.append(path)
        elif path.is_dir() and (subs := sorted(d for d in path.iterdir() if is_profile_dir(d))):
            found += subs
        else:
            rest.append(p)
    return found, rest
