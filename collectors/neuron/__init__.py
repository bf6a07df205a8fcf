"""neuron collector: AWS Neuron devices (Trainium, Inferentia) through neuron-monitor and sysfs.

  metrics.py    the catalog: every neuron.* metric, its unit, kind and origin
  topology.py   which device a NeuronCore is on, NEURON_RT_VISIBLE_CORES, neuron-ls -j
  monitor.py    neuron-monitor's config and its JSON lines -> rows (pure), old names accepted
  sysfs.py      /sys/devices/virtual/neuron_device counters -> rows (read only, deltas)
  collector.py  the Collector: the monitor as the profiler's child, the sysfs thread, ranks

Built from the documented formats (aws-neuron-sdk's neuron-monitor, neuron-sysfs and neuron-ls
user guides); it has not run on Neuron hardware.
"""
from .collector import NeuronCollector

__all__ = ["NeuronCollector"]
