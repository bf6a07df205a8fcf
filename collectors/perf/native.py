"""The compiled core (counterprof._native) and the attr every counter is opened with.

All perf_event_open calls go through `open_event`, which turns a failure into the
counterprof error for it (counterprof.ground.errors.perf_error).
"""
from __future__ import annotations

import struct
from typing import Any

from counterprof.ground.errors import native_missing, perf_error

from .events import EventSpec
from counterprof.ground.record import record

try:
    from counterprof._native import ffi as ffi, lib as lib     # re-exported: kernel_mode reads them
except ImportError as _exc:   # an uncompiled source tree
    ffi = lib = None
    _IMPORT_ERROR = str(_exc)
else:
    _IMPORT_ERROR = ""

PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_ID = 1 << 2
PERF_FORMAT_GROUP = 1 << 3
# Every leader is read as a group (a lone event is a group of one): one read per
# group per tick, and enabled/running shared by the members that are scheduled together.
READ_FORMAT = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_GROUP


def require_native() -> tuple[Any, Any]:
    if lib is None:
        raise native_missing(_IMPORT_ERROR)
    return ffi, lib


def drain_buffers(ffi: Any, n: int) -> tuple[Any, ...]:
    """The column arrays a drain of n records fills (the tick's and the kernel mode's alike):
    time, duration, slot, value, quality, and the validity bitmap."""
    return (ffi.new("int64_t[]", n), ffi.new("int64_t[]", n), ffi.new("int32_t[]", n),
            ffi.new("double[]", n), ffi.new("float[]", n), ffi.new("uint8_t[]", (n + 7) // 8))


@record(frozen=True)
class OpenFlags:
    """How a counter is opened, the perf stat way."""

    leader: bool            # leaders start disabled; members follow their leader
    enable_on_exec: bool    # launched workload: counting starts at exec, not at fork
    inherit: bool           # children and new threads are counted too (task counters)


def make_spec(event: EventSpec, flags: OpenFlags) -> Any:
    ffi_, _ = require_native()
    spec = ffi_.new("struct cp_event_spec *")
    spec.type = event.type
    spec.config = event.config
    spec.config1 = event.config1
    spec.config2 = event.config2
    spec.read_format = READ_FORMAT
    spec.disabled = 1 if flags.leader else 0
    spec.enable_on_exec = 1 if (flags.leader and flags.enable_on_exec) else 0
    spec.inherit = 1 if flags.inherit else 0
    m = event.modifiers
    spec.exclude_user = int(m.exclude_user)
    spec.exclude_kernel = int(m.exclude_kernel)
    spec.exclude_hv = int(m.exclude_hv)
    spec.exclude_idle = int(m.exclude_idle)
    spec.exclude_host = int(m.exclude_host)
    spec.exclude_guest = int(m.exclude_guest)
    spec.pinned = int(m.pinned and flags.leader)
    spec.exclusive = int(m.exclusive and flags.leader)
    spec.precise_ip = m.precise_ip
    return spec


def attr_bytes(event: EventSpec, flags: OpenFlags) -> bytes:
    """The perf_event_attr the syscall would get, byte for byte."""
    ffi_, lib_ = require_native()
    size = lib_.cp_attr_size()
    buf = ffi_.new("char[]", size)
    lib_.cp_build_attr(make_spec(event, flags), buf)
    data: bytes = ffi_.buffer(buf, size)[:]
    return data


# perf_event_attr's fixed layout (include/uapi/linux/perf_event.h); the flag bits live
# in one u64 at offset 40.
ATTR_FLAG_BITS = {
    "disabled": 0, "inherit": 1, "pinned": 2, "exclusive": 3, "exclude_user": 4,
    "exclude_kernel": 5, "exclude_hv": 6, "exclude_idle": 7, "mmap": 8, "comm": 9, "freq": 10,
    "inherit_stat": 11, "enable_on_exec": 12, "task": 13, "watermark": 14,
    "mmap_data": 17, "sample_id_all": 18, "exclude_host": 19, "exclude_guest": 20,
}


def decode_attr(raw: bytes) -> dict[str, int]:
    """Decode an attr the way perf's attr tests read theirs: by the ABI layout."""
    type_, size, config, period, sample_type, read_format, flags = struct.unpack_from("<IIQQQQQ", raw, 0)
    config1, config2 = struct.unpack_from("<QQ", raw, 56)
    out = {"type": type_, "size": size, "config": config, "sample_period": period,
           "sample_type": sample_type, "read_format": read_format,
           "config1": config1, "config2": config2, "precise_ip": (flags >> 15) & 3}
    for name, bit in ATTR_FLAG_BITS.items():
        out[name] = (flags >> bit) & 1
    return out


def open_event(event: EventSpec, flags: OpenFlags, pid: int, cpu: int, group_fd: int = -1,
               *, system_wide: bool = False) -> int:
    """perf_event_open; the fd, or a counterprof PerfEventError saying what to do."""
    _, lib_ = require_native()
    fd: int = lib_.cp_event_open(make_spec(event, flags), pid, cpu, group_fd)
    if fd < 0:
        raise perf_error(-fd, event.name, system_wide=system_wide,
                         kernel=not event.modifiers.exclude_kernel, pid=pid if pid > 0 else None)
    return fd


def close_fd(fd: int) -> None:
    if lib is not None and fd >= 0:
        lib.cp_close(fd)


def read_group(fd: int, nmembers: int) -> list[int]:
    """One group read: [nr, time_enabled, time_running, value...]."""
    ffi_, lib_ = require_native()
    words = ffi_.new("uint64_t[]", nmembers + 3)
    n = lib_.cp_read_words(fd, words, nmembers + 3)
    if n < 0:
        raise perf_error(-n, f"read of counter fd {fd}")
    return [words[i] for i in range(n)]


def enable(fd: int) -> None:
    _, lib_ = require_native()
    rc = lib_.cp_ioctl_enable(fd, 1)
    if rc < 0:
        raise perf_error(-rc, f"enable of counter fd {fd}")
