"""torch collector: torch.profiler in the workload's processes, Kineto traces -> spans
(collector.py says where each part runs).

The collector's names (TorchCollector, load_driver, ...) load from collector.py on first use:
`counterprof import` reads traces through importer.py alone, and importing this package for it
costs no collector machinery (counterprof.collector, the steps files, the claims: ~6 ms of the
import's start-up).
"""
from __future__ import annotations

TYPE_CHECKING = False     # (typing.TYPE_CHECKING without importing typing: ~2 ms before the scan starts)
if TYPE_CHECKING:
    from typing import Any


# collector.py's names (the entry point names TorchCollector); any other name is a submodule's
# or none: `from . import importer` asks for it here first, and must not load the collector
COLLECTOR_NAMES = ("TorchCollector", "load_driver", "BOOTSTRAP", "DRIVER")


def __getattr__(name: str) -> Any:
    if name not in COLLECTOR_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__name__}.collector"), name)
