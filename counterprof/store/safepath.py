"""Paths inside a run directory, never through a symbolic link.

A run directory is a trust boundary: it may come from another user, another host or a tarball,
and counterprof itself never writes a link into one. So every path counterprof lists, opens,
writes or deletes below a run's root is taken without following a link: folders and files are
looked at with lstat as the run is walked down from its root (each level checked before the
next is entered), files are opened with O_NOFOLLOW, and what is created or deleted is created
exclusively (O_EXCL) or deleted relative to a folder's descriptor (shutil.rmtree's dir_fd walk,
which never follows a link). The run's own path, the one the user named, may be a link: that is
the user's choice; what lies below it is the run's content.

A reader that finds a link skips it and names it (`skipped_link`, once per path, to the sink the
CLI installs: a warning line); a writer or a deleter refuses with LinkInRun.
"""
from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable

from ..ground.errors import RunDirectoryError

TYPE_CHECKING = False     # (typing.TYPE_CHECKING without importing typing: ~2 ms)
if TYPE_CHECKING:
    from pathlib import Path
# pathlib (with urllib.parse, ~3 ms) loads where a Path is made: `counterprof import` reaches
# this module (the CLI's guarded) before it starts scanning its first trace

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE = 0o600          # every file counterprof writes: command lines and data are the owner's
DIR_MODE = 0o700


class LinkInRun(RunDirectoryError):
    """A symbolic link where counterprof expects a file or folder of its own."""

    def __init__(self, path: str | os.PathLike[str], doing: str = "not followed"):
        from pathlib import Path
        self.path = Path(path)
        super().__init__(f"{path} is a symbolic link, which counterprof never writes into a run: "
                         f"{doing}; remove the link (or move the run's real files in its place)")


def _lmode(path: str | os.PathLike[str]) -> int | None:
    try:
        return os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None


def is_link(path: str | os.PathLike[str]) -> bool:
    mode = _lmode(path)
    return mode is not None and stat.S_ISLNK(mode)


def plain_dir(path: str | os.PathLike[str], *, report: bool = True) -> bool:
    """path is a folder itself (not a link to one). A link is named (skipped_link) unless
    report=False."""
    mode = _lmode(path)
    if mode is not None and stat.S_ISLNK(mode) and report:
        skipped_link(path)
    return mode is not None and stat.S_ISDIR(mode)


def plain_file(path: str | os.PathLike[str], *, report: bool = True) -> bool:
    """path is a regular file itself (not a link to one)."""
    mode = _lmode(path)
    if mode is not None and stat.S_ISLNK(mode) and report:
        skipped_link(path)
    return mode is not None and stat.S_ISREG(mode)


def children(folder: str | os.PathLike[str]) -> list[Path]:
    """The entries of a folder of the run, links left out and named; [] when folder is not a
    folder itself (missing, or a link: named)."""
    from pathlib import Path
    folder = Path(folder)
    if not plain_dir(folder):
        return []
    out = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for e in entries:
        if e.is_symlink():
            skipped_link(folder / e.name)
        else:
            out.append(folder / e.name)
    return out


def subdirs(folder: str | os.PathLike[str]) -> list[Path]:
    return [p for p in children(folder) if plain_dir(p, report=False)]


def files(folder: str | os.PathLike[str]) -> list[Path]:
    return [p for p in children(folder) if plain_file(p, report=False)]


def check_below(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Raise LinkInRun when any component of path below root (root itself excluded) is a link."""
    from pathlib import Path
    root, path = Path(root), Path(path)
    cur = root
    for part in path.relative_to(root).parts:
        cur = cur / part
        if is_link(cur):
            raise LinkInRun(cur, "refused")


def make_dirs(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """path and its missing parents below root, each 0700; a link on the way is refused."""
    from pathlib import Path
    root, path = Path(root), Path(path)
    cur = root
    for part in path.relative_to(root).parts:
        cur = cur / part
        mode = _lmode(cur)
        if mode is None:
            try:
                os.mkdir(cur, DIR_MODE)
            except FileExistsError:
                mode = _lmode(cur)
            else:
                continue
        if mode is not None and stat.S_ISLNK(mode):
            raise LinkInRun(cur, "nothing was written through it")
        if mode is not None and not stat.S_ISDIR(mode):
            raise RunDirectoryError(f"{cur} is not a directory; counterprof expected one of its own")
    return path


def _open(path: str | os.PathLike[str], flags: int, doing: str) -> int:
    try:
        return os.open(path, flags, FILE_MODE)
    except OSError:        # ELOOP (a link at the name) or EEXIST (O_EXCL met one)
        if is_link(path):
            raise LinkInRun(path, doing) from None
        raise


def open_read(path: str | os.PathLike[str]) -> int:
    """A descriptor of a file of the run, opened for reading without following a link."""
    return _open(path, READ_FLAGS, "not read through it")


def open_lock(path: str | os.PathLike[str]) -> int:
    """A lock file of the run (created 0600 if missing), never through a link."""
    return _open(path, LOCK_FLAGS, "not locked through it")


def create_new(path: str | os.PathLike[str]) -> int:
    """A new file, 0600, that did not exist (O_EXCL: a link planted at its name is never
    written through)."""
    return _open(path, NEW_FILE_FLAGS, "nothing was written through it")


def create_mapped(path: str | os.PathLike[str]) -> int:
    """A new file, 0600, opened to read and write (a shared mapping needs both), that did not
    exist (a link planted at its name is never written through)."""
    return _open(path, (NEW_FILE_FLAGS & ~os.O_WRONLY) | os.O_RDWR, "nothing was written through it")


def create_private(path: str | os.PathLike[str]) -> None:
    """Create path empty and 0600 (exclusively), for a writer that opens it by name next
    (pyarrow's file and Parquet writers): the file is ours and private before a byte is in it."""
    os.close(create_new(path))


def unlink_in_run(path: str | os.PathLike[str]) -> None:
    """Remove one file of the run (a link is removed itself, never what it points at)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def links_below(folder_fd: int, name: str) -> list[str]:
    """Every link in the tree `name` (relative to folder_fd), walked without following any."""
    mode = os.lstat(name, dir_fd=folder_fd).st_mode
    if stat.S_ISLNK(mode):
        return [name]
    if not stat.S_ISDIR(mode):
        return []
    found = []
    for top, dirs, fnames, top_fd in os.fwalk(name, dir_fd=folder_fd, follow_symlinks=False):
        for n in dirs + fnames:
            if stat.S_ISLNK(os.lstat(n, dir_fd=top_fd).st_mode):
                found.append(os.path.join(top, n))
    return found


def remove_tree_at(folder_fd: int, name: str) -> None:
    """Delete the file or tree `name` relative to folder_fd, never through a link (the caller
    checked links_below first)."""
    import shutil
    mode = os.lstat(name, dir_fd=folder_fd).st_mode
    if stat.S_ISDIR(mode) and sys.version_info >= (3, 11):
        shutil.rmtree(name, dir_fd=folder_fd)
    elif stat.S_ISDIR(mode):      # 3.10's rmtree has no dir_fd: the same walk by descriptor
        for _top, dirs, fnames, top_fd in os.fwalk(name, topdown=False, dir_fd=folder_fd,
                                                   follow_symlinks=False):
            for n in fnames:
                os.unlink(n, dir_fd=top_fd)
            for n in dirs:
                os.rmdir(n, dir_fd=top_fd)
        os.rmdir(name, dir_fd=folder_fd)
    else:
        os.unlink(name, dir_fd=folder_fd)


# -- naming what was skipped ------------------------------------------------------------------

_seen: set[str] = set()
_sink: Callable[[str], None] | None = None
skipped: list[str] = []          # every message, for callers with no sink (the Python API)


def set_sink(sink: Callable[[str], None] | None) -> None:
    """Where the names of skipped links go (the CLI: a warning line on stderr)."""
    global _sink
    _sink = sink


def skipped_link(path: str | os.PathLike[str]) -> None:
    skipped_file(path, f"{path} is a symbolic link, which counterprof never writes into a run: "
                       "skipped (not read, not copied, not deleted)")


def skipped_file(path: str | os.PathLike[str], msg: str) -> None:
    """Name a file of the run that readers leave out (a link; a Parquet file in the wrong
    table's folder, store/run_files.py), once per path, to the sink."""
    key = str(path)
    if key in _seen:
        return
    _seen.add(key)
    skipped.append(msg)
    if _sink is not None:
        _sink(msg)
