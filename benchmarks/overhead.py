"""counterprof's overhead, side by side with perf stat, in one run.

    python benchmarks/overhead.py                       # everything (the RSS run takes 10 min)
    python benchmarks/overhead.py --quick               # ~2 minutes
    python benchmarks/overhead.py --rounds 7 --rss-seconds 120 --json bench.json
    python benchmarks/overhead.py --only overhead,startup

A script, not a timed test: the machine it runs on is usually shared and noisy, so
every figure is relative, from paired runs (each round runs every mode once, in a
random order), summarised as the median of per-round ratios with its spread. No
absolute time is compared with a constant, except start-up and RSS, which are the
targets themselves.

Parts (--only):
  overhead  benchmarks/workload.py (fixed wall time, reports its iterations and CPU)
            alone, again alone (the noise reference), under `perf stat -I 10` (and
            `-I 1`, for reference), under `counterprof run -I 10` and `-I 1` (and
            `-I 10 --collectors perf`, to separate the host collector's share). Work ratio = rate(mode) / rate(alone).
            Profiler CPU = tree CPU (getrusage(RUSAGE_CHILDREN) delta around the run)
            - the workload's own CPU - the alone runs' residue (interpreter exit)
            - the same wrapper's start-up CPU (median of `WRAPPER -- true`), per second
            of workload, as % of one core.
  table     issue 14's table: the profiler's own CPU around a sleeping workload, where
            the tree's CPU is the tool's: (tree CPU of `TOOL -- sleep S` - the median of
            `TOOL -- true`) / S, for perf stat and counterprof run (default collectors) at
            -I 1, 10, 100 with the same events (--table-events); paired per round, the
            ratio counterprof / perf stat; and counterprof's threads from meta.json.
            --baseline EXE adds another counterprof (e.g. main's, for before/after) to the
            same rounds: its CPU, its threads, and the paired ratio counterprof / baseline.
  sampling  `counterprof run --sampling kernel` beside `--sampling tick` and perf stat, at -I 1 and
            -I 10 (not in the default parts: --only sampling). Kernel sampling samples per
            interval of each thread's CPU time, so a sleeping workload says little: both the
            busy benchmarks/workload.py and `sleep` run. counterprof's CPU: its process's own
            (meta.json profiler.cpu_s) minus the median of the same mode's `-- true`; perf
            stat's: tree CPU - the workload's own - the alone runs' residue - its `-- true`;
            % of one core per second of workload; ratio = counterprof / perf stat, paired per
            round; work ratio = iterations/s vs alone (the kernel's sampling runs in the
            workload's context: its cost shows there). --sampling-collectors picks the
            collectors (default: the default ones).
  startup   wall time of `true`, `perf stat -- true`, `counterprof --help`,
            `counterprof run -q -- true` (and with its summary); with --baseline, the baseline's
            `run -q -- true` and `run -- true` in the same rounds, and the paired ratios
            counterprof / baseline (wall, per round).
  cm        counterprof.profile() in one Python process: the workload function alone vs
            inside profile(interval_ms=10) and (interval_ms=1); profiler CPU from
            meta.json "profiler"."cpu_s" (profiler threads only).
  rss       `counterprof run -I 1` over a long workload; the counterprof process's RSS
            (psutil) every second: peak, first vs last quarter after warm-up, slope.
  live      `counterprof run -I 10 --live` side by side with `counterprof run -I 10` and the
            workload alone (--live-seconds each): the dashboard drawn on a real pty (120x40,
            TERM=xterm-256color, the pty the controlling terminal so keys are read too; the
            benchmark drains the pty like a terminal would), and the plain-line mode (stderr
            a pipe). Live cost = meta.json profiler cpu_s of the live run − that of the plain
            run in the same round, per second of workload; the view thread's own CPU and
            frames from meta.json "live_view"; work ratio vs the plain run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKLOAD = HERE / "workload.py"
PARTS = ("table", "overhead", "startup", "cm", "rss", "live")
OPT_IN_PARTS = ("sampling",)                  # run only when --only names them
SAMPLING_INTERVALS = (1.0, 10.0)
SAMPLING_TOOLS = ("perf", "tick", "kernel")
EVENTS = "task-clock,page-faults,context-switches"
TABLE_EVENTS = "task-clock,page-faults"       # the issue's: what perf stat counts here too
TABLE_INTERVALS = (1.0, 10.0, 100.0)
# issue 14's goals, % of one core: counterprof at -I 10 at most perf stat's, at -I 1 at most
# half of perf stat's, at -I 100 under 0.2%
TABLE_TARGET_VS_PERF = {10.0: 1.0, 1.0: 0.5}
TABLE_TARGET_PCT = {100.0: 0.2}
TARGET_HELP_S = 0.06
TARGET_RUN_TRUE_S = 0.15

TARGET_CPU_PCT = {10.0: 1.0, 1.0: 2.0}     # % of one core at -I 10 / -I 1
TARGET_STARTUP_S = TARGET_RUN_TRUE_S
TARGET_LIVE_CPU_PCT = 5.0                    # --live: under 5% of one core in the profiler ...
TARGET_LIVE_WORK_LOSS = 0.01                 # ... and under 1% of the workload's wall time
TARGET_RSS_MB = 150.0
FLAT_SLOPE_MB_PER_MIN = 0.5                  # "flat": |slope| below this ...
FLAT_QUARTER_DELTA_MB = 2.0                  # ... and last-quarter median within this of the first's


# -- small statistics ----------------------------------------------------------------------

def summary(values: list[float]) -> dict | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    out = {"n": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
    if len(v) >= 2:
        q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
        out.update(q1=q1, q3=q3)
    else:
        out.update(q1=v[0], q3=v[0])
    return out


def slope_per_min(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over ts (seconds), per minute."""
    n = len(ts)
    if n < 2:
        return 0.0
    mt, my = sum(ts) / n, sum(ys) / n
    den = sum((t - mt) ** 2 for t in ts)
    if den == 0:
        return 0.0
    return 60.0 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den


# -- running things --------------------------------------------------------------------------

def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_tree(cmd: list[str], timeout: float) -> dict:
    """Run cmd to completion; its wall time and the CPU of the whole tree it reaped."""
    c0 = children_cpu()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    return {"rc": p.returncode, "wall_s": wall, "tree_cpu_s": children_cpu() - c0,
            "stdout": p.stdout, "stderr": p.stderr}


def last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def read_meta(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def meta_facts(meta: dict | None) -> dict:
    """What a run's meta.json says about the profiler itself."""
    if not meta:
        return {"meta": "missing"}
    perf = (meta.get("collectors") or {}).get("perf") or {}
    host = (meta.get("collectors") or {}).get("host") or {}
    prof = meta.get("profiler") or {}
    return {
        "status": meta.get("status"),
        "profiler_cpu_s": prof.get("cpu_s"),
        "profiler_cpu_scope": prof.get("cpu_scope"),
        "profiler_max_rss_bytes": prof.get("max_rss_bytes"),
        "duration_s": (meta.get("duration_ns") or 0) / 1e9,
        "perf_status": perf.get("status"), "perf_reason": perf.get("reason") or None,
        "host_status": host.get("status"), "host_reason": host.get("reason") or None,
        "perf_thread_cpu_s": perf.get("thread_cpu_s"),
        "host_thread_cpu_s": host.get("thread_cpu_s"),
        "threads_thread_cpu_s": ((meta.get("collectors") or {}).get("threads") or {}).get("thread_cpu_s"),
        "sampler": perf.get("sampler"),
        "warnings": meta.get("warnings") or [],
        "workload": meta.get("workload"),
    }


def interval_of(mode: str) -> float:
    """cp-I10-perfonly -> 10.0"""
    return float(mode.split("-I", 1)[1].split("-")[0])


def thread_breakdown(recs: list[dict]) -> dict:
    """Per-thread CPU from meta.json, % of one core per second of workload: the C sampler,
    the Python drain thread (perf thread_cpu_s - sampler), the host collector's thread."""
    out: dict[str, list[float]] = {"sampler": [], "drain": [], "host": [], "threads": []}
    for x in recs:
        wl = x.get("workload") or {}
        el = wl.get("elapsed_s")
        s = x.get("sampler") or {}
        if not el:
            continue
        if s.get("thread_cpu_s") is not None:
            out["sampler"].append(100.0 * s["thread_cpu_s"] / el)
            if x.get("perf_thread_cpu_s") is not None:
                out["drain"].append(100.0 * (x["perf_thread_cpu_s"] - s["thread_cpu_s"]) / el)
        if x.get("host_thread_cpu_s") is not None:
            out["host"].append(100.0 * x["host_thread_cpu_s"] / el)
        if x.get("threads_thread_cpu_s") is not None:
            out["threads"].append(100.0 * x["threads_thread_cpu_s"] / el)
    return {k: summary(v) for k, v in out.items()}


def fmt_breakdown(b: dict | None) -> str:
    if not b:
        return "n/a"
    return ", ".join(f"{k} {v['median']:.2f}%" for k, v in b.items() if v)


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def stderr_lines(text: str, limit: int = 10) -> list[str]:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-limit:]


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.py = sys.executable
        self.cp = args.counterprof
        self.perf = args.perf
        self.tmp = Path(tempfile.mkdtemp(prefix="counterprof-bench-", dir=args.tmp))
        self.rng = random.Random(args.seed)
        self.serial = 0
        self.problems: list[str] = []

    def new_run_dir(self) -> Path:
        self.serial += 1
        return self.tmp / f"run-{self.serial:04d}"

    def workload_cmd(self, seconds: float) -> list[str]:
        return [self.py, str(WORKLOAD), "--seconds", f"{seconds:g}"]

    def problem(self, text: str) -> None:
        self.problems.append(text)
        print(f"  ! {text}", file=sys.stderr, flush=True)

    # -- wrappers -------------------------------------------------------------------------

    def wrapper(self, mode: str, run_dir: Path | None) -> list[str]:
        ev = self.args.events
        if mode == "alone":
            return []
        interval = f"{interval_of(mode):g}"
        if mode.startswith("perf-I"):
            return [self.perf, "stat", "-I", interval, "-e", ev, "-x", ",", "-o", "/dev/null", "--"]
        if mode.startswith("cp-I"):
            cmd = [self.cp, "run", "-q"]
            if ev:
                cmd += ["-e", ev]
            if mode.endswith("-perfonly"):
                cmd += ["--collectors", "perf"]
            return cmd + ["-I", interval, "-o", str(run_dir), "--"]
        raise ValueError(mode)

    def one(self, mode: str, tail: list[str], timeout: float) -> dict:
        run_dir = self.new_run_dir() if mode.startswith("cp-") else None
        cmd = self.wrapper(mode, run_dir) + tail
        res = run_tree(cmd, timeout)
        rec = {"mode": mode, "rc": res["rc"], "wall_s": res["wall_s"], "tree_cpu_s": res["tree_cpu_s"]}
        err = stderr_lines(res["stderr"])
        if err:
            rec["stderr"] = err
        if res["rc"] != 0:
            self.problem(f"{mode}: exit status {res['rc']}: {' | '.join(err[-3:])}")
        if run_dir is not None:
            rec.update(meta_facts(read_meta(run_dir)))
            if run_dir.exists():
                rec["run_dir_bytes"] = dir_bytes(run_dir)
                if not self.args.keep:
                    shutil.rmtree(run_dir, ignore_errors=True)
        return rec, res["stdout"]

    # -- overhead ---------------------------------------------------------------------------

    def overhead(self) -> dict:
        a = self.args
        modes = ["alone", "alone-again", "perf-I10", "perf-I1", "cp-I10", "cp-I1", "cp-I10-perfonly"]
        wrapped = ["perf-I10", "perf-I1", "cp-I10", "cp-I1", "cp-I10-perfonly"]
        runs: list[dict] = []
        timeout = a.seconds + 120
        print(f"[overhead] {a.rounds} rounds x {len(modes)} modes x {a.seconds:g} s "
              f"(+ start-up baselines)", file=sys.stderr, flush=True)
        for r in range(a.rounds):
            jobs = [(m, "work") for m in modes] + [(m, "true") for m in wrapped]
            self.rng.shuffle(jobs)
            for mode, kind in jobs:
                real_mode = "alone" if mode == "alone-again" else mode
                tail = self.workload_cmd(a.seconds) if kind == "work" else ["true"]
                rec, out = self.one(real_mode, tail, timeout)
                rec.update(mode=mode, kind=kind, round=r)
                if kind == "work":
                    wl = last_json_line(out)
                    if wl is None:
                        self.problem(f"{mode}: round {r}: no JSON from the workload")
                    else:
                        rec["workload"] = wl
                        # perf stat -I exits without wait()ing for its child (seen with perf
                        # 6.1): then the workload's CPU never reaches our RUSAGE_CHILDREN
                        rec["workload_reaped"] = rec["tree_cpu_s"] >= 0.5 * wl["cpu_s"]
                runs.append(rec)
            print(f"  round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
        return self._overhead_summary(runs, modes, wrapped)

    def _overhead_summary(self, runs, modes, wrapped) -> dict:
        work = {(x["round"], x["mode"]): x for x in runs if x["kind"] == "work" and "workload" in x}
        rounds = sorted({x["round"] for x in runs})
        # start-up CPU of a wrapper: `WRAPPER -- true`, pooled over the modes of one tool
        # (-I changes nothing measurable for `true`; pooling halves the noise)
        def tool(m):   # cp-I10, cp-I1 -> cp; cp-I10-perfonly -> cp-perfonly (fewer collectors start)
            return m.split("-I", 1)[0] + ("-perfonly" if m.endswith("-perfonly") else "")
        startup_cpu_by_mode = {m: summary([x["tree_cpu_s"] for x in runs if x["kind"] == "true"
                                           and x["mode"] == m and x["rc"] == 0]) for m in wrapped}
        startup_cpu = {m: summary([x["tree_cpu_s"] for x in runs if x["kind"] == "true"
                                   and tool(x["mode"]) == tool(m) and x["rc"] == 0]) for m in wrapped}
        # residue of a bare workload run: tree CPU its own getrusage cannot see (interpreter exit)
        residue = summary([work[(r, "alone")]["tree_cpu_s"] - work[(r, "alone")]["workload"]["cpu_s"]
                           for r in rounds if (r, "alone") in work])
        res_med = residue["median"] if residue else 0.0
        # meta.json's cpu_s counts from session start to the end of compaction: the same
        # figure for `-- true` is its fixed part
        meta_true = {}
        for m in wrapped:
            v = [x["profiler_cpu_s"] for x in runs if x["kind"] == "true" and tool(x["mode"]) == tool(m)
                 and x.get("profiler_cpu_s") is not None]
            meta_true[m] = statistics.median(v) if v else None
        unreaped = sorted({x["mode"] for x in work.values() if not x["workload_reaped"]})
        out = {"runs": runs, "startup_cpu_s": {tool(m): startup_cpu[m] for m in wrapped},
               "startup_cpu_s_by_mode": startup_cpu_by_mode, "alone_residue_cpu_s": residue,
               "meta_cpu_s_of_true": meta_true, "workload_not_reaped_by": unreaped, "modes": {}}
        for m in modes:
            ratios, cpu_pct, meta_pct, ticks_ratio, late = [], [], [], [], []
            for r in rounds:
                base, x = work.get((r, "alone")), work.get((r, m))
                if base is None or x is None:
                    continue
                if m != "alone":
                    ratios.append(x["workload"]["rate"] / base["workload"]["rate"])
                wl = x["workload"]
                if m in wrapped and startup_cpu[m]:
                    if x["workload_reaped"]:
                        excess = x["tree_cpu_s"] - wl["cpu_s"] - res_med - startup_cpu[m]["median"]
                    else:   # the wrapper never reaped the workload: the tree is the wrapper alone
                        excess = x["tree_cpu_s"] - startup_cpu[m]["median"]
                    cpu_pct.append(100.0 * excess / wl["elapsed_s"])
                if m.startswith("cp-") and meta_true[m] is not None:
                    if x.get("profiler_cpu_s") is not None:
                        meta_pct.append(100.0 * (x["profiler_cpu_s"] - meta_true[m]) / wl["elapsed_s"])
                    s = x.get("sampler") or {}
                    interval_s = interval_of(m) / 1000
                    if s.get("ticks") is not None and x.get("duration_s"):
                        ticks_ratio.append(s["ticks"] / (x["duration_s"] / interval_s))
                        late.append(s.get("late_ticks", 0) / max(1, s["ticks"]))
            entry = {"work_ratio": summary(ratios), "profiler_cpu_pct": summary(cpu_pct)}
            if m.startswith("cp-"):
                entry["meta_cpu_pct"] = summary(meta_pct)
                entry["ticks_vs_expected"] = summary(ticks_ratio)
                entry["late_tick_share"] = summary(late)
                cp_runs = [x for x in runs if x["mode"] == m]
                entry["thread_cpu_pct"] = thread_breakdown([x for x in cp_runs if x["kind"] == "work"])
                entry["max_rss_mb"] = max((x.get("profiler_max_rss_bytes") or 0) / 2**20 for x in cp_runs)
                entry["warnings"] = sorted({w for x in cp_runs for w in x.get("warnings", [])})
                entry["failed_runs"] = sum(1 for x in cp_runs if x["rc"] != 0 or x.get("status") != "complete")
                entry["read_errors"] = sum((x.get("sampler") or {}).get("read_errors", 0) for x in cp_runs)
            out["modes"][m] = entry
        # paired: counterprof -I 10 against perf stat -I 10, and the noise reference
        cp_vs_perf = [work[(r, "cp-I10")]["workload"]["rate"] / work[(r, "perf-I10")]["workload"]["rate"]
                      for r in rounds if (r, "cp-I10") in work and (r, "perf-I10") in work]
        out["cp10_vs_perf10"] = summary(cp_vs_perf)
        noise = out["modes"]["alone-again"]["work_ratio"]
        cvp = out["cp10_vs_perf10"]
        if noise and cvp:
            # within noise: the paired cp/perf median is no further below 1 than the
            # alone-vs-alone spread reaches (doing more work than perf stat is not a cost)
            reach = max(abs(noise["min"] - 1), abs(noise["max"] - 1))
            out["cp10_within_noise_of_perf"] = cvp["median"] >= 1 - reach
            out["noise_reach"] = reach
        return out

    # -- issue 14's table ----------------------------------------------------------------

    def table(self) -> dict:
        a = self.args
        ev = a.table_events
        secs = a.table_seconds
        tools = ("perf", "cp") + (("base",) if a.baseline else ())
        modes = [(tool, i) for tool in tools for i in TABLE_INTERVALS]
        print(f"[table] {a.rounds} rounds x {len(modes)} modes x (sleep {secs:g} + true), events {ev}",
              file=sys.stderr, flush=True)
        runs = []
        for r in range(a.rounds):
            jobs = [(tool, i, kind) for tool, i in modes for kind in ("sleep", "true")]
            self.rng.shuffle(jobs)
            for tool, interval, kind in jobs:
                tail = ["sleep", f"{secs:g}"] if kind == "sleep" else ["true"]
                run_dir = self.new_run_dir() if tool != "perf" else None
                if tool == "perf":
                    cmd = [self.perf, "stat", "-I", f"{interval:g}", "-e", ev, "-x", ",", "-o", "/dev/null", "--"]
                else:
                    exe = self.cp if tool == "cp" else a.baseline
                    cmd = [exe, "run", "-q", "-e", ev, "-I", f"{interval:g}", "-o", str(run_dir), "--"]
                res = run_tree(cmd + tail, secs + 120)
                rec = {"tool": tool, "interval_ms": interval, "kind": kind, "round": r,
                       "rc": res["rc"], "wall_s": res["wall_s"], "tree_cpu_s": res["tree_cpu_s"]}
                if res["rc"] != 0:
                    self.problem(f"table {tool} -I {interval:g} {kind}: exit status {res['rc']}: "
                                 f"{' | '.join(stderr_lines(res['stderr'])[-3:])}")
                if run_dir is not None:
                    rec.update(meta_facts(read_meta(run_dir)))
                    if not a.keep:
                        shutil.rmtree(run_dir, ignore_errors=True)
                runs.append(rec)
            print(f"  round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
        ok_runs = [x for x in runs if x["rc"] == 0]
        true_cpu = {(t, i): summary([x["tree_cpu_s"] for x in ok_runs if x["kind"] == "true"
                                     and x["tool"] == t and x["interval_ms"] == i]) for t, i in modes}
        pct = {}      # (tool, interval) -> {round: % of a core}
        for x in ok_runs:
            base = true_cpu[(x["tool"], x["interval_ms"])]
            if x["kind"] == "sleep" and base:
                pct.setdefault((x["tool"], x["interval_ms"]), {})[x["round"]] = \
                    100.0 * (x["tree_cpu_s"] - base["median"]) / secs
        out = {"events": ev, "seconds": secs, "runs": runs, "intervals": {}}
        for i in TABLE_INTERVALS:
            perf, cp = pct.get(("perf", i), {}), pct.get(("cp", i), {})
            ratios = [cp[r] / perf[r] for r in cp if r in perf and perf[r] > 0]
            threads = self._steady_threads(ok_runs, i, secs)
            host = threads.pop("host_s")
            if a.baseline:
                base = pct.get(("base", i), {})
                base_threads = self._steady_threads(ok_runs, i, secs, tool="base")
                base_threads.pop("host_s")
                baseline = {"base_pct": summary(list(base.values())),
                            "vs_base": summary([cp[r] / base[r] for r in cp if r in base and base[r] > 0]),
                            "base_threads_pct": {k: summary(v) for k, v in base_threads.items()}}
            else:
                baseline = {}
            out["intervals"][str(i)] = {**baseline,
                "perf_pct": summary(list(perf.values())), "cp_pct": summary(list(cp.values())),
                "ratio": summary(ratios),
                "threads_pct": {k: summary(v) for k, v in threads.items() if k not in ("rest", "sum")},
                "rest_pct": summary(threads["rest"]), "sum_pct": summary(threads["sum"]),
                # the host collector samples every 100 ms: its steady CPU per sample
                "host_us_per_sample": summary([1e6 * v / (secs * 10) for v in host]),
                "true_cpu_s": {"perf": true_cpu[("perf", i)], "cp": true_cpu[("cp", i)]}}
        return out

    @staticmethod
    def _steady_threads(runs: list[dict], interval: float, secs: float, tool: str = "cp") -> dict[str, list[float]]:
        """Each profiler thread's CPU (meta.json) in a `sleep` run minus its median in the `true`
        runs (thread start, first writes, stop: what does not grow with the run), % of a core;
        rest: the process's CPU beside the collectors' threads (main thread, compaction)."""
        def parts(x: dict) -> dict[str, float | None]:
            s = x.get("sampler") or {}
            sampler, perf = s.get("thread_cpu_s"), x.get("perf_thread_cpu_s")
            threads_sum = sum(x.get(k) or 0 for k in ("perf_thread_cpu_s", "host_thread_cpu_s",
                                                       "threads_thread_cpu_s"))
            return {"sampler": sampler, "drain": None if perf is None or sampler is None else perf - sampler,
                    "host": x.get("host_thread_cpu_s"), "threads": x.get("threads_thread_cpu_s"),
                    "rest": None if x.get("profiler_cpu_s") is None else x["profiler_cpu_s"] - threads_sum,
                    "sum": x.get("profiler_cpu_s")}
        cp = [x for x in runs if x["tool"] == tool and x["interval_ms"] == interval]
        base = {}
        for k in ("sampler", "drain", "host", "threads", "rest", "sum"):
            v = [parts(x)[k] for x in cp if x["kind"] == "true" and parts(x)[k] is not None]
            base[k] = statistics.median(v) if v else 0.0
        out: dict[str, list[float]] = {k: [] for k in base}
        out["host_s"] = []
        for x in cp:
            if x["kind"] != "sleep":
                continue
            for k, v in parts(x).items():
                if v is not None:
                    out[k].append(100.0 * (v - base[k]) / secs)
                    if k == "host":
                        out["host_s"].append(v - base[k])
        return out

    # -- kernel sampling against the tick and perf stat ---------------------------------

    def sampling(self) -> dict:
        a = self.args
        ev = a.table_events
        secs = a.seconds
        cells = [(tool, i) for tool in SAMPLING_TOOLS for i in SAMPLING_INTERVALS]
        print(f"[sampling] {a.rounds} rounds x {len(cells)} modes x (busy, sleep, true) x {secs:g} s, "
              f"events {ev}", file=sys.stderr, flush=True)
        runs = []
        for r in range(a.rounds):
            jobs = [(t, i, k) for t, i in cells for k in ("busy", "sleep", "true")] + [("alone", 0.0, "busy")]
            self.rng.shuffle(jobs)
            for tool, interval, kind in jobs:
                tail = {"busy": self.workload_cmd(secs), "sleep": ["sleep", f"{secs:g}"], "true": ["true"]}[kind]
                run_dir = self.new_run_dir() if tool in ("tick", "kernel") else None
                if tool == "alone":
                    cmd = []
                elif tool == "perf":
                    cmd = [self.perf, "stat", "-I", f"{interval:g}", "-e", ev, "-x", ",", "-o", "/dev/null", "--"]
                else:
                    cmd = [self.cp, "run", "-q", "-e", ev, "-I", f"{interval:g}", "--sampling", tool,
                           "-o", str(run_dir)]
                    if a.sampling_collectors:
                        cmd += ["--collectors", a.sampling_collectors]
                    cmd += ["--"]
                res = run_tree(cmd + tail, secs + 120)
                rec = {"tool": tool, "interval_ms": interval, "kind": kind, "round": r, "rc": res["rc"],
                       "tree_cpu_s": res["tree_cpu_s"]}
                if res["rc"] != 0:
                    self.problem(f"sampling {tool} -I {interval:g} {kind}: exit status {res['rc']}: "
                                 f"{' | '.join(stderr_lines(res['stderr'])[-3:])}")
                if kind == "busy":
                    rec["work"] = last_json_line(res["stdout"])
                if run_dir is not None:
                    meta = read_meta(run_dir)
                    rec.update(meta_facts(meta))
                    perf = ((meta or {}).get("collectors") or {}).get("perf") or {}
                    rec["sampling"] = perf.get("sampling")
                    rec["kernel_sampler"] = perf.get("kernel_sampler")
                    if not a.keep:
                        shutil.rmtree(run_dir, ignore_errors=True)
                runs.append(rec)
            print(f"  round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
        return self._sampling_summary(runs, cells, secs)

    @staticmethod
    def _sampling_summary(runs: list[dict], cells: list, secs: float) -> dict:
        ok_runs = [x for x in runs if x["rc"] == 0]
        by = {(x["round"], x["tool"], x["interval_ms"], x["kind"]): x for x in ok_runs}
        rounds = sorted({x["round"] for x in runs})
        residue = statistics.median([x["tree_cpu_s"] - x["work"]["cpu_s"] for x in ok_runs
                                     if x["tool"] == "alone" and x.get("work")] or [0.0])

        def true_median(tool, i, key):
            v = [x.get(key) for x in ok_runs if x["tool"] == tool and x["interval_ms"] == i
                 and x["kind"] == "true" and x.get(key) is not None]
            return statistics.median(v) if v else None

        def cpu_pct(x, tool, i):
            """The tool's own CPU over the run, % of one core per second of workload."""
            if tool == "perf":
                base = true_median(tool, i, "tree_cpu_s")
                own = x["tree_cpu_s"]
                # perf stat -I may exit without reaping its child: then the tree is perf alone
                if x["kind"] == "busy" and own >= 0.5 * x["work"]["cpu_s"]:
                    own -= x["work"]["cpu_s"] + residue
            else:
                base = true_median(tool, i, "profiler_cpu_s")
                own = x.get("profiler_cpu_s")
            if base is None or own is None:
                return None
            return 100.0 * (own - base) / secs

        out: dict = {"events": None, "seconds": secs, "residue_cpu_s": residue, "runs": runs, "cells": {}}
        for kind in ("busy", "sleep"):
            for tool, i in cells:
                pct, ratio, work, samples, lost, ran = [], [], [], [], 0, set()
                threads: dict[str, list[float]] = {"perf": [], "host": [], "threads": []}
                for r in rounds:
                    x, p = by.get((r, tool, i, kind)), by.get((r, "perf", i, kind))
                    alone = by.get((r, "alone", 0.0, "busy"))
                    if x is None:
                        continue
                    mine = cpu_pct(x, tool, i)
                    if mine is not None:
                        pct.append(mine)
                        theirs = cpu_pct(p, "perf", i) if p is not None else None
                        if theirs and theirs > 0:
                            ratio.append(mine / theirs)
                    if kind == "busy" and alone and x.get("work") and alone.get("work"):
                        work.append(x["work"]["rate"] / alone["work"]["rate"])
                    ks = x.get("kernel_sampler") or {}
                    if ks:
                        samples.append(ks["samples"] / secs)
                        lost += ks.get("lost", 0)
                    if x.get("sampling"):
                        ran.add(x["sampling"])
                    for k in threads:
                        if x.get(f"{k}_thread_cpu_s") is not None:
                            threads[k].append(100.0 * x[f"{k}_thread_cpu_s"] / secs)
                out["cells"][f"{kind} {tool} {i:g}"] = {
                    "cpu_pct": summary(pct), "vs_perf": summary(ratio), "work_ratio": summary(work),
                    "samples_per_s": summary(samples), "lost": lost, "sampling_ran": sorted(ran),
                    "threads_pct": {k: summary(v) for k, v in threads.items()}}
        return out

    # -- startup ------------------------------------------------------------------------

    def startup(self) -> dict:
        a = self.args
        cmds = {
            "true": ["true"],
            "perf stat": [self.perf, "stat", "-o", "/dev/null", "--", "true"],
            "counterprof --help": [self.cp, "--help"],
            "counterprof run": None,                  # default events, as a user would type it
            "counterprof run -e EVENTS": None,
            "counterprof run (summary)": None,
            "python -c pass": [self.py, "-c", "pass"],
            "python -c 'import counterprof.session'": [self.py, "-c", "import counterprof.session"],
        }
        if a.baseline:      # before/after in the same rounds: the same commands, the other install
            cmds["baseline run"] = None
            cmds["baseline run (summary)"] = None
        print(f"[startup] {a.startup_runs} runs x {len(cmds)} commands", file=sys.stderr, flush=True)
        if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
            # a source tree without __pycache__ (an editable install) then compiles every module
            # on every start: ~80 ms of each `counterprof run` that an installed wheel never pays
            print("[startup] PYTHONDONTWRITEBYTECODE is set: sources without a bytecode cache are "
                  "compiled on every start (run with `env -u PYTHONDONTWRITEBYTECODE "
                  "PYTHONPYCACHEPREFIX=/tmp/pyc` for an installed package's figures)",
                  file=sys.stderr, flush=True)
        samples: dict[str, list[dict]] = {k: [] for k in cmds}
        for _ in range(a.startup_runs):
            names = list(cmds)
            self.rng.shuffle(names)
            for name in names:
                cmd = cmds[name]
                if name.startswith(("counterprof run", "baseline run")):
                    exe = a.baseline if name.startswith("baseline") else self.cp
                    cmd = [exe, "run"] + ([] if name.endswith("(summary)") else ["-q"])
                    if name.endswith("EVENTS"):
                        cmd += ["-e", a.events]
                    cmd += ["-o", str(self.new_run_dir()), "--", "true"]
                res = run_tree(cmd, 120)
                rec = {"rc": res["rc"], "wall_s": res["wall_s"], "tree_cpu_s": res["tree_cpu_s"]}
                if res["rc"] != 0:
                    rec["stderr"] = stderr_lines(res["stderr"])
                    self.problem(f"startup {name}: exit status {res['rc']}: {' | '.join(rec['stderr'][-3:])}")
                elif name.startswith(("counterprof", "baseline")) and res["stderr"].strip():
                    rec["stderr"] = stderr_lines(res["stderr"], 3)
                samples[name].append(rec)
                if name.startswith(("counterprof run", "baseline run")) and not a.keep:
                    shutil.rmtree(cmd[-3], ignore_errors=True)
        out = {}
        for name, recs in samples.items():
            out[name] = {"command": " ".join(shlex.quote(c) for c in (cmds[name] or
                         ([a.baseline if name.startswith("baseline") else "counterprof", "run"]
                          + ([] if name.endswith("(summary)") else ["-q"])
                          + (["-e", a.events] if name.endswith("EVENTS") else [])
                          + ["-o", "DIR", "--", "true"]))),
                         "wall_s": summary([r["wall_s"] for r in recs if r["rc"] == 0]),
                         "tree_cpu_s": summary([r["tree_cpu_s"] for r in recs if r["rc"] == 0]),
                         "failed": sum(1 for r in recs if r["rc"] != 0),
                         "stderr": sorted({ln for r in recs for ln in r.get("stderr", [])})}
        if a.baseline:
            # paired per round: the i-th run of each command ran in the same shuffled round
            for mine, base in (("counterprof run", "baseline run"),
                               ("counterprof run (summary)", "baseline run (summary)")):
                pairs = [(x["wall_s"], y["wall_s"]) for x, y in zip(samples[mine], samples[base])
                         if x["rc"] == 0 and y["rc"] == 0 and y["wall_s"] > 0]
                out[base]["ratio_vs_baseline"] = summary([x / y for x, y in pairs])
        return out

    # -- context manager ----------------------------------------------------------------

    def cm(self) -> dict:
        a = self.args
        print(f"[cm] {a.rounds} rounds x 3 modes (+ empty blocks) x {a.seconds:g} s in one process",
              file=sys.stderr, flush=True)
        cmd = [self.py, str(Path(__file__).resolve()), "--cm-child", "--rounds", str(a.rounds),
               "--seconds", str(a.seconds), "--events", a.events, "--seed", str(a.seed),
               "--tmp", str(self.tmp)] + (["--keep"] if a.keep else [])
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=a.rounds * 3 * (a.seconds + 30) + 60)
        data = last_json_line(p.stdout)
        if p.returncode != 0 or data is None:
            self.problem(f"cm child failed ({p.returncode}): {' | '.join(stderr_lines(p.stderr, 5))}")
            return {"error": stderr_lines(p.stderr, 20)}
        other = [ln for ln in stderr_lines(p.stderr, 200) if "cm round" not in ln]
        if other:
            data["stderr"] = sorted(set(other))
        for pr in data.get("problems", []):
            self.problem(pr)
        return data

    # -- rss ----------------------------------------------------------------------------

    def rss(self) -> dict:
        import psutil
        a = self.args
        run_dir = self.new_run_dir()
        cmd = [self.cp, "run", "-q"] + (["-e", a.events] if a.events else []) + \
              ["-I", f"{a.rss_interval_ms:g}", "-o", str(run_dir), "--"] + self.workload_cmd(a.rss_seconds)
        print(f"[rss] {a.rss_seconds:g} s at -I {a.rss_interval_ms:g}, RSS sampled every second",
              file=sys.stderr, flush=True)
        c0 = children_cpu()
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL)
        proc = psutil.Process(p.pid)
        outs: dict[str, str] = {}

        def drain(name, stream):
            outs[name] = stream.read()
        readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
                   for n, s in (("stdout", p.stdout), ("stderr", p.stderr))]
        for t in readers:
            t.start()
        ts, rss = [], []
        next_t = t0
        last_report = t0
        while p.poll() is None:
            try:
                m = proc.memory_info().rss
            except psutil.Error:
                break
            now = time.perf_counter()
            ts.append(now - t0)
            rss.append(m / 2**20)
            if now - last_report >= 30:
                print(f"  {now - t0:.0f} s: RSS {rss[-1]:.1f} MB", file=sys.stderr, flush=True)
                last_report = now
            next_t += 1.0
            time.sleep(max(0.0, next_t - time.perf_counter()))
        p.wait()
        for t in readers:
            t.join()
        wall = time.perf_counter() - t0
        tree_cpu = children_cpu() - c0
        meta = meta_facts(read_meta(run_dir))
        disk = dir_bytes(run_dir) if run_dir.exists() else 0
        if not a.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        if p.returncode != 0:
            self.problem(f"rss run: exit status {p.returncode}: {' | '.join(stderr_lines(outs.get('stderr', ''), 3))}")
        wl = last_json_line(outs.get("stdout", "")) or {}
        warm = min(30.0, max(5.0, 0.1 * a.rss_seconds))
        post = [(t, y) for t, y in zip(ts, rss) if t >= warm]
        q = max(1, len(post) // 4)
        first = [y for _, y in post[:q]]
        last = [y for _, y in post[-q:]]
        slope = slope_per_min([t for t, _ in post], [y for _, y in post])
        sampled_peak = max(rss) if rss else None
        meta_peak = (meta.get("profiler_max_rss_bytes") or 0) / 2**20 or None
        peak = max([v for v in (sampled_peak, meta_peak) if v is not None], default=None)
        delta = (statistics.median(last) - statistics.median(first)) if post else None
        flat = (delta is not None and abs(slope) <= FLAT_SLOPE_MB_PER_MIN
                and abs(delta) <= FLAT_QUARTER_DELTA_MB)
        excess = None
        if wl:
            excess = tree_cpu - wl.get("cpu_s", 0.0)
        return {
            "command": " ".join(shlex.quote(c) for c in
                                ["counterprof"] + cmd[1:cmd.index("-o") + 1] + ["DIR", "--", "python",
                                 "benchmarks/workload.py", "--seconds", f"{a.rss_seconds:g}"]),
            "rc": p.returncode, "wall_s": wall, "samples": len(rss), "warmup_s": warm,
            "peak_rss_mb": peak, "sampled_peak_rss_mb": sampled_peak,
            "first_quarter_median_mb": statistics.median(first) if first else None,
            "last_quarter_median_mb": statistics.median(last) if last else None,
            "quarter_delta_mb": delta, "slope_mb_per_min": slope, "flat": flat,
            "meta_max_rss_mb": (meta.get("profiler_max_rss_bytes") or 0) / 2**20,
            "profiler_cpu_pct_meta": (100.0 * meta["profiler_cpu_s"] / wl["elapsed_s"]
                                      if meta.get("profiler_cpu_s") is not None and wl else None),
            "tree_minus_workload_cpu_pct": (100.0 * excess / wl["elapsed_s"] if excess is not None and wl else None),
            "run_dir_bytes": disk, "meta": meta, "workload": wl,
            "stderr": stderr_lines(outs.get("stderr", ""), 10),
            "series": [[round(t, 2), round(y, 2)] for t, y in zip(ts, rss)],
        }


    # -- live ----------------------------------------------------------------------------

    def live(self) -> dict:
        a = self.args
        modes = ["alone", "alone-again", "cp-I10", "cp-I10-live-tty", "cp-I10-live-lines"]
        print(f"[live] {a.rounds} rounds x {len(modes)} modes x {a.live_seconds:g} s",
              file=sys.stderr, flush=True)
        runs = []
        for r in range(a.rounds):
            order = list(modes)
            self.rng.shuffle(order)
            for mode in order:
                rec = self.live_one("alone" if mode == "alone-again" else mode, a.live_seconds)
                rec.update(round=r, mode=mode)
                runs.append(rec)
            print(f"  round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
        by = {(x["round"], x["mode"]): x for x in runs if x.get("work")}
        out = {"runs": runs, "modes": {}}
        for m in modes[1:]:
            vs_alone, vs_plain, extra_cpu, view_cpu, frames_per_s, tty_bps, fold = [], [], [], [], [], [], []
            for r in range(a.rounds):
                x, base, plain = by.get((r, m)), by.get((r, "alone")), by.get((r, "cp-I10"))
                if x is None:
                    continue
                wl = x["work"]
                if base:
                    vs_alone.append(wl["rate"] / base["work"]["rate"])
                if plain and m != "cp-I10":
                    vs_plain.append(wl["rate"] / plain["work"]["rate"])
                    if x.get("profiler_cpu_s") is not None and plain.get("profiler_cpu_s") is not None:
                        extra_cpu.append(100.0 * (x["profiler_cpu_s"] - plain["profiler_cpu_s"]) / wl["elapsed_s"])
                    tc = (x.get("perf_thread_cpu_s") or 0) + (x.get("host_thread_cpu_s") or 0)
                    tp = (plain.get("perf_thread_cpu_s") or 0) + (plain.get("host_thread_cpu_s") or 0)
                    fold.append(100.0 * (tc - tp) / wl["elapsed_s"])
                lv = x.get("live_view") or {}
                if lv:
                    view_cpu.append(100.0 * lv["cpu_s"] / wl["elapsed_s"])
                    frames_per_s.append(lv["frames"] / wl["elapsed_s"])
                if x.get("tty_bytes") is not None:
                    tty_bps.append(x["tty_bytes"] / wl["elapsed_s"])
            out["modes"][m] = {"work_vs_alone": summary(vs_alone), "work_vs_plain": summary(vs_plain),
                               "extra_profiler_cpu_pct": summary(extra_cpu),
                               "view_thread_cpu_pct": summary(view_cpu),
                               "collector_threads_extra_cpu_pct": summary(fold),
                               "frames_per_s": summary(frames_per_s), "tty_bytes_per_s": summary(tty_bps),
                               "live_mode": sorted({(x.get("live_view") or {}).get("mode", "-")
                                                    for x in runs if x["mode"] == m}),
                               "failed_runs": sum(1 for x in runs if x["mode"] == m and
                                                  (x["rc"] != 0 or not x.get("work")))}
        out["frame_cost"] = frame_cost()
        noise = out["modes"]["alone-again"]["work_vs_alone"]
        # how far apart two identical runs of the workload land: a smaller effect than this
        # cannot be seen in the work ratios on this machine today
        out["noise_reach"] = max(abs(noise["min"] - 1), abs(noise["max"] - 1)) if noise else None
        return out

    def live_one(self, mode: str, seconds: float) -> dict:
        """One run of the live part; for -live-tty, stderr and stdin on a pty we drain."""
        run_dir = self.new_run_dir() if mode != "alone" else None
        cmd = self.workload_cmd(seconds)
        if run_dir is not None:
            cmd = [self.cp, "run", "-q", "-e", self.args.events, "-I", "10", "-o", str(run_dir)] + \
                  (["--live"] if "live" in mode else []) + ["--"] + cmd
        c0 = children_cpu()
        t0 = time.perf_counter()
        tty_bytes = None
        if mode == "cp-I10-live-tty":
            rc, out, err, tty_bytes = run_on_pty(cmd, seconds + 120)
        else:
            p = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=seconds + 120, stdin=subprocess.DEVNULL)
            rc, out, err = p.returncode, p.stdout, p.stderr
        rec = {"mode": mode, "rc": rc, "wall_s": time.perf_counter() - t0,
               "tree_cpu_s": children_cpu() - c0, "tty_bytes": tty_bytes}
        wl = last_json_line(out)
        if wl is None or rc != 0:
            self.problem(f"live {mode}: exit status {rc}: {' | '.join(stderr_lines(err)[-3:])}")
        if run_dir is not None:
            meta = read_meta(run_dir)
            rec.update(meta_facts(meta))
            rec["live_view"] = (meta or {}).get("live_view")
            if mode == "cp-I10-live-lines":
                rec["plain_lines"] = sum(1 for ln in err.splitlines() if " s  " in ln and " | " in ln)
            if not self.args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
        if wl is not None and rc == 0:
            rec["work"] = wl        # the workload's own JSON line (meta's "workload" is the profiler's view)
        return rec


def frame_cost(repeat: int = 200) -> dict:
    """The live view's work at steady state, in this process with the real classes: a full
    60 s window of `-I 10` perf (3 events, drained every 0.5 s) and host (13 metrics, every
    second) batches; the cost of folding one batch, and of one frame (snapshot, figures,
    rendering at 120 columns). The runs above are too short to fill the window."""
    sys.path.insert(0, str(REPO / "tests"))
    import pyarrow as pa
    from live_batches import MS, T0, catalog, host_batch, perf_batch

    from counterprof.live import render as R
    from counterprof.live.frame import live_figures
    from counterprof.live.window import LiveWindow
    host_values = {"proc.cpu_user": 0.09, "proc.cpu_system": 0.001, "proc.rss": 1e7,
                   "proc.read_bytes": 0.0, "proc.write_bytes": 0.0, "proc.ctx_switches_voluntary": 1.0,
                   "proc.ctx_switches_involuntary": 2.0, "proc.threads": 1.0, "proc.processes": 1.0,
                   "system.cpu_util": 50.0, "system.cpu_iowait": 0.0, "system.mem_used": 1e9,
                   "system.mem_available": 2e10}
    perf = [pa.concat_batches([perf_batch(T0 + (k * 50 + i + 1) * 10 * MS, 10 * MS,
                                          {"task-clock": 9e6, "context-switches": 1.0, "page-faults": 2.0})
                               for i in range(50)]) for k in range(130)]
    host = [pa.concat_batches([host_batch(T0 + (k * 10 + i + 1) * 100 * MS, 100 * MS, host_values)
                               for i in range(10)]) for k in range(65)]
    w = LiveWindow()
    t0 = time.thread_time()
    for k in range(65):
        w.write("samples", perf[2 * k], 0)
        w.write("samples", perf[2 * k + 1], 0)
        w.write("samples", host[k], 0)
    fold_ms = 1000 * (time.thread_time() - t0) / (len(perf) + len(host))
    cat, h = catalog(), R.Header("python train.py", 65, "run")
    t0 = time.thread_time()
    for _ in range(repeat):
        R.layout(lambda p: live_figures(w.snapshot(), cat, {}, p), h, 120, 37, "256")
    frame_ms = 1000 * (time.thread_time() - t0) / repeat
    return {"fold_ms_per_batch": fold_ms, "frame_ms": frame_ms,
            "batches_per_s": 3.0, "snapshot_series": len(w.snapshot().series)}


def run_on_pty(cmd: list[str], timeout: float, cols: int = 120, rows: int = 40):
    """cmd with stdin and stderr on a new pty (its controlling terminal, in the foreground)
    and stdout a pipe; the pty's output is drained as a terminal would. Returns
    (exit status, stdout, the pty's text, bytes the pty carried)."""
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def make_controlling():      # after setsid (start_new_session): fd 0 is the pty
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "", "LC_ALL": "C.UTF-8"}
    p = subprocess.Popen(cmd, stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=env,
                         start_new_session=True, preexec_fn=make_controlling)
    os.close(slave)
    got = bytearray()
    total = [0]

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:          # EIO: every holder of the pty has closed it
                return
            if not chunk:
                return
            total[0] += len(chunk)
            got.extend(chunk[-4096:])
            del got[:-65536]

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    t.join(5)
    os.close(master)
    return p.returncode, out.decode(errors="replace"), got.decode(errors="replace"), total[0]


# -- the context-manager child ---------------------------------------------------------------

def cm_child(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))
    import workload
    import counterprof
    rng = random.Random(args.seed + 1)
    tmp = Path(args.tmp)
    serial = [0]
    problems: list[str] = []

    def new_dir() -> Path:
        serial[0] += 1
        return tmp / f"cm-{serial[0]:04d}"

    # warm-up: first-call costs (lazy imports, native library, entry points) out of the rounds
    workload.run(0.2)
    d = new_dir()
    with counterprof.profile(events=args.events, interval_ms=10, path=d):
        workload.run(0.2)
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)

    def vol_switches() -> int:
        """The main thread's voluntary context switches (waiting for the GIL counts)."""
        try:
            with open("/proc/thread-self/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def self_cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    runs = []
    modes = ["alone", "cm-I10", "cm-I1"]
    for r in range(args.rounds):
        order = modes + ["empty-I10", "empty-I1"]     # empty: the block's fixed cost
        rng.shuffle(order)
        for mode in order:
            rec = {"round": r, "mode": mode}
            v0 = vol_switches()
            if mode == "alone":
                c0 = self_cpu()
                w = workload.run(args.seconds)
                rec["proc_cpu_s"] = self_cpu() - c0
            else:
                interval = float(mode.split("-I")[1])
                seconds = 0.0 if mode.startswith("empty") else args.seconds
                d = new_dir()
                c0 = self_cpu()
                t0 = time.perf_counter()
                try:
                    cm = counterprof.profile(events=args.events, interval_ms=interval, path=d)
                    cm.__enter__()
                    try:
                        t1 = time.perf_counter()
                        w = workload.run(seconds) if seconds else None
                        t2 = time.perf_counter()
                    finally:
                        cm.__exit__(None, None, None)
                except Exception as exc:
                    problems.append(f"{mode}: round {r}: {type(exc).__name__}: {exc}")
                    continue
                t3 = time.perf_counter()
                rec["proc_cpu_s"] = self_cpu() - c0
                rec["enter_s"] = t1 - t0
                rec["exit_s"] = t3 - t2
                rec.update(meta_facts(read_meta(d)))
                rec["run_dir_bytes"] = dir_bytes(d)
                if rec.get("status") != "complete":
                    problems.append(f"{mode}: round {r}: meta status {rec.get('status')}")
                if not args.keep:
                    shutil.rmtree(d, ignore_errors=True)
            rec["main_voluntary_switches"] = vol_switches() - v0
            if w is not None:
                rec["workload"] = w
            runs.append(rec)
        print(f"  cm round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    by = {(x["round"], x["mode"]): x for x in runs}
    fixed = {}
    for m in ("cm-I10", "cm-I1"):
        empties = [x for x in runs if x["mode"] == "empty-" + m[3:]]
        v = [x["profiler_cpu_s"] for x in empties if x.get("profiler_cpu_s") is not None]
        fixed[m] = statistics.median(v) if v else 0.0
    out = {"runs": runs, "problems": problems, "modes": {}, "meta_cpu_s_of_empty_block": fixed,
           "empty_block": {m: {"enter_s": summary([x["enter_s"] for x in runs if x["mode"] == m]),
                               "exit_s": summary([x["exit_s"] for x in runs if x["mode"] == m])}
                           for m in ("empty-I10", "empty-I1")}}
    for m in modes:
        ratios, meta_pct, meta_net, other_pct, enter, exit_, ticks_ratio = [], [], [], [], [], [], []
        oncpu, vol = [], []
        for r in range(args.rounds):
            base, x = by.get((r, "alone")), by.get((r, m))
            if base is None or x is None:
                continue
            w = x["workload"]
            oncpu.append(w["thread_cpu_s"] / w["elapsed_s"])
            vol.append(x["main_voluntary_switches"] / w["elapsed_s"])
            if m != "alone":
                ratios.append(w["rate"] / base["workload"]["rate"])
                if x.get("profiler_cpu_s") is not None:
                    meta_pct.append(100.0 * x["profiler_cpu_s"] / w["elapsed_s"])
                    meta_net.append(100.0 * (x["profiler_cpu_s"] - fixed[m]) / w["elapsed_s"])
                enter.append(x["enter_s"])
                exit_.append(x["exit_s"])
                s = x.get("sampler") or {}
                interval_s = float(m[len("cm-I"):]) / 1000
                if s.get("ticks") is not None and x.get("duration_s"):
                    ticks_ratio.append(s["ticks"] / (x["duration_s"] / interval_s))
            # everything the process spent beyond the workload thread (profiler threads,
            # __enter__/__exit__ on the main thread), per second of workload
            other_pct.append(100.0 * (x["proc_cpu_s"] - w["thread_cpu_s"]) / w["elapsed_s"])
        entry = {"work_ratio": summary(ratios), "meta_cpu_pct": summary(meta_pct),
                 "meta_cpu_pct_minus_empty_block": summary(meta_net),
                 "workload_thread_on_cpu": summary(oncpu),
                 "workload_thread_voluntary_switches_per_s": summary(vol),
                 "process_minus_workload_cpu_pct": summary(other_pct)}
        if m != "alone":
            cm_runs = [x for x in runs if x["mode"] == m]
            entry.update(enter_s=summary(enter), exit_s=summary(exit_),
                         thread_cpu_pct=thread_breakdown(cm_runs),
                         ticks_vs_expected=summary(ticks_ratio),
                         warnings=sorted({wn for x in cm_runs for wn in x.get("warnings", [])}),
                         read_errors=sum((x.get("sampler") or {}).get("read_errors", 0) for x in cm_runs))
        out["modes"][m] = entry
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["process_max_rss_mb"] = ru.ru_maxrss / 1024
    print(json.dumps(out))
    return 0


# -- report ----------------------------------------------------------------------------------

def fmt_ratio(s: dict | None) -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.3f} [{s['min']:.3f}–{s['max']:.3f}]"


def fmt_pct(s: dict | None) -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.2f}% [{s['q1']:.2f}–{s['q3']:.2f}]"


def fmt_s(s: dict | None) -> str:
    if not s:
        return "n/a"
    return f"{s['median'] * 1000:.0f} ms [{s['min'] * 1000:.0f}–{s['max'] * 1000:.0f}]"


def ok(flag: bool | None) -> str:
    return "n/a" if flag is None else ("yes" if flag else "NO")


def report(results: dict) -> str:
    lines = [f"counterprof overhead benchmark — {results['host']['cpu_model']}, "
             f"{results['host']['cpus']} CPUs, kernel {results['host']['kernel']}, "
             f"Python {results['host']['python']}, counterprof {results['counterprof_version']} "
             f"({results['git_commit'][:10]})",
             f"command: {results['command']}",
             "work ratio = iterations/s vs alone in the same round, median [min–max]; "
             "CPU = % of one core, median [IQR]", ""]
    tb = results.get("table")
    if tb:
        a = results["args"]
        lines += [f"### Profiler CPU around `sleep {tb['seconds']:g}` ({a['rounds']} paired rounds, events "
                  f"{tb['events']}, default collectors; tree CPU − the tool's `-- true`, % of one core)", "",
                  "| interval | perf stat | counterprof run | ratio (paired) | target |", "|---|---|---|---|---|"]
        for i in TABLE_INTERVALS:
            e = tb["intervals"][str(i)]
            ratio = (e["ratio"] or {}).get("median")
            cp = (e["cp_pct"] or {}).get("median")
            if i in TABLE_TARGET_VS_PERF:
                t = TABLE_TARGET_VS_PERF[i]
                target = f"≤ {t:g}× perf stat: {ok(None if ratio is None else ratio <= t)}"
            else:
                t = TABLE_TARGET_PCT[i]
                target = f"< {t:g}%: {ok(None if cp is None else cp < t)}"
            r = e["ratio"]
            lines.append(f"| -I {i:g} | {fmt_pct(e['perf_pct'])} | {fmt_pct(e['cp_pct'])} | "
                         f"{'n/a' if not r else '{:.2f}x [{:.2f}–{:.2f}]'.format(r['median'], r['q1'], r['q3'])} | "
                         f"{target} |")
        lines += ["", "counterprof's threads, steady state (meta.json, `sleep` run − the median `true` run, % of a "
                  "core; rest = the process beside the collectors' threads: main thread, end of run; sum = the "
                  "process's CPU, less noisy than the tree's):"]
        for i in TABLE_INTERVALS:
            e = tb["intervals"][str(i)]
            rest = (e.get("rest_pct") or {}).get("median")
            hu = (e.get("host_us_per_sample") or {}).get("median")
            total = (e.get("sum_pct") or {}).get("median")
            lines.append(f"- -I {i:g}: {fmt_breakdown(e['threads_pct'])}, rest "
                         f"{'n/a' if rest is None else f'{rest:.2f}%'}, sum "
                         f"{'n/a' if total is None else f'{total:.2f}%'}; host collector "
                         f"{'n/a' if hu is None else f'{hu:.0f} µs'} of CPU per sample "
                         "(every 100 ms, wake-up included)")
        if a.get("baseline"):
            lines += ["", f"Before/after: the baseline `{a['baseline']}` in the same rounds (ratio = counterprof / "
                      "baseline, paired per round):", "",
                      "| interval | baseline | counterprof run | ratio (paired) | baseline's threads |",
                      "|---|---|---|---|---|"]
            for i in TABLE_INTERVALS:
                e = tb["intervals"][str(i)]
                r = e.get("vs_base")
                bt = e.get("base_threads_pct") or {}
                lines.append(f"| -I {i:g} | {fmt_pct(e.get('base_pct'))} | {fmt_pct(e['cp_pct'])} | "
                             f"{'n/a' if not r else '{:.2f}x [{:.2f}–{:.2f}]'.format(r['median'], r['q1'], r['q3'])} | "
                             f"{fmt_breakdown(bt)} |")
        lines.append("")
    o = results.get("overhead")
    if o:
        a = results["args"]
        lines += [f"### `counterprof run` vs `perf stat` ({a['rounds']} rounds × {a['seconds']:g} s, "
                  f"events {a['events']})", "",
                  "| mode | work vs alone | profiler CPU (tree − workload − start-up) "
                  "| meta.json cpu_s − its `-- true` value | target |",
                  "|---|---|---|---|---|"]
        names = {"alone-again": "alone again (noise)", "perf-I10": "perf stat -I 10",
                 "perf-I1": "perf stat -I 1 (reference)",
                 "cp-I10": "counterprof run -I 10", "cp-I1": "counterprof run -I 1",
                 "cp-I10-perfonly": "counterprof run -I 10 --collectors perf"}
        for m, label in names.items():
            e = o["modes"][m]
            target = ""
            if m in ("cp-I10", "cp-I1"):
                t = TARGET_CPU_PCT[interval_of(m)]
                med = (e["profiler_cpu_pct"] or {}).get("median")
                target = f"≤ {t:g}%: {ok(None if med is None else med <= t)}"
            lines.append(f"| {label} | {fmt_ratio(e['work_ratio'])} | "
                         f"{fmt_pct(e['profiler_cpu_pct']) if m != 'alone-again' else '—'} | "
                         f"{fmt_pct(e.get('meta_cpu_pct')) if m.startswith('cp-') else '—'} | {target} |")
        lines += ["", f"counterprof -I 10 vs perf stat -I 10, paired work ratio: {fmt_ratio(o.get('cp10_vs_perf10'))}; "
                  "no less work than perf stat beyond the noise "
                  f"(alone-vs-alone reaches ±{o.get('noise_reach', float('nan')):.3f}): "
                  f"{ok(o.get('cp10_within_noise_of_perf'))}",
                  ("workload not reaped by (its CPU is absent from the tree; profiler CPU = tree − start-up): "
                   + ", ".join(o["workload_not_reaped_by"]) if o.get("workload_not_reaped_by") else ""),
                  "start-up CPU subtracted (median tree CPU of WRAPPER -- true, pooled per tool): " + ", ".join(
                      f"{m} {(s or {}).get('median', float('nan')) * 1000:.0f} ms "
                      f"[{(s or {}).get('min', float('nan')) * 1000:.0f}–"
                      f"{(s or {}).get('max', float('nan')) * 1000:.0f}]"
                      for m, s in o["startup_cpu_s"].items()),
                  "sampler ticks vs expected (median): " + ", ".join(
                      f"{m} {(o['modes'][m].get('ticks_vs_expected') or {}).get('median', float('nan')):.3f}"
                      for m in ("cp-I10", "cp-I1"))
                  + "; late-tick share: " + ", ".join(
                      f"{m} {(o['modes'][m].get('late_tick_share') or {}).get('median', float('nan')):.3f}"
                      for m in ("cp-I10", "cp-I1")),
                  "profiler threads (meta.json, % of a core): " + "; ".join(
                      f"{m}: {fmt_breakdown(o['modes'][m].get('thread_cpu_pct'))}"
                      for m in ("cp-I10", "cp-I1", "cp-I10-perfonly")), ""]
    sm = results.get("sampling")
    if sm:
        a = results["args"]
        lines += [f"### Kernel sampling vs the tick vs perf stat ({a['rounds']} paired rounds of {sm['seconds']:g} s, "
                  f"events {a['table_events']}, collectors {a['sampling_collectors'] or 'default'}; CPU = % of one "
                  "core per second of workload: counterprof's process (meta.json) − its `-- true`, perf stat's tree "
                  "− the workload − its `-- true`)", "",
                  "| workload | -I | mode | profiler CPU | vs perf stat (paired) | work ratio | samples/s "
                  "| threads (meta.json, whole run) |",
                  "|---|---|---|---|---|---|---|---|"]
        for kind in ("busy", "sleep"):
            for i in SAMPLING_INTERVALS:
                for tool in SAMPLING_TOOLS:
                    e = sm["cells"][f"{kind} {tool} {i:g}"]
                    v, w, sp = e["vs_perf"], e["work_ratio"], e["samples_per_s"]
                    name = {"perf": "perf stat", "tick": "counterprof tick",
                            "kernel": "counterprof kernel"}[tool]
                    if tool == "kernel" and e["sampling_ran"] != ["kernel"]:
                        name += f" (ran: {', '.join(e['sampling_ran']) or '?'})"
                    vs = ("–" if tool == "perf" or not v
                          else "{:.2f}x [{:.2f}–{:.2f}]".format(v["median"], v["q1"], v["q3"]))
                    lines.append(
                        f"| {kind} | {i:g} ms | {name} | {fmt_pct(e['cpu_pct'])} | {vs} | "
                        f"{'–' if not w else '{:.3f} [{:.3f}–{:.3f}]'.format(w['median'], w['min'], w['max'])} | "
                        f"{'–' if not sp else '{:.0f}'.format(sp['median'])} | "
                        f"{fmt_breakdown(e['threads_pct']) if tool != 'perf' else '–'} |")
        lost = sum(e["lost"] for e in sm["cells"].values())
        lines += ["", f"kernel sample records lost: {lost}", ""]
    s = results.get("startup")
    if s:
        lines += [f"### Start-up ({results['args']['startup_runs']} runs each)", "",
                  "| command | wall, median [min–max] | tree CPU, median |", "|---|---|---|"]
        for _name, e in s.items():
            cpu = e["tree_cpu_s"]
            lines.append(f"| `{e['command']}` | {fmt_s(e['wall_s'])} | "
                         f"{'n/a' if not cpu else '%.0f ms' % (cpu['median'] * 1000)} |")
        ratios = [(name, e["ratio_vs_baseline"]) for name, e in s.items() if e.get("ratio_vs_baseline")]
        if ratios:
            lines += ["", "counterprof / baseline, wall, paired per round (median [min–max]): " + "; ".join(
                f"{name.replace('baseline ', '')}: {r['median']:.2f} [{r['min']:.2f}–{r['max']:.2f}]"
                for name, r in ratios)]
        cp = (s.get("counterprof run") or {}).get("wall_s")
        cs = (s.get("counterprof run (summary)") or {}).get("wall_s")
        hp = (s.get("counterprof --help") or {}).get("wall_s")
        # the goal names `run -- true` as a user types it (its summary printed); -q beside it
        lines += ["", f"targets: `counterprof --help` < {TARGET_HELP_S * 1000:g} ms: "
                  f"{ok(None if not hp else hp['median'] < TARGET_HELP_S)}; `counterprof run -- true` < "
                  f"{TARGET_RUN_TRUE_S * 1000:g} ms: {ok(None if not cs else cs['median'] < TARGET_RUN_TRUE_S)}"
                  f" (`run -q`: {ok(None if not cp else cp['median'] < TARGET_RUN_TRUE_S)})", ""]
    c = results.get("cm")
    if c and "modes" in c:
        lines += [f"### `counterprof.profile()` in-process ({results['args']['rounds']} rounds × "
                  f"{results['args']['seconds']:g} s)", "",
                  "| mode | work vs alone | profiler threads' CPU (meta.json) | same − empty block's "
                  "| process − workload thread CPU | __enter__ | __exit__ |",
                  "|---|---|---|---|---|---|---|"]
        for m, label in (("alone", "alone"), ("cm-I10", "profile(interval_ms=10)"),
                         ("cm-I1", "profile(interval_ms=1)")):
            e = c["modes"][m]
            lines.append(f"| {label} | {fmt_ratio(e['work_ratio']) if m != 'alone' else '1'} | "
                         f"{fmt_pct(e['meta_cpu_pct']) if m != 'alone' else '—'} | "
                         f"{fmt_pct(e['meta_cpu_pct_minus_empty_block']) if m != 'alone' else '—'} | "
                         f"{fmt_pct(e['process_minus_workload_cpu_pct'])} | "
                         f"{fmt_s(e.get('enter_s')) if m != 'alone' else '—'} | "
                         f"{fmt_s(e.get('exit_s')) if m != 'alone' else '—'} |")
        lines += ["", "profiler threads (meta.json, % of a core): " + "; ".join(
            f"{m}: {fmt_breakdown(c['modes'][m].get('thread_cpu_pct'))}" for m in ("cm-I10", "cm-I1")),
            "workload thread on-CPU share (thread CPU / wall; below 1 = waiting, e.g. for the GIL) and its "
            "voluntary switches/s: " + "; ".join(
                f"{m}: {c['modes'][m]['workload_thread_on_cpu']['median']:.4f}, "
                f"{c['modes'][m]['workload_thread_voluntary_switches_per_s']['median']:.0f}/s"
                for m in ("alone", "cm-I10", "cm-I1") if c['modes'][m].get('workload_thread_on_cpu'))]
        eb = c.get("empty_block") or {}
        lines += ["", "empty `with profile(): pass` (fixed cost): " + ", ".join(
            f"interval_ms={m[7:]}: cpu_s {c['meta_cpu_s_of_empty_block']['cm-' + m[6:]] * 1000:.0f} ms, "
            f"__enter__ {fmt_s(eb.get(m, {}).get('enter_s'))}, __exit__ {fmt_s(eb.get(m, {}).get('exit_s'))}"
            for m in ("empty-I10", "empty-I1")), ""]
    r = results.get("rss")
    if r:
        lines += [f"### Memory: `{r['command']}`", "",
                  "| peak RSS (ru_maxrss) | peak of 1 s samples | first → last quarter (median) | slope | flat "
                  "| profiler CPU (meta.json) | run dir |",
                  "|---|---|---|---|---|---|---|"]
        if r["sampled_peak_rss_mb"] is not None and r["first_quarter_median_mb"] is not None:
            lines.append(
                f"| {r['meta_max_rss_mb']:.1f} MB | {r['sampled_peak_rss_mb']:.1f} MB | "
                f"{r['first_quarter_median_mb']:.1f} → {r['last_quarter_median_mb']:.1f} MB | "
                f"{r['slope_mb_per_min']:+.3f} MB/min | {ok(r['flat'])} | "
                f"{'n/a' if r['profiler_cpu_pct_meta'] is None else '{:.2f}%'.format(r['profiler_cpu_pct_meta'])} | "
                f"{r['run_dir_bytes'] / 2**20:.1f} MB |")
        lines += ["", f"target: peak < {TARGET_RSS_MB:g} MB and flat: "
                  f"{ok(None if r['peak_rss_mb'] is None else r['peak_rss_mb'] < TARGET_RSS_MB and r['flat'])} "
                  f"(flat: |slope| ≤ {FLAT_SLOPE_MB_PER_MIN} MB/min and |last − first quarter| ≤ "
                  f"{FLAT_QUARTER_DELTA_MB} MB after {r['warmup_s']:g} s warm-up; {r['samples']} samples)", ""]
    lv = results.get("live")
    if lv and "modes" in lv:
        a = results["args"]
        lines += [f"### `--live` ({a['rounds']} rounds × {a['live_seconds']:g} s, -I 10, events {a['events']})", "",
                  "| mode | work vs alone | work vs `run -I 10` | profiler CPU added (meta.json cpu_s, vs `run -I 10`) "
                  "| live-view thread CPU | collector threads' extra CPU (the sink) | frames/s | pty bytes/s |",
                  "|---|---|---|---|---|---|---|---|"]
        names = {"alone-again": "alone again (noise)", "cp-I10": "counterprof run -I 10",
                 "cp-I10-live-tty": "… --live, dashboard on a pty (120×40)",
                 "cp-I10-live-lines": "… --live, stderr a pipe (a line a second)"}
        for m, label in names.items():
            e = lv["modes"][m]
            live = m.startswith("cp-I10-live")
            bps = e.get("tty_bytes_per_s")
            lines.append(f"| {label} | {fmt_ratio(e['work_vs_alone'])} | "
                         f"{fmt_ratio(e['work_vs_plain']) if live else ('1' if m == 'cp-I10' else '—')} | "
                         f"{fmt_pct(e['extra_profiler_cpu_pct']) if live else '—'} | "
                         f"{fmt_pct(e['view_thread_cpu_pct']) if live else '—'} | "
                         f"{fmt_pct(e['collector_threads_extra_cpu_pct']) if live else '—'} | "
                         f"{'{:.1f}'.format(e['frames_per_s']['median']) if e.get('frames_per_s') else '—'} | "
                         f"{'{:.0f}'.format(bps['median']) if bps else '—'} |")
        fc = lv.get("frame_cost")
        fps = (lv["modes"]["cp-I10-live-tty"].get("frames_per_s") or {}).get("median")
        if fc:
            steady = (fc["frame_ms"] * (fps or 4.0) + fc["fold_ms_per_batch"] * fc["batches_per_s"]) / 10
            lines += ["", "steady state (a full 60 s window, measured in-process): "
                      f"fold {fc['fold_ms_per_batch']:.2f} ms "
                      f"per batch × {fc['batches_per_s']:g} batches/s, one frame {fc['frame_ms']:.2f} ms × "
                      f"{fps or 4.0:.1f} frames/s = {steady:.2f}% of one core"]
        for m in ("cp-I10-live-tty", "cp-I10-live-lines"):
            e = lv["modes"][m]
            cpu = (e.get("extra_profiler_cpu_pct") or {}).get("median")
            work = (e.get("work_vs_plain") or {}).get("median")
            lines.append("")
            reach = lv.get("noise_reach")
            if work is None:
                work_verdict = "n/a"
            elif reach is not None and reach > TARGET_LIVE_WORK_LOSS:
                work_verdict = (f"not resolvable here (two identical runs differ by up to "
                                f"{100 * reach:.1f}%); median {work:.3f}")
            else:
                work_verdict = ok(work > 1 - TARGET_LIVE_WORK_LOSS)
            lines.append(f"target for {m} (modes seen: {', '.join(e['live_mode'])}): profiler CPU added "
                         f"< {TARGET_LIVE_CPU_PCT:g}% of a core: "
                         f"{ok(None if cpu is None else cpu < TARGET_LIVE_CPU_PCT)}; "
                         f"workload loses < {100 * TARGET_LIVE_WORK_LOSS:g}% vs `run -I 10`: {work_verdict}")
        lines.append("")
    if results.get("problems"):
        lines += ["### Problems", ""] + [f"- {p}" for p in results["problems"]] + [""]
    lines.append(f"load average before/after: {results['loadavg_before']} / {results['loadavg_after']}; "
                 f"took {results['took_s']:.0f} s")
    return "\n".join(lines)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma separated ({','.join(PARTS)})")
    p.add_argument("--quick", action="store_true",
                   help="~2 minutes: --rounds 3 --seconds 1 --startup-runs 5 --rss-seconds 30 "
                        "(explicit flags win)")
    p.add_argument("--rounds", type=int, help="paired rounds for overhead and cm (default 7)")
    p.add_argument("--seconds", type=float, help="workload duration per run (default 2)")
    p.add_argument("--startup-runs", type=int, help="runs per start-up command (default 9)")
    p.add_argument("--table-seconds", type=float, help="the sleeping workload of the table part (default 5)")
    p.add_argument("--table-events", default=TABLE_EVENTS,
                   help=f"events of the table part, for both tools (default {TABLE_EVENTS})")
    p.add_argument("--rss-seconds", type=float, help="duration of the memory run (default 600)")
    p.add_argument("--rss-interval-ms", type=float, default=1.0, help="interval of the memory run (default 1)")
    p.add_argument("--live-seconds", type=float,
                   help="workload duration per run of the live part (default 8; the dashboard's "
                        "first frame waits for the collectors' first data, about a second)")
    p.add_argument("--events", default=EVENTS,
                   help=f"events for perf stat and counterprof (default {EVENTS}; the same for both, "
                        "so they do the same work)")
    p.add_argument("--seed", type=int, default=None, help="seed for the per-round order (default: random, recorded)")
    p.add_argument("--json", metavar="PATH", help="write every figure and raw run to PATH")
    p.add_argument("--counterprof", default=None,
                   help="the counterprof executable (default: next to this Python, else PATH)")
    p.add_argument("--baseline", default=None, metavar="EXE",
                   help="table and startup: another counterprof executable in the same rounds, for "
                        "before/after (e.g. an older checkout's venv's bin/counterprof)")
    p.add_argument("--sampling-collectors", default=None, metavar="LIST",
                   help="sampling part: counterprof's --collectors (default: the default ones)")
    p.add_argument("--perf", default=shutil.which("perf") or "/usr/bin/perf", help="the perf executable")
    p.add_argument("--tmp", default=None, help="where run directories go (default: the system's temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--cm-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = {"rounds": 7, "seconds": 2.0, "startup_runs": 9, "rss_seconds": 600.0, "live_seconds": 8.0,
                "table_seconds": 5.0}
    quick = {"rounds": 3, "seconds": 1.0, "startup_runs": 5, "rss_seconds": 30.0, "live_seconds": 4.0,
             "table_seconds": 2.0}
    for k, v in (quick if args.quick else defaults).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    if args.counterprof is None:
        local = Path(sys.executable).parent / "counterprof"
        args.counterprof = str(local) if local.exists() else (shutil.which("counterprof") or "counterprof")
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = [x for x in args.only if x not in PARTS + OPT_IN_PARTS]
    if bad:
        p.error(f"unknown part(s) {bad}; choose from {PARTS + OPT_IN_PARTS}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.cm_child:
        return cm_child(args)
    try:
        rel = Path(sys.argv[0]).resolve().relative_to(REPO)
    except ValueError:
        rel = Path(sys.argv[0])
    command = " ".join(["python", shlex.quote(str(rel))] + [shlex.quote(a) for a in argv])
    if "--seed" not in argv:
        command += f"   # seed {args.seed}"
    sys.path.insert(0, str(REPO))
    try:
        import counterprof
        version = counterprof.__version__
    except ImportError:
        version = "?"
    from counterprof.run_meta import host_facts

    started = time.perf_counter()
    bench = Bench(args)
    results: dict = {"command": command, "argv": argv,
                     "args": {k: v for k, v in vars(args).items() if k != "cm_child"},
                     "counterprof_version": version, "git_commit": git_commit(),
                     "host": host_facts(), "platform": platform.platform(),
                     "perf_version": subprocess.run([args.perf, "--version"], capture_output=True,
                                                    text=True).stdout.strip(),
                     "loadavg_before": loadavg()}
    print(f"counterprof overhead benchmark: {command}", file=sys.stderr, flush=True)
    try:
        for part in PARTS + OPT_IN_PARTS:
            if part in args.only:
                results[part] = getattr(bench, part)()
    finally:
        if not args.keep:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    results["problems"] = bench.problems
    results["loadavg_after"] = loadavg()
    results["took_s"] = time.perf_counter() - started
    text = report(results)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
