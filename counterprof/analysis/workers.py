"""Work on a big run spread over the machine's CPUs, in worker subprocesses.

`spread(fn, parts)` gives [fn(part) for part in parts]: the first part is done in this process,
each other in a worker of its own at the same time. fn must be picklable by reference (a
module's function, or a functools.partial of one over picklable values); so must its results.
The workers are plain Python subprocesses, not multiprocessing's: those import the caller's own
__main__ again, and a script without a `__main__` guard would run twice. A part goes in through a
temporary file (a worker that died early would make writing to a pipe raise SIGPIPE, which the
CLI leaves at its default: it would kill the caller) and its result comes back through a pipe.
A worker that fails, for whatever reason, costs nothing: its part is done here afterwards (an
error that part raises is then raised here, as without workers). One whose caller is killed
is killed (Linux's parent-death signal).
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

P = TypeVar("P")
R = TypeVar("R")

MAX_WORKERS = 16


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spread(fn: Callable[[P], R], parts: Sequence[P]) -> list[R]:
    """[fn(part) for part in parts], the parts after the first in worker processes."""
    children = [_start(fn, part) for part in parts[1:]]
    try:
        out = [fn(parts[0])] if parts else []
        for i, (part, child) in enumerate(zip(parts[1:], children)):
            ok, got = _collect(child)
            children[i] = None
            out.append(got if ok else fn(part))
    finally:           # a part that raised here: the workers still going are not waited for
        for child in children:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
    return out


def _start(fn: Callable[[Any], Any], part: Any) -> subprocess.Popen[bytes] | None:
    """A worker computing fn(part), its input written (None: it could not start)."""
    root = str(Path(__file__).resolve().parents[2])       # the folder holding this counterprof
    # first on the worker's path: the caller's counterprof, whatever the working directory holds
    code = (f"import sys; sys.path.insert(0, {root!r}); "
            f"from counterprof.analysis.workers import _worker; sys.exit(_worker({os.getpid()}))")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    try:
        with tempfile.TemporaryFile() as f:
            pickle.dump((fn, part), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.seek(0)
            return subprocess.Popen([sys.executable, "-c", code], env=env, stdin=f,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return None          # no room, no process, or nothing to pickle: the part is done here


def _collect(child: subprocess.Popen[bytes] | None) -> tuple[bool, Any]:
    """(True, the worker's result) or (False, None) when it failed."""
    if child is None:
        return False, None
    assert child.stdout is not None
    try:
        ok, got = pickle.load(child.stdout)
    except Exception:          # it died, or wrote something else
        ok, got = False, None
    if child.poll() is None:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    child.stdout.close()
    return (ok is True and child.returncode == 0), got


def _die_with_parent() -> None:
    """Linux: SIGKILL to this worker when its caller exits (not SIGTERM: a disposition to ignore
    it is inherited from whoever started the caller; a worker has nothing to clean up)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)        # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker(caller: int) -> int:
    """A worker's body (started by _start): (fn, part) from stdin, (ok, fn(part)) to stdout."""
    _die_with_parent()
    if os.getppid() != caller:      # the caller died before prctl took
        return 1
    fn, part = pickle.load(sys.stdin.buffer)
    try:
        result: tuple[bool, Any] = (True, fn(part))
    except Exception:            # done again by the caller, whose error it then is
        result = (False, None)
    pickle.dump(result, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.flush()
    return 0
