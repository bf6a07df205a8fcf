"""neuron collector: AWS Neuron devices (Trainium, Inferentia) through neuron-monitor and sysfs.

  metrics.py    the catalog: every neuron.* metric, its unit, kind and origin
  topology.py   which device a NeuronCore is on, NEURON_RT_VISIBLE_CORES, neuron-ls -j
  monitor.py    neuron-monitor's config and its JSON lines -> rows (pure), old names accepted
  sysfs.py      /sys/devices/virtual/neuron_device counters -> rows (read only, deltas)
  collector.py  the Collector: the monitor as the profiler's child, the sysfs thread, ranks
  options.py    its flags on `counterprof run`

Built from the documented formats (aws-neuron-sdk's neuron-monitor, neuron-sysfs and neuron-ls
user guides); it has not run on Neuron hardware.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def __getattr__(name: str) -> Any:
    """NeuronCollector from collector.py, on first use: `counterprof run` builds its parser from
    options.py alone, before pyarrow loads."""
    if name != "NeuronCollector":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__name__}.collector"), name)
