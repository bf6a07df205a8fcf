"""Fakes of the Neuron tools and driver for tests: no Neuron hardware here.

BIN holds executables named like the real ones (neuron-monitor, neuron-ls): put it first on
PATH. make_sysfs() writes a tree laid out as neuron-sysfs-user-guide.rst describes; the test
(or its workload) moves the counters with bump(), as the hardware would.
"""
from __future__ import annotations

import os
from pathlib import Path

BIN = Path(__file__).parent / "bin"
HOSTILE_BIN = Path(__file__).parent / "hostile"     # a misbehaving neuron-monitor
DATA = Path(__file__).parent.parent / "data" / "neuron"

MEM_CATEGORIES = ("collectives", "constants", "dma_rings", "driver_memory", "model_code",
                  "model_shared_scratchpad", "nonshared_scratchpad", "notifications",
                  "runtime_memory", "tensors", "uncategorized")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_sysfs(root: Path, devices: int = 1, cores: int = 2, *, counter_dirs: bool = False,
               power: str = "POWER_STATUS_VALID,1700000000,10.00,55.00,32.50\n") -> Path:
    """neuronN/{core_count, info/architecture/device_name, stats/power/utilization} and
    neuron_coreM/stats/{other_info/flop_count, other_info/nc_time_in_use,
    memory_usage/device_mem/<category>/{total,present,peak}, status/success/{total,present}}.
    counter_dirs: other_info entries as counter directories (total/present) instead of files."""
    for d in range(devices):
        dev = root / f"neuron{d}"
        _write(dev / "core_count", f"{cores}\n")
        _write(dev / "info" / "architecture" / "device_name", "Trainium2\n")
        _write(dev / "stats" / "power" / "utilization", power)
        for m in range(cores):
            core = dev / f"neuron_core{m}" / "stats"
            for name in ("flop_count", "nc_time_in_use"):
                if counter_dirs:
                    _write(core / "other_info" / name / "total", "0\n")
                    _write(core / "other_info" / name / "present", "0\n")
                else:
                    _write(core / "other_info" / name, "0\n")
            for cat in MEM_CATEGORIES:
                used = 1 << 20 if cat in ("constants", "tensors") else 0
                for f in ("total", "present", "peak"):
                    _write(core / "memory_usage" / "device_mem" / cat / f, f"{used}\n")
            for f in ("total", "present"):
                _write(core / "status" / "success" / f, "0\n")
    return root


def bump(root: Path, device: int, core: int, flops: int = 0, us: int = 0) -> None:
    """Advance a NeuronCore's flop_count and nc_time_in_use (file or counter directory)."""
    other = Path(root) / f"neuron{device}" / f"neuron_core{core}" / "stats" / "other_info"
    for name, add in (("flop_count", flops), ("nc_time_in_use", us)):
        p = other / name
        p = p / "total" if p.is_dir() else p
        tmp = p.with_suffix(".tmp")
        tmp.write_text(f"{int(p.read_text()) + add}\n")
        os.replace(tmp, p)      # whole values only, as the driver's reads are


def path_with_fakes(env: dict | None = None, bin_dir: Path = BIN) -> dict:
    env = dict(os.environ if env is None else env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env
