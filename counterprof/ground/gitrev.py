"""The git revision a run was made from, read at the run's start from the checkout's files
(no `git` process: start-up stays cheap and git need not be installed). `counterprof history`
records it, so backfilling old runs keeps the revision each one ran.

Follows what git itself reads: `.git` as a directory, or as a file `gitdir: PATH` (worktrees,
submodules); HEAD as `ref: refs/heads/X` or a detached hash; the ref as a loose file under the
common dir (`commondir` for worktrees), else a line of `packed-refs`.
"""
from __future__ import annotations

import re
from pathlib import Path

_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")   # sha1, or sha256 repositories


def _git_dir(start: Path) -> Path | None:
    for d in (start, *start.parents):
        dot = d / ".git"
        if dot.is_dir():
            return dot
        if dot.is_file():
            text = dot.read_text(errors="replace").strip()
            if text.startswith("gitdir:"):
                p = Path(text[7:].strip())
                return p if p.is_absolute() else (d / p).resolve()
            return None
    return None


def git_revision(cwd: str | Path) -> str | None:
    """HEAD's commit hash for the checkout holding cwd; None outside one or when unreadable."""
    try:
        gd = _git_dir(Path(cwd).resolve())
        if gd is None:
            return None
        head = (gd / "HEAD").read_text().strip()
        if _SHA.match(head):
            return head
        if not head.startswith("ref:"):
            return None
        ref = head[4:].strip()
        common = gd
        if (gd / "commondir").is_file():
            c = Path((gd / "commondir").read_text().strip())
            common = c if c.is_absolute() else (gd / c).resolve()
        for base in (gd, common):
            loose = base / ref
            if loose.is_file():
                sha = loose.read_text().strip()
                return sha if _SHA.match(sha) else None
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref and _SHA.match(parts[0]):
                    return parts[0]
    except OSError:
        return None
    return None
