"""Finishing a run a killed profiler left: compact its journal, let each collector finish what
it left on disk (the torch collector's unconverted traces), mark it recovered.

`recover()` is the one recovery: `counterprof recover` calls it, and so does every subcommand
that reads a run (report, export, compare, ... through cli/common.open_run) when the profiler
that wrote it is gone."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ground.errors import RunDirectoryError
from .store import rundir, safepath
from .store.compact import CompactionReport, compact_rank
from .store.liveness import profiler_alive, profiler_on_this_host
from .store.meta import read_meta


@dataclass
class Recovery:
    """What recover() did: the journal's compaction, then what each collector finished."""

    compaction: CompactionReport
    lines: list[str] = field(default_factory=list)     # "<collector>: what it did", one each
    failed: list[str] = field(default_factory=list)    # "<collector>: why it could not finish"


def _metas(path: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The run's meta.json and those of the ranks that joined it."""
    out = [(path / rundir.META, read_meta(path / rundir.META))]
    for _rank, d in rundir.rank_dirs(path):
        own = d / rundir.META
        if safepath.plain_file(own):
            try:
                out.append((own, read_meta(own)))
            except RunDirectoryError:
                continue
    return out


def recover(path: str | os.PathLike[str], force: bool = False) -> Recovery:
    """Compact every partition's journal, then run each collector's recover(run) (torch traces
    not converted yet), then mark the run and its ranks recovered. Safe to repeat and to
    interrupt: the status changes last, so an interrupted recovery is finished by the next
    reader, and a later `counterprof recover` still converts what was left pending."""
    path = Path(path)
    meta = read_meta(path / rundir.META)
    if profiler_alive(meta) and not force:
        prof = meta["profiler"]
        raise RunDirectoryError(
            f"{path} is still being written by counterprof (pid {prof.get('pid')} on "
            f"{prof.get('host')}); stop it first, or pass --force")
    result = Recovery(CompactionReport())
    for _rank, d in rundir.rank_dirs(path):
        compact_rank(d, result.compaction, force=force)
    from .collector import registry
    for name, cls in sorted(registry().items()):
        if isinstance(cls, Exception):
            continue
        try:
            result.lines += [f"{name}: {line}" for line in cls.recover(path)]
        except Exception as exc:      # one collector's leftovers must not stop the others'
            result.failed.append(f"{name}: could not finish what the profiler left "
                                 f"({type(exc).__name__}: {exc}); run `counterprof recover {path}` "
                                 "again")
    if result.failed:
        return result                # still "running": the next reader tries again
    for own, rank_meta in _metas(path)[1:]:      # ranks that joined the run keep their own meta
        elsewhere = not profiler_on_this_host(rank_meta)
        if rank_meta.get("status") == "running" and (not profiler_alive(rank_meta) or (force and elsewhere)):
            rank_meta["status"] = "recovered"
            rundir.write_json(own, rank_meta)
    if meta.get("status") == "running":
        meta["status"] = "recovered"
        lost = meta.get("journal_failed")
        missing = (f"samples after {lost.get('after_s')} s are missing: the journal could not be "
                   f"written ({lost.get('reason')})" if isinstance(lost, dict)
                   else "what it had read was kept up to its last tick, or its last second where "
                        "its samples were not spilled (below -I 100, a live view)")
        meta.setdefault("warnings", []).append(
            "the profiler stopped without finishing; the run was recovered afterwards (journal "
            f"compacted, unconverted torch traces converted; {missing})")
        rundir.write_json(path / rundir.META, meta)
        for own in [path] + [d for _r, d in rundir.rank_dirs(path)]:
            (own / rundir.RESERVE).unlink(missing_ok=True)     # the space a killed profiler kept
    return result


def needs_recovery(meta: dict[str, Any]) -> bool:
    return meta.get("status") == "running" and not profiler_alive(meta)


def run_needs_recovery(path: str | os.PathLike[str]) -> bool:
    """A profiler of the run (its creator, or a rank that joined it) died while writing, and
    none is still writing (a live one compacts every partition when it stops)."""
    metas = [m for _, m in _metas(Path(path))]
    if any(profiler_alive(m) for m in metas):
        return False
    return any(needs_recovery(m) for m in metas)
