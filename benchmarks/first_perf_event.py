"""The kernel's first perf event, and what `counterprof run` does about it, side by side.

    python benchmarks/first_perf_event.py --baseline /path/to/other/counterprof --rounds 7

When no perf event exists on the machine, the first task event opened enables the kernel's
perf_sched_events static key and waits for an RCU grace period; the key goes off again ~1 s
after the last event closes. Each round, after a pause of --pause s with no event of ours open:
  - `first open`: a fresh process's first perf_event_open (task-clock on itself, disabled),
    then its second, timed around the syscall (counterprof's C core, as the collector opens);
  - `run -- true`: the wall time of `counterprof run -q -e task-clock -o DIR -- true`, for
    this checkout, this checkout with the warm-up switched off (counterprof.perf_warmup.warm_up
    replaced by a no-op) and (--baseline) another executable, each after its own pause, in a
    random order per round; the ratios are paired per round.
A perf event left open by anything else on the machine keeps the key on, and then nothing is
cold: the script says how many events other processes hold (from /proc/*/fdinfo) as it ends.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FIRST_OPEN = r"""
import time
from counterprof._native import ffi, lib
spec = ffi.new("struct cp_event_spec *")
spec.type, spec.config, spec.disabled = 1, 1, 1
out = []
for _ in range(2):
    t = time.perf_counter()
    fd = lib.cp_event_open(spec, 0, -1, -1)
    out.append(time.perf_counter() - t)
    if fd < 0:
        spec.exclude_kernel = spec.exclude_hv = 1
        fd = lib.cp_event_open(spec, 0, -1, -1)
print(out[0], out[1])
"""


def others_perf_events() -> int:
    """perf event descriptors other processes hold right now (anon_inode:[perf_event])."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]":
                    n += 1
        except OSError:
            continue
    return n


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.2f} ms [{min(xs) * 1e3:.2f}–{max(xs) * 1e3:.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", help="another counterprof executable, in the same rounds")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--pause", type=float, default=1.5, help="seconds with no event before each (default 1.5)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    mine = str(Path(sys.executable).with_name("counterprof"))
    # the same checkout with the warm-up thread switched off: what it alone is worth
    no_warmup = [sys.executable, "-c", "import sys, counterprof.perf_warmup as w; w.warm_up = lambda: None; "
                 "sys.argv[0] = 'counterprof'; from counterprof.cli import console_main; console_main()"]
    tools = {"this checkout": [mine], "no warm-up": no_warmup, **({"baseline": [a.baseline]} if a.baseline else {})}
    first: list[float] = []
    second: list[float] = []
    walls: dict[str, list[float]] = {k: [] for k in tools}
    tmp = Path(tempfile.mkdtemp(prefix="cp-first-event-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    try:
        for r in range(a.rounds):
            print(f"round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
            time.sleep(a.pause)
            out = subprocess.run([sys.executable, "-c", FIRST_OPEN], capture_output=True, text=True,
                                 check=True, env=env).stdout.split()
            first.append(float(out[0]))
            second.append(float(out[1]))
            names = list(tools)
            rng.shuffle(names)
            for name in names:
                time.sleep(a.pause)
                run_dir = tmp / f"{r}-{name.replace(' ', '_')}"
                t = time.perf_counter()
                subprocess.run([*tools[name], "run", "-q", "-e", "task-clock", "-o", str(run_dir), "--", "true"],
                               check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                walls[name].append(time.perf_counter() - t)
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{a.rounds} rounds, each after {a.pause:g} s with no event of ours; median [min–max]\n")
    print("| what | time |\n|---|---|")
    print(f"| a fresh process's first perf_event_open | {med(first)} |")
    print(f"| its second | {med(second)} |")
    for name, xs in walls.items():
        print(f"| `counterprof run -q -e task-clock -- true` ({name}) | {med(xs)} |")
    print()
    for other in [n for n in walls if n != "this checkout"]:
        ratios = [x / y for x, y in zip(walls["this checkout"], walls[other])]
        print(f"this checkout / {other}, paired per round: {statistics.median(ratios):.2f}x "
              f"[{min(ratios):.2f}–{max(ratios):.2f}]")
    print(f"perf events other processes hold now: {others_perf_events()} (any keeps the key on: "
          f"then nothing above was cold); load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
