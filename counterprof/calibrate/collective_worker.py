"""One rank of the collectives benchmark (run by measure.collectives in `world` processes).

    python -m counterprof.calibrate.collective_worker BACKEND SIZES_JSON REPEATS OUT_JSON

Rendezvous from MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE. measure.collectives forks the ranks
from the calibrating process instead (run(): torch is imported already, which saves seconds)
when it has not started torch's thread pools yet. For each collective and message size
(bytes per rank's buffer, as nccl-tests counts it): a warm-up, then REPEATS timed calls, each
the slowest rank's time (a barrier-free max: every rank's time is all-reduced). Rank 0 writes
{collective: {size: [seconds, ...]}} or {collective: "why not"}.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial


def main(argv: list[str]) -> int:
    return run(argv[0], json.loads(argv[1]), int(argv[2]), argv[3],
               int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


def run(backend: str, sizes: list[int], repeats: int, out: str, rank: int, world: int) -> int:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)            # gloo's own threads move the bytes; one rank per core
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    # {collective: {size: [seconds, ...]} or why not}
    results: dict[str, dict[str, list[float]] | str] = {}
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        per_size: dict[str, list[float]] = {}
        try:
            for size in sizes:
                n = max(1, size // 4)
                call: Callable[[], object]
                if coll == "all_reduce":
                    x = torch.ones(n, device=device)
                    call = partial(dist.all_reduce, x)
                elif coll == "all_gather":
                    # nccl-tests: size is the gathered buffer; each rank sends size / world
                    part = max(1, n // world)
                    x, y = torch.ones(part, device=device), torch.empty(part * world, device=device)
                    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
                    call = partial(gather, y, x)
                else:
                    part = max(1, n // world)
                    x, y = torch.ones(part * world, device=device), torch.empty(part, device=device)
                    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
                    call = partial(scatter, y, x)
                call()
                sync()
                times = []
                for _ in range(repeats):
                    dist.barrier()
                    t0 = time.perf_counter()
                    call()
                    sync()
                    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    times.append(float(t))
                per_size[str(n * 4)] = times
            results[coll] = per_size
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            results[coll] = f"{backend} {coll} failed: {str(exc).splitlines()[0][:200]}"
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
