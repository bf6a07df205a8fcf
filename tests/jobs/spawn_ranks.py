"""A job whose parent only waits for its ranks: `torch.multiprocessing.spawn` starts N processes
(default 2) that each multiply matrices for S seconds (default 3) on one intra-op thread, and the
parent joins them. No torch.distributed and no rank in any environment: nothing announces the
ranks. `python spawn_ranks.py [S] [N] [--mp]` (--mp: multiprocessing's own "spawn" context and
Process.join instead of torch's spawn). Each rank appends its truth (tests/jobs/truth.py) to
$JOB_TRUTH with its own main thread's shares of its compute window (from its schedstat at both
ends), the parent its own; the parent prints one JSON line: its pid and the ranks' truths."""
import json
import os
import sys
import time

import truth  # first: the wall clock starts before the imports


def _rank(i: int, seconds: float) -> None:
    import torch
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    run0, wait0 = truth.main_thread()
    t0 = time.monotonic_ns()
    n = 0
    while time.monotonic_ns() - t0 < seconds * 1e9:
        a = torch.tanh(a @ a)
        n += 1
    t1 = time.monotonic_ns()
    run1, wait1 = truth.main_thread()
    wall = (t1 - t0) / 1e9
    truth.record("spawn_ranks", role="rank", rank=i, tid=truth.MAIN_TID, t0=t0, t1=t1, matmuls=n,
                 run_share=(run1 - run0) / wall, wait_share=(wait1 - wait0) / wall)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seconds = float(args[0]) if args else 3.0
    n = int(args[1]) if len(args) > 1 else 2
    if "--mp" in sys.argv:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank, args=(i, seconds)) for i in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            sys.exit(1)
    else:
        import torch.multiprocessing as tmp
        tmp.spawn(_rank, args=(seconds,), nprocs=n, join=True)
    mine = truth.record("spawn_ranks", role="parent", tid=truth.MAIN_TID)
    path = os.environ.get("JOB_TRUTH")
    ranks = []
    if path:
        with open(path) as f:
            ranks = [r for r in map(json.loads, f) if r.get("role") == "rank"]
    print(json.dumps({"pid": os.getpid(), "parent": mine, "ranks": sorted(ranks, key=lambda r: r["rank"])}),
          flush=True)


if __name__ == "__main__":
    main()
