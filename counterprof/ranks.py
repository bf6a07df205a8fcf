"""Per-rank profiling of a multi-rank job that `counterprof run` launched.

    counterprof run -- torchrun --nproc_per_node 4 train.py      (per-rank: on)
    counterprof run --torch -- python spawns_its_ranks.py        (per-rank: auto)
    counterprof run --per-rank -- python launches_its_own_ranks.py

Instead of counting the launched process tree as one, the watcher looks through the tree a
few times a second for rank processes and, for each new rank, starts the collectors that can
attach to a running process (perf, host, threads: the per_rank collectors) on it, writing into that
rank's partition, rank=<r>/. A rank is found two ways:

- its environment at exec names it: COUNTERPROF_RANK (set it yourself, for jobs without
  torch.distributed), RANK (torchrun), OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID;
- it announces itself: under --torch, the driver in each Python process writes
  <run>/.ranks/<pid>.json (pid, rank, world_size, local_rank, cuda_device, host) once
  torch.distributed is initialised, which is how ranks of torch.multiprocessing.spawn or a
  custom launcher are known; under --jax, once jax.distributed is initialised.

A rank owns gpu:<LOCAL_RANK> (torchrun's convention), else, announced, gpu:<the CUDA device it
had selected when it announced>: that GPU's samples go to its partition.

A rank's own children (DataLoader workers) carry the same rank and are counted through their
rank root (perf's inherit, host's tree). Counting starts when a rank is found: within a poll
(0.25 s) of its start, or of its init_process_group, so the moments before are not the rank's.

Modes. "on" (--per-rank, and the default under torchrun, mpirun, srun, ...): the root process
tree is not counted by the per_rank collectors, only the ranks. "auto" (the default with
--torch): the root's per_rank collectors count the whole tree into rank=0 until a rank appears
below the root; then they are stopped (their rows stay) and each rank is counted on its own,
so rank 0 is not counted twice and the other ranks are not empty. meta.json's "rank_switch"
says when, and "ranks" which pid is which rank.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from .collector import Collector, SessionContext, Target, start_order, stop_order
from .ground.clock import Clock
from .ground.proctree import environ, multiprocessing_helper, pid_alive, rank_of, tree_order
from counterprof.ground.record import record

# launchers whose children are ranks: per-rank profiling is on by default for them
LAUNCHERS = ("torchrun", "mpirun", "mpiexec", "srun", "deepspeed", "accelerate", "horovodrun")
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")

# where the torch driver announces its rank (collectors/torch_trace/bootstrap/_counterprof_torch_driver.py)
ANNOUNCE_DIR = ".ranks"
ANNOUNCE_MAX_BYTES = 4096
ANNOUNCERS = ("torch.distributed", "jax.distributed")
FOREIGN_AFTER_S = 5.0     # an announcing pid not in the tree by then is not the workload's
EXEC_WITHIN_S = 5.0       # a process seen before its exec is looked at again this long


def launches_ranks(command: list[str]) -> bool:
    """Does this command start a multi-rank job (so per-rank profiling is the default)?"""
    if not command:
        return False
    exe = command[0].rsplit("/", 1)[-1]
    if exe in LAUNCHERS:
        return True
    return any(command[i] == "-m" and command[i + 1] in LAUNCHER_MODULES
               for i in range(len(command) - 1))


def per_rank_mode(command: list[str], asked: bool | None, torch: bool) -> bool | str:
    """How a launched command's ranks are counted: True (each rank, not the launcher), "auto"
    (the tree as one until ranks appear: under --torch or --jax (torch true) a Python job may
    spawn its ranks, and its driver announces them), or
    False (the tree as one). asked: --per-rank or --no-per-rank; None when neither was given."""
    if not command:
        return False
    if asked is not None:
        return asked
    if launches_ranks(command):
        return True
    return "auto" if torch else False


@record(frozen=True)
class Announcement:
    """A process's own word on its rank, as torch.distributed knows it."""
    pid: int
    rank: int
    world_size: int | None
    local_rank: int | None       # LOCAL_RANK
    host: str
    cuda_device: int | None = None    # the CUDA device selected when it announced
    source: str = "torch.distributed"  # whose rank it is: the torch or the jax driver's word


def _short_host(name: str) -> str:
    return name.split(".")[0]


def parse_announcement(name: str, data: bytes) -> Announcement:
    """An announcement file's content; ValueError (saying what is wrong) for anything else
    than a complete one of the process its name says."""
    if not name.endswith(".json") or not name[:-5].isdigit():
        raise ValueError("not named <pid>.json")
    try:
        doc = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not complete JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")

    def integer(key: str) -> int:
        value = doc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{key} is {value!r}, not a whole number >= 0")
        return value

    def optional(key: str) -> int | None:
        return None if doc.get(key) is None else integer(key)

    pid, rank = integer("pid"), integer("rank")
    if pid != int(name[:-5]):
        raise ValueError(f"names pid {pid}, but the file is {name}")
    world, local, device = (optional(k) for k in ("world_size", "local_rank", "cuda_device"))
    if world is not None and rank >= world:
        raise ValueError(f"rank {rank} is not below world_size {world}")
    host = doc.get("host")
    if not isinstance(host, str) or not host:
        raise ValueError(f"host is {host!r}")
    source = doc.get("source", "torch.distributed")
    if source not in ANNOUNCERS:
        raise ValueError(f"source is {source!r}, not one of {', '.join(ANNOUNCERS)}")
    return Announcement(pid, rank, world, local, host, device, source)


def read_announcements(folder: Path, done: set[str], since_ns: int = 0
                       ) -> tuple[list[tuple[str, Announcement]], list[tuple[str, str]]]:
    """The announcement files in folder not in `done`: ([(name, announcement)], [(name, why it
    is ignored)]). Never follows a symbolic link (the folder's or a file's), reads regular files
    only, at most ANNOUNCE_MAX_BYTES, and ignores files older than since_ns (wall clock: a run
    replaced with --force keeps the folder of the run before). Names in neither list (a
    temporary file being written) are looked at again next time."""
    good: list[tuple[str, Announcement]] = []
    bad: list[tuple[str, str]] = []
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return good, bad
    except OSError as exc:
        reason = "is a symbolic link" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
        if str(folder) not in done:
            bad.append((str(folder), f"{reason}: no announcement in it is read"))
        return good, bad
    try:
        for name in sorted(os.listdir(dfd)):
            if name in done or name.endswith(".tmp"):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=dfd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                bad.append((name, "is a symbolic link" if exc.errno == errno.ELOOP
                            else exc.strerror or str(exc)))
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    bad.append((name, "is not a regular file"))
                    continue
                if st.st_mtime_ns < since_ns:
                    bad.append((name, "was written before this run started"))
                    continue
                data = os.read(fd, ANNOUNCE_MAX_BYTES + 1)
            finally:
                os.close(fd)
            if len(data) > ANNOUNCE_MAX_BYTES:
                bad.append((name, f"is over {ANNOUNCE_MAX_BYTES} bytes"))
                continue
            try:
                good.append((name, parse_announcement(name, data)))
            except ValueError as exc:
                bad.append((name, str(exc)))
    finally:
        os.close(dfd)
    return good, bad


class RankSession(Protocol):
    """What the watcher needs of the session whose job's ranks it counts (session.Session):
    the run, the clock and the collectors' config it starts each rank's collectors with, and
    the calls that keep the session's books on the ranks (its partitions, its meta.json)."""

    @property
    def path(self) -> Path:
        """The run directory: its .ranks/ folder holds the announcements."""

    @property
    def clock(self) -> Clock: ...

    @property
    def config(self) -> dict[str, dict[str, Any]]:
        """Each collector's config, by name."""

    def warn(self, message: str) -> None:
        """Say something to the user, and in meta.json's warnings."""

    def own_entity(self, entity: str, rank: int) -> None:
        """Samples of `entity` (e.g. gpu:1, sampled once for the machine) belong to `rank`."""

    def rank_context(self, rank: int, target: Target) -> SessionContext:
        """The context a collector counting `rank` starts in: its batches land in that rank's
        partition."""

    def stop_root_per_rank(self, classes: list[type[Collector]]) -> list[str]:
        """auto mode's switch: stop the root's collectors of these classes; their names."""

    def rank_switched(self, facts: dict[str, Any]) -> None:
        """auto mode switched to counting each rank (facts: when, the trigger, what stopped)."""

    def rank_status(self, rank: int, col: Collector, status: str, reason: str,
                    found: dict[str, Any] | None) -> None:
        """A rank's collector started, failed or stopped; found: the watcher's entry for the
        rank (its pid, where its rank was read, world size, GPU)."""


class RankWatcher:
    """Finds the ranks of the tree under root and starts `classes` on each.

    mode "on": from the start, the root's per_rank collectors are not running. mode "auto":
    they are (session.collectors), and are stopped at the first rank found below the root."""

    def __init__(self, session: RankSession, classes: list[type[Collector]], root: int | None,
                 poll_s: float = 0.25, mode: str = "on", announce_dir: Path | None = None):
        self.session = session
        self.classes = classes
        self.root = root
        self.poll_s = poll_s
        self.mode = mode
        self.announce_dir = Path(announce_dir if announce_dir is not None
                                 else Path(session.path) / ANNOUNCE_DIR)
        self.host = _short_host(socket.gethostname())
        self.since_ns = time.time_ns() - 2_000_000_000    # mtime granularity and clock steps
        self.ranks: dict[int, dict[str, Any]] = {}       # rank -> {"pid", "collectors": [...]}
        self.pending: list[dict[str, Any]] = []           # auto, before the switch: ranks at the root
        self.switch: dict[str, Any] | None = None
        self._seen: set[int] = set()
        self._done: set[str] = set()                      # announcement files taken or refused
        self._unknown: dict[str, float] = {}              # announcements of pids not seen in the tree yet
        self._young: dict[int, tuple[float, bytes]] = {}  # rankless pids that may exec yet: (seen, cmdline)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        try:    # made by the profiler before the workload runs, for the owner only
            self.announce_dir.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            pass     # a run directory we cannot write in fails elsewhere, said there

    @property
    def counting(self) -> bool:
        """Whether ranks are counted on their own now (always in mode on; after the switch in auto)."""
        return self.mode == "on" or self.switch is not None

    def start(self, ctx: SessionContext) -> None:
        self._thread = ctx.start_thread("counterprof-ranks", self._loop)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.scan()
            except Exception as exc:     # never let the workload notice
                self.session.warn(f"rank watcher: {type(exc).__name__}: {exc}")

    def scan(self) -> None:
        """Start collectors on every rank root that appeared since the last scan."""
        pids = tree_order(self.root) if self.root is not None else []    # no pid: no tree
        now = time.monotonic()
        for pid in pids:
            if pid in self._seen and not self._may_exec(pid, now):
                continue
            self._seen.add(pid)
            env = environ(pid)
            rank = rank_of(env)
            if rank is None and pid != self.root and pid not in self._young:
                self._young[pid] = (now, _cmdline(pid))
            if rank is None or multiprocessing_helper(pid):
                continue
            local, world = env.get("LOCAL_RANK", ""), env.get("WORLD_SIZE", "")
            self._found(rank, pid, "environment", int(world) if world.isdigit() else None,
                        int(local) if local.isdigit() else None)
        self._read_announcements(set(pids))

    def _may_exec(self, pid: int, now: float) -> bool:
        """A process seen without a rank may have been caught between fork and exec, with its
        parent's environment: look again while it is young, once its command line changes."""
        first, cmdline = self._young.get(pid, (None, None))
        if first is None:
            return False
        if now - first > EXEC_WITHIN_S:
            del self._young[pid]
            return False
        latest = _cmdline(pid)
        if latest == cmdline:
            return False
        del self._young[pid]                  # exec'd: its environment is its own now
        return True

    def _read_announcements(self, tree: set[int]) -> None:
        good, bad = read_announcements(self.announce_dir, self._done, self.since_ns)
        for name, why in bad:
            self._done.add(name)
            where = name if os.sep in name else self.announce_dir / name    # the folder, or a file in it
            self.session.warn(f"rank announcement {where}: {why}; ignored")
        for name, ann in good:
            if ann.host != self.host:
                self._done.add(name)     # another node's, in a run on a shared filesystem
                continue
            if ann.pid not in tree and ann.pid not in self._seen:
                first = self._unknown.setdefault(name, time.monotonic())
                if not pid_alive(ann.pid):
                    self._done.add(name)  # announced and gone before we looked
                elif time.monotonic() - first > FOREIGN_AFTER_S:
                    self._done.add(name)
                    self.session.warn(f"rank announcement {name}: pid {ann.pid} is not a process "
                                      "of the workload; ignored")
                continue                  # else: started after the tree was listed; next scan
            self._done.add(name)
            # the GPU it drives: cuda:LOCAL_RANK by torchrun's convention, else the one it chose
            gpu = ann.local_rank if ann.local_rank is not None else ann.cuda_device
            self._found(ann.rank, ann.pid, ann.source, ann.world_size, gpu)

    def _found(self, rank: int, pid: int, source: str, world_size: int | None,
               gpu: int | None) -> None:
        """A rank process found; gpu: the CUDA ordinal it drives, when known."""
        known = {**{p["pid"]: p for p in self.pending},
                 **{e["pid"]: e for e in self.ranks.values()}}.get(pid)
        if known is not None:
            if known["rank"] != rank:
                self.session.warn(f"pid {pid} is rank {known['rank']} (from {known['source']}) "
                                  f"and rank {rank} (from {source}); counted as rank {known['rank']}")
            return
        if rank in self.ranks or any(p["rank"] == rank for p in self.pending):
            if source != "environment":      # (same RANK in the environment: the rank's child)
                self.session.warn(f"rank {rank} announced by pid {pid}, which another process "
                                  "already is: two processes with the same rank? counted once")
            return
        entry = {"rank": rank, "pid": pid, "source": source, "world_size": world_size,
                 "gpu": gpu}
        if not self.counting:
            if pid == self.root or world_size == 1:
                self.pending.append(entry)     # the root tree's counts are this rank's already
                return
            self._switch_to_ranks(entry)
        self._start_rank(entry)

    def _switch_to_ranks(self, trigger: dict[str, Any]) -> None:
        """auto: the first rank below the root: the root's per_rank collectors stop, each rank
        (those at the root found so far too) is counted on its own from now on."""
        stopped = self.session.stop_root_per_rank(self.classes)
        self.switch = {"at_ns": self.session.clock.now_ns(), "root_pid": self.root,
                       "trigger": {"rank": trigger["rank"], "pid": trigger["pid"],
                                   "source": trigger["source"]},
                       "root_collectors_stopped": stopped}
        self.session.rank_switched(self.switch)
        pending, self.pending = self.pending, []
        for entry in pending:
            self._start_rank(entry)

    def _start_rank(self, entry: dict[str, Any]) -> None:
        rank, pid = entry["rank"], entry["pid"]
        with self._lock:
            if self._stop.is_set():
                return
            self.ranks[rank] = {**entry, "collectors": []}
        self._say_if_nested(rank, pid)
        if entry["gpu"] is not None:
            self.session.own_entity(f"gpu:{entry['gpu']}", rank)
        ctx = self.session.rank_context(rank, Target("pid", pid))
        for cls in start_order(self.classes):
            col = cls(self.session.config.get(cls.name, {}))
            reason = ctx.start_collector(col)
            if reason is not None:
                self.session.rank_status(rank, col, "failed", reason, self.ranks[rank])
                continue
            self.ranks[rank]["collectors"].append(col)
            self.session.rank_status(rank, col, "ok", "", self.ranks[rank])

    def _say_if_nested(self, rank: int, pid: int) -> None:
        """A rank inside another rank's tree (a launcher that is rank 0 itself and starts the
        others): the outer rank's collectors may count the inner one too, so say so. (Announced
        ranks, attached after the inner one started, keep perf apart: counters inherit only to
        children started later; host sums the whole tree.)"""
        mine = set(tree_order(pid))
        for other, entry in list(self.ranks.items()):
            if other == rank:
                continue
            outer, inner = ((rank, other) if entry["pid"] in mine else
                            (other, rank) if pid in set(tree_order(entry["pid"])) else (None, None))
            if outer is not None:
                self.session.warn(f"rank {inner} runs inside rank {outer}'s process tree: rank "
                                  f"{outer}'s figures may include rank {inner}'s (host sums the "
                                  "tree; perf counts the children started after it attached)")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            entries = list(self.ranks.items())
        for rank, entry in entries:
            for col in stop_order(entry["collectors"]):
                try:
                    col.stop()
                except Exception as exc:
                    self.session.rank_status(rank, col, "failed", f"stop failed: {exc}", entry)
                    continue
                self.session.rank_status(rank, col, col.status, col.reason, entry)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(4096)
    except OSError:
        return b""
