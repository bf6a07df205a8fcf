"""Per-rank profiling of a multi-rank job that `counterprof run` launched.

    counterprof run -- torchrun --nproc_per_node 4 train.py      (per-rank: automatic)
    counterprof run --per-rank -- python launches_its_own_ranks.py

Instead of counting the launched process tree as one, the watcher looks through the tree a
few times a second for processes whose environment names a rank (RANK, as torchrun sets it;
OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID) and, for each new rank, starts the collectors
that can attach to a running process (perf, host, threads) on it, writing into that rank's partition,
rank=<r>/. A rank's own children (DataLoader workers) carry the same rank and are counted
through their rank root (perf's inherit, host's tree). Counting starts when a rank is found:
within a poll (0.25 s) of its start, so the first moments of each rank's start-up are missed.
"""
from __future__ import annotations

import threading
from typing import Any

from .collector import Collector, Target
from .errors import CounterprofError
from .proctree import environ, rank_of, tree_order

# launchers whose children are ranks: per-rank profiling is on by default for them
LAUNCHERS = ("torchrun", "mpirun", "mpiexec", "srun", "deepspeed", "accelerate", "horovodrun")
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def launches_ranks(command: list[str]) -> bool:
    """Does this command start a multi-rank job (so per-rank profiling is the default)?"""
    if not command:
        return False
    exe = command[0].rsplit("/", 1)[-1]
    if exe in LAUNCHERS:
        return True
    return any(command[i] == "-m" and command[i + 1] in LAUNCHER_MODULES
               for i in range(len(command) - 1))


class RankWatcher:
    def __init__(self, session, classes: list[type[Collector]], root: int, poll_s: float = 0.25):
        self.session = session
        self.classes = classes
        self.root = root
        self.poll_s = poll_s
        self.ranks: dict[int, dict[str, Any]] = {}       # rank -> {"pid", "collectors": [...]}
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None

    def start(self, ctx) -> None:
        self._thread = ctx.start_thread("counterprof-ranks", self._loop)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.scan()
            except Exception as exc:     # never let the workload notice
                self.session.warn(f"rank watcher: {type(exc).__name__}: {exc}")

    def scan(self) -> None:
        """Start collectors on every rank root that appeared since the last scan."""
        for pid in tree_order(self.root):
            if pid in self._seen:
                continue
            self._seen.add(pid)
            env = environ(pid)
            rank = rank_of(env)
            if rank is None or rank in self.ranks:   # not a rank, or a rank's own child
                continue
            local = env.get("LOCAL_RANK", "")
            if local.isdigit():    # torchrun's convention: a rank drives cuda:LOCAL_RANK
                self.session.own_entity(f"gpu:{int(local)}", rank)
            world = env.get("WORLD_SIZE", "")
            self._start_rank(rank, pid, int(world) if world.isdigit() else None)

    def _start_rank(self, rank: int, pid: int, world_size: int | None = None) -> None:
        entry = {"pid": pid, "world_size": world_size, "collectors": []}
        with self._lock:
            if self._stop.is_set():
                return
            self.ranks[rank] = entry
        ctx = self.session.rank_context(rank, Target("pid", pid))
        for cls in sorted(self.classes, key=lambda c: c.start_late):
            col = cls(self.session.config.get(cls.name, {}))
            try:
                col.start(ctx)
            except Exception as exc:
                reason = str(exc) if isinstance(exc, CounterprofError) else f"{type(exc).__name__}: {exc}"
                try:
                    col.stop()
                except Exception:
                    pass
                self.session.rank_status(rank, col, "failed", reason)
                continue
            entry["collectors"].append(col)
            self.session.rank_status(rank, col, "ok", "")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            entries = list(self.ranks.items())
        for rank, entry in entries:
            for col in sorted(entry["collectors"], key=lambda c: not c.start_late):
                try:
                    col.stop()
                except Exception as exc:
                    self.session.rank_status(rank, col, "failed", f"stop failed: {exc}")
                    continue
                self.session.rank_status(rank, col, col.status, col.reason)
