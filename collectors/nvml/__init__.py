"""nvml collector: GPU metrics through nvidia-ml-py (NVML), GPM on Hopper and newer.

  library.py    the one NVML chokepoint (lazy init, shutdown, errors to null, unsupported once)
  devices.py    GPUs by CUDA ordinal: PCI bus order, CUDA_VISIBLE_DEVICES, --gpus
  metrics.py    the catalog and where each metric comes from (fields, GPM ids, sample types)
  sampler.py    one GPU: probe, fast tick, GPM windows, the driver's sample buffer
  procs.py      the workload's process tree (for its GPU memory)
  collector.py  the Collector: thread, cadences, emission, failure

pynvml is imported only when the collector is used, never here.
"""
from .collector import NvmlCollector

__all__ = ["NvmlCollector"]
