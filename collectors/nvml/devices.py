"""Which GPUs the workload sees, named by CUDA ordinal (gpu:N), and how they map to NVML.

NVML numbers devices in PCI bus order; CUDA numbers them in the order CUDA_VISIBLE_DEVICES
lists them, counted from CUDA's own physical order. That physical order is PCI bus order with
CUDA_DEVICE_ORDER=PCI_BUS_ID, and also under CUDA's default FASTEST_FIRST when every GPU is
the same model (ties are broken by PCI bus id). With mixed models and FASTEST_FIRST, CUDA's
order cannot be known from NVML: counterprof uses PCI order and says so.

CUDA_VISIBLE_DEVICES entries are indices, GPU UUIDs (a unique prefix is enough: "GPU-8f3e")
or MIG instances ("MIG-<uuid>" or the older "MIG-GPU-<uuid>/<gi>/<ci>"). As in CUDA, an entry
that names no device ends the list: it and everything after it are not visible. A MIG
instance is sampled as its parent GPU (whole-GPU power, energy, clocks, temperature, memory;
NVML gives no utilization or GPM for a GPU in MIG mode through these calls).
"""
from __future__ import annotations

import os
from dataclasses import field
from typing import Any
from collections.abc import Mapping

from counterprof.ground.errors import UsageError

from .library import Nvml
from counterprof.ground.record import record


@record
class Gpu:
    nvml_index: int
    handle: Any
    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int | None
    mig: bool = False
    ordinal: int = -1            # CUDA ordinal as the workload sees it; -1 = not visible
    via: str = ""                # the CUDA_VISIBLE_DEVICES entry that selected it
    notes: list[str] = field(default_factory=list)

    @property
    def entity(self) -> str:
        return f"gpu:{self.ordinal}"

    def facts(self, driver_version: str | None) -> dict[str, Any]:
        """One entry of meta.json's "gpus"."""
        return {"index": self.ordinal, "name": self.name, "uuid": self.uuid,
                "pci_bus_id": self.pci_bus_id, "nvml_index": self.nvml_index,
                "driver_version": driver_version, "memory_total_bytes": self.memory_total,
                "mig_mode": self.mig, **({"visible_as": self.via} if self.via else {})}


def pci_key(bus_id: str) -> tuple[int, ...]:
    """"00000000:17:00.0" -> (0, 0x17, 0, 0), so short and long forms sort alike."""
    try:
        dom, bus, rest = bus_id.strip().split(":")
        dev, fn = rest.split(".")
        return (int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16))
    except ValueError:
        return (1 << 32, 0, 0, 0)


def physical_gpus(nvml: Nvml) -> list[Gpu]:
    """Every GPU NVML can open, in PCI bus order (CUDA's physical order, see above)."""
    count = nvml.call("nvmlDeviceGetCount") or 0
    gpus = []
    for i in range(count):
        handle = nvml.call("nvmlDeviceGetHandleByIndex", i, where=f"nvml:{i}")
        if handle is None:      # e.g. no permission on this device: CUDA cannot use it either
            continue
        pci = nvml.call("nvmlDeviceGetPciInfo", handle, where=f"nvml:{i}")
        mem = nvml.call("nvmlDeviceGetMemoryInfo", handle, where=f"nvml:{i}")
        mig = nvml.call("nvmlDeviceGetMigMode", handle, where=f"nvml:{i}")
        gpus.append(Gpu(
            nvml_index=i, handle=handle,
            name=str(nvml.call("nvmlDeviceGetName", handle, where=f"nvml:{i}") or "?"),
            uuid=str(nvml.call("nvmlDeviceGetUUID", handle, where=f"nvml:{i}") or ""),
            pci_bus_id=str(pci.busId) if pci is not None else "",
            memory_total=int(mem.total) if mem is not None else None,
            mig=bool(mig is not None and mig[0] == nvml.const("NVML_DEVICE_MIG_ENABLE", 1))))
    gpus.sort(key=lambda g: pci_key(g.pci_bus_id))
    return gpus


def _mig_parent_uuid(nvml: Nvml, entry: str) -> str | None:
    if entry.startswith("MIG-GPU-"):          # MIG-GPU-<parent uuid>/<gi>/<ci> (CUDA < 11.5)
        return entry[len("MIG-"):].split("/")[0]
    handle = nvml.call("nvmlDeviceGetHandleByUUID", entry)
    if handle is None:
        return None
    parent = nvml.call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
    return nvml.call("nvmlDeviceGetUUID", parent) if parent is not None else None


def visible_gpus(nvml: Nvml, physical: list[Gpu], cuda_visible: str | None) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves visible, in CUDA ordinal order, ordinals set."""
    if cuda_visible is None:
        chosen = [(g, "") for g in physical]
    else:
        chosen = []
        for raw in cuda_visible.split(","):
            entry = raw.strip()
            gpu = None
            if entry.isdigit():
                i = int(entry)
                gpu = physical[i] if i < len(physical) else None
            elif entry.startswith("GPU-"):
                matches = [g for g in physical if g.uuid.startswith(entry)]
                gpu = matches[0] if len(matches) == 1 else None
            elif entry.startswith("MIG-"):
                parent = _mig_parent_uuid(nvml, entry)
                gpu = next((g for g in physical if parent and g.uuid == parent), None)
                if gpu is not None:
                    gpu.notes.append(f"MIG instance {entry}: sampled as its parent GPU")
            if gpu is None:
                break                     # as CUDA: an entry naming no device ends the list
            if any(g is gpu for g, _ in chosen):
                continue                  # listed twice: sampled once
            chosen.append((gpu, entry))
    out = []
    for ordinal, (gpu, entry) in enumerate(chosen):
        gpu.ordinal, gpu.via = ordinal, entry
        out.append(gpu)
    return out


def order_warning(gpus: list[Gpu], environ: Mapping[str, str]) -> str | None:
    if environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        return None
    if len({g.name for g in gpus}) > 1:
        return ("the GPUs are of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA "
                "numbers them fastest first, which NVML cannot know, so gpu:N follows PCI order and "
                "may differ from cuda:N; set CUDA_DEVICE_ORDER=PCI_BUS_ID to make them agree")
    return None


def parse_gpus(value: Any) -> list[int] | None:
    """--gpus "0,1" (or a list) -> [0, 1]; None = every visible GPU."""
    if value is None or value == "" or value == "all":
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        text = str(item).strip()
        if not text.isdigit():
            raise UsageError(f"--gpus {value}: {text!r} is not a GPU number (give CUDA ordinals "
                             "such as 0,1, as the workload sees them)")
        if int(text) not in out:
            out.append(int(text))
    return out


def select(visible: list[Gpu], wanted: list[int] | None, environ: Mapping[str, str]) -> list[Gpu]:
    """The visible GPUs --gpus asks for; UsageError for one that does not exist."""
    if wanted is None:
        return visible
    missing = [i for i in wanted if i >= len(visible)]
    if missing:
        have = ", ".join(f"gpu:{g.ordinal} {g.name}" for g in visible) or "none"
        cvd = environ.get("CUDA_VISIBLE_DEVICES")
        scope = f" with CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else ""
        raise UsageError(
            f"--gpus {','.join(map(str, wanted))}: no GPU {', '.join(map(str, missing))} here; "
            f"{len(visible)} GPU(s) visible{scope} ({have}). GPUs are numbered by CUDA ordinal, "
            "as the workload sees them")
    return [visible[i] for i in wanted]


def discover(nvml: Nvml, environ: Mapping[str, str] | None = None) -> tuple[list[Gpu], list[str]]:
    """(the GPUs the workload can see, in CUDA ordinal order; warnings)."""
    environ = os.environ if environ is None else environ
    visible = visible_gpus(nvml, physical_gpus(nvml), environ.get("CUDA_VISIBLE_DEVICES"))
    warning = order_warning(visible, environ)
    return visible, [warning] if warning else []
