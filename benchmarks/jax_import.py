"""JAX profile conversion against Kineto trace conversion, side by side in one run.

    python benchmarks/jax_import.py                      # records both traces, 7 paired rounds
    python benchmarks/jax_import.py --rounds 5 --json out.json
    python benchmarks/jax_import.py --jax-profile P.xplane.pb --kineto-trace T.json.gz

The two traces are recorded first (unless given), on this machine's CPU, to about the same
size on disk: a JAX profile (jax.profiler.trace around a jitted MLP's gradient steps: the
XSpace, <host>.xplane.pb) and a torch.profiler trace of a loop of small ops (Kineto JSON,
uncompressed). Each measurement is a fresh process doing one conversion to Arrow spans: the
JAX one convert_file() (collectors/jax_trace/convert.py: protobuf's upb decoder, the events
walked in Python), the Kineto one TraceConversion (native/kineto.c's parser and Arrow compute),
timed inside the process around the call (imports and start-up excluded). Each round runs both,
in a random order; the result is each format's median MB/s and events/s and the ratio of the
medians. An XSpace holds an event in ~25 bytes, Kineto JSON in ~250: MB/s compares what a user
waits for per file size, events/s what each decoder does per event.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JAX_RECORD = r"""
import sys, jax, jax.numpy as jnp
out, steps = sys.argv[1], int(sys.argv[2])
def loss(ws, x):
    for w in ws:
        x = jax.nn.relu(x @ w)
    return jnp.sum(x)
g = jax.jit(jax.grad(loss))
x = jnp.ones((32, 64)); ws = [jnp.ones((64, 64)) * 0.01 for _ in range(8)]
g(ws, x)[0].block_until_ready()
with jax.profiler.trace(out):
    for i in range(steps):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            ws = [w - 0.001 * d for w, d in zip(ws, g(ws, x))]
    jax.block_until_ready(ws)
"""

KINETO_RECORD = r"""
import sys, torch
out, iters = sys.argv[1], int(sys.argv[2])
x = torch.ones(16, 16)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for i in range(iters):
        with torch.profiler.record_function(f"ProfilerStep#{i}"):
            y = torch.tanh(x @ x + 1.0).sum()
prof.export_chrome_trace(out)
"""

JAX_CONVERT = r"""
import json, sys, time
from counterprof.collectors.jax_trace import convert
convert.messages()          # protobuf's import and the schema: start-up, as the Kineto side's imports
t0 = time.perf_counter()
done = convert.convert_file(sys.argv[1])
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0, "events": done.events, "spans": done.spans}))
"""

KINETO_CONVERT = r"""
import json, sys, time
from counterprof.collectors.torch_trace.convert import TraceConversion
import pyarrow
t0 = time.perf_counter()
conv = TraceConversion(sys.argv[1])
rows = sum(b.num_rows for b in conv)
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0, "events": conv.scanner.events, "spans": rows}))
"""


def record(work: Path, jax_steps: int, kineto_iters: int) -> tuple[Path, Path]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([sys.executable, "-c", JAX_RECORD, str(work / "jaxlog"), str(jax_steps)],
                   check=True, env=env, capture_output=True)
    (xplane,) = (work / "jaxlog").rglob("*.xplane.pb")
    kineto = work / "kineto.json"
    subprocess.run([sys.executable, "-c", KINETO_RECORD, str(kineto), str(kineto_iters)], check=True,
                   capture_output=True)
    return xplane, kineto


def measure(code: str, path: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"conversion of {path} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--jax-profile", type=Path, help="an .xplane.pb to convert (default: record one)")
    ap.add_argument("--kineto-trace", type=Path, help="a Kineto trace to convert (default: record one)")
    ap.add_argument("--jax-steps", type=int, default=1800, help="steps of the recorded JAX job (~17 KB each)")
    ap.add_argument("--kineto-iters", type=int, default=7200, help="iterations of the recorded torch loop (~4 KB each)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cp-jax-bench-") as tmp:
        work = Path(tmp)
        xplane, kineto = args.jax_profile, args.kineto_trace
        if xplane is None or kineto is None:
            rec_x, rec_k = record(work, args.jax_steps, args.kineto_iters)
            xplane, kineto = xplane or rec_x, kineto or rec_k
        sizes = {"jax": xplane.stat().st_size, "kineto": kineto.stat().st_size}
        runs: dict[str, list[dict]] = {"jax": [], "kineto": []}
        ratios = []
        for r in range(args.rounds):
            order = [("jax", JAX_CONVERT, xplane), ("kineto", KINETO_CONVERT, kineto)]
            random.shuffle(order)
            got = {name: measure(code, path) for name, code, path in order}
            for name in runs:
                runs[name].append(got[name])
            mbs = {n: sizes[n] / got[n]["seconds"] / 1e6 for n in got}
            ratios.append(mbs["kineto"] / mbs["jax"])
            print(f"round {r + 1}: " + ", ".join(f"{n} {got[n]['seconds']:.3f} s ({mbs[n]:.1f} MB/s)"
                                                for n in ("jax", "kineto")), file=sys.stderr)
    out = {"rounds": args.rounds, "files": {"jax": str(xplane), "kineto": str(kineto)}}
    for name, rs in runs.items():
        secs = statistics.median(x["seconds"] for x in rs)
        out[name] = {"bytes": sizes[name], "events": rs[0]["events"], "spans": rs[0]["spans"],
                     "median_s": secs, "mb_per_s": sizes[name] / secs / 1e6,
                     "events_per_s": rs[0]["events"] / secs}
    out["kineto_over_jax_mb_per_s"] = out["kineto"]["mb_per_s"] / out["jax"]["mb_per_s"]
    out["kineto_over_jax_events_per_s"] = out["kineto"]["events_per_s"] / out["jax"]["events_per_s"]
    out["median_of_round_ratios_mb_per_s"] = statistics.median(ratios)
    print(f"{'format':8} {'file':>9} {'events':>10} {'spans':>9} {'median':>8} {'MB/s':>7} {'Mevents/s':>10}")
    for name in ("jax", "kineto"):
        o = out[name]
        print(f"{name:8} {o['bytes'] / 1e6:7.1f} MB {o['events']:>10,} {o['spans']:>9,} {o['median_s']:7.3f}s "
              f"{o['mb_per_s']:7.1f} {o['events_per_s'] / 1e6:10.2f}")
    print(f"Kineto / JAX: {out['kineto_over_jax_mb_per_s']:.1f}x the MB/s (ratio of medians; median of "
          f"per-round ratios {out['median_of_round_ratios_mb_per_s']:.1f}x), "
          f"{out['kineto_over_jax_events_per_s']:.2f}x the events/s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
