"""One time base for every collector.

Every timestamp in a run is Unix epoch nanoseconds computed as a CLOCK_MONOTONIC
reading plus one offset taken at session start, so a wall-clock step during the
run (NTP, a suspended VM) cannot tear the timeline, and runs from several hosts
still meet on one axis (their offsets come from their own wall clocks).
"""
from __future__ import annotations

import time


def _measure_offset(pairs: int = 5) -> int:
    """epoch - monotonic, from the tightest of a few back-to-back readings."""
    best: tuple[int, int] | None = None   # (width, offset)
    for _ in range(pairs):
        m0 = time.monotonic_ns()
        wall = time.time_ns()
        m1 = time.monotonic_ns()
        width = m1 - m0
        if best is None or width < best[0]:
            best = (width, wall - (m0 + width // 2))
    assert best is not None, "pairs must be at least 1"
    return best[1]


class Clock:
    """Monotonic readings on the epoch axis. `offset_ns` is fixed for the session's life."""

    def __init__(self, offset_ns: int | None = None):
        self.offset_ns = _measure_offset() if offset_ns is None else offset_ns

    def now_ns(self) -> int:
        return time.monotonic_ns() + self.offset_ns
