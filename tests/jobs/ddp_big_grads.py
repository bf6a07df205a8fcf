"""Data-parallel training on the CPU over gloo where the gradient sync is the cost: an MLP with
~17M fp32 parameters (67 MB of gradients) and a batch of 4 rows, so the all-reduce moves far
more bytes than the step computes. Each step accumulates two micro-batches, the first under
`model.no_sync()` (the same forward and backward without the all-reduce), as people measure
what DDP's sync costs; every step is alike, so the traced ones stand for all.

    torchrun --standalone --nproc_per_node 2 ddp_big_grads.py [--steps N]
    python ddp_big_grads.py --spawn 2 --port PORT [--steps N]      (torch.multiprocessing.spawn)

Each rank times both micro-batches of every step itself (perf_counter). The truth: the synced
micro-batch's extra time over the no_sync one is what the collectives cost, a share
(sum synced - sum no_sync) / loop time. Each rank appends its figures to
$JOB_TRUTH (truth.py).
"""
from truth import main_thread, record

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, LAYERS = 2048, 4          # 4 x 2048 x 2048 fp32 weights: 67 MB of gradients


def train(rank: int, world_size: int, args) -> None:
    if args.spawn:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=world_size)
    else:
        dist.init_process_group("gloo")              # torchrun's environment
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    model = DDP(nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)

    def micro_batch() -> None:
        x = torch.randn(4, WIDTH, generator=gen)
        model(x).square().mean().backward()

    micro_batch()                                     # warm-up: buffers, the reducer's buckets
    optimizer.zero_grad()
    synced = local = 0.0
    log = []
    loop_start, (_, delay0) = time.perf_counter(), main_thread()
    for _ in range(args.steps):
        start_ns = time.time_ns()
        t = time.perf_counter()
        with model.no_sync():
            micro_batch()
        t1 = time.perf_counter()
        micro_batch()                                 # the same work, all-reducing 67 MB
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        local += t1 - t
        synced += t2 - t1
        log.append((start_ns, time.time_ns(), t1 - t, t2 - t1))
    loop_s = time.perf_counter() - loop_start
    run_delay = main_thread()[1] - delay0
    dist.barrier()
    # dropped before the group (tests/rank_workloads.py: gloo's teardown abort); micro_batch
    # holds `model`, so it is set to None, not deleted
    model = optimizer = None
    dist.destroy_process_group()
    record("ddp_big_grads", rank=rank, world_size=world_size, steps=args.steps, loop_s=loop_s,
           synced_s=synced, local_s=local, loop_run_delay_s=run_delay,
           collectives_s=max(0.0, synced - local), step_log=log)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--spawn", type=int, default=0, help="start this many ranks with mp.spawn")
    ap.add_argument("--port", type=int, default=29512)
    args = ap.parse_args()
    if args.spawn:
        mp.spawn(train, args=(args.spawn, args), nprocs=args.spawn)
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


if __name__ == "__main__":
    main()
