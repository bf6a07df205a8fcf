"""One run from the runs of several hosts (or jobs): `counterprof merge`.

Each input's rank partitions (its tables' files and its own folder) are copied into the output,
in the current layout whatever the input's (a rank may come from one input only); each keeps
the meta.json of the process that wrote it (its host, its collectors), and the catalogs are
merged, so a report of the output sees every rank, estimates the hosts' clock skew from
collective end times, and finds the stragglers across hosts.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import safepath
from .compact import LOCK
from ..ground.errors import UsageError


class MergeConflict(UsageError):
    """The inputs cannot be merged as given: they overlap the output, or share a rank."""


@dataclass
class MergeResult:
    path: Path           # the merged run
    ranks: int
    runs: int
    hosts: list[str]


def merge_runs(inputs: list[str], output: str, replace: bool = False) -> MergeResult:
    """Merge the runs at inputs into a new run at output (replace: one already there). Inputs
    that overlap the output, or share a rank, are a MergeConflict; an input with an unfinished
    journal, or none with a rank partition, a RunDirectoryError; all before anything is written."""
    from ..ground.errors import RunDirectoryError
    from . import rundir
    from .journal import segments
    from .reader import Run
    from .meta import read_meta
    from .run_files import table_parquet

    runs = [Run(r) for r in inputs]
    # every link resolved (realpath, unlike Path.resolve, does not raise on a loop of links)
    target = Path(os.path.realpath(output))
    for run in runs:      # before anything is written: a copy into its own input never ends
        src = Path(os.path.realpath(run.path))
        if target == src or src in target.parents or target in src.parents:
            where = ("is" if target == src else "is inside" if src in target.parents else "contains")
            raise MergeConflict(f"-o {output} {where} the input run {run.path}: merging into "
                             "it would copy the run into itself (or replace it); choose an -o "
                             "outside every input")
    owner: dict[int, Path] = {}
    for run in runs:
        own = dict(rundir.rank_dirs(run.path))
        for rank in run.ranks():
            if rank in owner:
                raise MergeConflict(f"rank {rank} is in both {owner[rank]} and {run.path}: merge runs "
                                 "of different ranks (one per host of one job)")
            if rank in own and segments(own[rank]):
                raise RunDirectoryError(f"{run.path} has an unfinished journal (rank {rank}): run "
                                        f"`counterprof recover {run.path}` first")
            owner[rank] = run.path
    if not owner:
        raise RunDirectoryError("none of the runs holds a rank partition")
    for run in runs:      # every meta.json checked (shape, numbers' ranges) before -o is made
        read_meta(run.path / rundir.META)
        for rank in run.ranks():
            run.rank_meta(rank)
    out = rundir.create(output, replace=replace)

    catalog: dict[str, dict[str, Any]] = {}
    ranks_meta: dict[str, dict[str, Any]] = {}
    for run in runs:
        for m in run.catalog.values():
            catalog.setdefault(m["name"], m)
        own = dict(rundir.rank_dirs(run.path))
        for rank in run.ranks():
            meta = run.rank_meta(rank)
            dest = rundir.rank_dir(out, rank)
            if rank in own:     # its traces and files; the tables' files go to their datasets
                _copy_own_files(own[rank], dest, out)
            for table in rundir.TABLE_NAMES:     # a file in the wrong table's folder: named, not copied
                for _r, f in table_parquet(run.path, table, rank):
                    _copy_file(f, rundir.dataset_dir(out, table, rank) / f.name)
            rundir.write_json(dest / rundir.META, {**meta, "merged_from": str(run.path)})
            ranks_meta[str(rank)] = {"host": (meta.get("host") or {}).get("hostname"),
                                     "run": str(run.path), "status": meta.get("status")}
    # the run-level facts of the input that started first: the merged run's start (the export's
    # and the report's time 0) is then before every rank's data, whatever the argument order
    metas = [r.meta for r in runs]
    first = min(metas, key=lambda m: m.get("start_ns") or float("inf"))
    ends = [m["end_ns"] for m in metas if isinstance(m.get("end_ns"), int)]
    if ends and isinstance(first.get("start_ns"), int):
        first = {**first, "end_ns": max(ends), "duration_ns": max(ends) - first["start_ns"]}
    hosts = sorted({v["host"] for v in ranks_meta.values() if v["host"]})
    merged = {**first, "id": out.name, "status": "merged", "merged_from": [str(r.path) for r in runs],
              "ranks": ranks_meta, "hosts": hosts}
    rundir.write_json(out / rundir.META, merged)
    rundir.write_json(out / rundir.CATALOG, sorted(catalog.values(), key=lambda m: (m.get("source", ""), m["name"])))
    return MergeResult(out, len(owner), len(runs), hosts)


def _copy_own_files(src: Path, dest: Path, out: Path) -> None:
    """A rank's own folder (traces, steps files, ...) without its journal, locks and Parquet
    files: regular files only. A link is skipped and named, never copied as what it points at
    (a run's `rank=0/x -> /etc/shadow` must not come out of merge as a file holding its bytes)."""
    from . import rundir
    for top, dirs, names in os.walk(src):          # links to folders are listed, not entered
        here = Path(top)
        for d in list(dirs):
            if safepath.is_link(here / d) or (here == src and d == rundir.JOURNAL):
                if safepath.is_link(here / d):
                    safepath.skipped_link(here / d)
                dirs.remove(d)
        for name in names:
            f = here / name
            if name == LOCK or name.endswith(".parquet") or not safepath.plain_file(f):
                continue
            target = dest / f.relative_to(src)
            rundir.make_dirs(target.parent, out)
            _copy_file(f, target)


def _copy_file(src: Path, target: Path) -> None:
    """One file, 0600 like every file of a run (never through a link at either end)."""
    with os.fdopen(safepath.open_read(src), "rb") as r, os.fdopen(safepath.create_new(target), "wb") as w:
        shutil.copyfileobj(r, w, 1 << 20)
    st = os.stat(src)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
