"""The run directory on disk: its creation, meta.json, catalog.json and partitions.

<run>/meta.json                               the run, its command, host, each collector's status
<run>/catalog.json                            every metric: name, unit, kind, description, source
<run>/samples/rank=<r>/samples-<writer>.parquet   one dataset per table, hive-partitioned by rank
<run>/spans/rank=<r>/spans-<writer>.parquet
<run>/_ranks/rank=<r>/                        each rank's own files (rank_dir):
    journal/       Arrow IPC stream segments not yet compacted
    traces/        torch's Kineto traces
    meta.json, catalog.json   those of a process that joined another's run

Each table is its own dataset, so any reader opens it in one line (pyarrow.dataset(run/samples,
partitioning="hive"), DuckDB, Polars, Spark). A rank's own files stay in one folder (a joined
rank owns it, merge copies it, replace removes it), under a name dataset readers skip: they
skip names starting with "_" or "." (Spark keeps "_" names holding "=", hence not "_rank=<r>").
Files being written in a dataset folder are named ".<name>.tmp" for the same reason.

Runs of the older layout (<run>/rank=<r>/ holding the Parquet files, journal/ and traces/ of the
rank) are data someone kept: rank_dirs, table_dir and table_files find their files too.

Run directories are readable by their owner only: command lines can hold secrets.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import fcntl
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ..errors import RunDirectoryError

META = "meta.json"
CATALOG = "catalog.json"
JOURNAL = "journal"
TRACES = "traces"
RANKS = "_ranks"
TABLE_NAMES = ("samples", "spans")
_RANK_DIR = re.compile(r"^rank=(\d+)$")


class Words(NamedTuple):
    """How a refusal tells the caller what to do, in the caller's own terms."""
    other: str          # choosing another directory
    replace: str        # replacing the run in it


CLI_WORDS = Words("choose another -o", "pass --force")                    # counterprof run/import/merge
API_WORDS = Words("pass another path=", "pass replace=True")              # counterprof.profile()


def default_run_path(parent: str | os.PathLike = ".") -> Path:
    """A new timestamped directory name in `parent` that does not exist yet."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(parent) / f"counterprof-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    return path


def create(path: str | os.PathLike, *, replace: bool = False, allow: tuple[str, ...] = (),
           words: Words = CLI_WORDS) -> Path:
    """Create a run directory (mode 0700). Refuses a directory that already holds a run.
    allow: names a just-claimed directory may already hold. words: the caller's terms for what
    to do instead (CLI_WORDS, API_WORDS)."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise RunDirectoryError(f"{path} exists and is not a directory; {words.other}")
        if (path / META).exists() and not replace:
            raise RunDirectoryError(already_holds_a_run(path, words))
        if any(p.name not in allow + (CLAIM_LOCK,) for p in path.iterdir()) and not (path / META).exists():
            raise RunDirectoryError(
                f"{path} is not empty and is not a run directory; {words.other}")
        if replace:
            _clear_run(path)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise RunDirectoryError(f"cannot create run directory {path}: {exc.strerror}") from exc
    return path


JOB = ".job"           # the job that owns the run: its other processes join instead of refusing


def already_holds_a_run(path: str | os.PathLike, words: Words = CLI_WORDS) -> str:
    return f"{path} already holds a run; {words.other}, or {words.replace} to replace it"


def claim(path: str | os.PathLike, *, replace: bool = False, job: str | None = None,
          words: Words = CLI_WORDS,
          on_create: Callable[[Path], None] | None = None) -> tuple[Path, bool]:
    """Create a run directory, or join it: (path, joined). With a job id, the first process of
    the job to get here creates the run; the job's other processes (the other ranks of a
    torchrun job, each in its own counterprof.profile()) join it and write their own partition.
    Simultaneous starts agree on who created it through a lock file; a finished run of another
    job is replaced with replace=True, refused otherwise. on_create(path) runs in the creator
    before any joiner is let in: it writes the run's first meta.json, so a joiner never sees a
    claimed directory that is not yet a run."""
    path = Path(path)
    if job is None:
        path = create(path, replace=replace, words=words)
        if on_create is not None:
            on_create(path)
        return path, False
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(path / CLAIM_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise RunDirectoryError(f"cannot create run directory {path}: {exc.strerror}") from exc
    # One process at a time decides: the creator checks (with replace, clears) the directory and
    # writes the job id before the next one looks, so a joiner never writes into a directory
    # that is still being checked, and a refused creator leaves nothing for the others to join.
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        owner = _read_owner(path)
        if owner == job:
            return path, True
        if owner is not None:
            if not (replace and _finished(path)):
                raise RunDirectoryError(
                    f"{path} already holds a run of another job ({owner or 'unknown'}); "
                    f"{words.other}, or set COUNTERPROF_JOB alike in every process of one job"
                    + (f", or {words.replace} to replace it" if _finished(path) else ""))
            (path / JOB).unlink()                 # replacing a finished run of another job
        create(path, replace=replace, allow=(JOB,), words=words)
        write_text = path / (JOB + ".tmp")
        write_text.write_text(job + "\n")
        os.replace(write_text, path / JOB)
        if on_create is not None:
            on_create(path)
        return path, False
    finally:
        os.close(lock)


CLAIM_LOCK = ".claim.lock"


def _read_owner(path: Path) -> str | None:
    try:
        return (path / JOB).read_text().strip()
    except FileNotFoundError:
        return None


def _finished(path: Path) -> bool:
    """The run in path is no longer being written (its profiler finished or is gone)."""
    from .meta import read_meta
    from .recover import writer_alive
    try:
        meta = read_meta(path / META)
    except RunDirectoryError:
        return False
    return not writer_alive(meta) and all(
        not writer_alive(read_meta(d / META)) for _r, d in rank_dirs(path) if (d / META).exists())


def _clear_run(path: Path) -> None:
    """Remove what an earlier run left: only files counterprof writes."""
    for child in path.iterdir():
        if child.name in (META, CATALOG, JOB) or child.name.endswith(".tmp"):
            child.unlink()
        elif child.is_dir() and (_RANK_DIR.match(child.name) or child.name in (RANKS, *TABLE_NAMES)):
            for f in sorted(child.rglob("*"), reverse=True):
                f.rmdir() if f.is_dir() else f.unlink()
            child.rmdir()


def rank_name(rank: int) -> str:
    return f"rank={rank}"


def make_dirs(path: Path) -> Path:
    """path and its missing parents (inside the run), each readable by the owner only."""
    path = Path(path)
    if not path.is_dir():
        make_dirs(path.parent)
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def rank_dir(run: Path, rank: int) -> Path:
    """The folder of a rank's own files (journal, traces, a joined rank's meta), created."""
    return make_dirs(Path(run) / RANKS / rank_name(rank))


def traces_dir(run: Path, rank: int) -> Path:
    """Where the workload's torch writes a rank's traces (the torch driver, which cannot import
    counterprof, builds the same path)."""
    return rank_dir(run, rank) / TRACES


def _ranked(parent: Path) -> list[tuple[int, Path]]:
    out = []
    if parent.is_dir():
        for child in parent.iterdir():
            m = _RANK_DIR.match(child.name)
            if m and child.is_dir():
                out.append((int(m.group(1)), child))
    return out


def rank_dirs(run: Path) -> list[tuple[int, Path]]:
    """(rank, folder of its own files) for every rank that has one, in either layout."""
    found = dict(_ranked(Path(run)))                  # the older layout
    found.update(_ranked(Path(run) / RANKS))
    return sorted(found.items())


def trace_globs(*patterns: str) -> list[str]:
    """Globs, relative to the run, of the files matching patterns in every rank's traces/."""
    return [f"{prefix}rank=*/{TRACES}/{p}" for prefix in (RANKS + "/", "") for p in patterns]


def table_dir(rank_path: Path, table: str) -> Path:
    """Where the Parquet files of table go for the rank whose own folder is rank_path: the
    table's dataset (<run>/<table>/rank=<r>), or rank_path itself in a run of the older layout.
    Not created."""
    rank_path = Path(rank_path)
    if rank_path.parent.name == RANKS:
        return rank_path.parent.parent / table / rank_path.name
    return rank_path


def dataset_dir(run: Path, table: str, rank: int) -> Path:
    """<run>/<table>/rank=<r>, created: where a rank's Parquet files of table go."""
    return make_dirs(Path(run) / table / rank_name(rank))


def table_files(run: Path, table: str, rank: int | None = None) -> list[tuple[int, Path]]:
    """(rank, Parquet file) of one table, every rank or one, in either layout."""
    run = Path(run)
    dirs = _ranked(run / table) + [(r, table_dir(d, table)) for r, d in _ranked(run)]
    return sorted((r, f) for r, d in dirs if rank is None or r == rank
                  for f in d.glob(f"{table}-*.parquet"))


def ranks(run: Path) -> list[int]:
    """Every rank with files in the run: its own folder, or a table's partition."""
    found = {r for r, _ in rank_dirs(run)}
    for table in TABLE_NAMES:
        found.update(r for r, _ in _ranked(Path(run) / table))
    return sorted(found)


def write_json(path: Path, data: Any) -> None:
    """Atomic replace: a reader, or a profiler killed mid-write, never sees half a file."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


def is_run(path: str | os.PathLike) -> bool:
    return (Path(path) / META).is_file()
