"""nvml collector: GPU metrics through nvidia-ml-py (NVML), GPM on Hopper and newer.

  library.py    the one NVML chokepoint (lazy init, shutdown, errors to null, unsupported once)
  devices.py    GPUs by CUDA ordinal: PCI bus order, CUDA_VISIBLE_DEVICES, --gpus
  metrics.py    the catalog and where each metric comes from (fields, GPM ids, sample types)
  sampler.py    one GPU: probe, fast tick, GPM windows, the driver's sample buffers (few NVML calls)
  procs.py      the workload's process tree (for its GPU memory)
  collector.py  the Collector: thread, cadences, emission, failure
  options.py    its flags on `counterprof run`

pynvml is imported only when the collector is used, never here.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def __getattr__(name: str) -> Any:
    """NvmlCollector from collector.py, on first use: `counterprof run` builds its parser from
    options.py alone, before pyarrow loads."""
    if name != "NvmlCollector":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__name__}.collector"), name)
