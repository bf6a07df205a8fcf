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
import errno
import json
import os
import fcntl
import re
from pathlib import Path
from typing import Any, NamedTuple
from collections.abc import Callable

from ..ground.errors import RunDirectoryError
from . import safepath
from .liveness import claimer_alive, profiler_alive
from .meta import load_json, read_meta

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


def default_run_path(parent: str | os.PathLike[str] = ".") -> Path:
    """A new timestamped directory name in `parent` that does not exist yet."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(parent) / f"counterprof-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    return path


def create(path: str | os.PathLike[str], *, replace: bool = False, allow: tuple[str, ...] = (),
           words: Words = CLI_WORDS, locked: bool = False) -> Path:
    """Create a run directory (mode 0700) and claim it: counterprof's marker file is created in
    it exclusively, so of two processes creating one run at once exactly one wins. Refuses a
    directory that already holds a run (replace=True replaces a finished one) and any directory
    counterprof did not make (a meta.json alone does not make a run). allow: names a
    just-claimed directory may already hold. words: the caller's terms for what to do instead
    (CLI_WORDS, API_WORDS). locked: the caller holds the directory's claim lock (claim())."""
    path = Path(path)
    if not locked:
        with _claim_lock(path, words):
            return create(path, replace=replace, allow=allow, words=words, locked=True)
    names = set(os.listdir(path))
    kind = _kind(path, names, allow)
    if kind in ("run", "older run"):
        if not replace:
            raise RunDirectoryError(already_holds_a_run(path, words))
        if not _finished(path):
            raise RunDirectoryError(f"{path} holds a run that counterprof is still writing; stop "
                                    f"it first, or {words.other}")
        _clear_run(path, names)
    elif kind == "foreign meta":
        raise RunDirectoryError(
            f"{path} holds a {META} that counterprof did not write (no {MARKER} marker, no "
            f"counterprof_version): it is not a run, and counterprof replaces only its own runs; "
            f"{words.other}")
    elif kind == "foreign":
        raise RunDirectoryError(f"{path} is not empty and is not a run directory; {words.other}")
    _write_marker(path, words)
    return path


JOB = ".job"           # the job that owns the run: its other processes join instead of refusing
MARKER = ".counterprof"   # written at claim time: what makes a directory a counterprof run
RESERVE = ".reserve"      # space a session keeps for its last meta.json (a full disk)
MARKER_FORMAT = "counterprof-run/1"


def already_holds_a_run(path: str | os.PathLike[str], words: Words = CLI_WORDS) -> str:
    gone = _killed_claimer(Path(path))
    if gone is not None:
        return (f"{path} holds what a counterprof process left when it was killed before writing "
                f"its {META} (pid {gone} is gone): {words.replace} to replace it, or {words.other}")
    return f"{path} already holds a run; {words.other}, or {words.replace} to replace it"


def _killed_claimer(path: Path) -> int | None:
    """The pid that claimed this run (its marker), when the run has no meta.json and that
    process is gone from this host: an import or a start killed mid-way. None otherwise (a run
    being written, another host's, or a marker that cannot be read)."""
    if safepath.plain_file(path / META, report=False):
        return None
    by = _marker_creator(path)
    pid = by.get("pid") if by is not None else None
    if by is None or not isinstance(pid, int) or pid == os.getpid() or claimer_alive(by):
        return None
    return pid


class _claim_lock:
    """The directory made (0700) and held under an flock on its own descriptor while one
    process decides whether it may create the run in it: no file of ours is left in a directory
    we refuse."""

    def __init__(self, path: Path, words: Words):
        self.path, self.words = path, words

    def __enter__(self) -> int:
        path = self.path
        if path.exists() and not path.is_dir():
            raise RunDirectoryError(f"{path} exists and is not a directory; {self.words.other}")
        try:
            existed = path.is_dir()
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not existed:
                os.chmod(path, 0o700)
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise RunDirectoryError(f"cannot create run directory {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            # a filesystem that locks only files open for writing (NFS emulates flock with
            # byte-range locks): the lock file of earlier versions
            os.close(self.fd)
            self.fd = safepath.open_lock(path / CLAIM_LOCK)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)       # releases the lock


def claim(path: str | os.PathLike[str], *, replace: bool = False, job: str | None = None,
          words: Words = CLI_WORDS,
          on_create: Callable[[Path], None] | None = None) -> tuple[Path, bool]:
    """Create a run directory, or join it: (path, joined). With a job id, the first process of
    the job to get here creates the run; the job's other processes (the other ranks of a
    torchrun job, each in its own counterprof.profile()) join it and write their own partition.
    Simultaneous starts agree on who created it through the directory's lock; a finished run of
    another job is replaced with replace=True, refused otherwise. on_create(path) runs in the
    creator before any joiner (or a second creator) is let in: it writes the run's first
    meta.json, so nobody sees a claimed directory that is not yet a run."""
    path = Path(path)
    # One process at a time decides: the creator checks (with replace, clears) the directory and
    # writes the job id before the next one looks, so a joiner never writes into a directory
    # that is still being checked, and a refused creator leaves nothing for the others to join.
    with _claim_lock(path, words):
        if job is None:
            create(path, replace=replace, words=words, locked=True)
            if on_create is not None:
                on_create(path)
            return path, False
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
        create(path, replace=replace, allow=(JOB,), words=words, locked=True)
        tmp = path / (JOB + f".{os.getpid()}.tmp")
        safepath.unlink_in_run(tmp)
        with os.fdopen(safepath.create_new(tmp), "w") as f:
            f.write(job + "\n")
        os.replace(tmp, path / JOB)
        if on_create is not None:
            on_create(path)
        return path, False


def remove_run(path: Path, words: Words = CLI_WORDS) -> None:
    """Delete a finished run of counterprof's own, whole (a run set's member, replaced with
    the set): refused, with nothing deleted, for anything else, a run still being written, or
    a run holding a link."""
    path = Path(path)
    if not safepath.plain_dir(path, report=False):
        raise safepath.LinkInRun(path, "nothing was replaced") if safepath.is_link(path) else \
            RunDirectoryError(f"{path} is not a directory; {words.other}")
    with _claim_lock(path, words):
        names = set(os.listdir(path))
        if _kind(path, names, ()) not in ("run", "older run"):
            raise RunDirectoryError(f"{path} is not a counterprof run, so it is not replaced; {words.other}")
        if not _finished(path):
            raise RunDirectoryError(f"{path} holds a run that counterprof is still writing; stop "
                                    f"it first, or {words.other}")
        _clear_run(path, names)
    try:
        os.rmdir(path)           # what is left in it (not counterprof's) stays, and so does it
    except OSError:
        pass


def abandon(path: Path) -> None:
    """Undo a claim that never became a run: the directory this process created and claimed is
    removed when it holds nothing but the marker (anything else in it is left as it is)."""
    path = Path(path)
    try:
        if set(os.listdir(path)) == {MARKER}:
            os.unlink(path / MARKER)
            os.rmdir(path)
    except OSError:
        pass


CLAIM_LOCK = ".claim.lock"     # the lock file of earlier versions (the directory is locked now)


def _kind(path: Path, names: set[str], allow: tuple[str, ...]) -> str:
    """What a directory holds: "run" (counterprof's marker), "older run" (a meta.json of
    counterprof from before the marker), "foreign meta", "foreign" or "empty"."""
    if MARKER in names:
        return "run" if _marker_ok(path) else "foreign"
    if META in names:
        try:
            meta = load_json(path / META)
        except RunDirectoryError:
            return "foreign meta"
        return "older run" if isinstance(meta, dict) and "counterprof_version" in meta else "foreign meta"
    if names - set(allow) - {CLAIM_LOCK}:
        return "foreign"
    return "empty"


def _marker_ok(path: Path) -> bool:
    try:
        fd = safepath.open_read(path / MARKER)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        head = f.read(4096)
    try:
        data = json.loads(head)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("format") == MARKER_FORMAT


def _write_marker(path: Path, words: Words) -> None:
    """Created exclusively: a marker already there means another process claimed the run."""
    from socket import gethostname
    try:
        fd = safepath.create_new(path / MARKER)
    except FileExistsError:
        raise RunDirectoryError(already_holds_a_run(path, words)) from None
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": MARKER_FORMAT, "created_by": {"pid": os.getpid(), "host": gethostname()}}, f)
            f.write("\n")
    except OSError as exc:         # a full disk: no half-written marker makes the directory a run
        safepath.unlink_in_run(path / MARKER)
        from ..ground.errors import os_error
        raise os_error(exc, path, "creating the run directory") from None


def _read_owner(path: Path) -> str | None:
    try:
        fd = safepath.open_read(path / JOB)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        return f.read().strip()


def _finished(path: Path) -> bool:
    """The run in path is no longer being written (its profiler finished or is gone)."""
    if not (path / META).exists():
        return not _marker_creator_alive(path)    # claimed, first meta never written
    try:
        meta = read_meta(path / META)
    except RunDirectoryError:
        return False
    return not profiler_alive(meta) and all(
        not profiler_alive(read_meta(d / META)) for _r, d in rank_dirs(path)
        if safepath.plain_file(d / META))


def _marker_creator(path: Path) -> dict[str, Any] | None:
    """The marker's created_by (pid, host); None when the marker cannot be read."""
    try:
        with os.fdopen(safepath.open_read(path / MARKER), "rb") as f:
            by = json.loads(f.read(4096)).get("created_by") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return by if isinstance(by, dict) else None


def _marker_creator_alive(path: Path) -> bool:
    by = _marker_creator(path)
    return by is not None and claimer_alive(by)


_CLEARED_DIRS = (RANKS, *TABLE_NAMES, ".ranks")


def _clear_run(path: Path, names: set[str]) -> None:
    """Remove what an earlier run left: only names counterprof writes, and nothing at all when
    any of them is or holds a symbolic link (counterprof never writes one: what it points at is
    not ours, and deleting the link would hide that from the user)."""
    doomed = sorted(n for n in names if n in (META, CATALOG, JOB, MARKER, RESERVE)
                    or (n.endswith(".tmp") and not os.path.isdir(path / n))
                    or ((_RANK_DIR.match(n) or n in _CLEARED_DIRS) and os.path.isdir(path / n)))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        links = [link for n in doomed for link in safepath.links_below(fd, n)]
        if links:
            shown = ", ".join(str(path / link) for link in links[:3])
            more = f" and {len(links) - 3} more" if len(links) > 3 else ""
            raise RunDirectoryError(
                f"{path} holds symbolic links ({shown}{more}), which counterprof never writes: "
                "nothing was replaced (what they point at is not the run's); remove them, or "
                "choose another directory")
        for n in doomed:
            safepath.remove_tree_at(fd, n)
    finally:
        os.close(fd)


def rank_name(rank: int | str) -> str:
    """The name of a rank's folder, rank=<r> (the hive partition's; "*" for a glob)."""
    return f"rank={rank}"


def rank_of_dir(folder: Path) -> int:
    """The rank a rank=<r> folder (rank_name) is of."""
    return int(Path(folder).name.split("=", 1)[1])


def make_dirs(path: Path, run: Path) -> Path:
    """path and its missing parents inside the run (run: its root), each readable by the owner
    only; a symbolic link on the way is refused."""
    return safepath.make_dirs(Path(run), Path(path))


def run_of_rank(rank_path: Path) -> Path:
    """The run a rank's own folder belongs to (<run>/_ranks/rank=<r>, or <run>/rank=<r> in a
    run of the older layout)."""
    rank_path = Path(rank_path)
    return rank_path.parent.parent if rank_path.parent.name == RANKS else rank_path.parent


def rank_dir(run: Path, rank: int) -> Path:
    """The folder of a rank's own files (journal, traces, a joined rank's meta), created."""
    return make_dirs(Path(run) / RANKS / rank_name(rank), Path(run))


def traces_dir(run: Path, rank: int) -> Path:
    """Where the workload's torch writes a rank's traces (the torch driver, which cannot import
    counterprof, builds the same path)."""
    return rank_dir(run, rank) / TRACES


def _ranked(parent: Path) -> list[tuple[int, Path]]:
    """(rank, folder) of parent's rank=<r> folders; links are skipped and named (safepath)."""
    out = []
    for child in safepath.subdirs(parent):
        m = _RANK_DIR.match(child.name)
        if m:
            out.append((int(m.group(1)), child))
    return out


def rank_dirs(run: Path) -> list[tuple[int, Path]]:
    """(rank, folder of its own files) for every rank that has one, in either layout."""
    found = dict(_ranked(Path(run)))                  # the older layout
    found.update(_ranked(Path(run) / RANKS))
    return sorted(found.items())


def trace_files(run: Path, *patterns: str, rank: int | None = None) -> list[Path]:
    """The regular files matching patterns in every rank's traces/ (either layout), found
    without following a link."""
    from fnmatch import fnmatch
    return sorted(f for r, d in rank_dirs(Path(run)) if rank is None or r == rank
                  for f in safepath.files(d / TRACES) if any(fnmatch(f.name, p) for p in patterns))


def parquet_files(folder: Path, table: str) -> list[Path]:
    """The Parquet files of table in one partition folder (links skipped and named)."""
    return sorted(f for f in safepath.files(folder)
                  if f.name.startswith(f"{table}-") and f.name.endswith(".parquet"))


def trace_globs(*patterns: str) -> list[str]:
    """Globs, relative to the run, of the files matching patterns in every rank's traces/."""
    return [f"{prefix}{rank_name('*')}/{TRACES}/{p}" for prefix in (RANKS + "/", "") for p in patterns]


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
    return make_dirs(Path(run) / table / rank_name(rank), Path(run))


def table_files(run: Path, table: str, rank: int | None = None) -> list[tuple[int, Path]]:
    """(rank, Parquet file) of one table, every rank or one, in either layout."""
    run = Path(run)
    dirs = _ranked(run / table) + [(r, table_dir(d, table)) for r, d in _ranked(run)]
    return sorted((r, f) for r, d in dirs if rank is None or r == rank
                  for f in parquet_files(d, table))


def ranks(run: Path) -> list[int]:
    """Every rank with files in the run: its own folder, or a table's partition."""
    found = {r for r, _ in rank_dirs(run)}
    for table in TABLE_NAMES:
        found.update(r for r, _ in _ranked(Path(run) / table))
    return sorted(found)


def write_json(path: Path, data: Any) -> None:
    """Atomic replace: a reader, or a profiler killed mid-write, never sees half a file."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    safepath.unlink_in_run(tmp)         # one a killed process of this pid left (or a planted link)
    text = json.dumps(data, indent=2, default=str) + "\n"   # one write, not one per token
    with os.fdopen(safepath.create_new(tmp), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def is_run(path: str | os.PathLike[str]) -> bool:
    """A directory holding a meta.json of its own (not a link): a run to read. Runs from before
    counterprof's marker (MARKER) have none, and are read as runs all the same."""
    return safepath.plain_file(Path(path) / META, report=False)
