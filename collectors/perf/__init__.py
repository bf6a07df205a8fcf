"""perf collector: CPU counters through perf_event_open, sampled by the native thread.

Data path: the C sampling thread reads every group each interval and keeps scaled
per-series deltas in a ring; a Python drain thread moves finished ticks into
Arrow batches (column arrays straight from C, no per-row Python) twice a second, and emits them to the session.
Collectors that ride the sampler's tick (ctx.tick_riders: host, threads) are drained by the same
thread about once a second (rider.drain_ridden()): one Python wake-up for all three.

  collector.py  the Collector: events, counters, the sampler, the drain thread
  options.py    its flags on `counterprof run` (-e, --sampling, -A, --per-thread)

The package loads collector.py (numpy, pyarrow, the compiled sampler) on first use of
PerfCollector: `counterprof run` builds its parser from options.py alone, before pyarrow loads.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def __getattr__(name: str) -> Any:
    if name != "PerfCollector":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__name__}.collector"), name)
