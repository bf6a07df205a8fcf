"""The one place counterprof calls NVML (nvidia-ml-py, imported as pynvml), like nvitop's.

- The module is passed in (tests pass a fake with the real library's behaviour); by default it
  is `pynvml`, imported here and never at package import.
- nvmlInit is lazy (first use) and nvmlShutdown runs at close() or, failing that, at exit.
- Every call goes through `call()`: an NVMLError becomes None (unknown), a NOT_SUPPORTED function
  or field is noted once by name (per device), other errors once by name with the message.
- A lost GPU raises `GpuLost`, a library-wide failure (driver unloaded, version mismatch)
  `NvmlUnavailable`: both counterprof errors made in counterprof/ground/errors.py.
"""
from __future__ import annotations

import atexit
import ctypes
import importlib
import importlib.util
import struct
import sys
from typing import Any

from counterprof.ground.errors import (
    NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS,
    GpuLost, NvmlError, NvmlUnavailable, nvml_error,
)

# nvmlValueType_t -> (member of the nvmlValue_t union, width in bits for unsigned counters;
# None: signed or floating, never wraps)
_VALUE_MEMBERS = {
    0: ("dVal", None),
    1: ("uiVal", 32),
    2: ("ulVal", 8 * ctypes.sizeof(ctypes.c_ulong)),
    3: ("ullVal", 64),
    4: ("sllVal", None),
    5: ("siVal", None),
    6: ("usVal", 16),
}


# nvmlValue_t's 8 bytes decoded by value type ("=": the machine's byte order, as ctypes lays
# the union out; every member starts at offset 0)
_RAW = {0: struct.Struct("=d"), 1: struct.Struct("=I4x"),
        2: struct.Struct("=Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "=I4x"),
        3: struct.Struct("=Q"), 4: struct.Struct("=q"), 5: struct.Struct("=i4x"), 6: struct.Struct("=H6x")}


def _record_format(cls: Any) -> struct.Struct | None:
    """One struct.Struct for the whole c_nvmlFieldValue_t record, laid out from the ctypes
    class's own offsets: (timestamp, valueType, nvmlReturn, value bytes). Decoding the array
    at once skips pynvml's Python-level __getattribute__ on every member of every field.
    None when the layout is not the one this code knows (then members are read one by one)."""
    try:
        want = [("timestamp", "q", 8), ("valueType", "I", 4), ("nvmlReturn", "I", 4), ("value", "8s", 8)]
        parts: list[str] = []
        pos = 0
        for name, code, size in sorted(want, key=lambda w: getattr(cls, w[0]).offset):
            member = getattr(cls, name)
            if member.size != size or member.offset < pos:
                return None
            parts.append("x" * (member.offset - pos) + code)
            pos = member.offset + size
        parts.append("x" * (ctypes.sizeof(cls) - pos))
        fmt = struct.Struct("=" + "".join(parts))
        return fmt if fmt.size == ctypes.sizeof(cls) else None
    except (AttributeError, TypeError):
        return None


def union_value(value_type: int, value: Any) -> tuple[float | None, int | None]:
    """(number, counter width in bits) of an nvmlValue_t read as `value_type`."""
    member, width = _VALUE_MEMBERS.get(int(value_type), (None, None))
    if member is None:
        return None, None
    return float(getattr(value, member)), width


def load_module(module: Any = None) -> Any:
    """The NVML module: `module` itself when it is an object, else import it by name
    (default pynvml). ImportError when nvidia-ml-py is not installed."""
    if module is None or isinstance(module, str):
        return importlib.import_module(module or "pynvml")
    return module


class Nvml:
    """An NVML session over one module. Not thread-safe: one sampling thread uses it."""

    def __init__(self, module: Any):
        self.lib = module
        self.initialized = False
        # name of a function or field -> devices (gpu:N; "" for the system) it is unsupported on
        self.unsupported: dict[str, list[str]] = {}
        # name -> the first error message seen (errors other than NOT_SUPPORTED)
        self.errors: dict[str, str] = {}
        self._record: struct.Struct | None | bool = None     # see _record_format

    # -- lifecycle -----------------------------------------------------------------------

    def init(self) -> None:
        if self.initialized:
            return
        try:
            self.lib.nvmlInit()
        except self.lib.NVMLError as exc:
            raise nvml_error(exc.value, "nvmlInit") from None
        self.initialized = True
        atexit.register(self.close)

    def close(self) -> None:
        """nvmlShutdown once; idempotent."""
        if not self.initialized:
            return
        self.initialized = False
        atexit.unregister(self.close)
        try:
            self.lib.nvmlShutdown()
        except self.lib.NVMLError:
            pass

    def const(self, name: str, default: Any = None) -> Any:
        """A constant (NVML_FI_..., NVML_GPM_METRIC_...) of this nvidia-ml-py, or default when
        it is older than the constant."""
        return getattr(self.lib, name, default)

    # -- calls ---------------------------------------------------------------------------

    def call(self, fn: str, *args: Any, where: str = "", name: str | None = None,
             absent_codes: tuple[int, ...] = (), absent: Any = None) -> Any:
        """lib.fn(*args), or None when NVML cannot answer. `name`: what to call it in
        meta.json (default fn). `absent_codes`: return codes that mean "nothing to report"
        rather than an error (e.g. NOT_FOUND from nvmlDeviceGetSamples: no new samples):
        they give `absent`. Raises GpuLost / NvmlUnavailable."""
        self.init()
        f = getattr(self.lib, fn, None)
        if f is None:   # this nvidia-ml-py predates the function
            self.note(name or fn, NVML_ERROR_FUNCTION_NOT_FOUND, where)
            return None
        try:
            return f(*args)
        except self.lib.NVMLError as exc:
            if exc.value in absent_codes:
                return absent
            self.note(name or fn, exc.value, where)
            return None

    def field_values(self, handle: Any, fields: list[tuple[int, int]], names: list[str],
                     where: str = "") -> list[tuple[float, int | None, int] | None]:
        """One nvmlDeviceGetFieldValues for (field id, scope id) pairs: per field
        (value, counter width, timestamp in epoch µs), or None where that field's own
        nvmlReturn says it failed (checked for every field: NVML's value is undefined then)."""
        if not fields:
            return []
        values = self.call("nvmlDeviceGetFieldValues", handle, fields, where=where)
        if values is None:
            return [None] * len(fields)
        out: list[tuple[float, int | None, int] | None] = []
        if self._record is None:
            self._record = _record_format(getattr(self.lib, "c_nvmlFieldValue_t", None)) or False
        if isinstance(self._record, struct.Struct) and isinstance(values, ctypes.Array):
            records = self._record.iter_unpack(memoryview(values).cast("B"))
        else:
            records = ((v.timestamp, v.valueType, v.nvmlReturn, v.value) for v in values)
        for (stamp, vtype, ret, raw), name in zip(records, names):
            if ret != NVML_SUCCESS:
                self.note(name, ret, where)
                out.append(None)
                continue
            if isinstance(raw, bytes):
                dec = _RAW.get(vtype)
                number = float(dec.unpack(raw)[0]) if dec else None
                width = _VALUE_MEMBERS.get(vtype, (None, None))[1]
            else:
                number, width = union_value(vtype, raw)
            out.append(None if number is None else (number, width, int(stamp)))
        return out

    def is_unsupported(self, name: str, where: str = "") -> bool:
        return where in self.unsupported.get(name, ())

    def note(self, name: str, code: int, where: str = "") -> None:
        """Record NVML's answer `code` for `name` on `where`; raises for a lost GPU or a
        library-wide failure."""
        err = nvml_error(code, name, where)
        if isinstance(err, (GpuLost, NvmlUnavailable)):
            raise err
        if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
            devices = self.unsupported.setdefault(name, [])
            if where not in devices:
                devices.append(where)
        else:
            self.errors.setdefault(name, str(err))


def no_driver_here() -> bool:
    """True where nvmlInit would fail for want of libnvidia-ml.so.1: the dlopen pynvml's
    nvmlInit makes on Linux, made without importing pynvml (~15 ms of a run's start-up on a
    machine with no NVIDIA driver; a failed dlopen costs ~0.1 ms)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return True
    return False


def open_nvml(module: Any = None) -> Nvml:
    """An initialized Nvml, or NvmlError / ImportError saying why not. By default (pynvml),
    the error where there is no driver is the one pynvml's nvmlInit raises, found without it."""
    if (module is None and "pynvml" not in sys.modules            # imported already: ask it
            and importlib.util.find_spec("pynvml") is not None and no_driver_here()):
        raise nvml_error(NVML_ERROR_LIBRARY_NOT_FOUND, "nvmlInit")
    nvml = Nvml(load_module(module))
    nvml.init()
    return nvml


__all__ = ["Nvml", "open_nvml", "load_module", "union_value", "NvmlError", "GpuLost",
           "NvmlUnavailable"]
