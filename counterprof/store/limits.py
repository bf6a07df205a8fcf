"""The memory this process may use, and the readers sized to it (issue 30, item 3).

Batch schedulers start jobs under limits: an address-space limit (`ulimit -v`, RLIMIT_AS) or a
cgroup's memory.max. A reader of a run (report, export, history, merge) loads Arrow, numpy and
DuckDB, which size themselves for the machine: mimalloc and glibc reserve address space per
thread (a 5 KB run's `report` reserves ~2.2 GB of it while touching ~180 MB), OpenBLAS a buffer
per core, DuckDB a thread per core and 80% of the machine's memory. Under a limit they then fail
wherever an allocation does: a MemoryError, an ImportError from a shared object that could not be
mapped, DuckDB's OutOfMemoryException, or glibc aborting a thread that got no thread-local
memory (exit 127, nothing Python can catch).

So `fit_process()`, at the start of each command that reads runs (before numpy, pyarrow or
DuckDB load), reads the limits and, under an address-space limit, makes those libraries reserve
little (Arrow's system pool, one OpenBLAS thread, one malloc arena); below what a reader needs
(MIN_AS_BYTES, measured) it stops at once with one line saying the limit and what to do.
`duckdb_config()` sizes DuckDB (memory_limit, threads) to what is left. `message()` is the line
the CLI prints when memory runs out anyway: built here at start-up, so the error path allocates
nothing (cli/common.py writes its bytes).
"""
from __future__ import annotations

import os
import resource
import sys

MB = 1 << 20
# The smallest address-space limit under which `report`, `export`, `history add` and `merge`
# of a small run work, measured with `ulimit -v` (tests/hostile: the "memory" class) on
# x86-64 Linux, Python 3.11, pyarrow, DuckDB and numpy with OpenBLAS: export and merge ~300 MB,
# report ~450 MB, history add ~500 MB (its DuckDB file at DuckDB's defaults); with a margin:
# below it they are refused at start with one line.
# (COUNTERPROF_MIN_AS_MB lowers it for tests: the path where memory runs out anyway)
MIN_AS_BYTES = int(os.environ.get("COUNTERPROF_MIN_AS_MB") or 600) * MB
# DuckDB's memory_limit: this share of what the limits leave (DuckDB's own default is 80% of
# the machine's memory; its threads, Arrow and Python need the rest)
DUCKDB_SHARE = 0.5
SMALL_BYTES = 4096 * MB         # less left than this: DuckDB gets one thread

_message: bytes = b""           # the line for running out of memory, built by fit_process
_spill_dir: str | None = None   # DuckDB's temp_directory for this process (spill_dir)


def spill_dir() -> str:
    """A directory of this process's own under the system's temp directory where DuckDB spills
    (its default is ./.tmp: the user's working directory, maybe read-only or a checkout),
    removed at exit."""
    global _spill_dir
    if _spill_dir is None:
        import atexit
        import shutil
        import tempfile
        _spill_dir = tempfile.mkdtemp(prefix="counterprof-spill-")
        atexit.register(shutil.rmtree, _spill_dir, True)
    return _spill_dir


def address_limit() -> int | None:
    """RLIMIT_AS's soft limit in bytes (None: unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None      # "max": none


def cgroup_limit() -> tuple[int, int] | None:
    """(memory.max, memory.current) of this process's cgroup, the tightest of its own and its
    ancestors' (v2; v1's memory.limit_in_bytes and usage_in_bytes alike); None: no limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[tuple[int, int]] = []
    for line in lines:
        _id, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":                           # v2
            roots, limit_name, usage_name = (["/sys/fs/cgroup", "/sys/fs/cgroup/unified"],
                                             "memory.max", "memory.current")
        elif "memory" in controllers.split(","):       # v1
            roots, limit_name, usage_name = (["/sys/fs/cgroup/memory"], "memory.limit_in_bytes",
                                             "memory.usage_in_bytes")
        else:
            continue
        for root in roots:
            parts = [p for p in path.split("/") if p]
            # the cgroup's folder, then its ancestors (a namespace shows its own root only)
            for n in range(len(parts), -1, -1):
                d = "/".join([root, *parts[:n]])
                limit = _read_int(f"{d}/{limit_name}")
                if limit is not None and limit < (1 << 62):      # v1 writes ~2**63 for none
                    found.append((limit, _read_int(f"{d}/{usage_name}") or 0))
    return min(found, key=lambda lu: lu[0] - lu[1]) if found else None


def _vm_size() -> int:
    """This process's address space now (VmSize), in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def left() -> int | None:
    """Bytes this process may still take under its limits (None: no limit)."""
    room = []
    a = address_limit()
    if a is not None:
        room.append(a - _vm_size())
    c = cgroup_limit()
    if c is not None:
        room.append(c[0] - c[1])
    return max(0, min(room)) if room else None


def _describe() -> tuple[str, str]:
    """(the limit in words, what to do) for the messages."""
    a = address_limit()
    need_kb = MIN_AS_BYTES // 1024
    if a is not None and (cgroup_limit() is None or a <= cgroup_limit()[0]):   # type: ignore[index]
        limit = f"the address-space limit of {a // MB:,} MB (ulimit -v {a // 1024})"
        if a >= MIN_AS_BYTES:          # enough for a small run: this one needs more
            return limit, (f"this run needs more: raise it (ulimit -v {2 * (a // 1024)} doubles it), "
                           "or read the run where no such limit is set")
        return limit, (f"raise it to at least {MIN_AS_BYTES // MB:,} MB (ulimit -v {need_kb}) for a "
                       "small run, more for a large one")
    c = cgroup_limit()
    if c is not None:
        return (f"the cgroup's memory limit of {c[0] // MB:,} MB ({c[1] // MB:,} MB of it in use)",
                "raise the job's memory limit (memory.max), or run it where more is free")
    return ("", "")


class MemoryLimitTooSmall(Exception):
    """The process's limits leave less than a reader of a run needs: said before anything loads."""


def fit_process() -> None:
    """Size this process to its limits before numpy, pyarrow and DuckDB load (a command that
    reads runs; not one that launches a workload: the environment set here is inherited).
    Builds the out-of-memory line; raises MemoryLimitTooSmall (with the line to print) when
    the address-space limit is below what a reader needs."""
    global _message
    _message = _line()
    what, todo = _describe()
    map_large_blocks()
    a = address_limit()
    if a is None:
        return
    if a < MIN_AS_BYTES:
        raise MemoryLimitTooSmall(f"{what} is below the {MIN_AS_BYTES // MB:,} MB a reader of a run "
                                  f"needs: {todo}")
    # reserve little: what each of these does by default is sized for the machine, not the limit
    if "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")   # not mimalloc's reservations
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")             # not a buffer per core
    if "pyarrow" not in sys.modules:       # Arrow's thread pools: one CPU and one I/O thread
        os.environ.setdefault("OMP_THREAD_LIMIT", "1")
        os.environ.setdefault("ARROW_IO_THREADS", "1")
    try:                    # one malloc arena (each thread's is a 64 MB reservation otherwise)
        import ctypes
        ctypes.CDLL(None).mallopt(-8, 1)      # M_ARENA_MAX (glibc; elsewhere: no such symbol)
    except (OSError, AttributeError):
        pass


def map_large_blocks() -> None:
    """glibc's malloc: blocks of 1 MB and more mapped on their own, so a big array's memory
    goes back to the system when it is freed. By default glibc raises that threshold each time
    such a block is freed (up to 32 MB), after which big temporaries come from the heap, which
    seldom shrinks: the report of 1024 ranks x 1 h peaked ~190 MB higher for it
    (docs/PERFORMANCE.md)."""
    try:
        import ctypes
        ctypes.CDLL(None).mallopt(-3, 1 << 20)       # M_MMAP_THRESHOLD (glibc; elsewhere: no such symbol)
    except (OSError, AttributeError):
        pass


def release_freed() -> None:
    """Hand memory already freed back to the system (between the runs of a compare, each read
    whole): glibc keeps a freed heap for reuse, and the next run's peak would sit on top of it
    (~1.6 GB after a 1024-rank run, measured)."""
    try:
        import ctypes
        ctypes.CDLL(None).malloc_trim(0)             # glibc; elsewhere: no such symbol
    except (OSError, AttributeError):
        pass


def duckdb_config() -> dict[str, str | int]:
    """DuckDB's settings under this process's limits (none: DuckDB's own defaults): its
    memory_limit a share of what the limits leave, one thread when that is small; where it
    spills: spill_dir()."""
    room = left()
    if room is None:
        return {"temp_directory": spill_dir()}
    config: dict[str, str | int] = {"memory_limit": f"{max(64 * MB, int(room * DUCKDB_SHARE)) // MB}MB",
                                    "temp_directory": spill_dir()}
    if room < SMALL_BYTES:
        config["threads"] = 1
    return config


def message() -> bytes:
    """The out-of-memory line (built at start-up by fit_process; built now if it was not)."""
    global _message
    if not _message:
        _message = _line()
    return _message


def _line() -> bytes:
    what, todo = _describe()
    if not what:          # no limit: the machine's memory
        return (b"counterprof: out of memory: the run is larger than this machine can analyse, or "
                b"holds values no run can have (see the warnings above)\n")
    return f"counterprof: out of memory under {what}: {todo}\n".encode()


def is_out_of_memory(exc: BaseException) -> bool:
    """exc is memory running out: a MemoryError (Arrow's too), DuckDB's OutOfMemoryException,
    an ImportError of a shared object the loader could not map, an OSError ENOMEM."""
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    if name == "OutOfMemoryException":          # duckdb's, not imported here
        return True
    if isinstance(exc, ImportError):
        text = str(exc)
        return ("failed to map segment" in text or "cannot allocate memory" in text.lower()
                or "cannot map zero-fill pages" in text)
    if isinstance(exc, OSError):
        import errno
        return exc.errno == errno.ENOMEM
    return False
