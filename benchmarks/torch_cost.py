"""What `counterprof run --torch` costs the workload's own loop, and what it gets from short and
unmarked jobs: issue 28's bound (the loop under --torch at most 1.10x alone on every CPU
labelled job) and its unmarked benchmarks (a raw `a @ b` loop, a 64 MB elementwise loop, a
2-rank gloo all_reduce, and the worst case, a loop of µs ops).

    python benchmarks/torch_cost.py [--rounds 7] [--only labelled,unmarked] [--modes ...]
                                      [--jobs gpt2,ddp] [--json PATH]

A script, not a timed test: the machine is usually shared. Each round runs every job in every
mode once, in a random order; a job's figure is its own loop as it measures it (the labelled
jobs' $JOB_TRUTH: loop_s, resnet_infer's forward_s, ddp_train's ranks' mean loop_s; the
unmarked loops' seconds per iteration over a fixed wall time), and each ratio is taken within a
round (mode / alone). Three summaries per mode:
  wall         the median of the rounds' ratios of the loop's wall time (min-max)
  best         the ratio of the modes' fastest rounds (the least disturbed ones)
  own CPU      the median of the rounds' ratios of the loop's wall time less the time its main
               thread(s) waited for a CPU while it ran (run delay, /proc/<pid>/task/<pid>/schedstat
               sampled every 0.1 s by this script): what other processes on a shared machine
               add is taken out; what the profiler's own threads and processes take from the
               workload's CPUs is taken out too, so `profiler CPU` (meta.json) is printed beside
               it.

Modes (--modes; default alone,torch,torch-2/20):
  alone        the job by itself
  run          `counterprof run -q` without --torch (the default collectors): what is not torch's
  torch        `counterprof run -q --torch` (the default collectors, the default schedules:
               the adaptive time windows)
  torch-2/20   the same with `--torch-time-window 2/20`: the time schedule before issue 28
               (the first time window after 20 s), for a before/after in the same rounds

For the unmarked jobs under `torch`, the run's report (--json) says what came of it: the number
of traces, the roofline's top op and its bound, the overall verdict and its shares. Ceilings:
`counterprof calibrate --quick --no-collectives --force` into a private XDG_CACHE_HOME first
(--ceilings-home DIR reuses one).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "jobs"
PY = sys.executable
MODES = ("alone", "run", "torch", "torch-2/20")
DEFAULT_MODES = "alone,torch,torch-2/20"
BOUND = 1.10

UNMARKED = {
    "mm": """
        import json, os, time, torch
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < SECONDS:
            c = a @ b
            n += 1
        loop = time.perf_counter() - t0
    """,
    "elementwise 64 MB": """
        import json, os, time, torch
        size = 16 * 1024 * 1024
        a, b, c = torch.rand(size), torch.rand(size), torch.empty(size)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < SECONDS:
            torch.add(a, b, out=c)
            n += 1
        loop = time.perf_counter() - t0
    """,
    "µs ops (worst case)": """
        import json, os, time, torch
        x = torch.randn(16)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < SECONDS:
            x.add(1)
            n += 1
        loop = time.perf_counter() - t0
    """,
}
ALL_REDUCE = """
    import json, os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
    def bench(rank, port):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        x, go = torch.randn(1 << 20), torch.ones(1)
        n, t0 = 0, time.perf_counter()
        while True:
            go.fill_(1.0 if time.perf_counter() - t0 < SECONDS else 0.0)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)      # every rank stops at the same one
            if go.item() == 0:
                break
            dist.all_reduce(x)
            n += 1
        loop = time.perf_counter() - t0
        if rank == 0:
            with open(os.environ["JOB_TRUTH"], "a") as f:
                f.write(json.dumps({"iters": n, "loop_s": loop, "pid": os.getpid(),
                                    "end_unix_ns": time.time_ns()}) + "\\n")
        dist.destroy_process_group()
    if __name__ == "__main__":
        mp.spawn(bench, args=(int(sys.argv[1]),), nprocs=2)
"""
WRITE_TRUTH = """
with open(os.environ["JOB_TRUTH"], "a") as f:
    f.write(json.dumps({"iters": n, "loop_s": loop, "pid": os.getpid(), "end_unix_ns": time.time_ns()}) + "\\n")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MainThreads:
    """Samples, every `period` s, the schedstat of the main thread of every process in the tree
    under `root` (on-CPU ns, run-delay ns), so a loop's run delay can be read off afterwards."""

    def __init__(self, root: int, period: float = 0.1):
        self.root, self.period = root, period
        self.samples: dict[int, list[tuple[int, int]]] = {}      # pid -> [(unix ns, delay ns)]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            import psutil
            root = psutil.Process(self.root)
        except Exception:
            return
        while not self.done.is_set():
            try:
                pids = [self.root] + [c.pid for c in root.children(recursive=True)]
            except Exception:
                pids = [self.root]
            now = time.time_ns()
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
                        delay = int(f.read().split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                self.samples.setdefault(pid, []).append((now, delay))
            self.done.wait(self.period)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def delay_s(self, pid: int, t0: int, t1: int) -> float | None:
        """The run delay of pid's main thread between unix ns t0 and t1 (linear between
        samples, the last sample past the end: the process exits right after its loop)."""
        s = self.samples.get(pid)
        if not s or len(s) < 2:
            return None

        def at(t: int) -> float:
            if t <= s[0][0]:
                return s[0][1]
            for (ta, da), (tb, db) in zip(s, s[1:]):
                if ta <= t <= tb:
                    return da + (db - da) * (t - ta) / max(1, tb - ta)
            return s[-1][1]
        return max(0.0, (at(t1) - at(t0)) / 1e9)


def loops_of(lines: list[dict], seconds_key: str = "loop_s") -> list[tuple[int, int, float, int]]:
    """(pid, end unix ns, loop seconds, iterations) of each process's loop."""
    return [(x["pid"], x["end_unix_ns"], x[seconds_key], x.get("iters", 1))
            for x in lines if seconds_key in x and "pid" in x]


def labelled_jobs(gpt2_steps: int = 12, ddp_steps: int = 12) -> dict:
    """name -> (argv after the interpreter, truth lines -> loops_of(...))."""
    return {
        f"gpt2_train (AdamW, {gpt2_steps} steps)": (
            lambda: [str(JOBS / "gpt2_train.py"), "--steps", str(gpt2_steps)], loops_of),
        "dataloader_bound": (lambda: [str(JOBS / "dataloader_bound.py")], loops_of),
        "resnet_infer (forwards)": (lambda: [str(JOBS / "resnet_infer.py")],
                                    lambda lines: loops_of(lines, "forward_s")),
        f"ddp_train (2 ranks, spawn, {ddp_steps} steps)": (
            lambda: [str(JOBS / "ddp_train.py"), "--spawn", "2", "--steps", str(ddp_steps), "--port",
                     str(free_port())], loops_of),
    }


def unmarked_jobs(tmp: Path, seconds: float) -> dict:
    jobs = {}
    for name, body in UNMARKED.items():
        path = tmp / f"unmarked_{len(jobs)}.py"
        path.write_text(textwrap.dedent(body).replace("SECONDS", repr(seconds)) + WRITE_TRUTH)
        jobs[name] = (lambda p=path: [str(p)], loops_of)
    path = tmp / "all_reduce.py"
    path.write_text(textwrap.dedent(ALL_REDUCE).replace("SECONDS", repr(seconds)))
    jobs["gloo all_reduce 4 MB (2 ranks)"] = (lambda: [str(path), str(free_port())], loops_of)
    return jobs


def figures(loops: list[tuple[int, int, float, int]], threads: MainThreads) -> dict:
    """The loop's wall time per iteration (mean over processes), and the same less its main
    thread's run delay."""
    wall = statistics.mean(sec / it for _, _, sec, it in loops)
    own = []
    for pid, end, sec, it in loops:
        d = threads.delay_s(pid, end - int(sec * 1e9), end)
        own.append(None if d is None else (sec - d) / it)
    return {"figure": wall, "own": statistics.mean(own) if own and None not in own else None}


def run_once(tmp: Path, argv: list[str], mode: str, env: dict, tag: str):
    truth = tmp / f"{tag}.jsonl"
    truth.unlink(missing_ok=True)
    e = {**env, "JOB_TRUTH": str(truth)}
    run = None
    if mode == "alone":
        cmd = [PY, *argv]
    else:
        run = tmp / f"run-{tag}"
        cmd = [PY, "-m", "counterprof", "run", "-q", "-o", str(run), "--force"]
        if mode != "run":
            cmd.append("--torch")
        if mode == "torch-2/20":
            cmd += ["--torch-time-window", "2/20"]
        cmd += ["--", PY, *argv]
    proc = subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(tmp))
    threads = MainThreads(proc.pid)
    try:
        rc = proc.wait(timeout=900)
    finally:
        threads.stop()
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} -> exit {rc}")
    return [json.loads(x) for x in truth.read_text().splitlines()], run, threads


def run_facts(run: Path) -> dict:
    """What a --torch run left: its traces (how many, MB, time windows among them) and the
    profiler's own CPU seconds (meta.json)."""
    meta = json.loads((run / "meta.json").read_text())
    torch_st = meta["collectors"].get("torch", {})
    traces = list(run.rglob("*.pt.trace.json"))
    return {"traces": torch_st.get("traces", 0), "status": torch_st.get("status"),
            "time_traces": sum(p.name.endswith(".time.pt.trace.json") for p in traces),
            "trace_mb": sum(p.stat().st_size for p in traces) / 1e6,
            "profiler_cpu_s": (meta.get("profiler") or {}).get("cpu_s")}


def what_came(run: Path, env: dict) -> dict:
    """The report's view of an unmarked job's run."""
    out = run_facts(run)
    rep = subprocess.run([PY, "-m", "counterprof", "report", str(run), "--json"], env=env,
                         capture_output=True, text=True, timeout=300)
    if rep.returncode != 0:
        out["report"] = rep.stderr.strip().splitlines()[-1:]
        return out
    r = json.loads(rep.stdout)
    roof = r.get("roofline") or {}
    top = (roof.get("top_ops") or [{}])[0]
    out.update(verdict=r["overall"]["verdict"], shares=r["overall"].get("shares"),
               roofline=bool(roof), top_op=top.get("name"), bound=top.get("bound"))
    return out


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f}x ({min(values):.2f}-{max(values):.2f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default="labelled,unmarked")
    ap.add_argument("--seconds", type=float, default=5.0, help="the unmarked loops' wall time (default 5)")
    ap.add_argument("--modes", default=DEFAULT_MODES, help=f"of {','.join(MODES)} (default {DEFAULT_MODES})")
    ap.add_argument("--jobs", default=None, metavar="WORDS",
                    help="only the jobs whose name holds one of these comma-separated words")
    ap.add_argument("--ceilings-home", default=None, help="an XDG_CACHE_HOME with ceilings already")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--gpt2-steps", type=int, default=12,
                    help="gpt2_train's steps (default 12, as the tests run it; the job's own default is 40)")
    ap.add_argument("--ddp-steps", type=int, default=12, help="ddp_train's steps (default 12)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    parts = {p.strip() for p in args.only.split(",")}
    modes = [m for m in MODES if m in args.modes.split(",")]
    assert modes[0] == "alone", "alone is every ratio's denominator"
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    raw: dict = {}
    with tempfile.TemporaryDirectory(prefix="counterprof-torch-cost-") as d:
        tmp = Path(d)
        env = dict(os.environ)
        env["XDG_CACHE_HOME"] = args.ceilings_home or str(tmp / "xdg")
        if not args.ceilings_home and "unmarked" in parts:
            subprocess.run([PY, "-m", "counterprof", "calibrate", "--quick", "--no-collectives", "--force"],
                           env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        jobs = {}
        if "labelled" in parts:
            jobs.update({k: ("labelled",) + v for k, v in labelled_jobs(args.gpt2_steps, args.ddp_steps).items()})
        if "unmarked" in parts:
            jobs.update({k: ("unmarked",) + v for k, v in unmarked_jobs(tmp, args.seconds).items()})
        if args.jobs:
            words = [w.strip() for w in args.jobs.split(",") if w.strip()]
            jobs = {k: v for k, v in jobs.items() if any(w in k for w in words)}
        for rnd in range(args.rounds):
            order = [(job, mode) for job in jobs for mode in modes]
            rng.shuffle(order)
            for i, (job, mode) in enumerate(order):
                kind, argv_of, loops = jobs[job]
                lines, run, threads = run_once(tmp, argv_of(), mode, env, f"r{rnd}-{i}")
                rec = figures(loops(lines), threads)
                if run is not None and kind == "unmarked" and mode == "torch":
                    rec.update(what_came(run, env))
                elif run is not None:
                    rec.update(run_facts(run))
                raw.setdefault(job, {}).setdefault(mode, []).append(rec)
                print(f"round {rnd + 1}/{args.rounds}: {job:32s} {mode:10s} {rec['figure']:.6g}"
                      f" (own CPU {rec['own'] if rec['own'] is None else format(rec['own'], '.6g')})"
                      + (f"  {rec.get('traces')} traces ({rec.get('time_traces')} time), "
                         f"{rec.get('trace_mb', 0):.1f} MB" if "traces" in rec else "")
                      + (f", {rec.get('verdict')}, {rec.get('bound')}" if "verdict" in rec else ""),
                      file=sys.stderr, flush=True)
    print(f"\nloop time under each mode / alone: {args.rounds} paired rounds; seed {seed}; "
          f"load {os.getloadavg()[0]:.1f} at the end; {os.cpu_count()} CPUs")
    print("wall: median (min-max) of the rounds' ratios; best: fastest / fastest; own CPU: median "
          "(min-max) of the rounds' ratios of the loop less its main thread's run delay")
    summary = {}
    for m in modes[1:]:
        print(f"\n{m}:")
        print(f"  {'job':32s} {'wall':>22s} {'best':>7s} {'own CPU':>22s}  bound {BOUND}x (own CPU)")
        for job, by_mode in raw.items():
            alone = by_mode["alone"]
            recs = by_mode.get(m, [])
            wall = [r["figure"] / a["figure"] for r, a in zip(recs, alone)]
            own = [r["own"] / a["own"] for r, a in zip(recs, alone) if r["own"] and a["own"]]
            best = min(r["figure"] for r in recs) / min(a["figure"] for a in alone) if recs else None
            summary.setdefault(job, {})[m] = {
                "wall": statistics.median(wall) if wall else None, "best": best,
                "own": statistics.median(own) if own else None}
            ok = ""
            if jobs[job][0] == "labelled" and own:
                ok = "ok" if statistics.median(own) <= BOUND else "OVER"
            print(f"  {job:32s} {fmt(wall):>22s} {best:7.3f} {fmt(own):>22s}  {ok}")
    print(f"\n{'traces per run (time windows among them), trace MB, profiler CPU s: medians':60s}")
    for job, by_mode in raw.items():
        cells = []
        for m in modes[1:]:
            recs = [r for r in by_mode.get(m, []) if "traces" in r]
            if recs:
                med = {k: statistics.median(r.get(k) or 0 for r in recs)
                       for k in ("traces", "time_traces", "trace_mb", "profiler_cpu_s")}
                cells.append(f"{m}: {med['traces']:g} ({med['time_traces']:g}), {med['trace_mb']:.1f} MB, "
                             f"{med['profiler_cpu_s']:.2f} s")
        print(f"  {job:32s} " + "; ".join(cells))
    came = {job: by_mode["torch"] for job, by_mode in raw.items()
            if by_mode.get("torch") and "verdict" in by_mode["torch"][0]}
    if came:
        print("\nunmarked jobs under --torch (default schedule), per round: traces / verdict (shares) / "
              "roofline top op: bound / trace MB")
        for job, recs in came.items():
            for r in recs:
                shares = ", ".join(f"{k} {v:.0%}" for k, v in (r.get("shares") or {}).items())
                print(f"  {job:32s} {r['traces']} / {r.get('verdict')} ({shares}) / "
                      f"{r.get('top_op')}: {r.get('bound')} / {r['trace_mb']:.1f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps({"seed": seed, "rounds": args.rounds, "raw": raw,
                                               "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
