"""The live window's arithmetic: per-tick sums of a series (`Bucket`), a copy of the window
(`Snapshot`), and the values read from them, as pure functions.

A series is held per (source, metric, entity) as one Bucket of sums per display tick. Rates
are computed as sums over the covered time (value sum / duration the known values cover),
never as means of per-tick rates, so ticks of different lengths weigh right. Nothing here
reads files, keeps state or formats text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple
from collections.abc import Iterable, Mapping

# One display tick of one series, as sums (so buckets merge by adding):
#   vsum  sum of known values            vdur  sum of value x duration (ratios)
#   kdur  duration the known values cover (ns)    qdur  duration actually counted (quality x duration)
#   dur   all duration, known or not     known/unknown  row counts
#   last  newest known value (gauges)    vmax  largest known value    t_last newest time (ns)
class Bucket(NamedTuple):
    vsum: float
    vdur: float
    kdur: float
    qdur: float
    dur: float
    known: int
    unknown: int
    last: float | None
    vmax: float | None
    t_last: int


EMPTY = Bucket(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, None, None, 0)

CURRENT_S = 1.0    # "now" values: the last second every collector has reported
VERDICT_S = 3.0    # the bottleneck line: a little longer, so it does not flicker
STALE_S = 2.0      # a collector this far behind the others is left out of "now"

Key = tuple[str, str, str]  # (source, metric, entity)


def merge(a: Bucket, b: Bucket) -> Bucket:
    """Two buckets of one series (or two entities' buckets: see merge_entities)."""
    if a.last is None or (b.last is not None and b.t_last >= a.t_last):
        last = b.last
    else:
        last = a.last
    vmax = a.vmax if b.vmax is None else (b.vmax if a.vmax is None else max(a.vmax, b.vmax))
    return Bucket(a.vsum + b.vsum, a.vdur + b.vdur, a.kdur + b.kdur, a.qdur + b.qdur,
                  a.dur + b.dur, a.known + b.known, a.unknown + b.unknown, last, vmax,
                  max(a.t_last, b.t_last))


@dataclass(frozen=True)
class Snapshot:
    """A copy of the live window at two resolutions: `series`, the last seconds in display
    ticks (keyed by time // tick_ns), for current values and the verdict; `history`, the
    whole window in buckets of `history_ticks` ticks (keyed by tick // history_ticks), for
    the sparklines, so a frame merges tens of buckets per series, not hundreds."""

    tick_ns: int
    window_ticks: int
    series: Mapping[Key, Mapping[int, Bucket]]
    history: Mapping[Key, Mapping[int, Bucket]] = field(default_factory=dict)
    history_ticks: int = 1
    newest: int | None = None          # newest tick seen in any series
    version: int = 0                   # changes whenever data arrives
    mfu: tuple[dict[str, Any], ...] = ()   # per torch trace window, newest last: {"rank", "end_ns", "mfu"}

    def keys(self, source: str | None = None) -> list[Key]:
        return [k for k in self.series if source is None or k[0] == source]

    def get(self, key: Key) -> LiveSeries:
        return LiveSeries(self.series.get(key, {}), self.history.get(key, {}))


@dataclass(frozen=True)
class LiveSeries:
    """One series (or a sum of several) at both resolutions."""

    fine: Mapping[int, Bucket]
    coarse: Mapping[int, Bucket]


# -- series arithmetic ------------------------------------------------------------------

def combined(snap: Snapshot, source: str, metric: str, entities: Iterable[str] | None = None
             ) -> LiveSeries | None:
    """One series for (source, metric) over the given entities (default: all). Several
    entities add up side by side: values sum, and the time covered is the longest any one
    entity covers, so the rate of the sum is the sum of rates."""
    keys = [k for k in snap.series
            if k[0] == source and k[1] == metric and (entities is None or k[2] in entities)]
    if not keys:
        return None
    if len(keys) == 1:
        return snap.get(keys[0])
    return LiveSeries(sum_side_by_side([snap.series[k] for k in keys]),
                  sum_side_by_side([snap.history.get(k, {}) for k in keys]))


def sum_side_by_side(parts: list[Mapping[int, Bucket]]) -> dict[int, Bucket]:
    out: dict[int, Bucket] = {}
    for part in parts:
        for t, b in part.items():
            a = out.get(t)
            out[t] = b if a is None else side_by_side(a, b)
    return out


def side_by_side(a: Bucket, b: Bucket) -> Bucket:
    """Two entities over the same interval: values add; the time covered is not doubled;
    the share counted is the worse one."""
    m = merge(a, b)
    dur = max(a.dur, b.dur)
    worst = min(_counted(a), _counted(b))
    return m._replace(kdur=max(a.kdur, b.kdur), dur=dur, qdur=worst * dur)


def _counted(b: Bucket) -> float:
    """The share of b's interval counted; 1.0 for a bucket without duration."""
    share = coverage(b) if b.dur else 1.0
    return 1.0 if share is None else share


def common_end(snap: Snapshot) -> int | None:
    """The newest tick every source has completed (a source's newest tick is still filling).
    Collectors hand data over at their own cadence (perf every 0.5 s, host every second), so
    "now" ends where all of them have reported, and two panels never disagree only because
    one is fresher. A source silent for more than STALE_S (failed, finished) does not hold
    the others back."""
    newest: dict[str, int] = {}
    for (source, _m, _e), b in snap.series.items():
        if b:
            t = max(b)
            if t > newest.get(source, t - 1):
                newest[source] = t
    if not newest:
        return None
    top = max(newest.values())
    stale = round(STALE_S * 1e9 / snap.tick_ns)
    return min(t for t in newest.values() if t >= top - stale) - 1


def recent(buckets: Mapping[int, Bucket] | None, tick_ns: int, seconds: float,
           end: int | None = None) -> Bucket | None:
    """The `seconds` of a series up to tick `end` (default: its own newest tick)."""
    if not buckets:
        return None
    newest = max(buckets) if end is None else end
    span = max(1, round(seconds * 1e9 / tick_ns))
    acc = EMPTY
    for t in range(newest - span + 1, newest + 1):
        b = buckets.get(t)
        if b is not None:
            acc = merge(acc, b)
    return acc if acc.known or acc.unknown else None


def binned(buckets: Mapping[int, Bucket] | None, end: int | None, window_ticks: int,
           points: int) -> list[Bucket | None]:
    """The window ending at tick `end`, in `points` equal bins (oldest first); None where a
    bin holds no data."""
    out: list[Bucket | None] = [None] * points
    if not buckets or end is None or points <= 0:
        return out
    start = end - window_ticks + 1
    for t, b in buckets.items():
        if start <= t <= end:
            i = (t - start) * points // window_ticks
            prev = out[i]
            out[i] = b if prev is None else merge(prev, b)
    return out


def rate(b: Bucket | None) -> float | None:
    """Per second, for deltas: value sum over the time the known values cover."""
    if b is None or not b.known or b.kdur <= 0:
        return None
    return b.vsum / (b.kdur / 1e9)


def per_ns(b: Bucket | None) -> float | None:
    """Value per nanosecond of interval (task-clock ns per ns = CPUs; s per s likewise x1e9)."""
    if b is None or not b.known or b.kdur <= 0:
        return None
    return b.vsum / b.kdur


def cpus_from_seconds(b: Bucket | None) -> float | None:
    """CPU seconds per second of interval: CPUs kept busy."""
    v = per_ns(b)
    return None if v is None else v * 1e9


def cpu_seconds(user: LiveSeries | None, sys_: LiveSeries | None) -> LiveSeries:
    """user + system CPU seconds (both cover the same intervals: time is not doubled)."""
    def add(u: Mapping[int, Bucket], s: Mapping[int, Bucket]) -> dict[int, Bucket]:
        out: dict[int, Bucket] = {}
        for t in set(u) | set(s):
            a, b = u.get(t), s.get(t)
            if b is None:
                out[t] = u[t]           # t is in u or s
            elif a is None:
                out[t] = b
            else:
                out[t] = merge(a, b)._replace(kdur=max(a.kdur, b.kdur), dur=max(a.dur, b.dur))
        return out
    empty = LiveSeries({}, {})
    user, sys_ = user or empty, sys_ or empty
    return LiveSeries(add(user.fine, sys_.fine), add(user.coarse, sys_.coarse))


def weighted(b: Bucket | None) -> float | None:
    """Duration-weighted mean, for ratios (percent over an interval)."""
    if b is None or not b.known or b.kdur <= 0:
        return None
    return b.vdur / b.kdur


def gauge_last(b: Bucket | None) -> float | None:
    return None if b is None else b.last


def gauge_mean(b: Bucket | None) -> float | None:
    return None if b is None or not b.known else b.vsum / b.known


def quotient(a: Bucket | None, b: Bucket | None, scale: float = 1.0) -> float | None:
    """a's value sum over b's (instructions / cycles): both over the same ticks."""
    if a is None or b is None or not a.known or not b.known or b.vsum == 0:
        return None
    return scale * a.vsum / b.vsum


def coverage(b: Bucket | None) -> float | None:
    """Share of the interval the counter actually ran (1.0 unless multiplexed)."""
    if b is None or b.dur <= 0:
        return None
    return min(1.0, b.qdur / b.dur)


TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def current_value(kind: str, unit: str, b: Bucket | None) -> tuple[float | None, str]:
    """A series' value for display and its unit key, by catalog kind: gauges their newest
    value, ratios their weighted mean, deltas a rate (time counters as % of the time)."""
    if kind == "gauge":
        return gauge_last(b), unit
    if kind == "ratio":
        return weighted(b), unit
    if unit in TIME_UNITS:
        v = per_ns(b)
        return (None if v is None else 100.0 * v * 1e9 * TIME_UNITS[unit]), "percent"
    r = rate(b)
    if unit in ("bytes", "B"):
        return r, "bytes/s"
    if unit in ("", "count"):
        return r, "/s"
    return r, f"{unit}/s"


def history_value(kind: str, unit: str, b: Bucket | None) -> float | None:
    if kind == "gauge":
        return gauge_mean(b)
    return current_value(kind, unit, b)[0]


def kind_of(catalog: Mapping[str, Any], metric: str, buckets: Mapping[int, Bucket] | None) -> tuple[str, str]:
    """(kind, unit) from the catalog; without an entry, a series with durations is a delta."""
    entry = catalog.get(metric)
    if entry is not None:
        kind = getattr(entry, "kind", None) or entry.get("kind")
        unit = getattr(entry, "unit", None)
        if unit is None:
            unit = entry.get("unit", "")
        return kind, unit
    has_dur = any(b.dur > 0 for b in (buckets or {}).values())
    return ("delta" if has_dur else "gauge"), ""

