"""The Neuron driver's sysfs tree (neuron-sysfs-user-guide.rst), read without neuron-monitor.

  <root>/neuronN/core_count
  <root>/neuronN/neuron_coreM/stats/other_info/flop_count       FLOPs so far
  <root>/neuronN/neuron_coreM/stats/other_info/nc_time_in_use   µs executing
  <root>/neuronN/neuron_coreM/stats/memory_usage/device_mem/<category>/{total,present,peak}
  <root>/neuronN/stats/power/utilization     "<status>,<unix s>,<min>,<max>,<avg>" (% of max, per minute)

The guide draws other_info's entries as plain files and most counters as directories holding
`total` and `present`: both are read (a directory's `total`). Files are only ever opened for
reading: writing to a counter clears it. flop_count and nc_time_in_use become deltas between
reads (a counter that goes back was cleared: that interval has no row, the next one does);
a memory category's `total` is its current use (memory and power are read once a second,
the counters every tick). NeuronCore M of device N is core
N * core_count + M, the machine-wide number neuron-monitor uses.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterable

from .monitor import Row
from .topology import MAX_CORE, MAX_DEVICE

POWER_VALID = "POWER_STATUS_VALID"
SLOW_EVERY_NS = 1_000_000_000      # memory (a dozen files a core) and power: gauges, once a second
MAX_READ = 256                     # a counter or the power line is a few dozen bytes
MAX_CATEGORIES = 64                # memory categories a core lists (the guide has 11)


def read_text(path: str) -> str | None:
    """At most MAX_READ bytes of a file, opened read only (a write would clear a counter) and
    non-blocking: a path that is (or links to) a FIFO, /dev/zero or a huge file does not hang
    or fill memory. None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, MAX_READ).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_number(path: str) -> float | None:
    """A counter's value: the file's number, or a counter directory's `total`. None when the
    file is missing, empty, not a number, negative, NaN or infinite (nothing to count from)."""
    if os.path.isdir(path):
        path = os.path.join(path, "total")
    text = read_text(path)
    if not text or not text.strip():
        return None
    try:
        v = float(text.split()[0])
    except ValueError:
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _numbered(root: str, prefix: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out = []
    for n in names:
        num = n[len(prefix):]
        if n.startswith(prefix) and 0 < len(num) <= 4 and num.isascii() and num.isdigit():
            out.append((int(num), os.path.join(root, n)))
    return sorted(out)


def devices(root: str) -> list[tuple[int, str]]:
    """(device index, its directory) for each neuronN under root."""
    return [(i, d) for i, d in _numbered(root, "neuron") if i <= MAX_DEVICE]


def present(root: str) -> bool:
    return bool(devices(root))


def cores(device_dir: str) -> list[tuple[int, str]]:
    return _numbered(device_dir, "neuron_core")


def core_count(device_dir: str) -> int:
    """The device's core_count file when it is a sane whole number, else its neuron_coreM count."""
    n = read_number(os.path.join(device_dir, "core_count"))
    if n is not None and n.is_integer() and 1 <= n <= MAX_CORE + 1:
        return int(n)
    return len(cores(device_dir))


def parse_power(text: str) -> tuple[int, float] | None:
    """"POWER_STATUS_VALID,1700000000,10.00,55.00,32.50" -> (timestamp, avg); None otherwise."""
    parts = [p.strip() for p in text.strip().split(",")]
    if len(parts) != 5 or parts[0] != POWER_VALID:
        return None
    try:
        stamp, avg = int(parts[1]), float(parts[4])
    except ValueError:
        return None
    return (stamp, avg) if math.isfinite(avg) and avg >= 0 else None


def inventory_rows(root: str) -> list[list[str]]:
    rows = []
    for idx, d in devices(root):
        name = ""
        for rel in ("info/architecture/device_name", "info/architecture/device_type"):
            text = read_text(os.path.join(d, rel))
            if text is not None:
                name = text.strip()[:64]
                break
        rows.append([f"neuron:{idx}", name or "?", str(core_count(d))])
    return rows


class SysfsSampler:
    """Reads the counters of the chosen NeuronCores each tick; keeps the previous reading."""

    def __init__(self, root: str):
        self.root = root
        self.layout: list[tuple[int, int, str]] = []     # (device, core number, core dir)
        self.device_dirs: dict[int, str] = {}
        for dev, ddir in devices(root):
            self.device_dirs[dev] = ddir
            per = core_count(ddir)
            for m, cdir in cores(ddir):
                self.layout.append((dev, dev * per + m, cdir))
        self.prev: dict[tuple[int, str], tuple[float, int]] = {}
        self.files: dict[str, str] = {}            # a counter's path -> the file holding its value
        self.slow_at: int | None = None            # memory and power: once a second

    def _read(self, path: str) -> float | None:
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = os.path.join(path, "total") if os.path.isdir(path) else path
        return read_number(f)

    def tick(self, now_ns: int, wanted: set[int] | None) -> list[Row]:
        """Rows for the cores in `wanted` (None: every core) and their devices. The others are
        read once, so that a core the workload is found to use later counts from the start."""
        rows: list[Row] = []
        devs = set()
        slow = self.slow_at is None or now_ns - self.slow_at >= SLOW_EVERY_NS
        if slow:
            self.slow_at = now_ns
        for dev, core, cdir in self.layout:
            chosen = wanted is None or core in wanted
            ent = f"neuron:{dev}/core:{core}"
            other = os.path.join(cdir, "stats", "other_info")
            for name, metric, scale in (("flop_count", "neuron.flop_count", 1.0),
                                        ("nc_time_in_use", "neuron.nc_time_in_use", 1e-6)):
                key = (core, name)
                if not chosen and key in self.prev:
                    continue   # a core not (yet) the workload's keeps its first reading as the baseline
                v = self._read(os.path.join(other, name))
                if v is None:
                    continue
                before = self.prev.get(key)
                self.prev[key] = (v, now_ns)
                if not chosen:
                    continue
                if before is not None and v >= before[0] and now_ns > before[1]:
                    rows.append(Row(now_ns - before[1], metric, ent, (v - before[0]) * scale, None, core))
            if not chosen or not slow:
                continue
            devs.add(dev)
            used = self._device_mem(os.path.join(cdir, "stats", "memory_usage", "device_mem"))
            if used is not None:
                rows.append(Row(None, "neuron.sysfs_device_mem_used", ent, used, None, core))
        for dev in sorted(devs):
            rows.extend(self._power(dev))
        return rows

    @staticmethod
    def _device_mem(mem_dir: str) -> float | None:
        try:
            names = sorted(os.listdir(mem_dir))[:MAX_CATEGORIES]
        except OSError:
            return None
        vals = [v for v in (read_number(os.path.join(mem_dir, n)) for n in names) if v is not None]
        total = sum(vals)
        return total if vals and math.isfinite(total) else None

    def _power(self, dev: int) -> Iterable[Row]:
        text = read_text(os.path.join(self.device_dirs[dev], "stats", "power", "utilization"))
        got = parse_power(text) if text is not None else None
        if got is None:
            return []
        # the driver's figure changes once a minute; a gauge every tick like the others
        return [Row(None, "neuron.power_util", f"neuron:{dev}", got[1], None, None)]
