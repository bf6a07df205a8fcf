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
is killed (Linux's parent-death signal), and one that gives nothing back long after this process
did its own part (a hang, or a `sys.executable` that is not a Python: an embedding application)
is killed then and its part done here.
"""
from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

P = TypeVar("P")
R = TypeVar("R")

MAX_WORKERS = 16
# How long the workers may take beyond this process's own part before theirs are done here:
# the parts cost about the same, but more workers than free CPUs share them (SLACK x the parts'
# count x this process's time), and never less than MIN_WAIT_S (a first import, a busy machine)
SLACK = 4.0
MIN_WAIT_S = 60.0


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


fallbacks = 0      # parts a worker did not give back, done here instead (what tests watch)


def spread(fn: Callable[[P], R], parts: Sequence[P]) -> list[R]:
    """[fn(part) for part in parts], the parts after the first in worker processes."""
    global fallbacks
    children: list[subprocess.Popen[bytes] | None] = []
    try:
        children += [_start(fn, part) for part in parts[1:]]
        began = time.monotonic()
        out = [fn(parts[0])] if parts else []
        now = time.monotonic()
        deadline = now + max(MIN_WAIT_S, SLACK * len(parts) * (now - began))
        for i, part in enumerate(parts[1:]):
            ok, got = _collect(children[i], deadline)
            children[i] = None
            if not ok:
                fallbacks += 1
                got = fn(part)
            out.append(got)
    finally:           # a part that raised here, or Ctrl-C: the workers still going are stopped
        for child in children:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
    return out


def _start(fn: Callable[[Any], Any], part: Any) -> subprocess.Popen[bytes] | None:
    """A worker computing fn(part), its input written (None: it could not start)."""
    # the caller's own import path, whole (-I: no working directory, no PYTHONPATH, no user
    # site of the worker's own): the worker imports the modules the caller has
    code = (f"import sys; sys.path[:] = {sys.path!r}; "
            f"from counterprof.analysis.workers import _worker; _worker({os.getpid()})")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    try:
        with tempfile.TemporaryFile() as f:
            pickle.dump((fn, part), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.seek(0)
            return subprocess.Popen([sys.executable, "-I", "-c", code], env=env, stdin=f,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except Exception:        # no room, no process, or nothing to pickle: the part is done here
        return None


def _collect(child: subprocess.Popen[bytes] | None, deadline: float) -> tuple[bool, Any]:
    """(True, the worker's result) or (False, None) when it gave none: it failed, or had begun
    none by the deadline (time.monotonic())."""
    if child is None:
        return False, None
    assert child.stdout is not None
    try:
        # (a result once begun is read whole: its worker has done the work)
        if not select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        ok, got = pickle.load(child.stdout)
    except Exception:          # it died, wrote something else, or is late
        ok, got = False, None
    if child.poll() is None:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    child.stdout.close()
    return ok is True, got      # a whole result is kept however its worker then ended


def _die_with_parent() -> None:
    """Linux: SIGKILL to this worker when its caller exits (not SIGTERM: a disposition to ignore
    it is inherited from whoever started the caller; a worker has nothing to clean up)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)        # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker(caller: int) -> None:
    """A worker's body (started by _start): (fn, part) from stdin, (ok, fn(part)) to stdout,
    which nothing else may write to (whatever prints goes to stderr, which is /dev/null)."""
    _die_with_parent()
    if os.getppid() != caller:      # the caller died before prctl took
        os._exit(1)
    result_fd = os.dup(1)
    os.dup2(2, 1)
    fn, part = pickle.load(sys.stdin.buffer)
    try:
        result: tuple[bool, Any] = (True, fn(part))
    except Exception:            # done again by the caller, whose error it then is
        result = (False, None)
    with os.fdopen(result_fd, "wb") as out:
        pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
    os._exit(0)                  # nothing left to clean up: no exit handlers, no interpreter teardown
