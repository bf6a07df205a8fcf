"""Training-loop-shaped workloads with steps and regions, for compare and history:
`python tests/step_workloads.py NAME ARGS...`.

The extra time a candidate run takes comes from the environment (COUNTERPROF_TEST_EXTRA_MS), so
baseline and candidate run the same command, as `counterprof compare` requires.

    steps N SPIN_MS SLEEP_MS      N steps, each a region "compute" (a wall-clock spin: preemption
                                  does not lengthen it) and a region "io" (a sleep, + the extra)
    work N KILO_ITERS             N steps of a fixed amount of CPU work (a region "compute": a Python
                                  loop of KILO_ITERS thousand iterations): a step takes longer when
                                  another process holds the CPU (contention), unlike the spin above
    gloo N SLEEP_MS               2 ranks (gloo, launched like torchrun would), each step a sleep and
                                  an all_reduce; rank COUNTERPROF_TEST_SLOW_RANK sleeps the extra
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import counterprof

EXTRA_S = float(os.environ.get("COUNTERPROF_TEST_EXTRA_MS", "0")) / 1000
CRASH_AT = int(os.environ.get("COUNTERPROF_TEST_CRASH_AT", "0"))   # exit 3 before this step


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def steps(n: str, spin_ms: str, sleep_ms: str) -> None:
    for i in range(int(n)):
        if CRASH_AT and i == CRASH_AT:
            sys.exit(3)
        with counterprof.region("step", category="step"):
            with counterprof.region("compute"):
                _spin(float(spin_ms) / 1000)
            with counterprof.region("io"):
                time.sleep(float(sleep_ms) / 1000 + EXTRA_S)


def work(n: str, kilo_iters: str) -> None:
    iters = int(kilo_iters) * 1000
    for _ in range(int(n)):
        with counterprof.region("step", category="step"):
            with counterprof.region("compute"):
                x = 0
                for i in range(iters):
                    x += i * i


def _gloo_rank(n: int, sleep_s: float) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    slow = int(os.environ.get("COUNTERPROF_TEST_SLOW_RANK", "1"))
    t = torch.ones(1024)
    for _ in range(n):
        with counterprof.region("step", category="step"):
            with counterprof.region("work"):
                time.sleep(sleep_s + (EXTRA_S if rank == slow else 0.0))
            with counterprof.region("allreduce"):
                dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()


def gloo(n: str, sleep_ms: str) -> None:
    if "RANK" in os.environ:
        _gloo_rank(int(n), float(sleep_ms) / 1000)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__, "gloo", n, sleep_ms], env=env))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
