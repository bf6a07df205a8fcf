"""A 2-rank data-parallel training loop on the CPU (gloo) that communicates far more than it
computes: each step runs a small model and then all_reduces a 32 MB gradient bucket (as a
large model's data-parallel step would) with gloo.

Expected verdict: collectives (most of each step is inside all_reduce). Needs the torch
collector to see the collectives:
    counterprof run --torch -- python examples/gloo_allreduce.py
Run as is, it starts its two ranks itself (each with RANK/WORLD_SIZE in its environment, as
torchrun would); under torchrun (RANK already set) it is one rank.
Usage: python examples/gloo_allreduce.py [STEPS] [SLOW_MS]   (default 30 steps, 0 ms)
SLOW_MS makes the last rank a straggler: it sleeps that long in every step before the
all_reduce, and the other rank waits for it there.
"""
import os
import socket
import subprocess
import sys


def rank_main(steps: int, slow_ms: float = 0.0) -> None:
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    bucket = torch.ones(8 * 1024 * 1024)                 # 32 MB of float32 gradients
    x = torch.randn(32, 64)
    straggler = dist.get_rank() == dist.get_world_size() - 1
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()              # the compute: tiny
        if straggler and slow_ms:
            time.sleep(slow_ms / 1000)
        dist.all_reduce(bucket)                          # the communication: large
        bucket.fill_(1.0)
        opt.step()                                       # a step: torch traces mark it
    dist.barrier()
    dist.destroy_process_group()


def launch(steps: int, slow_ms: float, world: int = 2) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__, str(steps), str(slow_ms)], env=env))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    slow_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    if "RANK" in os.environ:
        rank_main(steps, slow_ms)
    else:
        sys.exit(launch(steps, slow_ms))
