"""Parts for tests/unit/test_workers.py to spread over worker processes: a worker unpickles a
function by its module's name, so they live in a module on the tests' import path (a test
module itself is imported by pytest's importlib mode under a name a worker cannot import)."""
from __future__ import annotations

import os


def square_sum(offset: int, part: list[int]) -> tuple[int, int]:
    import numpy as np          # (in the worker: the caller's numpy, whatever the working directory holds)
    return os.getpid(), int(np.sum(np.square(part))) + offset


def fails_on_seven(part: list[int]) -> int:
    if 7 in part:
        raise ValueError("seven")
    return len(part)


def noisy(part: list[int]) -> int:
    print("a library that prints", flush=True)        # must not reach the result's pipe
    os.write(1, b"and one at the fd level\n")
    return sum(part)


def hangs_in_a_worker(caller: int, part: list[int]) -> int:
    """sum(part), or, in any process but `caller`, a hang (a worker that never answers)."""
    if os.getpid() != caller:
        import time
        time.sleep(3600)
    return sum(part)
