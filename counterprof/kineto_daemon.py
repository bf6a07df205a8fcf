"""Kineto's daemon mode, served for one ask: `counterprof trace --pid PID -o RUN` traces a PyTorch
job that was not started under counterprof, if it was started with KINETO_USE_DAEMON=1 (as for
dynolog), with no daemon installed.

The protocol (libkineto's IpcFabricConfigClient, dynolog's IPCMonitor and ipcfabric): datagrams
on the abstract unix socket "dynolog" (its name ends with a NUL, as ipcfabric addresses do; a
path under $KINETO_IPC_SOCKET_DIR when that is set), each a header {size_t size; char type[32]}
and `size` bytes:
    ctxt   {int32 gpu, int32 pid, int64 jobid}   -> {int32 count}   (a process with GPUs registers)
    req    {int32 type, int32 n, int64 jobid, int32 pids[n]} -> a config text ("" : nothing to do)
A process asks every few seconds (5 here); pids are its own and its ancestors', so a launcher's
pid reaches its workers. The config asks for ACTIVITIES_DURATION_MSECS of tracing from now (or
ACTIVITIES_ITERATIONS steps) into ACTIVITIES_LOG_FILE, which Kineto writes as <name>_<pid>.json.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ground.errors import UsageError

NAME = "dynolog"
HEADER = struct.Struct("<Q32s")
ACTIVITIES = 0x2                # the request type's bit for a trace (EVENTS is 0x1)
SETTLE_S = 0.5                  # a trace file unchanged this long is written
GRACE_S = 6.0                   # a launcher's pid: more of its workers may ask within a poll (5 s)


@dataclass
class Served:
    pid: int
    asked_at: float                                 # monotonic s we answered its request
    prefix: str                                     # ACTIVITIES_LOG_FILE without .json
    chain: tuple[int, ...] = ()                     # its pids: its own, then its ancestors'
    files: list[Path] = field(default_factory=list)


def _address() -> str | bytes:
    folder = os.environ.get("KINETO_IPC_SOCKET_DIR")
    return os.path.join(folder, NAME) if folder else f"\0{NAME}\0".encode()


def bind() -> socket.socket:
    """The daemon's socket, or a UsageError when another daemon (dynolog) holds the name."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    addr = _address()
    try:
        if isinstance(addr, str) and os.path.exists(addr):
            raise OSError(errno.EADDRINUSE, "in use")
        s.bind(addr)
    except OSError as exc:
        s.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError("a Kineto daemon (dynolog, or another `counterprof trace --pid`) already serves "
                             "this host's jobs: ask through it (`dyno gputrace`), or stop it first") from None
        raise
    s.settimeout(0.2)
    return s


def config(prefix: str, ms: int | None, steps: int | None) -> bytes:
    if steps:
        body = f"PROFILE_START_ITERATION=0\nPROFILE_START_ITERATION_ROUNDUP=1\nACTIVITIES_ITERATIONS={steps}\n"
    else:
        body = f"PROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS={ms}\n"
    return f"ACTIVITIES_LOG_FILE={prefix}.json\n{body}".encode()


def serve(wanted: set[int], folder: Path, ms: int | None, steps: int | None, timeout_s: float,
          job: int | None = None) -> dict[int, Served]:
    """Answer the requests of every process whose pid or an ancestor's is in wanted (or whose
    SLURM job id is job) with one trace config, until each has written its trace or timeout_s
    passes; nothing for the others."""
    s = bind()
    served: dict[int, Served] = {}
    deadline = time.monotonic() + timeout_s
    last_new = 0.0
    try:
        while time.monotonic() < deadline:
            try:
                data, addr = s.recvfrom(1 << 16)
            except TimeoutError:
                data, addr = b"", None
            if data and addr is not None and len(data) >= HEADER.size:
                size, kind = HEADER.unpack_from(data)
                body = data[HEADER.size:HEADER.size + size]
                kind = kind.split(b"\0", 1)[0]
                if kind == b"ctxt":
                    s.sendto(HEADER.pack(4, b"ctxt") + struct.pack("<i", 1), addr)
                elif kind == b"req" and len(body) >= 16:
                    rtype, n, jobid = struct.unpack_from("<iiq", body)
                    pids = struct.unpack_from(f"<{max(0, min(n, (len(body) - 16) // 4))}i", body, 16)
                    answer = b""
                    ours = bool(wanted & set(pids)) or (job is not None and jobid == job)
                    if pids and rtype & ACTIVITIES and pids[0] not in served and ours:
                        prefix = str(folder / f"kineto_{pids[0]}")
                        served[pids[0]] = Served(pids[0], time.monotonic(), prefix, tuple(pids))
                        last_new = time.monotonic()
                        answer = config(prefix, ms, steps)
                    s.sendto(HEADER.pack(len(answer), b"req") + answer, addr)
            if served and all(_written(v) for v in served.values()) and _all_reached(wanted, served):
                # each pid asked itself: done; a launcher's: its other workers ask within a poll
                if (wanted and all(w in served for w in wanted)) or time.monotonic() - last_new > GRACE_S:
                    break
    finally:
        s.close()
    for v in served.values():
        _written(v)
    return served


def _all_reached(wanted: set[int], served: dict[int, Served]) -> bool:
    """Every wanted pid asked (itself, or its workers: a launcher's children)."""
    return all(any(w in v.chain for v in served.values()) for w in wanted)


def _written(v: Served) -> bool:
    """Its trace files (<prefix>_<pid>.json), once complete: unchanged for SETTLE_S and JSON."""
    found = sorted(Path(v.prefix).parent.glob(Path(v.prefix).name + "*.json"))
    done = []
    for f in found:
        try:
            st = f.stat()
            if time.time() - st.st_mtime < SETTLE_S:
                continue
            with open(f, "rb") as fh:
                json.load(fh)
        except (OSError, ValueError):
            continue
        done.append(f)
    v.files = done
    return bool(done)
