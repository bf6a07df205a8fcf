"""Where a NeuronCore is: its device, its entity name, the rank that owns it, and the inventory.

NeuronCores are numbered across the machine (neuron-monitor's `neuroncores_in_use` keys,
NEURON_RT_VISIBLE_CORES, neuron-ls's `neuroncore_ids`), so core C is on device
C // cores-per-device, where cores-per-device is the logical count (Trn2 with LNC=2 shows 4
logical NeuronCores per device, each two physical ones).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

NEURON_LS_TIMEOUT_S = 10.0


def parse_core_list(text: str | None) -> list[int] | None:
    """NEURON_RT_VISIBLE_CORES ("0-3", "4,5", "0-1,6") -> [0, 1, 2, 3]; None when unset or bad."""
    if text is None or not text.strip():
        return None
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            return None
        out.extend(c for c in range(a, b + 1) if c not in out)
    return out


@dataclass
class Topology:
    """What the machine is: cores per device (logical), device memory, device count."""

    cores_per_device: int | None = None
    device_count: int | None = None
    device_memory: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)      # neuron_hardware_info as given

    def device_of(self, core: int) -> int:
        # unknown layout: one device holds them all (said in meta.json's neuron facts)
        return core // self.cores_per_device if self.cores_per_device else 0

    def core_entity(self, core: int) -> str:
        return f"neuron:{self.device_of(core)}/core:{core}"

    def update(self, info: dict[str, Any]) -> None:
        """From neuron-monitor's neuron_hardware_info (always in its output)."""
        if not isinstance(info, dict) or info.get("error"):
            return
        per = info.get("neuroncore_per_device_count")
        if isinstance(per, int) and per > 0:
            self.cores_per_device = per
        count = info.get("neuron_device_count")
        if isinstance(count, int) and count >= 0:
            self.device_count = count
        mem = info.get("neuron_device_memory_size")
        if isinstance(mem, (int, float)) and mem > 0:
            self.device_memory = int(mem)
        self.facts = {k: v for k, v in info.items() if k != "error"}


def neuron_ls(command: str = "neuron-ls") -> list[dict[str, Any]] | None:
    """`neuron-ls -j` as a list of devices; None when neuron-ls is not on PATH or fails."""
    exe = shutil.which(command)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-j"], capture_output=True, timeout=NEURON_LS_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        data = json.loads(out.stdout)
    except ValueError:
        return None
    if isinstance(data, dict):     # a wrapper object: its first list of devices
        data = next((v for v in data.values() if isinstance(v, list)), None)
    if not isinstance(data, list):
        return None
    return [d for d in data if isinstance(d, dict)]


def device_rows(devices: list[dict[str, Any]]) -> list[list[str]]:
    """neuron-ls -j devices as `counterprof list` rows."""
    rows = []
    for d in devices:
        idx = d.get("neuron_device")
        mem = d.get("memory_size")
        cores = d.get("neuroncore_ids")
        procs = d.get("neuron_processes") or []
        rows.append([
            f"neuron:{idx}", str(d.get("bdf", "?")), str(d.get("nc_count", "?")),
            str(d.get("logical_neuroncore_config", "-")),
            f"{mem / 2**30:.1f} GiB" if isinstance(mem, (int, float)) and mem else "?",
            ",".join(map(str, cores)) if isinstance(cores, list) else "?",
            ", ".join(f"{p.get('pid')} {p.get('command', '')}".strip() for p in procs if isinstance(p, dict)) or "-",
        ])
    return rows


def own_cores(environ: dict[str, str]) -> list[int] | None:
    """The NeuronCores a process was given (NEURON_RT_VISIBLE_CORES at its exec)."""
    return parse_core_list(environ.get("NEURON_RT_VISIBLE_CORES"))


def sysfs_root(config: dict[str, Any] | None = None) -> str:
    """The Neuron sysfs tree: config "sysfs_root", else COUNTERPROF_NEURON_SYSFS, else the driver's."""
    cfg = config or {}
    return str(cfg.get("sysfs_root") or os.environ.get("COUNTERPROF_NEURON_SYSFS")
               or "/sys/devices/virtual/neuron_device")
