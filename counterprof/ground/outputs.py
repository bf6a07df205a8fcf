"""The modes of the files counterprof writes for its user.

A run directory is private (0700, its files 0600: it holds command lines and data; see
store/safepath.py), and so is what a subcommand creates on its own behalf (DuckDB's history
file). A file the user names on the command line (`report --html FILE`, `export --perfetto
FILE`, `correlate --csv FILE`, ...) is the user's output, like `perf -o` or `cp`'s: created with
the mode the user's umask gives (0644 under umask 022); an existing file keeps the mode its owner
gave it. Secrets in command lines are redacted before any such file is written
(ground/redact.py).

The subcommands that launch nothing set a private umask at start (cli.private_umask) so that
everything else they create is owner-only; the user's umask is kept here for their outputs.
"""
from __future__ import annotations

import os

_USER_UMASK: int | None = None


def private_umask() -> None:
    """Files and folders this process creates are its owner's only from now on; the umask
    before is kept for the outputs the user names (user_opener)."""
    global _USER_UMASK
    before = os.umask(0o077)
    if _USER_UMASK is None:
        _USER_UMASK = before
    os.umask(before | 0o077)


def user_umask() -> int:
    """The umask the user started counterprof with."""
    if _USER_UMASK is not None:
        return _USER_UMASK
    current = os.umask(0o077)
    os.umask(current)
    return current


def user_opener(path: str, flags: int) -> int:
    """open()'s opener for an output file the user named: created with the user's umask
    (0666 & ~umask), as cp and perf -o create theirs; an existing file keeps its mode."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return os.open(path, flags | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o666 & ~user_umask())
    except OSError:
        pass
    return fd
