"""The nvml collector's cost, with the fake NVML of tests/fake_nvml.py (no GPU needed).

    python benchmarks/nvml_tick.py                 # ~5 minutes
    python benchmarks/nvml_tick.py --quick
    python benchmarks/nvml_tick.py --only paths --rounds 9     # the old path against the new
    python benchmarks/nvml_tick.py --only paths,tick --real     # the same on a GPU machine
    python benchmarks/nvml_tick.py --gpus 8 --rounds 9 --json nvml-bench.json

Without a GPU this shows the Python side only: the real driver's time inside each NVML call
comes on top (on a GPU machine, pass --real to sample the real pynvml instead).

Parts:
  paths     the path before issue 35 (config sample_buffers=False: every reading polled every
            tick) against the new one (sample buffers read once a second, slow-moving
            readings once a second), in paired rounds (both in each round, in random order):
            the collector's own sampling thread at 100 ms for --seconds, after a warm-up, on
            2 fake GPUs with GPM (or every GPU with --real). Per GPU: NVML calls per second
            (counted by a wrapper around the module, GPM's shown apart), the thread's CPU
            (its own CPU clock) per fast tick and as % of a core; medians over rounds, and the
            median of the per-round ratios new/old.
  tick      µs per GPU for one fast tick, one GPM window and one slow tick, on the old path
            (fast: one batched nvmlDeviceGetFieldValues + 6 calls; slow: 3 sample buffers,
            processes) and the new (fast: the field batch; slow: 5 sample buffers, temperature,
            memory, throttle reasons, processes), for a PCIe GPU and
            an SXM-like GPU with 18 NVLink links (36 more fields per batch). "of which NVML"
            is the same NVML calls replayed alone (the fake's cost, standing in for the
            library's), so the rest is counterprof's own Python per tick. These are hot-loop
            figures: in the live thread, which wakes every interval with cold caches, the same
            tick costs several times more (the slowdown part's thread CPU shows it).
  cli       benchmarks/workload.py as its own process, alone (twice: the second is the noise
            reference) and under `counterprof run --collectors nvml` at 10 Hz and 100 Hz, with
            the fake in the profiler's process: the slowdown a launched workload sees.
  slowdown  benchmarks/workload.py's CPU-bound loop in this process: alone, alone again
            (the noise reference), and inside
            counterprof.profile(collectors=["nvml"]) at 10 Hz and at 100 Hz (GPM at its
            100 ms windows in both). In-process is the worst case: the sampling thread shares
            the workload's GIL. Each round runs the four modes in a random order; figures
            are medians of per-round ratios (work rate vs alone), with the profiler thread's
            CPU as % of one core.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))          # fake_nvml
sys.path.insert(0, str(HERE))                 # workload

import fake_nvml  # noqa: E402
import workload  # noqa: E402


def summary(values):
    v = sorted(values)
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) >= 2 else [v[0]] * 3
    return {"n": len(v), "median": statistics.median(v), "q1": q[0], "q3": q[2], "min": v[0], "max": v[-1]}


# -- tick ----------------------------------------------------------------------------------

class Recorder:
    """Wraps the NVML module: notes each call made, to replay them alone."""

    def __init__(self, lib):
        self._lib = lib
        self.recording: list | None = None

    def __getattr__(self, name):
        attr = getattr(self._lib, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr

        def call(*args):
            if self.recording is not None:
                self.recording.append((attr, args))
            return attr(*args)
        return call


def tick_costs(n_gpus: int, nvlinks: int, iterations: int, repeats: int, module=None,
               buffers: bool = True) -> dict:
    from counterprof.ground.clock import Clock
    from counterprof.collectors.nvml import devices
    from counterprof.collectors.nvml.library import open_nvml
    from counterprof.collectors.nvml.sampler import GpuSampler, WallClock

    lib = module or fake_nvml.FakeNvml([fake_nvml.hopper(bus_id=f"00000000:{0x10 + i:02X}:00.0",
                                                         nvlinks=nvlinks, processes=[(os.getpid(), 2**30)])
                                        for i in range(n_gpus)])
    rec = Recorder(lib)
    nvml = open_nvml(rec)
    gpus, _ = devices.discover(nvml, {})
    wall = WallClock(Clock())
    samplers = [GpuSampler(nvml, g, wall, sample_buffers=buffers) for g in gpus]
    for s in samplers:
        s.probe([])
    pids = {os.getpid()}

    def fast():
        rows = []
        wall.refresh()
        for s in samplers:
            s.tick(rows)

    def gpm():
        rows = []
        for s in samplers:
            s.gpm_prev_ns -= 10**9          # every call a full window (NVML wants >= 100 ms)
            s.gpm_tick(rows)

    def slow():
        rows = []
        for s in samplers:
            s.slow_tick(rows, pids)

    out = {}
    for name, fn in (("fast", fast), ("gpm", gpm), ("slow", slow)):
        fn()
        rec.recording = []
        fn()
        calls, rec.recording = rec.recording, None

        def replay(calls=calls):
            for f, args in calls:
                try:
                    f(*args)
                except Exception:
                    pass
        total, alone = [], []
        for _ in range(repeats):
            for target, acc in ((fn, total), (replay, alone)):
                t0 = time.perf_counter()
                for _ in range(iterations):
                    target()
                acc.append((time.perf_counter() - t0) / iterations / n_gpus * 1e6)
        out[name] = {"us_per_gpu": summary(total), "nvml_calls_us_per_gpu": summary(alone),
                     "calls_per_gpu": len(calls) / n_gpus}
    for s in samplers:
        s.close()
    nvml.close()
    return out


# -- paths: the old path against the new ---------------------------------------------------

class Counting:
    """Wraps the NVML module: counts each NVML function called (the fake or the real one)."""

    def __init__(self, lib):
        self._lib = lib
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name):
        attr = getattr(self._lib, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr

        def call(*args):
            self.calls[name] += 1
            return attr(*args)
        return call


GPM_CALLS = ("nvmlGpmSampleGet", "nvmlGpmMetricsGet")


def path_run(buffers: bool, seconds: float, interval_ms: float, real: bool, tmp: Path) -> dict:
    """One run of the collector's thread; its steady state over `seconds` after a warm-up."""
    import threading
    from counterprof.session import Session
    if real:
        import pynvml
        lib = Counting(pynvml)
    else:
        # the driver sampling every 100 ms (util: 1/6 s to 1 s on real GPUs)
        lib = Counting(fake_nvml.FakeNvml([fake_nvml.hopper(bus_id=f"00000000:{0x10 + i:02X}:00.0",
                                                            sample_period_s=0.1)
                                           for i in range(2)]))
    s = Session(tmp, collectors=["nvml"], on_warning=lambda m: None,
                config={"nvml": {"module": lib, "interval_ms": interval_ms, "sample_buffers": buffers}})
    s.prepare()
    s.start()
    try:
        time.sleep(0.5)          # past the probe
        thread = next(t for t in threading.enumerate() if t.name == "counterprof-nvml")
        clock = time.pthread_getcpuclockid(thread.ident)
        calls0, cpu0, t0 = lib.calls.copy(), time.clock_gettime(clock), time.monotonic()
        time.sleep(seconds)
        calls, cpu, dt = lib.calls - calls0, time.clock_gettime(clock) - cpu0, time.monotonic() - t0
        n = len(next(c for c in s.collectors if c.name == "nvml").samplers)
    finally:
        s.stop()
    per_s = {fn: c / dt / n for fn, c in calls.items()}
    cpu_per_gpu_s = cpu / dt / n
    return {"gpus": n, "calls_per_gpu_s": sum(v for f, v in per_s.items() if f not in GPM_CALLS),
            "gpm_calls_per_gpu_s": sum(v for f, v in per_s.items() if f in GPM_CALLS),
            "core_pct_per_gpu": 100.0 * cpu_per_gpu_s,
            "us_per_tick_per_gpu": cpu_per_gpu_s * 1e6 * interval_ms / 1000.0,
            "by_function": per_s}


def paths(rounds: int, seconds: float, seed: int, real: bool, interval_ms: float = 100.0) -> dict:
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="counterprof-nvml-paths-"))
    got: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(rounds):
        order = ["old", "new"]
        rng.shuffle(order)
        for mode in order:
            got[mode].append(path_run(mode == "new", seconds, interval_ms, real, tmp / f"{mode}-{r}"))
    out: dict = {"rounds": rounds, "seconds": seconds, "interval_ms": interval_ms,
                 "gpus": got["new"][0]["gpus"]}
    for key in ("calls_per_gpu_s", "gpm_calls_per_gpu_s", "core_pct_per_gpu", "us_per_tick_per_gpu"):
        old, new = [g[key] for g in got["old"]], [g[key] for g in got["new"]]
        ratios = [b / a for a, b in zip(old, new) if a]
        out[key] = {"old": summary(old), "new": summary(new),
                    "ratio_new_old": summary(ratios) if ratios else None}
    for mode in ("old", "new"):
        fns = sorted({f for g in got[mode] for f in g["by_function"]})
        out[f"{mode}_by_function"] = {f: statistics.median(g["by_function"].get(f, 0.0) for g in got[mode])
                                      for f in fns}
    return out


def _print_paths(r: dict, real: bool) -> None:
    where = "real NVML" if real else "fake NVML"
    print(f"NVML paths, {where}, {r['gpus']} GPU(s), {r['rounds']} paired rounds x {r['seconds']:g} s "
          f"at {r['interval_ms']:g} ms (per GPU; median [q1-q3]; ratio = median of per-round new/old):")
    labels = {"calls_per_gpu_s": "NVML calls/s, GPM aside", "gpm_calls_per_gpu_s": "GPM calls/s",
              "us_per_tick_per_gpu": "thread CPU µs per tick", "core_pct_per_gpu": "% of a core"}
    print(f"  {'':26} {'old':>22} {'new':>22}   new/old")
    for key, label in labels.items():
        v = r[key]
        o, n, q = v["old"], v["new"], v["ratio_new_old"]
        ratio = f"{q['median']:.3f} [{q['q1']:.3f}-{q['q3']:.3f}]" if q else "-"
        print(f"  {label:26} {o['median']:9.2f} [{o['q1']:.2f}-{o['q3']:.2f}] "
              f"{n['median']:9.2f} [{n['q1']:.2f}-{n['q3']:.2f}]   {ratio}")
    for mode in ("old", "new"):
        fns = ", ".join(f"{f.removeprefix('nvml')} {v:.1f}" for f, v in r[f"{mode}_by_function"].items())
        print(f"  {mode} calls/s by function: {fns}")


# -- slowdown ------------------------------------------------------------------------------

def slowdown(n_gpus: int, seconds: float, rounds: int, seed: int) -> dict:
    import counterprof
    rng = random.Random(seed)
    # "alone again" is the noise reference: the same workload alone, as a mode of its own
    modes = ["alone", "alone again", "10Hz", "100Hz"]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {"10Hz": [], "100Hz": []}
    tmp = Path(tempfile.mkdtemp(prefix="counterprof-nvml-bench-"))
    workload.run(0.3)                                   # warm up
    for r in range(rounds):
        order = modes[:]
        rng.shuffle(order)
        for mode in order:
            if mode.startswith("alone"):
                rates[mode].append(workload.run(seconds)["rate"])
                continue
            fake = fake_nvml.FakeNvml([fake_nvml.hopper(bus_id=f"00000000:{0x10 + i:02X}:00.0")
                                       for i in range(n_gpus)])
            interval = 100.0 if mode == "10Hz" else 10.0
            with counterprof.profile(collectors=["nvml"], path=tmp / f"{mode}-{r}",
                                     config={"nvml": {"module": fake, "interval_ms": interval}}) as run:
                got = workload.run(seconds)
            rates[mode].append(got["rate"])
            cpu[mode].append(100.0 * run.meta["collectors"]["nvml"]["thread_cpu_s"] / got["elapsed_s"])
    out = {}
    for mode in ("alone again", "10Hz", "100Hz"):
        ratios = [a / b for a, b in zip(rates[mode], rates["alone"])]
        out[mode] = {"work_ratio": summary(ratios), "slowdown_pct": 100.0 * (1 - statistics.median(ratios)),
                     "profiler_thread_cpu_pct": summary(cpu[mode]) if mode in cpu else None}
    return out


CLI_WITH_FAKE = ("import sys; sys.path.insert(0, {tests!r}); import fake_nvml; "
                 "sys.modules['pynvml'] = fake_nvml.FakeNvml([fake_nvml.hopper(bus_id='00000000:%02X:00.0' % (16 + i)) "
                 "for i in range({gpus})]); from counterprof.cli import main; sys.exit(main(sys.argv[1:]))")


def cli_slowdown(n_gpus: int, seconds: float, rounds: int, seed: int) -> dict:
    """benchmarks/workload.py as its own process: alone, and under `counterprof run
    --collectors nvml` (the fake in the profiler's process) at 10 Hz and 100 Hz."""
    import subprocess
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="counterprof-nvml-bench-cli-"))
    wl = [sys.executable, str(HERE / "workload.py"), "--seconds", str(seconds)]
    code = CLI_WITH_FAKE.format(tests=str(HERE.parent / "tests"), gpus=n_gpus)
    modes = {"alone": wl, "alone again": wl}
    for label, interval in (("10Hz", "100"), ("100Hz", "10")):
        modes[label] = [sys.executable, "-c", code, "run", "-q", "--collectors", "nvml",
                        "--nvml-interval-ms", interval, "-o", str(tmp / label), "--force", "--", *wl]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {"10Hz": [], "100Hz": []}
    for _ in range(rounds):
        order = list(modes)
        rng.shuffle(order)
        for mode in order:
            p = subprocess.run(modes[mode], capture_output=True, text=True, timeout=120)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not line:
                raise RuntimeError(f"{mode}: rc {p.returncode}: {p.stderr[-500:]}")
            got = json.loads(line[-1])
            rates[mode].append(got["rate"])
            if mode in cpu:
                meta = json.loads((tmp / mode / "meta.json").read_text())
                cpu[mode].append(100.0 * meta["collectors"]["nvml"]["thread_cpu_s"] / got["elapsed_s"])
    out = {}
    for mode in ("alone again", "10Hz", "100Hz"):
        ratios = [a / b for a, b in zip(rates[mode], rates["alone"])]
        out[mode] = {"work_ratio": summary(ratios), "slowdown_pct": 100.0 * (1 - statistics.median(ratios)),
                     "profiler_thread_cpu_pct": summary(cpu[mode]) if mode in cpu else None}
    return out


def _print_slowdown(title: str, r: dict) -> None:
    print(title)
    for mode, v in r.items():
        w, c = v["work_ratio"], v["profiler_thread_cpu_pct"]
        thread = f"nvml thread {c['median']:.2f} % of a core" if c else "(noise reference)"
        print(f"  {mode:11} work ratio {w['median']:.4f} [{w['q1']:.4f}-{w['q3']:.4f}]  "
              f"slowdown {v['slowdown_pct']:+.2f} %   {thread}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and rounds")
    p.add_argument("--gpus", type=int, default=1, help="GPUs in the fake for the slowdown part (default 1)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=3.0, help="workload seconds per run (default 3)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", default="paths,tick,cli,slowdown", help="parts: paths, tick, cli, slowdown")
    p.add_argument("--real", action="store_true",
                   help="paths and tick parts on the real pynvml (needs a GPU)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 3, 1.5
    parts = set(args.only.split(","))
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_avg": os.getloadavg()}}
    if "paths" in parts:
        r = paths(args.rounds, args.seconds, args.seed, args.real)
        result["paths"] = r
        _print_paths(r, args.real)
    if "tick" in parts:
        module = None
        if args.real:
            import pynvml
            module = pynvml
        iters, reps = (100, 3) if args.quick else (300, 7)
        result["tick"] = {}
        for (label, links), (path, buffers) in itertools.product(
                (("PCIe GPU", 0), ("SXM GPU, 18 NVLinks", 18)), (("old path", False), ("new path", True))):
            r = tick_costs(2, links, iters, reps, module, buffers)
            result["tick"][f"{label}, {path}"] = r
            print(f"tick, {label}, {path} (µs per GPU, median [q1-q3]; of which the NVML calls alone):")
            for part, v in r.items():
                a, b = v["us_per_gpu"], v["nvml_calls_us_per_gpu"]
                # the slow part's calls are stateful (samples newer than a timestamp): replayed
                # with the recorded timestamp they return more, so "alone" is not comparable
                alone = "    n/a" if part == "slow" else f"{b['median']:7.1f}"
                print(f"  {part:5} {a['median']:7.1f} [{a['q1']:.1f}-{a['q3']:.1f}]   "
                      f"NVML {alone}   ({v['calls_per_gpu']:.0f} calls)")
            if args.real and path == "new path":
                break
    if "cli" in parts:
        r = cli_slowdown(args.gpus, args.seconds, args.rounds, args.seed)
        result["cli"] = r
        _print_slowdown(f"workload slowdown, `counterprof run` (own process), {args.gpus} fake GPU(s), "
                        f"{args.rounds} rounds x {args.seconds:g} s:", r)
    if "slowdown" in parts:
        r = slowdown(args.gpus, args.seconds, args.rounds, args.seed)
        result["slowdown"] = r
        _print_slowdown(f"workload slowdown in-process (profile()), {args.gpus} fake GPU(s), "
                        f"{args.rounds} rounds x {args.seconds:g} s:", r)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
