"""Workloads whose thread states are known by construction, for the threads collector's tests:
`python tests/thread_workloads.py NAME ARGS...`. Each prints one JSON line at the end with its own
accounting (monotonic ns window, its pid, its main thread's sleep or run delay measured by itself).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time

BLOCK = b"x" * (1 << 20)     # hashlib releases the GIL on inputs this big: helpers do not hold it


def _hash_until(stop: threading.Event) -> None:
    while not stop.is_set():
        hashlib.sha256(BLOCK).digest()


def _hash_for(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hashlib.sha256(BLOCK[: 1 << 16]).digest()


def sleepy(seconds: str, busy_ms: str, sleep_ms: str, helpers: str = "2") -> None:
    """The main thread computes busy_ms then sleeps sleep_ms, for S seconds, while `helpers`
    threads hash without the GIL; it times its own sleep."""
    stop = threading.Event()
    threads = [threading.Thread(target=_hash_until, args=(stop,)) for _ in range(int(helpers))]
    for t in threads:
        t.start()
    t0 = time.monotonic_ns()
    slept = 0
    while time.monotonic_ns() - t0 < float(seconds) * 1e9:
        _hash_for(float(busy_ms) / 1000)
        s = time.monotonic_ns()
        time.sleep(float(sleep_ms) / 1000)
        slept += time.monotonic_ns() - s
    t1 = time.monotonic_ns()
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id(), "t0": t0, "t1": t1,
                      "sleep_share": slept / (t1 - t0)}), flush=True)


def _schedstat() -> tuple[int, int]:
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run), int(wait)


def contended(seconds: str) -> None:
    """Computes for S seconds (run it pinned onto a CPU another process keeps busy); reads its
    own run delay from /proc/self/task/TID/schedstat at both ends."""
    run0, wait0 = _schedstat()
    t0 = time.monotonic_ns()
    while time.monotonic_ns() - t0 < float(seconds) * 1e9:
        sum(range(1000))
    t1 = time.monotonic_ns()
    run1, wait1 = _schedstat()
    print(json.dumps({"pid": os.getpid(), "t0": t0, "t1": t1, "wait_share": (wait1 - wait0) / (t1 - t0),
                      "run_share": (run1 - run0) / (t1 - t0)}), flush=True)


def _heavy_item(i: int) -> int:
    x = 0
    for k in range(150_000):      # heavy Python per item (~10 ms), in the worker
        x += (k * i) % 7
    return x


def loader(items: str) -> None:
    """A torch DataLoader with 2 workers doing heavy Python per item; the main loop only waits."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Heavy(Dataset):
        def __len__(self):
            return int(items)

        def __getitem__(self, i):
            return torch.tensor(_heavy_item(i))

    t0 = time.monotonic_ns()
    total = 0
    for batch in DataLoader(Heavy(), batch_size=4, num_workers=2):
        total += int(batch.sum())
    t1 = time.monotonic_ns()
    print(json.dumps({"pid": os.getpid(), "t0": t0, "t1": t1, "total": total}), flush=True)


def spin_forever() -> None:
    """Print our pid, then compute until killed."""
    print(os.getpid(), flush=True)
    while True:
        sum(range(1000))


DDP = r"""
import os, torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(30):
    opt.zero_grad()
    model(torch.randn(32, 256)).sum().backward()
    opt.step()
# The cleanup DDP scripts end with: without the barrier and the del, the reducer keeps the
# process group alive into interpreter teardown, where torch 2.13's gloo aborted ("terminate
# called without an active exception") in 4 of 70 runs under torchrun alone, no profiler;
# with the barrier, 0 of 40; with the barrier and the del, 0 of 40.
dist.barrier()
del model, opt
dist.destroy_process_group()
"""


def ddp() -> None:
    """One rank of a small gloo DDP training loop (run it under torchrun)."""
    exec(compile(DDP, "ddp", "exec"), {})


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
