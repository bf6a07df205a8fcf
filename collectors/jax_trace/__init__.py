"""jax collector: JAX (XProf) profiles -> spans.

convert.py turns what jax.profiler writes into spans; importer.py brings such profiles into a
run (`counterprof import`); collector.py is `counterprof run --jax`.

This module only tells JAX profile files from other traces by their names and places (and the
first bytes of a lone JSON trace), with the standard library alone: `counterprof import` asks
it about every path before it knows which converter to load.

What jax.profiler.trace(dir) / start_trace(dir) + stop_trace() write:
    dir/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.xplane.pb      (XSpace protobuf)
    dir/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.trace.json.gz  (Chrome trace of it)
    dir/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/perfetto_trace.json.gz (create_perfetto_trace=True)
"""
from __future__ import annotations

import os
import re
from pathlib import Path

XPLANE_SUFFIX = ".xplane.pb"
JSON_SUFFIX = ".trace.json.gz"
PERFETTO_NAME = "perfetto_trace.json.gz"
# the session folder's name: the local time jax wrote the profile at, to the second
STAMP = re.compile(r"^(\d{4})_(\d{2})_(\d{2})_(\d{2})_(\d{2})_(\d{2})$")
# torch.profiler's tensorboard handler names its traces *.pt.trace.json[.gz]: never JAX's
_TORCH_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
_KINETO_SUFFIXES = (".json", ".json.gz")
# a Chrome trace made from an XSpace names its processes after the planes (/host:CPU, /device:GPU:0)
_PLANE_NAME = re.compile(rb'"name"\s*:\s*"/(?:host|device):')
SNIFF_BYTES = 16 << 10


def in_session_folder(path: Path) -> bool:
    """path lies in plugins/profile/<stamp>/, where jax.profiler writes a session."""
    parent = path.parent
    return bool(STAMP.match(parent.name)) and parent.parent.name == "profile" \
        and parent.parent.parent.name == "plugins"


def is_profile_file(path: str | os.PathLike[str], xspace_folders: set[Path] | None = None) -> bool:
    """A file jax.profiler wrote (an XSpace, or a Chrome trace made from one). xspace_folders:
    the folders known to hold an XSpace (else the file's folder is listed)."""
    p = Path(path)
    name = p.name
    if name.endswith(XPLANE_SUFFIX):
        return True
    if not name.endswith(".json.gz") and not name.endswith(".json"):
        return False
    if in_session_folder(p) and (name == PERFETTO_NAME or name.endswith(JSON_SUFFIX)):
        return True
    if name.endswith(_TORCH_SUFFIXES):
        return False
    if name == PERFETTO_NAME or name.endswith(JSON_SUFFIX):
        if xspace_folders is not None:
            if p.parent in xspace_folders:
                return True
        else:
            try:
                if any(f.name.endswith(XPLANE_SUFFIX) for f in p.parent.iterdir()):
                    return True
            except OSError:
                pass
        return sniff_json(p)
    return False


def sniff_json(path: Path) -> bool:
    """The first bytes of a (gzip'd) JSON trace name a plane (/host:CPU): a trace made from an
    XSpace. Kineto's traces never do. Unreadable: False (the Kineto importer says why)."""
    import zlib
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return False
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(31).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return False
    return bool(_PLANE_NAME.search(head))


def split_paths(paths: list[str | os.PathLike[str]]) -> tuple[list[Path], list[str | os.PathLike[str]]]:
    """(the JAX profile files among paths and under its directories, everything else). A
    directory that holds no JAX profile is passed on as it is; one that does is replaced by
    the other trace files (*.json, *.json.gz) found under it, so Kineto traces beside a JAX
    profile are imported too and the JAX profile's own JSON is not read as Kineto's."""
    jax: list[Path] = []
    other: list[str | os.PathLike[str]] = []
    for given in paths:
        p = Path(given)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if not f.name.startswith(".") and f.is_file())
            folders = {f.parent for f in files if f.name.endswith(XPLANE_SUFFIX)}
            mine = [f for f in files if is_profile_file(f, folders)]
            if not mine:
                other.append(given)
                continue
            jax += mine
            taken = set(mine)
            other += [f for f in files if f not in taken and f.name.endswith(_KINETO_SUFFIXES)]
        elif p.is_file() and is_profile_file(p):
            jax.append(p)
        else:
            other.append(given)
    return list(dict.fromkeys(jax)), other
