"""Kineto (torch.profiler) trace files for tests: the real GPU traces in ../shared/traces, and
small hand-made ones written exactly as Kineto lays them out."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from helpers import REPO

_CANDIDATES = [os.environ.get("COUNTERPROF_TRACES"), REPO.parent / "shared" / "traces",
               REPO.parent.parent / "shared" / "traces", Path("/work/shared/traces")]
SHARED = next((Path(p) for p in _CANDIDATES if p and Path(p, "README.md").is_file()), None)
needs_shared_traces = pytest.mark.skipif(
    SHARED is None, reason="the real GPU traces (../shared/traces) are not on this machine; "
                           "set COUNTERPROF_TRACES to their directory")


def shared_traces() -> list[Path]:
    return sorted(SHARED.glob("*.json.gz")) if SHARED else []


def shared(name: str) -> Path:
    return SHARED / name


def write_trace(path: Path, events: list, meta: dict | None = None, *, after: tuple = (),
                gz: bool = False, indent: int | None = None, array_format: bool = False) -> Path:
    """A trace file: meta keys before traceEvents, except those named in `after`."""
    meta = dict(meta or {})
    if array_format:
        text = json.dumps(events, indent=indent)
    else:
        doc = {k: v for k, v in meta.items() if k not in after}
        doc["traceEvents"] = events
        doc.update({k: meta[k] for k in after if k in meta})
        text = json.dumps(doc, indent=indent)
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def X(cat: str, name: str, ts, dur, pid=100, tid=100, **args) -> dict:
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = {k.replace("_", " ") if k == "External_id" else k: v for k, v in args.items()}
    return ev


def launch(name: str, ts, dur, correlation: int, kernel_ts, kernel_dur, *, cat="kernel",
           stream=7, device=0, pid=100, tid=100, ext=None, **kernel_args) -> list[dict]:
    """A runtime launch on the CPU and the GPU span it launched (same correlation)."""
    rt = X("cuda_runtime", "cudaLaunchKernel", ts, dur, pid=pid, tid=tid, correlation=correlation)
    args = {"device": device, "stream": stream, "correlation": correlation, **kernel_args}
    if ext is not None:
        args["External id"] = ext
        rt["args"]["External id"] = ext
    gpu = {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": kernel_ts,
           "dur": kernel_dur, "args": args}
    return [rt, gpu]
