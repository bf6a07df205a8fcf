"""A run's control channel: `counterprof trace` asks the drivers inside a running job for a
window now, and each answers (the driver's side: collectors/torch_trace/bootstrap).

<run>/_control/drivers/<host>_<pid>.json     a Python process of the job with a driver: pid, host, rank
<run>/_control/trace/<id>.json               an ask: id, steps or ms, start_step, asked_ns, by
<run>/_control/answers/<id>/<host>_<pid>.json   a process's answer: status (traced, not reached),
                                             steps [first, last] or ms, file, bytes, why

Files are written whole (renamed into place), 0600 in 0700 folders, never through a link; the
folder starts with "_", so dataset readers skip it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CONTROL = "_control"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            doc = json.loads(os.read(fd, 1 << 20))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _docs(folder: Path) -> list[dict[str, Any]]:
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    return [d for d in (_read(folder / n) for n in names) if d is not None]


def drivers(run: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The processes of the job that registered a driver, in name order."""
    return _docs(Path(run) / CONTROL / "drivers")


def asks(run: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every ask made of the run, oldest first."""
    return sorted(_docs(Path(run) / CONTROL / "trace"), key=lambda d: d.get("asked_ns") or 0)


def answers(run: str | os.PathLike[str], ask_id: str) -> list[dict[str, Any]]:
    return _docs(Path(run) / CONTROL / "answers" / ask_id)


def write_ask(run: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """<run>/_control/trace/<id>.json, whole. Raises OSError."""
    folder = Path(run)
    for part in (CONTROL, "trace"):
        folder = folder / part
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        name = f"{doc['id']}.json"
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            os.write(fd, json.dumps(doc).encode())
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
