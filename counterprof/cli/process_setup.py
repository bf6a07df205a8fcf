"""counterprof's own process, set up for a command's speed and memory: pandas kept out, numpy's
BLAS loaded with one thread, Arrow on the system allocator. Only the CLI's process: profile()
leaves the user's process alone."""
from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType


class _NoPandas:
    """A meta-path finder that says pandas is not installed."""

    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is kept out of counterprof's own process", name=name)
        return None


def keep_pandas_out() -> None:
    """pyarrow imports pandas (when it is installed) at its first array conversion in a
    process, only to ask whether the input is a DataFrame: 0.3-0.6 s of a run's start-up, for
    a process that never holds one. Only for counterprof's own process (the subcommands that
    hand no data to pandas); a user's process (profile()) is left alone."""
    if _NoPandas not in sys.meta_path and "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas)


def import_arrow_with_one_blas_thread() -> None:
    """pyarrow imports numpy, whose OpenBLAS starts a thread per core at load (tens of ms of
    start-up on a busy machine); the profiler does no BLAS. The variable is set only while
    numpy loads, so the workload's environment is the user's."""
    import importlib
    set_here = "OPENBLAS_NUM_THREADS" not in os.environ and "numpy" not in sys.modules
    if set_here:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        importlib.import_module("pyarrow")
    finally:
        if set_here:
            del os.environ["OPENBLAS_NUM_THREADS"]


@contextmanager
def numpy_left_out() -> Iterator[None]:
    """pyarrow (pyarrow.lib and pyarrow._compute) imports numpy when it is installed, for its
    numpy conversions: ~45 ms of the ~110 that loading the libraries takes (numpy's ~150
    modules and its OpenBLAS). `counterprof import` makes none (its conversion is Arrow's
    compute functions), so while the body imports, `import numpy` fails as where numpy is
    absent, and pyarrow loads without it. numpy is importable again afterwards (pyarrow's
    numpy conversions then say NumPy is not present). A pyarrow that requires numpy (before
    18: its numpy C API import would print an error before failing) loads with it. Only for
    counterprof's own process, where neither is loaded yet."""
    hide = ("numpy" not in sys.modules and "pyarrow" not in sys.modules
            and (_pyarrow_major() or 0) >= NUMPY_OPTIONAL_PYARROW)
    if hide:
        sys.modules["numpy"] = None              # type: ignore[assignment]  # ImportError
        try:
            import pyarrow
            import pyarrow._compute  # noqa: F401
        except ImportError:                      # a pyarrow that requires numpy
            for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
                del sys.modules[name]
            del sys.modules["numpy"]
            hide = False
    try:
        yield
    finally:
        if hide and "numpy" in sys.modules and sys.modules["numpy"] is None:
            del sys.modules["numpy"]


NUMPY_OPTIONAL_PYARROW = 18     # the first pyarrow whose lib and _compute import without numpy


def _pyarrow_major() -> int | None:
    """The installed pyarrow's major version, from its _generated_version.py (not
    importlib.metadata: ~9 ms); None where it cannot be told."""
    import importlib.util
    import re
    try:
        spec = importlib.util.find_spec("pyarrow")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            with open(os.path.join(folder, "_generated_version.py"), encoding="utf-8") as f:
                m = re.search(r"""version_tuple = \((\d+),""", f.read())
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


def use_system_allocator() -> None:
    """In counterprof's own process, Arrow allocates through malloc rather than its default
    mimalloc pool, which keeps freed memory around: compaction and the summary at the end of a
    long run peak ~30 MB lower. (The context manager leaves the user's process alone.)"""
    import pyarrow as pa
    pa.set_memory_pool(pa.system_memory_pool())


_gc_paused = False


def pause_gc() -> None:
    """The cyclic collector off while numpy, pyarrow and the command's modules load (~300
    modules, ~200k objects, none of them garbage): 62 collections in a `run -q -- true`, ~6 ms."""
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def resume_gc() -> None:
    """The collector on again once the command is set up (only what pause_gc turned off), with
    what start-up made frozen: gc.freeze moves it out of the collector's generations without a
    pass over it. Re-enabled without that, the first collections walk all of it and cost as
    much as the ones avoided. 7 collections and ~1 ms are left of a `run -q -- true` (0.96x wall
    paired; with its summary 0.93x). A steady run collects about once a minute (its drains make
    few container objects), so this is start-up's figure only."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        gc.enable()
