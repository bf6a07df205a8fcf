"""torch collector: torch.profiler in the workload's processes, Kineto traces -> spans
(collector.py says where each part runs).

The collector's names (TorchCollector, load_driver, ...) load from collector.py on first use:
`counterprof import` reads traces through importer.py alone, and importing this package for it
costs no collector machinery (counterprof.collector, the steps files, the claims: ~6 ms of the
import's start-up).
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib
    collector = importlib.import_module(f"{__name__}.collector")
    return collector if name == "collector" else getattr(collector, name)
