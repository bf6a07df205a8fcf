"""Kineto (torch.profiler) trace files for tests: the real GPU traces in ../shared/traces, and
small hand-made ones written exactly as Kineto lays them out.

The real traces are found at $COUNTERPROF_TRACES (which must then hold them), else beside the
checkout. Where they are absent the tests that read them skip, saying so, except where
COUNTERPROF_REQUIRE_TRACES is set (.ci/run sets it, as it does for perf, tmux and chromium):
then importing this module raises, and the session stops before any test runs."""
from __future__ import annotations

import gzip
import json
import os
import textwrap
from pathlib import Path

import pytest

from helpers import REPO, traces_dir


def _is_traces(p: Path) -> bool:
    return Path(p, "README.md").is_file() and any(Path(p).glob("*.json.gz"))


_EXPLICIT = os.environ.get("COUNTERPROF_TRACES")
if _EXPLICIT and not _is_traces(Path(_EXPLICIT)):
    # a path given on purpose that holds no traces is a mistake to say, not a reason to look elsewhere
    raise RuntimeError(f"COUNTERPROF_TRACES={_EXPLICIT!r} holds no shared traces (a README.md and "
                       "*.json.gz files): point it at the traces folder")
_CANDIDATES = [_EXPLICIT, REPO.parent / "shared" / "traces",
               REPO.parent.parent / "shared" / "traces", Path("/work/shared/traces")]
SHARED = next((Path(p) for p in _CANDIDATES if p and _is_traces(Path(p))), None)
MISSING = ("the real GPU traces (shared/traces beside the checkout) are not on this machine; "
           "set COUNTERPROF_TRACES to their directory")
if SHARED is None and os.environ.get("COUNTERPROF_REQUIRE_TRACES"):
    raise RuntimeError(f"COUNTERPROF_REQUIRE_TRACES is set but {MISSING} (looked in: "
                       + ", ".join(dict.fromkeys(str(p) for p in _CANDIDATES if p)) + ")")
needs_shared_traces = pytest.mark.skipif(SHARED is None, reason=MISSING)


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


# ---- big synthetic traces (memory tests, the import benchmark) -------------------------------

_STEP_EVENTS = """\
  {{
    "ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 4242, "tid": 4242,
    "ts": {t0}.125, "dur": 40.5,
    "args": {{
      "External id": {x}, "Record function id": 0, "Sequence number": {x}, "Fwd thread id": 0,
      "Concrete Inputs": ["", "", ""], "Input type": ["float", "float", "float"],
      "Input Strides": [[4096, 1], [4096, 1], [1]], "Input Dims": [[64, 4096], [4096, 4096], [4096]],
      "Ev Idx": {x}
    }}
  }},
  {{
    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,
    "ts": {t1}.5, "dur": 6.25,
    "args": {{
      "External id": {x}, "cbid": 211, "correlation": {c}
    }}
  }},
  {{
    "ph": "f", "id": {c}, "pid": 4242, "tid": 4242, "ts": {t1}.5,
    "cat": "ac2g", "name": "ac2g", "bp": "e"
  }},
  {{
    "ph": "X", "cat": "kernel", "name": "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)", "pid": 0, "tid": 7,
    "ts": {t2}.75, "dur": 120.0,
    "args": {{
      "External id": {x}, "queued": 0, "device": 0, "context": 1,
      "stream": 7, "correlation": {c},
      "registers per thread": 232, "shared memory": 73728, "blocks per SM": 0.592593,
      "warps per SM": 2.370370, "grid": [64, 1, 1], "block": [128, 1, 1],
      "est. achieved occupancy %": 4
    }}
  }},
  {{
    "ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 4242, "tid": 4242,
    "ts": {t3}.0, "dur": 20.0,
    "args": {{
      "External id": {y}, "Collective name": "allreduce", "In msg nelems": 1048576,
      "Out msg nelems": 1048576, "Group size": 8, "dtype": "Float", "Process Group Name": "0"
    }}
  }},
  {{
    "ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "pid": 0, "tid": 20,
    "ts": {t4}.0, "dur": 300.0,
    "args": {{
      "External id": {y}, "device": 0, "stream": 20, "correlation": {d}
    }}
  }}"""  # noqa: E501  laid out byte for byte as Kineto writes it


def write_big_trace(path: Path, target_bytes: int) -> int:
    """A Kineto-shaped trace (indented as Kineto writes it) of about target_bytes; returns the
    number of complete events in it. Streams to disk: memory stays small whatever the size."""
    events = 0
    with open(path, "w") as f:
        f.write('{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "nccl", "rank": 0, '
                '"world_size": 8},\n  "traceEvents": [\n')
        i = 0
        written = 0
        while written < target_bytes:
            t = 1_000_000 + i * 1000
            chunk = _STEP_EVENTS.format(t0=t, t1=t + 10, t2=t + 20, t3=t + 200, t4=t + 400,
                                        x=2 * i, y=2 * i + 1, c=3 * i, d=3 * i + 1)
            if i % 16:              # one collective every 16 steps, as in a training step
                chunk = chunk[: chunk.index(',\n  {\n    "ph": "X", "cat": "cpu_op", "name": "record_param_comms"')]
            if i:
                f.write(",\n")
            f.write(chunk)
            written += len(chunk) + 2
            events += 3 if i % 16 else 5
            i += 1
        f.write('\n  ],\n  "traceName": "synthetic", "displayTimeUnit": "ms",\n'
                '  "baseTimeNanoseconds": 1700000000000000000\n}\n')
    return events


def profiler_after_first_trace(run: Path, first: Path) -> str:
    """Python source for a child process: a `counterprof run`-style torch collector on `run`
    converts the trace `first`, then stops sweeping (its thread joined), leaving `s` (the
    session), `col` (the collector) and `traces` (rank 0's traces folder) for what follows."""
    return textwrap.dedent(f"""
    import os, shutil, sys, time
    from pathlib import Path
    from counterprof.session import Session
    from counterprof.collector import Target
    s = Session({str(run)!r}, collectors=["torch"], target=Target("launch", os.getpid()), rank=0)
    s.prepare(); s.start()
    traces = Path({str(traces_dir(run))!r})
    traces.mkdir(parents=True)
    shutil.copy({str(first)!r}, traces)
    col = s.collectors[0]
    while col.traces < 1:
        time.sleep(0.05)
    col._stop.set(); col._thread.join()      # no sweeps of its own from here on
    """)


def duplicated_trace(src: Path, copies: int, dst: Path) -> int:
    """A real trace made `copies` times longer: its events repeated one after another in time
    (each copy shifted past the one before), correlation, External id and flow ids offset per
    copy so that launches still find their kernels. Returns the number of events written."""
    import gzip
    import json
    opener = gzip.open if str(src).endswith(".gz") else open
    with opener(src, "rt") as f:
        doc = json.load(f)
    events = doc.get("traceEvents") or []
    ts = [float(e["ts"]) for e in events if "ts" in e]
    span = (max(float(e["ts"]) + float(e.get("dur", 0) or 0) for e in events if "ts" in e) - min(ts)) if ts else 0
    ids = [int(v) for e in events for v in ((e.get("args") or {}).get("correlation"),
                                           (e.get("args") or {}).get("External id"), e.get("id"))
           if isinstance(v, (int, float)) and not isinstance(v, bool)]
    id_step = (max(ids) + 1) if ids else 0
    out = []
    for k in range(copies):
        for e in events:
            if k == 0 or "ts" not in e:
                if k == 0:
                    out.append(e)
                continue
            c = dict(e)
            c["ts"] = float(e["ts"]) + k * (span + 1000)
            if "args" in e and isinstance(e["args"], dict):
                a = dict(e["args"])
                for key in ("correlation", "External id"):
                    if isinstance(a.get(key), int) and a[key] > 0:
                        a[key] += k * id_step
                c["args"] = a
            if isinstance(e.get("id"), int):
                c["id"] = e["id"] + k * id_step
            out.append(c)
    doc["traceEvents"] = out
    with open(dst, "w") as f:
        json.dump(doc, f)
    return len(out)
