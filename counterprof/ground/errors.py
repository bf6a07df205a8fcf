"""The error hierarchy, and the one place that turns errno values into it.

Every message says what happened and what to do about it; the CLI prints the
message alone (no traceback) and exits 1, or 2 for usage errors.
"""
from __future__ import annotations

import errno as _errno
import os


class CounterprofError(Exception):
    """Base of every error counterprof raises on purpose."""

    exit_code = 1


class UsageError(CounterprofError):
    """Bad command line or bad arguments: exit 2, before the workload starts."""

    exit_code = 2


class EventSyntaxError(UsageError):
    """An event list that does not parse, or names an event nobody knows."""


class RunDirectoryError(CounterprofError):
    """A run directory that cannot be created, read or recovered."""


class NativeUnavailable(CounterprofError):
    """The compiled part (counterprof._native) is missing: an uncompiled source tree."""


def native_missing(cause: object) -> NativeUnavailable:
    """The error for an import of counterprof._native that failed (cause: the ImportError);
    collectors that need it say str() of it as the reason they are unavailable."""
    return NativeUnavailable(
        f"counterprof's compiled part is missing ({cause}); reinstall with `pip install .`")


class PerfEventError(CounterprofError):
    """perf_event_open or a counter read failed. `errno` is the kernel's."""

    def __init__(self, message: str, errno: int = 0, event: str | None = None):
        super().__init__(message)
        self.errno = errno
        self.event = event


class EventNotSupported(PerfEventError):
    """This machine cannot count the event (no PMU, unknown config): `<not supported>`."""


class PerfPermissionError(PerfEventError):
    """perf_event_paranoid, capabilities or seccomp forbid the counter."""


class TargetGone(PerfEventError):
    """The process or thread to count no longer exists."""


def perf_event_paranoid(proc: str = "/proc") -> int | None:
    try:
        with open(os.path.join(proc, "sys/kernel/perf_event_paranoid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _owner_if_not_ours(pid: int | None, proc: str) -> str | None:
    """The user owning process pid when it is not us (and we are not root), else None."""
    if pid is None or os.geteuid() == 0:
        return None
    try:
        uid = os.stat(os.path.join(proc, str(pid))).st_uid
    except OSError:
        return None
    if uid == os.geteuid():
        return None
    try:
        import pwd
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


# errno values whose message needs nothing but the event's name: the error and what it means
_PERF_ERRNO: dict[int, tuple[type[PerfEventError], str]] = {
    _errno.EINVAL: (EventNotSupported,
                    "the kernel rejected the event's settings (EINVAL): an unknown config value or "
                    "modifier for this PMU, or an event that cannot join this group"),
    _errno.EBUSY: (PerfEventError,
                   "the PMU is busy (EBUSY): another tool holds it exclusively (a pinned or "
                   "exclusive event, or the NMI watchdog)"),
    _errno.E2BIG: (PerfEventError,
                   "this kernel is older than the perf_event_attr counterprof was built with "
                   "(E2BIG); rebuild counterprof on this machine"),
    _errno.ENOSYS: (PerfPermissionError,
                    "perf_event_open is not available (ENOSYS): the kernel lacks "
                    "CONFIG_PERF_EVENTS or a sandbox hides the syscall"),
}


def perf_error(err: int, event: str, *, system_wide: bool = False, kernel: bool = False,
               pid: int | None = None, proc: str = "/proc") -> PerfEventError:
    """The counterprof error for a perf_event_open failure with errno `err` (positive).
    kernel: the event counts kernel space too (no :u)."""
    name = _errno.errorcode.get(err, str(err))
    if err in (_errno.ENOENT, _errno.EOPNOTSUPP, _errno.ENODEV):
        return EventNotSupported(
            f"{event}: the kernel exposes no PMU that counts it ({name}; usual in virtual "
            "machines and containers without PMU passthrough)", err, event)
    if err in (_errno.EACCES, _errno.EPERM):
        owner = _owner_if_not_ours(pid, proc)
        if owner is not None:
            return PerfPermissionError(
                f"{event}: process {pid} belongs to {owner}, not to you ({name}): only its owner "
                "or root (CAP_PERFMON with ptrace rights) may count it; run counterprof as that "
                "user or as root", err, event)
        paranoid = perf_event_paranoid(proc)
        if paranoid is None:
            return PerfPermissionError(
                f"{event}: perf_event_open is not permitted ({name}) and "
                "/proc/sys/kernel/perf_event_paranoid is missing: the kernel may lack "
                "CONFIG_PERF_EVENTS", err, event)
        # what each level allows an unprivileged user (Documentation/admin-guide/perf-security.rst)
        if system_wide:
            need, what, alt = 0, "system-wide (-a) counting", ""
        elif kernel:
            need, what, alt = 1, "counting kernel space", "; or count user space only with :u"
        else:
            need, what, alt = 2, "counting this process", ""
        if paranoid <= need:
            return PerfPermissionError(
                f"{event}: perf_event_open was refused ({name}) although "
                f"kernel.perf_event_paranoid is {paranoid}: a seccomp profile (Docker's default "
                "blocks it) or an LSM forbids the syscall; run the container with "
                "--cap-add PERFMON or a seccomp profile that allows perf_event_open",
                err, event)
        return PerfPermissionError(
            f"{event}: {what} is not permitted ({name}): kernel.perf_event_paranoid is "
            f"{paranoid}; run as root or with CAP_PERFMON, or lower it with "
            f"`sudo sysctl kernel.perf_event_paranoid={need}`{alt}", err, event)
    if err == _errno.ESRCH:
        target = f"process {pid}" if pid is not None else "the target process"
        return TargetGone(f"{event}: {target} does not exist (it may have exited)", err, event)
    if err == _errno.EMFILE or err == _errno.ENFILE:
        return PerfEventError(
            f"{event}: out of file descriptors ({name}): each counter needs one per thread or "
            "CPU; raise the limit (`ulimit -n 65536`) or count fewer events", err, event)
    if err in _PERF_ERRNO:
        cls, what = _PERF_ERRNO[err]
        return cls(f"{event}: {what}", err, event)
    return PerfEventError(f"{event}: perf_event_open failed: {os.strerror(err)} ({name})",
                          err, event)


# -- NVML ------------------------------------------------------------------------------------
# Return codes from nvml.h (a stable ABI; nvidia-ml-py's NVML_ERROR_* constants have the same
# values), so this module needs no vendor import.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_GPU_NOT_FOUND = 28


class NvmlError(CounterprofError):
    """An NVML call failed. `code` is NVML's return code, `function` the call or field."""

    def __init__(self, message: str, code: int = 0, function: str = ""):
        super().__init__(message)
        self.code = code
        self.function = function


class NvmlUnavailable(NvmlError):
    """NVML cannot be used at all here: no driver, driver not loaded, library mismatch.
    Mid-run it ends the GPU collector."""


class GpuLost(NvmlError):
    """One GPU stopped answering (fell off the bus, needs a reset); the others may still work."""


_NVML_LOST = (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED, NVML_ERROR_GPU_NOT_FOUND)


def nvml_error(code: int, function: str, where: str = "") -> NvmlError:
    """The counterprof error for NVML return code `code` from `function` (a call or a field
    name); `where` names the device (gpu:N) when there is one."""
    at = f"{where}: " if where else ""
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return NvmlUnavailable(
            "no NVIDIA driver here: libnvidia-ml.so.1 was not found (install the NVIDIA driver; "
            "in a container, start it with the NVIDIA container toolkit, e.g. `docker run --gpus all`)",
            code, function)
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return NvmlUnavailable(
            "the NVIDIA kernel driver is not loaded (`modprobe nvidia`, or check `nvidia-smi` and dmesg)",
            code, function)
    if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return NvmlUnavailable(
            "libnvidia-ml and the NVIDIA kernel driver are different versions (a driver upgrade "
            "without a reboot): reboot, or reload the nvidia kernel modules", code, function)
    if code == NVML_ERROR_UNINITIALIZED:
        return NvmlUnavailable(
            f"{at}{function}: NVML is not initialized (was nvmlShutdown called elsewhere in this "
            "process?)", code, function)
    if code in _NVML_LOST:
        what = {NVML_ERROR_GPU_IS_LOST: "the GPU is lost (fell off the bus or stopped responding)",
                NVML_ERROR_RESET_REQUIRED: "the GPU needs a reset",
                NVML_ERROR_GPU_NOT_FOUND: "the GPU is no longer found"}[code]
        return GpuLost(f"{at}{what}; {function} failed. Check `nvidia-smi` and dmesg for Xid "
                       "errors; the GPU needs a reset (`nvidia-smi -r`) or a reboot", code, function)
    if code == NVML_ERROR_NOT_SUPPORTED:
        return NvmlError(f"{at}{function} is not supported on this GPU", code, function)
    if code == NVML_ERROR_FUNCTION_NOT_FOUND:
        return NvmlError(f"{at}{function} is not in this driver's NVML (the driver is older than "
                         "the function)", code, function)
    if code == NVML_ERROR_NO_PERMISSION:
        return NvmlError(f"{at}{function} is not permitted for this user (run as root, or ask "
                         "the administrator to allow it)", code, function)
    if code == NVML_ERROR_OPERATING_SYSTEM:
        return NvmlError(f"{at}{function} was blocked by the operating system", code, function)
    if code == NVML_ERROR_TIMEOUT:
        return NvmlError(f"{at}{function} timed out in the driver", code, function)
    return NvmlError(f"{at}{function} failed with NVML error {code}", code, function)


# -- the file system -------------------------------------------------------------------------

class DiskFull(RunDirectoryError):
    """No space left (ENOSPC, EDQUOT) where counterprof writes."""


def os_error(exc: OSError, path: str | os.PathLike[str] | None = None, doing: str = "using it",
             kept: str = "") -> CounterprofError:
    """The counterprof error for an OSError met while doing something to path (a run's file,
    an output): one line that names the file, what failed and what to do. doing: what was being
    done, as "writing meta.json". kept: what was kept anyway (said on a full disk)."""
    where = str(path if path is not None else (exc.filename or "a file"))
    err = exc.errno
    name = _errno.errorcode.get(err, str(err)) if err else type(exc).__name__
    if isinstance(exc, PermissionError) or err in (_errno.EACCES, _errno.EPERM):
        who = ""
        try:
            st = os.stat(where)
            who = f", owned by uid {st.st_uid} with mode {st.st_mode & 0o777:o}"
        except OSError:
            pass
        return RunDirectoryError(
            f"{where}: permission denied ({doing}{who}); run as the user who made it, or give "
            "yourself access to it")
    if err in (_errno.ENOSPC, _errno.EDQUOT):
        folder = where if os.path.isdir(where) else os.path.dirname(where) or "."
        return DiskFull(f"{folder}: no space left on the device ({doing}, {name})"
                        + (f"; kept {kept}" if kept else "")
                        + "; free some space and run the command again")
    if err == _errno.EROFS:
        return RunDirectoryError(f"{where}: read-only file system ({doing}); copy the run "
                                 "somewhere writable")
    if err == _errno.EIO:
        return RunDirectoryError(f"{where}: input/output error ({doing}): the disk or network "
                                 "file system failed; copy what is readable elsewhere")
    return RunDirectoryError(f"{where}: {doing} failed: {exc.strerror or exc} ({name})")
