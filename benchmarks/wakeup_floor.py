"""The floor under any profiler that wakes a thread every interval: what one wake-up costs here.

    python benchmarks/wakeup_floor.py                  # 5 paired rounds, ~1 minute
    python benchmarks/wakeup_floor.py --rounds 7 --seconds 3

A C thread that does nothing but sleep until its next deadline, with each of the ways a
sampler can wait (clock_nanosleep to an absolute deadline, as perf stat -I does; a condition
variable's timed wait, which a sampler uses to be woken early for stop; a timerfd read), at
-I 1, 10 and 100 ms. Its CPU (CLOCK_THREAD_CPUTIME_ID over the loop) per wake-up and as % of
one core. On a VM the timer's reprogramming and the wake-up itself are charged to the
sleeping thread, so this is the least a per-interval user-space tick can cost: a sampler that
reads counters on such a tick costs this plus its reads, whatever it is written in. Issue 14's
goal at -I 1 (half of perf stat's cost) is below this floor where the floor is about perf
stat's whole cost: only sampling in the kernel (no wake-up of ours per interval) can reach it.
The last row gives the waiting thread a timer slack of 1% of the interval (PR_SET_TIMERSLACK;
the kernel's default is 50 µs), which lets the kernel fire its timer with another one.

The C program is compiled here with the system's cc (a benchmark script, not a test: gcc is
on every machine this project builds on, since the package's extension needs it). Each round
runs every (mechanism, interval) cell once, in a random order; the figure is the median over
rounds with min-max. Nothing is compared with a constant.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

static int64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    const char *how = argv[1];
    long period_ns = atol(argv[2]);
    int n = atoi(argv[3]);
    long slack_ns = argc > 4 ? atol(argv[4]) : 0;     /* 0: the kernel's default (50 us) */
    if (slack_ns > 0) prctl(PR_SET_TIMERSLACK, (unsigned long)slack_ns, 0, 0, 0);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_t cond;
    pthread_cond_init(&cond, &ca);
    int tfd = timerfd_create(CLOCK_MONOTONIC, 0);
    struct itimerspec its = {{period_ns / 1000000000, period_ns % 1000000000},
                             {period_ns / 1000000000, period_ns % 1000000000}};
    if (how[0] == 't') timerfd_settime(tfd, 0, &its, NULL);
    int64_t c0 = thread_cpu_ns();
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n; i++) {
        deadline.tv_nsec += period_ns % 1000000000;
        deadline.tv_sec += period_ns / 1000000000;
        if (deadline.tv_nsec >= 1000000000) { deadline.tv_nsec -= 1000000000; deadline.tv_sec++; }
        if (how[0] == 'n') {
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL);
        } else if (how[0] == 'c' || how[0] == 's') {     /* 's': the same wait, with slack */
            pthread_cond_timedwait(&cond, &mu, &deadline);
        } else {
            uint64_t expirations;
            if (read(tfd, &expirations, sizeof expirations) < 0) return 1;
        }
    }
    printf("%lld\n", (long long)(thread_cpu_ns() - c0));
    return 0;
}
"""
MECHANISMS = {"n": "clock_nanosleep (absolute deadline)", "c": "pthread_cond_timedwait", "t": "timerfd read",
              "s": "pthread_cond_timedwait, timer slack 1% of the interval"}
SLACK_SHARE = 0.01     # the 's' rows: PR_SET_TIMERSLACK to this share of the interval
INTERVALS_MS = (1.0, 10.0, 100.0)


def build(tmp: Path) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("wakeup_floor: no C compiler (cc or gcc) on PATH")
    src, exe = tmp / "floor.c", tmp / "floor"
    src.write_text(SOURCE)
    subprocess.run([cc, "-O2", "-o", str(exe), str(src), "-lpthread"], check=True)
    return exe


def cell(exe: Path, how: str, interval_ms: float, seconds: float) -> float:
    """CPU ns per wake-up of one run of `seconds`."""
    n = max(5, int(seconds * 1000 / interval_ms))
    slack = str(int(interval_ms * 1e6 * SLACK_SHARE)) if how == "s" else "0"
    out = subprocess.run([str(exe), how, str(int(interval_ms * 1e6)), str(n), slack], check=True,
                         capture_output=True, text=True).stdout
    return int(out) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per cell (default 2)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    cells = [(how, iv) for how in MECHANISMS for iv in INTERVALS_MS]
    per_wake: dict[tuple[str, float], list[float]] = {c: [] for c in cells}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="wakeup-floor-") as tmp:
        exe = build(Path(tmp))
        for r in range(args.rounds):
            order = cells[:]
            rng.shuffle(order)
            for how, iv in order:
                per_wake[(how, iv)].append(cell(exe, how, iv, args.seconds))
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)
    load1 = os.getloadavg()
    print(f"wake-up floor: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"kernel {platform.release()}; {args.rounds} paired rounds of {args.seconds:g} s per cell, seed {seed}")
    print(f"command: python benchmarks/wakeup_floor.py --rounds {args.rounds} --seconds {args.seconds:g} "
          f"--seed {seed}")
    print()
    print("| wait | " + " | ".join(f"-I {iv:g}: µs per wake-up, % of a core" for iv in INTERVALS_MS) + " |")
    print("|---|" + "---|" * len(INTERVALS_MS))
    for how, label in MECHANISMS.items():
        row = []
        for iv in INTERVALS_MS:
            xs = per_wake[(how, iv)]
            med = statistics.median(xs)
            row.append(f"{med / 1e3:.1f} [{min(xs) / 1e3:.1f}–{max(xs) / 1e3:.1f}], "
                       f"{100 * med / (iv * 1e6):.2f}%")
        print(f"| {label} | " + " | ".join(row) + " |")
    print()
    print(f"load average before/after: {' '.join(f'{x:.2f}' for x in load0)} / "
          f"{' '.join(f'{x:.2f}' for x in load1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
