"""A run's Roofline: its ceilings chosen, its spans read (what `roofline`, `report`, `compare`,
`history` and the live MFU share).

Ceilings: the file given (`calibrate --json` output), else the ones the run copied from its
host's `counterprof calibrate` at its start (meta.json "ceilings", written by the session when
the run starts; null: there were none then), else (GPUs) the datasheet for the device the trace
names. A run keeps the ceilings it started with: a later `counterprof calibrate` changes no
run's roofline or verdict. Only a run from before counterprof copied them (no "ceilings" key in
its meta.json) recorded on this host falls back to this host's cache as it is today, and a
note says so. None: the ops are listed without bounds, and a note says so.
"""
from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..store.meta import RunMeta

if TYPE_CHECKING:
    from .roofline import Roofline
    from ..store.op_rows import OpRows
    from ..store.reader import Run

Doc = dict[str, Any]      # a ceilings document (`counterprof calibrate --json`, a datasheet entry)

# how the note of a run without a copy of its ceilings begins (renderers show it in front)
TODAYS = "ceilings from this host's cache as it is today"


def run_roofline(run: Run, spans: Any, rank: int | None = None, file_docs: dict[str, Doc] | None = None,
                 keep_atoms: bool = True, keep_calls: bool = False) -> Roofline:
    """The Roofline of a run's spans (a spans table, or the run's RunQuery: read in batches),
    with the ceilings chosen as the module docstring says (what `report` calls too)."""
    return spans_roofline(spans, run.meta if rank is None else run.rank_meta(rank), file_docs, rank, keep_atoms,
                          keep_calls)


def spans_roofline(spans: Any, meta: dict[str, Any], file_docs: dict[str, Doc] | None = None,
                   rank: int | None = None, keep_atoms: bool = True, keep_calls: bool = False) -> Roofline:
    """The Roofline of spans with the ceilings chosen from meta (a run's meta.json: its copied
    ceilings, its host) as the module docstring says (the live view's MFU calls it too)."""
    from .roofline import roofline
    from ..calibrate import datasheet
    from ..store.op_rows import OpRows
    src = OpRows.of(spans, rank)
    try:
        gpu, device_name = _device(src)
        ceilings, note = choose_ceilings(gpu, device_name, file_docs, meta)
        sheet = datasheet.lookup(device_name) if gpu else None
        r = roofline(src, ceilings, device=device_name if gpu else "cpu", datasheet=sheet, keep_atoms=keep_atoms,
                     origin=note or None, keep_calls=keep_calls)
    finally:
        src.close()
    return r


def roofline_if_ops(run: Run, spans: Any, warn: Callable[[str], None]) -> Roofline | None:
    """run_roofline of a run that has torch ops (None without any). Its failure is said through
    warn and costs nothing else: the roofline is evidence for report, compare and history."""
    import pyarrow as pa
    import pyarrow.compute as pc
    try:
        if isinstance(spans, pa.Table):
            if not spans.num_rows or not pc.any(pc.is_in(spans.column("category").cast("string"), value_set=pa.array(
                    ["cpu_op", "kernel", "xla_op"]))).as_py():
                return None
            return run_roofline(run, spans)
        # a RunQuery: asked, not read (a file found damaged is left out and the question asked again)
        if "spans" not in spans.tables or not spans.run(lambda: spans.con.sql(
                "SELECT 1 FROM spans WHERE category::VARCHAR IN ('cpu_op', 'kernel', 'xla_op') LIMIT 1").fetchall()):
            return None
        return cast("Roofline", spans.run(lambda: run_roofline(run, spans)))
    except Exception as exc:
        warn(f"roofline left out: {type(exc).__name__}: {exc}")
        return None


def _device(src: OpRows) -> tuple[bool, str | None]:
    """(GPU work in the spans?, the GPU's name as the trace's deviceProperties give it)."""
    gpu = src.has_kernels()
    name = None
    marks = src.marks()
    for cat, attrs in zip(marks.column("category").to_pylist(), marks.column("attrs").to_pylist()):
        if cat != "window":
            continue
        try:
            devices = json.loads(attrs or "{}").get("devices") or []
        except ValueError:
            continue
        if devices:
            name = devices[0]
            break
    return gpu, name


def _pick(docs: dict[str, Doc] | None, gpu: bool, name: str | None) -> Doc | None:
    if not docs:
        return None
    if not gpu:
        return docs.get("cpu") or next((d for d in docs.values() if d.get("kind") == "cpu"), None) \
            or (next(iter(docs.values())) if len(docs) == 1 else None)
    gpus = [d for d in docs.values() if d.get("kind") != "cpu"]
    for d in gpus:
        if name and name in (d.get("device"), d.get("device_name")):
            return d
    return gpus[0] if gpus else None


def choose_ceilings(gpu: bool, name: str | None, file_docs: dict[str, Doc] | None,
                    meta: RunMeta | dict[str, Any]) -> tuple[Doc | None, str]:
    """The ceilings document for the run's device, and a note saying where it came from."""
    doc = _pick(file_docs, gpu, name)
    if doc is not None:
        return doc, f"ceilings from the file given ({doc.get('device')})"
    m = RunMeta.of(meta)
    doc = _pick(m.ceilings, gpu, name)
    if doc is not None:
        return doc, "ceilings copied into the run at its start, from `counterprof calibrate` on its host"
    snapshot = "ceilings" in m.raw          # the run copied what there was at its start (null: none)
    recorded_on = m.host.hostname
    if not snapshot and recorded_on and recorded_on == socket.gethostname():
        from ..calibrate import cached
        doc = _pick(cached(), gpu, name)
        if doc is not None:
            return doc, (f"{TODAYS} (measured {doc.get('measured_at')}), not the ones in force when the run "
                         "started: the run is older than counterprof's copy of them, and a later "
                         "`counterprof calibrate` changes this roofline")
    if gpu:
        from ..calibrate import datasheet
        doc = datasheet.lookup(name)
        if doc is not None:
            return doc, f"ceilings from the datasheet of {doc['datasheet_entry']} ({doc['reference']})"
        return None, (f"no datasheet entry for the device {name!r}: pass --ceilings FILE" if name
                      else "the trace names no device: pass --ceilings FILE")
    if snapshot and recorded_on:
        return None, ("no ceilings when this run started (`counterprof calibrate` had saved none on "
                      f"{recorded_on}), and a run keeps the ceilings it started with: run `counterprof "
                      "calibrate` before the next run, or hold this one to a file (--ceilings FILE)")
    return None, "no ceilings: run `counterprof calibrate` on the machine that ran it (or pass --ceilings FILE)"
