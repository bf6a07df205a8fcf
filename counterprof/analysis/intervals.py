"""Interval sets: sorted, disjoint [start, end) pairs in ns. Pure, no I/O.

Busy time of a stream, time two kernel classes overlap, idle gaps and region clipping
are all unions, intersections and differences of such sets.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

Intervals = list[tuple[int, int]]


def merge(pairs: Iterable[tuple[int, int]]) -> Intervals:
    """Union of possibly overlapping, unsorted intervals; empty ones dropped."""
    out: Intervals = []
    for p in sorted(p for p in pairs if p[1] > p[0]):
        s, e = p
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:      # the caller's tuple itself: a rank's millions of steps are not copied
            out.append(p if type(p) is tuple else (s, e))
    return out


def total(iv: Intervals) -> int:
    return sum(e - s for s, e in iv)


_AFTER_ANY_END = float("inf")


def intersect(a: Intervals, b: Intervals) -> Intervals:
    if len(a) > len(b):          # symmetric: the shorter set walks, the longer is searched
        a, b = b, a
    if len(a) * 16 < len(b) and isinstance(b[0], tuple):
        # a few intervals (a verdict window, a step) against a whole run's set: bisection finds
        # where each starts, so a run's thousands of windows do not each walk the whole set
        found: Intervals = []
        n = len(b)
        for lo, hi in a:
            j = bisect_right(b, (lo, _AFTER_ANY_END)) - 1      # the last one starting at or before lo
            if j < 0 or b[j][1] <= lo:
                j += 1
            while j < n and b[j][0] < hi:
                s, e = max(lo, b[j][0]), min(hi, b[j][1])
                if s < e:
                    found.append((s, e))
                j += 1
        return found
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a minus b."""
    out: Intervals = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


class Indexed:
    """An interval set prepared for many clips (one per window or region)."""

    def __init__(self, iv: Intervals):
        self.iv = iv
        self.ends = [e for _, e in iv]

    def clip(self, lo: int, hi: int) -> Intervals:
        """The part inside [lo, hi), found by bisection."""
        if hi <= lo:
            return []
        iv = self.iv
        i = bisect_right(self.ends, lo)
        out: Intervals = []
        while i < len(iv) and iv[i][0] < hi:
            s, e = iv[i]
            s, e = max(s, lo), min(e, hi)
            if e > s:
                out.append((s, e))
            i += 1
        return out


def clip(iv: Intervals, lo: int, hi: int) -> Intervals:
    return Indexed(iv).clip(lo, hi)


def span(iv: Intervals) -> tuple[int, int] | None:
    return (iv[0][0], iv[-1][1]) if iv else None


def gaps(iv: Intervals) -> Intervals:
    """The holes between consecutive intervals."""
    return [(iv[k][1], iv[k + 1][0]) for k in range(len(iv) - 1)]


