"""What the torch driver's step windows cost a batch-1 serving loop (issue 35): the loop's own
per-request latency (median, p99) and throughput alone and under `counterprof run --torch`,
paired within rounds, and where each window's cost went (the driver's per-window account).

    python benchmarks/torch_window_cost.py [--rounds 5] [--seconds 10] [--jobs serve,resnet]
                                           [--modes alone,torch] [--json PATH]
                                           [--baseline PKGDIR] [--batches N] [--threads T]
                                           [--fixed-malloc]

A script, not a timed test: the machine is usually shared. Each round runs every job in every
mode once, in a random order; ratios are taken within a round (torch / alone) and the medians
of the rounds' ratios are printed (min-max beside them).

Jobs (--jobs):
  serve   tests/jobs/serve_batch1.py: a 2-layer transformer, batch-1 requests under
          inference_mode for --seconds, each request timed by the job (perf_counter_ns). Its
          figures: requests/s, median and p99 latency, and under --torch the requests that ran
          inside a window against those outside (the windows' start and end from the driver's
          account, `wcost` lines in the steps file).
  resnet  tests/jobs/resnet_infer.py (a labelled job): its forward_s.
  gpt2    tests/jobs/gpt2_train.py --steps 12 (a labelled job, slow on 2 cores): its loop_s.

Another build, paired in the same rounds (--baseline PKGDIR adds the mode `base`: `counterprof
run --torch` with PKGDIR first on PYTHONPATH, a package folder holding that build's counterprof
with its collectors in counterprof/collectors, e.g. a checkout of the commit before copied so).

--fixed-malloc runs every mode with glibc malloc's thresholds fixed (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_): by default glibc raises its mmap threshold once a large block is
freed, and a profiler window frees large ones, after which resnet_infer's ~1 MB activations
come from the heap instead of fresh mmaps: the job ran ~25% faster after any torch.profiler
session than alone, which a comparison with the job alone then reads as a gain. --threads T
sets OMP_NUM_THREADS (resnet_infer's intra-op threads spin against a busy neighbour on 2 cores).

The per-window account (meta.json collectors.torch.window_cost, from the driver's `wcost` lines):
the first window (the profiler's one-time set-up in it) apart from the steady ones; per steady
window the median of its start, recorded steps' excess over the loop's step time, stop, export
and total cost; and the duty: all windows' cost over the process's time.
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

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "jobs"
PY = sys.executable


def job_argv(name: str, seconds: float, batches: int | None = None) -> list[str]:
    if name == "serve":
        return [str(JOBS / "serve_batch1.py"), "--seconds", str(seconds)]
    if name == "resnet":
        return [str(JOBS / "resnet_infer.py"), *(["--batches", str(batches)] if batches else [])]
    if name == "gpt2":
        return [str(JOBS / "gpt2_train.py"), "--steps", "12"]
    raise SystemExit(f"unknown job {name!r}")


def window_spans(run: Path) -> list[tuple[int, int, dict]]:
    """(start, end, fields) of every step window the driver accounted for (run clock ns)."""
    out = []
    for path in run.rglob("*.steps"):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if parts[0] == "wcost" and len(parts) == 5:
                fields = dict(kv.split("=", 1) for kv in parts[4].split())
                out.append((int(parts[1]), int(parts[2]), fields))
    return sorted(out)


def serve_figures(truth: dict, windows: list[tuple[int, int, dict]]) -> dict:
    starts, ends = truth["request_start_ns"], truth["request_end_ns"]
    lat = sorted(e - s for s, e in zip(starts, ends))
    fig = {"rps": truth["requests"] / truth["loop_s"], "median_us": statistics.median(lat) / 1e3,
           "p99_us": lat[int(0.99 * (len(lat) - 1))] / 1e3, "loop_s": truth["loop_s"]}
    if windows:
        off = truth["to_unix_ns"]
        spans = [(a - off, b - off) for a, b, _ in windows]
        inside, outside, i = [], [], 0
        for s, e in zip(starts, ends):
            while i < len(spans) and spans[i][1] < s:
                i += 1
            (inside if i < len(spans) and spans[i][0] <= e else outside).append(e - s)
        fig["requests_in_windows"] = len(inside)
        fig["outside_median_us"] = statistics.median(outside) / 1e3 if outside else None
        fig["inside_median_us"] = statistics.median(inside) / 1e3 if inside else None
        # what the windows added to the loop, by the job's own clock: the requests inside them
        # less as many at the median outside, over the loop's time
        if outside:
            extra = sum(inside) - len(inside) * statistics.median(outside)
            fig["window_share_by_job"] = extra / (truth["loop_s"] * 1e9)
    return fig


FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def run_once(tmp: Path, job: str, mode: str, seconds: float, tag: str, args: argparse.Namespace) -> dict:
    truth_path = tmp / f"{tag}.jsonl"
    truth_path.unlink(missing_ok=True)
    env = {**os.environ, "JOB_TRUTH": str(truth_path), "PYTHONDONTWRITEBYTECODE": "1"}
    if args.fixed_malloc:
        env.update(FIXED_MALLOC)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    if mode == "base":
        env["PYTHONPATH"] = args.baseline
    argv = job_argv(job, seconds, args.batches)
    run = tmp / f"run-{tag}"
    if mode == "alone":
        cmd = [PY, *argv]
    else:
        cmd = [PY, "-m", "counterprof", "run", "-q", "-o", str(run), "--force", "--torch", "--", PY, *argv]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          cwd=str(tmp), timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} -> exit {proc.returncode}\n{proc.stderr[-2000:]}")
    truth = [json.loads(x) for x in truth_path.read_text().splitlines()][-1]
    windows = window_spans(run) if mode != "alone" else []
    if job == "serve":
        fig = serve_figures(truth, windows)
    else:
        fig = {"loop_s": truth.get("loop_s", truth.get("forward_s"))}
    if windows:     # what the driver counted each window to cost the loop (its pacing's figure)
        fig["windows_cost_s"] = sum(int(f.get("cost_us", 0)) for _, _, f in windows) / 1e6
        fig["first_window_cost_s"] = int(windows[0][2].get("cost_us", 0)) / 1e6
    if mode != "alone":
        meta = json.loads((run / "meta.json").read_text())
        st = meta["collectors"].get("torch", {})
        fig["traces"] = st.get("traces", 0)
        fig["window_cost"] = st.get("window_cost")
    return fig


def spread(values: list[float]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0, help="the serving loop's length")
    ap.add_argument("--jobs", default="serve,resnet")
    ap.add_argument("--modes", default="alone,torch")
    ap.add_argument("--json", help="write every round's figures here")
    ap.add_argument("--baseline", metavar="PKGDIR", help="another build's package folder: adds the mode `base`")
    ap.add_argument("--batches", type=int, help="resnet_infer's batches (default: its own, 30)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every job")
    ap.add_argument("--fixed-malloc", action="store_true", help="glibc malloc's thresholds fixed in every mode")
    args = ap.parse_args()
    jobs, modes = args.jobs.split(","), args.modes.split(",")
    if args.baseline and "base" not in modes:
        modes.append("base")
    results: dict[str, dict[str, list[dict]]] = {j: {m: [] for m in modes} for j in jobs}
    with tempfile.TemporaryDirectory(prefix="counterprof-wcost-") as t:
        tmp = Path(t)
        for r in range(args.rounds):
            order = [(j, m) for j in jobs for m in modes]
            random.shuffle(order)
            for j, m in order:
                fig = run_once(tmp, j, m, args.seconds, f"{j}-{m}-{r}", args)
                results[j][m].append(fig)
                print(f"round {r} {j:7s} {m:6s} " + " ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in fig.items() if k != "window_cost"), flush=True)
    print()
    for j in jobs:
        alone = results[j].get("alone") or []
        for m in modes:
            if m == "alone":
                continue
            rows = results[j][m]
            print(f"== {j}: {m} / alone over {len(rows)} rounds (median of the rounds' ratios, min-max)")
            if j == "serve" and alone:
                print("  throughput      ", spread([a["rps"] / b["rps"] for a, b in zip(rows, alone)]))
                print("  median latency  ", spread([a["median_us"] / b["median_us"] for a, b in zip(rows, alone)]))
                print("  median latency outside windows", spread(
                    [a["outside_median_us"] / b["median_us"] for a, b in zip(rows, alone)
                     if a.get("outside_median_us")]))
                print("  p99 latency     ", spread([a["p99_us"] / b["p99_us"] for a, b in zip(rows, alone)]))
                print("  windows' share by the job's clock", spread([a.get("window_share_by_job") for a in rows]))
                print("  inside/outside median latency", spread(
                    [a["inside_median_us"] / a["outside_median_us"] for a in rows
                     if a.get("inside_median_us") and a.get("outside_median_us")]))
            elif alone:
                print("  loop time       ", spread([a["loop_s"] / b["loop_s"] for a, b in zip(rows, alone)]))
                print("  loop time less the windows' cost", spread(
                    [(a["loop_s"] - a.get("windows_cost_s", 0.0)) / b["loop_s"] for a, b in zip(rows, alone)]))
                print("  first window's cost / loop alone", spread(
                    [a.get("first_window_cost_s", 0.0) / b["loop_s"] for a, b in zip(rows, alone)]))
            print("  traces          ", spread([float(a.get("traces") or 0) for a in rows]))
            costs = [a["window_cost"] for a in rows if a.get("window_cost")]
            if costs:
                keys = [k for k in costs[0] if isinstance(costs[0][k], (int, float))]
                for k in keys:
                    print(f"  window_cost.{k:22s}", spread([float(c[k]) for c in costs if c.get(k) is not None]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
