"""Neuron Explorer profile directories -> a run directory (`counterprof import`).

Each profile directory (one NeuronCore's device profile, with its system profile when Explorer
processed both) is read by explorer.py and written as one spans file and one samples file of
its rank; a new run gets its meta.json and catalog here, and `into` an existing, finished run
adds the files beside what is there (its meta.json lists the import, its catalog gains the
profile's metrics). Files are written under temporary names and renamed in once every profile
is read, so a run never holds half an import.

Ranks: --rank's value for one profile; for several, --rank plus each NeuronCore's place in the
order of (device, core) the profiles name (Metadata.neuron_device_idx, neuroncore_idx).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from counterprof import __version__
from counterprof.ground.errors import CounterprofError, RunDirectoryError, os_error
from counterprof.ground.record import record
from counterprof.ground.schema import SAMPLES_SCHEMA, SPANS_SCHEMA
from counterprof.store import rundir
from counterprof.store.meta import read_meta
from counterprof.store.parquet_writer import write_file

from ..torch_trace import importer as kineto
from . import explorer
from .profile_dirs import find_profiles  # noqa: F401  (import_trace's way in)


@record
class ImportedNeuronProfile(kineto.ImportedTrace):
    """What `counterprof import` reports of one Neuron Explorer profile directory."""

    source: str = "neuron"
    version: str = ""
    core: str = ""
    alignment: dict[str, Any] | None = None
    samples_tmp: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "source": "neuron_explorer", "schema_version": self.version,
                "neuroncore": self.core, "alignment": self.alignment}


def import_profiles(dirs: list[Path], run: str | os.PathLike[str], *, replace: bool = False, into: bool = False,
                    default_rank: int = 0, command: list[str] | None = None,
                    on_trace: Callable[[Any], None] | None = None) -> list[ImportedNeuronProfile]:
    """Read each profile directory and write it into `run`: a new run (replace: over a finished
    one), or with into=True beside what an existing finished run holds."""
    run_path = Path(run)
    if into:
        _check_into(run_path)
    profiles = [ImportedNeuronProfile(str(d)) for d in dirs]
    read: dict[int, explorer.Profile] = {}
    for trace in profiles:
        t0 = time.perf_counter()
        try:
            p = explorer.read_profile(trace.path)
        except explorer.NeuronProfileError as exc:
            trace.failed = str(exc)
        else:
            read[id(trace)] = p
            trace.version, trace.core = p.version, f"neuron:{p.device}/core:{p.core}"
            trace.problems = list(p.problems)
            trace.spans = p.spans.num_rows
            trace.gpu_spans = sum(p.counts.get(n, 0) for n in ("Instruction", "DmaPacket", "CcOp"))
            trace.events = trace.spans
            trace.window = p.window
            trace.alignment = p.alignment.to_json()
        trace.seconds = time.perf_counter() - t0
    cores = sorted({(p.device, p.core) for p in read.values()})
    for trace in profiles:
        got = read.get(id(trace))
        if got is None:
            trace.rank = default_rank
        elif len(cores) == 1:
            trace.rank, trace.rank_source = default_rank, "--rank" if default_rank else "default"
        else:
            trace.rank = default_rank + cores.index((got.device, got.core))
            trace.rank_source = f"order of the NeuronCores (neuron:{got.device}/core:{got.core})"
    for trace in profiles:
        if on_trace is not None:
            on_trace(trace)
    if not read:
        raise CounterprofError("nothing could be imported" + ("" if on_trace is not None else ": " + "; ".join(
            f"{t.path}: {t.failed}" for t in profiles)))
    existed = run_path.exists()
    if not into:
        run_path = rundir.create(run_path, replace=replace)
    elif not replace:
        again = [t.path for t in profiles if not t.failed and t.rank is not None and any(
            (run_path / table / rundir.rank_name(t.rank) / _file_name(t, table)).exists()
            for table in ("spans", "samples"))]
        if again:
            raise RunDirectoryError(f"{run_path} already holds the import of {', '.join(again)}: pass --force to "
                                    "replace it (its spans would count twice otherwise)")
    try:
        for i, trace in enumerate(profiles):
            prof = read.get(id(trace))
            if prof is None:
                continue
            trace.tmp = run_path / f".import-neuron-{os.getpid()}-{i}.spans.tmp"
            _write(trace.tmp, SPANS_SCHEMA, prof.spans)
            if prof.samples.num_rows:
                trace.samples_tmp = run_path / f".import-neuron-{os.getpid()}-{i}.samples.tmp"
                _write(trace.samples_tmp, SAMPLES_SCHEMA, prof.samples)
        for trace in profiles:
            assert trace.rank is not None
            for tmp, table in ((trace.tmp, "spans"), (trace.samples_tmp, "samples")):
                if tmp is not None:
                    os.replace(tmp, rundir.dataset_dir(run_path, table, trace.rank) / _file_name(trace, table))
            trace.tmp = trace.samples_tmp = None
    except BaseException as exc:
        for trace in profiles:
            for tmp in (trace.tmp, trace.samples_tmp):
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
        if not existed and not into:
            rundir.abandon(run_path)
        if isinstance(exc, OSError):
            raise os_error(exc, run_path, "importing the Neuron profiles",
                           kept="nothing (the part-files were removed)") from None
        raise
    try:
        (_add_meta if into else _write_meta)(run_path, profiles, command)
    except OSError as exc:
        raise os_error(exc, run_path, "writing meta.json",
                       kept="the converted spans (`counterprof import --force` again once there is space)") from None
    return profiles


def _file_name(trace: ImportedNeuronProfile, table: str) -> str:
    """The same name for the same profile of the same NeuronCore (a second import replaces
    it), as a run names its files: <table>-<writer>.parquet."""
    name = f"neuron-{Path(trace.path).resolve().name}-{trace.core}"
    return f"{table}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".parquet"


def _check_into(run: Path) -> None:
    if not rundir.is_run(run):
        raise RunDirectoryError(f"{run} is not a run directory (no meta.json): --into adds to a finished run; "
                                "to make a new one, use -o")
    meta = read_meta(run / rundir.META)
    if meta.get("status") not in ("complete", "failed", "interrupted"):
        raise RunDirectoryError(f"{run} is still being written (status {meta.get('status')!r}): wait for it to "
                                "finish, or `counterprof recover` it, then import into it")


def _write(target: Path, schema: pa.Schema, table: pa.Table) -> None:
    # the profile's metrics and their units, in the file itself (its catalog.json comes after)
    write_file(target, schema, [table.cast(schema)], row_group_size=kineto.ROW_GROUP_ROWS, compression="zstd",
               catalog={m.name: m.to_json() for m in explorer.METRICS})


def _collector(profiles: list[ImportedNeuronProfile]) -> dict[str, Any]:
    ok = [t for t in profiles if not t.failed]
    return {"status": "ok" if ok else "failed", "reason": "" if ok else "no profile could be read",
            "config": {"imported": len(ok), "files": len(profiles),
                       "schema_versions": sorted({t.version for t in ok}),
                       "alignment": [t.alignment for t in ok]}}


def _catalog() -> list[dict[str, Any]]:
    return [m.to_json() for m in explorer.METRICS]


def _write_meta(run_path: Path, profiles: list[ImportedNeuronProfile], command: list[str] | None) -> None:
    windows = [t.window for t in profiles if t.window and not t.failed]
    start = min((w[0] for w in windows), default=None)
    end = max((w[1] for w in windows), default=None)
    imported = [t for t in profiles if not t.failed]
    meta = {
        "id": run_path.name, "counterprof_version": __version__, "status": "complete", "source": "import",
        "command": command, "argv": list(sys.argv), "cwd": os.getcwd(), "start_ns": start, "end_ns": end,
        "duration_ns": end - start if start is not None and end is not None else None,
        "rank": min((t.rank for t in imported if t.rank is not None), default=0),
        "traces": [t.to_json() for t in profiles],
        "collectors": {"neuron_explorer": _collector(profiles)},
        "warnings": [f"{t.path}: {p}" for t in profiles for p in t.problems],
    }
    rundir.write_json(run_path / rundir.META, meta)
    rundir.write_json(run_path / rundir.CATALOG, _catalog())


def _add_meta(run_path: Path, profiles: list[ImportedNeuronProfile], command: list[str] | None) -> None:
    """The import, added to a finished run's meta.json and catalog (their other entries kept)."""
    meta = read_meta(run_path / rundir.META)
    # the run's span takes in the profiles (a reader leaves out rows outside it); one far from
    # the run's own time is said: was it taken beside this run?
    windows = [t.window for t in profiles if t.window and not t.failed]
    a, b = meta.get("start_ns"), meta.get("end_ns")
    problems = []
    if isinstance(a, int) and isinstance(b, int):
        for t in profiles:
            if t.window and not t.failed and (t.window[1] < a - 60_000_000_000 or t.window[0] > b + 60_000_000_000):
                problems.append(f"{t.path}: the profile lies more than a minute outside the run's own time: was it "
                                "taken beside this run? (its spans are kept where they fall)")
    if windows:
        meta["start_ns"] = min([w[0] for w in windows] + ([a] if isinstance(a, int) else []))
        meta["end_ns"] = max([w[1] for w in windows] + ([b] if isinstance(b, int) else []))
        meta["duration_ns"] = meta["end_ns"] - meta["start_ns"]
    meta["traces"] = [*(meta.get("traces") or []), *[t.to_json() for t in profiles]]
    collectors = dict(meta.get("collectors") or {})
    collectors["neuron_explorer"] = _collector(profiles)
    meta["collectors"] = collectors
    meta["warnings"] = [*(meta.get("warnings") or []), *problems,
                        *[f"{t.path}: {p}" for t in profiles for p in t.problems]]
    meta.setdefault("imports", []).append({"command": command, "profiles": [t.path for t in profiles]})
    rundir.write_json(run_path / rundir.META, meta)
    path = run_path / rundir.CATALOG
    try:
        catalog = json.loads(path.read_text()) if path.exists() else []
    except (OSError, ValueError):
        catalog = []
    have = {(m.get("source"), m.get("name")) for m in catalog if isinstance(m, dict)}
    catalog += [m for m in _catalog() if (m["source"], m["name"]) not in have]
    rundir.write_json(path, catalog)
