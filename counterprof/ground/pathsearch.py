"""Finding a command on PATH, as a shell does, without importing shutil: shutil loads bz2,
lzma and zlib to learn its archive formats, ~2.5 ms of every `counterprof run`'s start-up."""
from __future__ import annotations

import os
import stat


def which(name: str, path: str | None = None) -> str | None:
    """The first executable regular file `name` on PATH (shutil.which's answer on POSIX): a name
    with a slash is checked as given; an empty PATH finds nothing, an empty entry in one is the
    current directory (answered as ./name, where shutil says name)."""
    if os.sep in name:
        return name if _executable(name) else None
    search = os.environ.get("PATH", os.defpath) if path is None else path
    if not search:
        return None
    for folder in search.split(os.pathsep):
        candidate = os.path.join(folder or os.curdir, name)
        if _executable(candidate):
            return candidate
    return None


def _executable(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(mode) and os.access(path, os.X_OK)
