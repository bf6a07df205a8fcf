"""A data-parallel step with known collectives, and one rank that is late to some of them.

    torchrun --standalone --nproc_per_node N collective_skew.py [--steps S] [--delay-ms D] [--every K]

Each step: a tiny model's forward and backward, then an all_reduce of a 4 MiB gradient
bucket, an all_gather of 256 KiB per rank, an uneven all_to_all (rank r sends (r + 1) x 64 KiB
in all to the others, split evenly), and the optimizer's step (a step: torch traces mark it).
The last rank sleeps D ms before the all_reduce of every K-th step: the others wait for it
there, by D less whatever they were late by themselves.

Every rank times each of its calls (blocking: the call returns when the collective is done on
it) and appends to $JOB_TRUTH one line with them: per call its step, op, bytes (nccl-tests'
count), start (unix ns) and duration, and which calls were delayed. Nothing here knows
counterprof.
"""
from truth import record

import argparse
import os
import time

import torch
import torch.distributed as dist

BUCKET = 4 << 20                 # bytes of the all_reduce
GATHER = 256 << 10               # bytes each rank contributes to the all_gather
A2A_UNIT = 64 << 10              # the all_to_all: rank r sends (r + 1) units in all


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--delay-ms", type=float, default=40.0)
    ap.add_argument("--every", type=int, default=3)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    bucket = torch.ones(BUCKET // 4)
    part = torch.full((GATHER // 4,), float(rank))
    gathered = torch.empty(world * GATHER // 4)
    send = torch.ones((rank + 1) * A2A_UNIT // 4 * world)       # split evenly over the ranks
    sizes = [(r + 1) * A2A_UNIT // 4 for r in range(world)]      # what each rank sends to each
    recv = torch.empty(sum(sizes))
    late = rank == world - 1
    calls = []

    def timed(step: int, op: str, nbytes: int, fn) -> None:
        start_ns, t = time.time_ns(), time.perf_counter()
        fn()
        calls.append({"step": step, "op": op, "bytes": nbytes, "start_unix_ns": start_ns,
                      "duration_s": time.perf_counter() - t})

    delayed = []
    for step in range(args.steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if late and step % args.every == 0:
            time.sleep(args.delay_ms / 1000)
        if step % args.every == 0:
            delayed.append(step)
        timed(step, "all_reduce", BUCKET, lambda: dist.all_reduce(bucket))
        timed(step, "all_gather", GATHER * world, lambda: dist.all_gather_into_tensor(gathered, part))
        timed(step, "all_to_all", send.numel() * 4,
              lambda: dist.all_to_all_single(recv, send, output_split_sizes=sizes,
                                             input_split_sizes=[send.numel() // world] * world))
        opt.step()
    dist.barrier()
    dist.destroy_process_group()
    record("collective_skew", rank=rank, world_size=world, late_rank=world - 1, delay_ms=args.delay_ms,
           delayed_steps=delayed, calls=calls, host=os.uname().nodename)


if __name__ == "__main__":
    main()
