"""What the collectives cost a CPU job inside its main thread's own ops.

On a CPU, a data-parallel job's gradient sync costs its step more than the time its main thread
waits for the all-reduce: the collective's threads take CPU and memory bandwidth while backward
runs (so the backward ops that overlap it run longer than the same ops alone), and the sync's
own work runs as ops on the main thread (DDP's reducer copies gradients into and out of its
buckets; its hooks run inside AccumulateGrad). Measured on the labelled DDP job (2 ranks over
gloo, 67 MB of gradients, 2026-12-06): the main thread's blocked wait covered 25% of the step
against the job's own no_sync() truth of 42%; the ops overlapped by the all-reduce ran
90-120 ms per traced second longer than the same ops (same name, same input shapes) alone.

`comm_caused` turns that into intervals of the main thread's op time, so that the interval sets
every verdict scope clips and intersects carry it:
- an op (outermost on the main thread) mostly under the rank's collectives, whose same-name,
  same-shapes twins ran outside them: its time beyond their median, as the tail of the op (a
  key's excess is its overlapped instances' total minus their count times the median, never
  below 0: noise above and below the median cancels);
- an op of the sync itself (`SYNC_OPS`): all of it, at any depth.
An op with no twin outside the collectives gives nothing: no baseline, no claim.
"""
from __future__ import annotations

import json
import statistics
from typing import Any

from counterprof.analysis import intervals as iv

# record_function names of the data-parallel sync's own work on the main thread
SYNC_OPS = ("torch.distributed.ddp.reducer::",)
OVERLAPPED = 0.5        # an op this much under the rank's collectives ran beside them
MIN_TWINS = 2           # instances outside the collectives a median needs


def _key(name: str, attrs: Any) -> tuple[str, str]:
    dims = ""
    if isinstance(attrs, str) and attrs:
        try:
            d = json.loads(attrs)
        except ValueError:
            d = None
        if isinstance(d, dict) and d.get("input_dims") is not None:
            dims = json.dumps(d["input_dims"])
    return name, dims


def comm_caused(ops: list[tuple[int, int, str, Any]], collectives: iv.IntervalSet) -> iv.Intervals:
    """ops: the main thread's (start, end, name, attrs) of one rank; collectives: that rank's
    collective intervals (merged). -> the intervals of op time the collectives caused."""
    if not ops or not collectives:
        return []
    ops = sorted(ops, key=lambda o: (o[0], -o[1]))
    covered = iv.Indexed(collectives)
    caused: iv.Intervals = []
    outer: list[tuple[int, int, tuple[str, str], bool]] = []
    end = -1
    for s, e, name, attrs in ops:
        if name.startswith(SYNC_OPS):
            caused.append((s, e))
            continue
        if s < end or e <= s:
            continue                        # nested in an op already taken
        end = e
        under = iv.total(covered.clip(s, e))
        outer.append((s, e, _key(name, attrs), under >= OVERLAPPED * (e - s)))
    alone: dict[tuple[str, str], list[int]] = {}
    beside: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for s, e, k, over in outer:
        if over:
            beside.setdefault(k, []).append((s, e))
        else:
            alone.setdefault(k, []).append(e - s)
    for k, occ in beside.items():
        twins = alone.get(k, [])
        if len(twins) < MIN_TWINS:
            continue
        m = statistics.median(twins)
        tails = [max(0, e - s - m) for s, e in occ]
        excess = sum(e - s for s, e in occ) - m * len(occ)
        if excess <= 0 or not any(tails):
            continue
        f = min(1.0, excess / sum(tails))
        caused.extend((e - int(t * f), e) for (s, e), t in zip(occ, tails) if t > 0)
    return iv.merge(caused)
