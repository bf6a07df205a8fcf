"""Kernel-side interval sampling against a per-interval tick, side by side, in one run.

    python benchmarks/kernel_sampling.py                  # 5 paired rounds, ~2 minutes
    python benchmarks/kernel_sampling.py --rounds 3 --seconds 2

Issue 14 asks for a profiler below perf stat's own cost at -I 1 (half of it) and -I 10. Any
thread woken every interval costs at least a wake-up (benchmarks/wakeup_floor.py: about perf
stat's whole cost at -I 1 on this VM), so the way below it is to let the kernel sample: a
task-clock leader per CPU on the workload (inherit, PERF_SAMPLE_READ | PERF_SAMPLE_TID, Linux
6.12 or later) writes the group's counts into an mmap ring every INTERVAL of each thread's
CPU time, and the profiler wakes twice a second to drain it. This script measures that probe
(benchmarks/kernel_sampling_probe.c, compiled here) against the same group read on a tick
(the probe's `tick` mode, which is what counterprof's sampler and perf stat -I do), on a
sleeping workload and on a CPU-bound one (benchmarks/workload.py), at -I 1 and -I 10:

  profiler CPU   the probe's own CPU per second of workload, % of one core
  work ratio     the busy workload's iterations/s against its run alone in the same round
                 (the kernel's sampling runs in the workload's context: its cost shows here)
  samples/s      samples or ticks per second
  tail           the task-clock the rings never carried (each thread's counts after its last
                 sample), as % of the total: what a reader of the rings alone would miss,
                 and the final read of the groups gives back

What kernel sampling measures differs: samples come per INTERVAL of each thread's CPU time,
not of wall time. A sleeping workload takes none (its counters do not move either), and a
thread's counts since its last sample reach the rings only at its next one (or the final
read), so a per-wall-time row of a mostly idle thread can be late by up to its sleep.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE = HERE / "kernel_sampling_probe.c"
WORKLOAD = HERE / "workload.py"
INTERVALS_MS = (1.0, 10.0)
MODES = ("kernel", "tick")


def build(tmp: Path) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("kernel_sampling: no C compiler (cc or gcc) on PATH")
    exe = tmp / "probe"
    subprocess.run([cc, "-O2", "-o", str(exe), str(PROBE)], check=True)
    return exe


def probe(exe: Path, mode: str, interval_ms: float, command: list[str]) -> tuple[dict, str]:
    out = subprocess.run([str(exe), mode, str(int(interval_ms * 1e6)), "--", *command], capture_output=True,
                         text=True)
    if out.returncode != 0:
        sys.exit(f"kernel_sampling: the probe failed ({mode}, -I {interval_ms:g}): {out.stderr.strip()}")
    lines = out.stdout.strip().splitlines()
    fields = dict(kv.split("=", 1) for kv in lines[-1].split())
    return {k: float(v) if k != "mode" else v for k, v in fields.items()}, "\n".join(lines[:-1])


def alone(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}–{max(xs):.2f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0, help="per run (default 3)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    workloads = {"sleep": ["sleep", f"{args.seconds:g}"],
                 "busy": [sys.executable, str(WORKLOAD), "--seconds", f"{args.seconds:g}"]}
    cells = [(w, m, iv) for w in workloads for m in MODES for iv in INTERVALS_MS] + [("busy", "alone", 0.0)]
    got: dict[tuple[str, str, float], list[dict]] = {c: [] for c in cells}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kernel-sampling-") as tmp:
        exe = build(Path(tmp))
        for r in range(args.rounds):
            order = cells[:]
            rng.shuffle(order)
            round_rate: dict[tuple[str, str, float], float] = {}
            for w, m, iv in order:
                if m == "alone":
                    rec: dict = {}
                    out = alone(workloads[w])
                else:
                    rec, out = probe(exe, m, iv, workloads[w])
                if w == "busy":
                    round_rate[(w, m, iv)] = json.loads(out.strip().splitlines()[-1])["rate"]
                got[(w, m, iv)].append(rec)
            base = round_rate[("busy", "alone", 0.0)]
            for key, rate in round_rate.items():
                got[key][-1]["work_ratio"] = rate / base
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)
    load1 = os.getloadavg()
    print(f"kernel-side sampling vs a tick: {platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}; "
          f"{args.rounds} paired rounds of {args.seconds:g} s, seed {seed}")
    print(f"command: python benchmarks/kernel_sampling.py --rounds {args.rounds} --seconds {args.seconds:g} "
          f"--seed {seed}")
    print("group: task-clock leader + page-faults, median [min–max]")
    print()
    print("| workload | -I | mode | profiler CPU, % of a core | work ratio | samples or ticks /s "
          "| tail, % of task-clock |")
    print("|---|---|---|---|---|---|---|")
    for w in workloads:
        for iv in INTERVALS_MS:
            for m in MODES:
                recs = got[(w, m, iv)]
                cpu = [100 * x["self_cpu_s"] / args.seconds for x in recs]
                rate = [(x["samples"] + x["ticks"]) / args.seconds for x in recs]
                ratio = med([x["work_ratio"] for x in recs]) if w == "busy" else "–"
                tail = ([100 * (1 - x["sampled_task_clock_s"] / x["task_clock_s"]) for x in recs
                         if x["task_clock_s"] > 0.01] if m == "kernel" else [])
                print(f"| {w} | {iv:g} ms | {m} | {med(cpu)} | {ratio} | {statistics.median(rate):.0f} | "
                      f"{med(tail) if tail else '–'} |")
    lost = sum(x["lost"] for recs in got.values() for x in recs if "lost" in x)
    print()
    print(f"records lost from the rings: {lost:g}; load average before/after: "
          f"{' '.join(f'{x:.2f}' for x in load0)} / {' '.join(f'{x:.2f}' for x in load1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
