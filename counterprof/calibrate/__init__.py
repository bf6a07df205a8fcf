"""This machine's ceilings (what its compute, memory and links can do), measured and cached.

    docs = calibrate(quick=True)         # {"cpu": {...}, "<gpu name>": {...}}: one document per device
    save(docs)                           # $XDG_CACHE_HOME/counterprof/ceilings/<host>-<device>.json
    cached()                             # this host's saved documents, by device
    peak(doc, "fp32"), bandwidth(doc)    # what the roofline reads

A ceilings document: {"schema", "source": measured | datasheet | file, "host", "device",
"kind": cpu | gpu, "measured_at", "quick", "peaks": {dtype: FLOP/s}, "bandwidth_bytes_per_s",
"matmul": {dtype: detail}, "memory": {...}, "collectives": {...}, "host_device": {...},
"skipped": {what: why}, "datasheet": the vendor's figures where the device is known,
"load": how loaded the machine was while it measured (calibrate/load.py: other processes'
share of the CPUs, per step and over all; "loaded" when others held
thresholds.calibrate_others_share or more in a step: `counterprof calibrate` then saves only
with --force, and "saved_anyway" says so)}.

A run copies the documents in force at its start into its meta.json ("ceilings"; null when
there were none) and keeps them: a later calibrate changes no run's roofline.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, TypedDict
from collections.abc import Callable

SCHEMA = 1

Doc = dict[str, Any]      # a ceilings document (JSON), as the module docstring describes


class Mode(TypedDict):
    """A calibration's shape sweeps (square sides; collectives' bytes) and timing."""

    cpu_sizes: list[int]
    bf16_sizes: list[int]
    gpu_sizes: list[int]
    repeats: int
    min_s: float
    stream_min_s: float
    coll_sizes: list[int]


# shape sweeps and timing per mode: quick fits in 30 s on 2 CPU cores
MODES: dict[bool, Mode] = {
    True: {"cpu_sizes": [1024, 2048], "bf16_sizes": [1024], "gpu_sizes": [2048, 4096],
           "repeats": 5, "min_s": 0.08, "stream_min_s": 0.2,
           "coll_sizes": [8, 512, 32 << 10, 1 << 20, 4 << 20, 16 << 20]},
    False: {"cpu_sizes": [256, 512, 1024, 2048, 3072, 4096], "bf16_sizes": [512, 1024, 2048],
            "gpu_sizes": [1024, 2048, 4096, 8192, 16384], "repeats": 7, "min_s": 0.25, "stream_min_s": 0.4,
            # nccl-tests' sweep, every 4x from 8 B to 256 MiB (collective_sizes caps it by memory)
            "coll_sizes": [1 << k for k in range(3, 29, 2)] + [1 << 28]},
}


def collective_sizes(sizes: list[int], world: int) -> list[int]:
    """The sweep's sizes that memory allows: each rank holds about twice the size (input and
    output), every rank on this host; at most an eighth of the memory available."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return sizes
    kept = [s for s in sizes if 2 * s * world <= avail / 8]
    return kept or sizes[:1]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "counterprof" / "ceilings"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def cache_path(device: str, host: str | None = None) -> Path:
    return cache_dir() / f"{_slug(host or socket.gethostname())}-{_slug(device)}.json"


def save(docs: dict[str, Doc]) -> list[Path]:
    """Write each device's document to the cache (atomically: a reader never sees half a file)."""
    paths = []
    for device, doc in docs.items():
        path = cache_path(device, doc.get("host"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=float))
        os.replace(tmp, path)
        paths.append(path)
    return paths


def cached(host: str | None = None) -> dict[str, Doc]:
    """This host's saved ceilings by device; {} when `counterprof calibrate` never ran here."""
    prefix = _slug(host or socket.gethostname()) + "-"
    out: dict[str, Doc] = {}
    d = cache_dir()
    try:
        if not d.is_dir():
            return out
        found = sorted(d.glob(f"{prefix}*.json"))
    except OSError:          # another user's cache (HOME kept across setpriv/sudo): none
        return out
    for path in found:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue           # a damaged cache file is as good as none: calibrate again
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA and doc.get("device"):
            out[doc["device"]] = doc
    return out


def load_file(path: str | os.PathLike[str]) -> dict[str, Doc]:
    """Ceilings from a file given by the user: one document, or {device: document}."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    docs = {doc.get("device", "file"): doc} if "peaks" in doc else doc
    if not docs:
        raise ValueError("no ceilings in it (expected `counterprof calibrate --json` output)")
    for name, d in docs.items():
        if not isinstance(d, dict) or not isinstance(d.get("peaks"), dict) \
                or not isinstance(d.get("bandwidth_bytes_per_s"), (int, float)):
            raise ValueError(f"{name}: needs \"peaks\" {{dtype: FLOP/s}} and \"bandwidth_bytes_per_s\"")
        d.setdefault("source", "file")
        d.setdefault("device", name)
        d.setdefault("kind", "gpu" if name != "cpu" else "cpu")
    return docs


def peak(doc: Doc, dtype: str | None) -> float | None:
    """The FLOP/s ceiling for a dtype; None when it was not measured (never guessed)."""
    if not dtype:
        return None
    value = (doc.get("peaks") or {}).get(dtype)
    return float(value) if value else None


def bandwidth(doc: Doc) -> float | None:
    value = doc.get("bandwidth_bytes_per_s")
    return float(value) if value else None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def calibrate(quick: bool = False, progress: Callable[[str], None] = lambda s: None,
              gpu: bool = True, collectives: bool = True, world: int = 2,
              fresh_process: bool = False) -> dict[str, Doc]:
    """Measure this machine: the CPU always, each GPU when torch sees one.
    fresh_process: this process has run no torch op yet (the CLI), so the collectives' ranks
    may fork from it (seconds faster than starting interpreters); otherwise they are spawned."""
    from . import datasheet, measure    # here: every run reads cached(), ~3 ms of imports
    from .load import LoadMeter
    meter = LoadMeter()
    mode = MODES[quick]
    host = socket.gethostname()
    started = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    cpu: dict[str, Any] = {"schema": SCHEMA, "source": "measured", "host": host, "device": "cpu",
                           "device_name": cpu_name(), "kind": "cpu", "measured_at": stamp,
                           "quick": quick, "cpus": os.cpu_count(), "matmul": {}, "skipped": {},
                           "datasheet": None}
    if collectives:     # first: its ranks fork from this process before torch starts threads
        with meter.phase("the gloo collectives"):
            coll = measure.collectives("gloo", world, collective_sizes(mode["coll_sizes"], world),
                                       mode["repeats"], progress=progress,
                                       fork=fresh_process)
        if "skipped" in coll:
            cpu["skipped"]["collectives gloo"] = coll["skipped"]
            meter.phases.pop("the gloo collectives", None)
        cpu["collectives"] = {"gloo": coll}
    for dtype, sizes in (("fp32", mode["cpu_sizes"]), ("bf16", mode["bf16_sizes"])):
        with meter.phase(f"the CPU {dtype} matmul"):
            r = measure.cpu_matmul(dtype, sizes, mode["repeats"], mode["min_s"], progress)
        if "skipped" in r:
            cpu["skipped"][f"matmul {dtype}"] = r["skipped"]
            meter.phases.pop(f"the CPU {dtype} matmul", None)
        else:
            cpu["matmul"][dtype] = r
    with meter.phase("the CPU memory bandwidth"):
        cpu["memory"] = measure.cpu_stream(mode["repeats"], mode["stream_min_s"], progress=progress)
    cpu["peaks"] = {dt: r["flops_per_s"] for dt, r in cpu["matmul"].items()}
    cpu["bandwidth_bytes_per_s"] = cpu["memory"]["bytes_per_s"]
    docs = {"cpu": cpu}
    ok, why = measure.gpu_available() if gpu else (False, "--no-gpu")
    if not ok:
        cpu["skipped"]["gpu"] = why
    else:
        import torch
        p2p = measure.gpu_p2p(mode["repeats"], mode["min_s"], progress) if torch.cuda.device_count() > 1 else None
        nccl = measure.collectives("nccl", torch.cuda.device_count(), mode["coll_sizes"], mode["repeats"],
                                   progress=progress) if collectives else None
        for i in range(torch.cuda.device_count()):
            with meter.phase(f"the GPU{i} measurements"):
                g = measure.gpu_device(i, mode["gpu_sizes"], mode["repeats"], mode["min_s"], progress)
            name = g["device"] if torch.cuda.device_count() == 1 else f"{g['device']} #{i}"
            g.update({"schema": SCHEMA, "source": "measured", "host": host, "device": name,
                      "device_name": g["device"], "measured_at": stamp, "quick": quick,
                      "datasheet": datasheet.lookup(g["device"], g.get("arch"))})
            if p2p is not None:
                g["p2p"] = p2p
            if nccl is not None:
                g["collectives"] = {"nccl": nccl}
            docs[name] = g
    load = meter.summary()
    for doc in docs.values():
        doc["wall_s"] = round(time.time() - started, 2)
        doc["load"] = load
    return docs


def loaded(docs: dict[str, Doc]) -> dict[str, Any] | None:
    """The load record of a calibration that others' CPU use spoiled (None: a quiet one, or
    not known)."""
    for doc in docs.values():
        load = doc.get("load")
        if isinstance(load, dict) and load.get("loaded"):
            return load
    return None
