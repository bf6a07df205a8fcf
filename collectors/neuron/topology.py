"""Where a NeuronCore is: its device, its entity name, the rank that owns it, and the inventory.

NeuronCores are numbered across the machine (neuron-monitor's `neuroncores_in_use` keys,
NEURON_RT_VISIBLE_CORES, neuron-ls's `neuroncore_ids`), so core C is on device
C // cores-per-device, where cores-per-device is the logical count (Trn2 with LNC=2 shows 4
logical NeuronCores per device, each two physical ones).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import field
from typing import Any
from counterprof.ground.pathsearch import which
from counterprof.ground.record import record

NEURON_LS_TIMEOUT_S = 10.0
NEURON_LS_MAX_BYTES = 4 << 20       # a device list; 16 devices are a few kB
# NeuronCore numbers are machine-wide: a trn2.48xlarge has 64 logical (128 physical). Anything
# past this is not a core number (a typo, "1e9", a fuzzed key), and would make lists unbounded.
MAX_CORE = 4095
MAX_DEVICE = 1023


def core_number(text: Any) -> int | None:
    """"12" -> 12; None for anything else ("-1", "1e9", "abc", "²", " 3", past MAX_CORE)."""
    if not isinstance(text, str) or not (0 < len(text) <= 4 and text.isascii() and text.isdigit()):
        return None
    n = int(text)
    return n if n <= MAX_CORE else None


def parse_core_list(text: str | None) -> list[int] | None:
    """NEURON_RT_VISIBLE_CORES ("0-3", "4,5", "0-1,6") -> [0, 1, 2, 3]; None when unset or bad."""
    if text is None or not text.strip():
        return None
    out: dict[int, None] = {}        # ordered, and no quadratic dedup for a wide range
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        a, b = core_number(lo.strip()), core_number(hi.strip()) if sep else core_number(lo.strip())
        if a is None or b is None or b < a:
            return None
        out.update(dict.fromkeys(range(a, b + 1)))
    return list(out)


@record
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
        """From neuron-monitor's neuron_hardware_info (always in its output). Values out of any
        real machine's range are left out: they would divide core numbers or fill meta.json."""
        if not isinstance(info, dict) or info.get("error"):
            return
        per = _whole(info.get("neuroncore_per_device_count"), 1, MAX_CORE + 1)
        if per is not None:
            self.cores_per_device = per
        count = _whole(info.get("neuron_device_count"), 0, MAX_DEVICE + 1)
        if count is not None:
            self.device_count = count
        mem = _whole(info.get("neuron_device_memory_size"), 1, 1 << 50)
        if mem is not None:
            self.device_memory = mem
        self.facts = {str(k)[:64]: v if not isinstance(v, str) else v[:200]
                      for k, v in list(info.items())[:32] if k != "error" and _scalar(v)}


def _whole(v: Any, lo: int, hi: int) -> int | None:
    """An int in [lo, hi]: JSON's 4 or 4.0, not true, "4", 1e308 or NaN."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        return None
    return int(v) if lo <= v <= hi else None


def _scalar(v: Any) -> bool:
    """What meta.json can hold as a fact: a string, a bool, a finite number, null."""
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return abs(v) < 1 << 63
    return v is None or isinstance(v, (str, bool))


def neuron_ls(command: str = "neuron-ls") -> list[dict[str, Any]] | None:
    """`neuron-ls -j` as a list of devices; None when neuron-ls is not on PATH or fails. Run
    as the monitor is (child.py): a helper it forks holding its stdout, or output without end,
    cannot hang or fill `counterprof list` (subprocess.run's timeout waits for EOF)."""
    import subprocess
    from .child import MonitorProcess

    exe = which(command)
    if exe is None:
        return None
    ls = MonitorProcess([exe, "-j"])
    try:
        ls.spawn()
    except OSError:
        return None
    proc = ls.proc
    assert proc is not None         # spawned
    lines: list[bytes] = []
    size = [0]

    def take(line: bytes) -> None:
        size[0] += len(line) + 1
        if size[0] <= NEURON_LS_MAX_BYTES:
            lines.append(line)

    def too_long(n: int) -> None:
        size[0] += n

    deadline = time.monotonic() + NEURON_LS_TIMEOUT_S
    try:
        ls.pump(take, too_long, lambda: None,
                lambda: (time.monotonic() > deadline or size[0] > NEURON_LS_MAX_BYTES
                         or proc.poll() is not None))     # exited: what it wrote is in the pipe
        try:
            rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = None
    finally:
        ls.kill(1.0)           # it, and any helper it left
        ls.close()
    if rc != 0 or size[0] > NEURON_LS_MAX_BYTES:
        return None
    try:
        data = json.loads(b"\n".join(lines))
    except (ValueError, RecursionError):
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
        procs = d.get("neuron_processes")
        procs = procs if isinstance(procs, list) else []
        size = mem if isinstance(mem, (int, float)) and not isinstance(mem, bool) and 0 < mem < 1 << 60 else None
        rows.append([
            f"neuron:{idx}", str(d.get("bdf", "?")), str(d.get("nc_count", "?")),
            str(d.get("logical_neuroncore_config", "-")),
            f"{size / 2**30:.1f} GiB" if size else "?",
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
