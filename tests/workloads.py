"""Small workloads with known behaviour, run as `python tests/workloads.py NAME ARGS...`.

Each one does a fixed amount of a thing the counters must see, so a test can hold
counterprof to perf stat, or to the workload's own accounting.
"""
from __future__ import annotations

import json
import mmap
import os
import resource
import signal
import subprocess
import sys
import threading
import time

PAGE = mmap.PAGESIZE


def touch(pages: str) -> None:
    """Write one byte to each of N fresh anonymous pages: N minor page faults."""
    n = int(pages)
    m = mmap.mmap(-1, n * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)   # one fault per 4 KiB page, not per 2 MiB
    for i in range(0, n * PAGE, PAGE):
        m[i] = 1
    m.close()


def burn(seconds: str) -> None:
    """Use S seconds of CPU (process time, not wall time)."""
    _burn(float(seconds))


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for _ in range(2000):
            x += 1


def tree(children: str, seconds: str) -> None:
    """Burn S seconds in each of N child processes and in one extra thread of this one."""
    procs = [subprocess.Popen([sys.executable, __file__, "burn", seconds]) for _ in range(int(children))]
    t = threading.Thread(target=_burn, args=(float(seconds),))
    t.start()
    t.join()
    for p in procs:
        p.wait()


def threads_then_more(n: str, seconds: str, late_after: str) -> None:
    """Print our pid; N threads spin until L s, then one new thread spins until S s (so most
    of the CPU is used by a thread born after a profiler attached); finally print our CPU."""
    print(os.getpid(), flush=True)
    start = time.monotonic()

    def spin(until):
        while time.monotonic() < start + until:
            sum(range(1000))

    early = [threading.Thread(target=spin, args=(float(late_after),)) for _ in range(int(n))]
    for t in early:
        t.start()
    for t in early:
        t.join()
    late = threading.Thread(target=spin, args=(float(seconds),), name="late")
    late.start()
    late.join()
    print(json.dumps({"cpu_s": time.process_time()}), flush=True)


def on_signal(exit_code: str, marker: str) -> None:
    """Print ready, then wait; on SIGTERM or SIGINT write the signal number to MARKER and exit."""
    def handler(signum, _frame):
        with open(marker, "w") as f:
            f.write(str(signum))
        sys.exit(int(exit_code))

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    print("ready", flush=True)
    time.sleep(60)
    sys.exit(99)


def marker(path: str) -> None:
    """Create PATH: tells a test the workload started."""
    open(path, "w").close()


def report_cpu() -> None:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"user_s": ru.ru_utime, "system_s": ru.ru_stime}))


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
