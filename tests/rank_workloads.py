"""Multi-rank jobs written the way users write them, for the rank watcher's tests:

    python tests/rank_workloads.py ddp OUT STEPS [PORT]   a 2-rank DDP MLP over gloo with AdamW:
        under torchrun (RANK set) one rank; else it starts both with torch.multiprocessing.spawn
        and init_method tcp://127.0.0.1:PORT
    python tests/rank_workloads.py mp OUT SECONDS          2 multiprocessing processes, no
        torch.distributed, each started with COUNTERPROF_RANK in its environment; each burns
        SECONDS of CPU

Each rank writes OUT/rank<r>.json: its pid, its own CPU (time.process_time()) from the moment
it knows its rank to its end, and that span's wall-clock ends (from_ns, to_ns: time.time_ns()):
the truth the profiler's per-rank counts over the same span are held to.
"""
from __future__ import annotations

import json
import os
import sys
import time

# Each rank waits this long, off-CPU, after init_process_group: the profiler's watcher (a poll
# every 0.25 s) has found it by then, so the rank's CPU from here on is all counted as its own.
SETTLE_S = 1.0


def _report(out: str, rank: int, cpu_from: float, from_ns: int, **extra) -> None:
    doc = {"rank": rank, "pid": os.getpid(), "cpu_s": time.process_time() - cpu_from,
           "from_ns": from_ns, "to_ns": time.time_ns(), **extra}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(doc, f)


def train(rank: int, world: int, port: int | None, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if port is None:                      # torchrun: MASTER_ADDR, RANK... in the environment
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
    cpu_from, from_ns = time.process_time(), time.time_ns()
    rank = dist.get_rank()
    time.sleep(SETTLE_S)
    torch.manual_seed(rank)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(steps):
        x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    # Without the del, DDP's reducer keeps the process group alive into interpreter teardown,
    # where torch 2.13's gloo can abort a rank ("terminate called without an active exception").
    dist.barrier()
    del model, opt
    dist.destroy_process_group()
    _report(out, rank, cpu_from, from_ns, world=world)


def ddp(out: str, steps: str, port: str = "0") -> None:
    if "RANK" in os.environ:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, int(steps), out)
        return
    import torch.multiprocessing as mp
    mp.spawn(train, args=(2, int(port), int(steps), out), nprocs=2, join=True)


def _mp_rank(rank: int, seconds: float, out: str) -> None:
    time.sleep(SETTLE_S)                  # found from its environment within a poll of its start
    cpu_from, from_ns = time.process_time(), time.time_ns()
    x = 0
    while time.process_time() - cpu_from < seconds:
        x += 1
    _report(out, rank, cpu_from, from_ns, env_rank=os.environ.get("COUNTERPROF_RANK"))


def mp(out: str, seconds: str) -> None:
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")   # a fresh interpreter: exec'd with the environment below
    procs = []
    for rank in range(2):
        os.environ["COUNTERPROF_RANK"] = str(rank)
        p = ctx.Process(target=_mp_rank, args=(rank, float(seconds), out))
        p.start()
        procs.append(p)
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))


if __name__ == "__main__":
    {"ddp": ddp, "mp": mp}[sys.argv[1]](*sys.argv[2:])
