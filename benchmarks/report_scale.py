"""The commands that read a whole big run -- report, compare, collectives, export --window --
for two counterprof builds side by side: wall time and peak RSS, paired within rounds.

    python benchmarks/synthetic_run.py -o /tmp/syn256 --ranks 256 --minutes 60 --hz 10 --metrics 20
    python benchmarks/report_scale.py /tmp/syn256 --new /tmp/newpkg --base /tmp/basepkg --rounds 3

NEW and BASE are package folders (`pip install --no-deps --target /tmp/newpkg .` in each
checkout); each command runs as `python -P -m counterprof ...` with PYTHONPATH set to one of
them, in a fresh process (peak RSS from getrusage of the child: its largest process; and the
process tree's RSS summed, sampled every 0.2 s, for a command with worker processes). Each round runs every
(command, build) once in a random order; the table gives each side's median [min-max] and the
median of the rounds' NEW/BASE ratios. `compare` compares the run with itself (the worst
case: both sides whole); `--commands` picks a subset.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile

COMMANDS = {
    "report": ["report", "{run}"],
    "compare": ["compare", "{run}", "{run}"],
    "collectives": ["collectives", "{run}"],
    "export --window 60 s": ["export", "{run}", "--perfetto", "{out}/w.pftrace", "--window", "600:660"],
}


def tree_rss_mb(root: int) -> float:
    """RSS of root and every process below it, summed (MB): a command with worker processes
    holds their memory too (getrusage gives the largest single process only)."""
    parent, rss = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(d)], rss[int(d)] = int(fields[1]), int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += [c for c, pp in parent.items() if pp == pid]
    return total / 2**20


def measure(pkg: str, args: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MB of the largest process, peak RSS MB of the process tree summed,
    sampled every 0.2 s) of `python -P -m counterprof args` with pkg on the path."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True); "
            "w = time.perf_counter() - t; "
            "print(p.returncode, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.stderr.write(p.stderr[-2000:])")
    env = {**os.environ, "PYTHONPATH": pkg, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, sys.executable, "-P", "-m", "counterprof", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    tree = 0.0
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            tree = max(tree, tree_rss_mb(proc.pid))
    rc, wall, rss = stdout.split()
    if rc != "0":
        raise SystemExit(f"{pkg}: counterprof {' '.join(args)} failed:\n{stderr}")
    return float(wall), int(rss) / 1024, tree


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run directory, e.g. from benchmarks/synthetic_run.py")
    p.add_argument("--new", required=True, help="package folder of the new build")
    p.add_argument("--base", required=True, help="package folder of the build before")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated, of: " + ", ".join(COMMANDS))
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    picked = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = [c for c in picked if c not in COMMANDS]
    if unknown:
        raise SystemExit(f"unknown command(s) {unknown}: pick from {list(COMMANDS)}")
    builds = {"new": args.new, "base": args.base}
    rng = random.Random(args.seed)
    got: dict[tuple[str, str], list[tuple[float, float, float]]] = {(c, b): [] for c in picked for b in builds}
    with tempfile.TemporaryDirectory(prefix="report-scale-") as out:
        for r in range(args.rounds):
            todo = [(c, b) for c in picked for b in builds]
            rng.shuffle(todo)
            for c, b in todo:
                cmd = [a.format(run=args.run, out=out) for a in COMMANDS[c]]
                got[(c, b)].append(measure(builds[b], cmd))
                w, m, t = got[(c, b)][-1]
                print(f"round {r + 1}: {b} {c}: {w:.1f} s, {m:.0f} MB ({t:.0f} MB all processes)",
                      file=sys.stderr, flush=True)
    load = os.getloadavg()
    print(f"\n{args.run}: {args.rounds} rounds, medians [min-max]; load average {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs\n")
    print("| command | base: time, peak RSS (all processes) | new: time, peak RSS (all processes) "
          "| new/base time | new/base RSS |")
    print("|---|---|---|---|---|")

    def side(xs: list[tuple[float, float, float]]) -> str:
        w, m, t = [x[0] for x in xs], [x[1] for x in xs], [x[2] for x in xs]
        return (f"{statistics.median(w):.1f} s [{min(w):.1f}-{max(w):.1f}], "
                f"{statistics.median(m):.0f} MB ({statistics.median(t):.0f})")
    for c in picked:
        base, new = got[(c, "base")], got[(c, "new")]
        tr = statistics.median(n[0] / b[0] for n, b in zip(new, base))
        mr = statistics.median(n[1] / b[1] for n, b in zip(new, base))
        print(f"| {c} | {side(base)} | {side(new)} | {tr:.2f} | {mr:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
