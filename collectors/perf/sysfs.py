"""PMUs as the kernel describes them under /sys/bus/event_source/devices.

Each PMU directory has:
  type            the perf_event_attr.type to use
  format/<term>   where a term's bits go, e.g. "config:0-7" or "config:0-7,32-35"
  events/<name>   named events as terms, e.g. "event=0x3c" or "event=0xd0,umask=0x81"
  events/<name>.scale, .unit   how to present the count (energy, bandwidth...)

`root` is the sysfs mount point, so tests can point it at a fake tree.
"""
from __future__ import annotations

import os
import re
from dataclasses import field
from functools import cached_property
from pathlib import Path

from counterprof.ground.errors import EventSyntaxError
from counterprof.ground.record import record

DEVICES = "bus/event_source/devices"
CONFIG_FIELDS = ("config", "config1", "config2")
_FORMAT = re.compile(r"^(config[12]?):(.+)$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_EVENT_FILE_SUFFIXES = (".scale", ".unit", ".per-pkg", ".snapshot")


def parse_format(text: str) -> list[tuple[str, int, int]]:
    """'config:0-7,32-35' -> [('config', 0, 7), ('config', 32, 35)]."""
    m = _FORMAT.match(text.strip())
    if not m:
        raise ValueError(f"unrecognized format {text!r}")
    field_name, ranges = m.groups()
    out = []
    for part in ranges.split(","):
        r = _RANGE.match(part.strip())
        if not r:
            raise ValueError(f"unrecognized bit range {part!r} in {text!r}")
        lo = int(r.group(1))
        hi = int(r.group(2)) if r.group(2) is not None else lo
        if hi < lo or hi > 63:
            raise ValueError(f"bad bit range {part!r} in {text!r}")
        out.append((field_name, lo, hi))
    return out


def parse_int(text: str) -> int:
    """0x.. is hex, digits alone decimal (leading zeros too: 010 is 10, as perf's
    strtoull base 10 reads it); bare hex digits like 3c are taken as hex."""
    text = text.strip()
    if re.fullmatch(r"[0-9]+", text):
        return int(text, 10)
    try:
        return int(text, 0)
    except ValueError:
        if re.fullmatch(r"[0-9a-fA-F]+", text):
            return int(text, 16)
        raise


def parse_terms(text: str) -> list[tuple[str, str | None]]:
    """'event=0x3c,umask=0x1,inv' -> [('event','0x3c'), ('umask','0x1'), ('inv', None)]."""
    terms: list[tuple[str, str | None]] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            terms.append((k.strip(), v.strip()))
        else:
            terms.append((part, None))
    return terms


@record
class Pmu:
    name: str
    type: int
    path: Path
    formats: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)

    @property
    def is_core(self) -> bool:
        """The CPU's own PMU (as opposed to uncore, software, tracepoint, ...)."""
        n = self.name
        return (n in ("cpu", "cpu_core", "cpu_atom") or n.startswith(("armv8_", "armv9_"))
                or "pmuv3" in n)

    @cached_property
    def events(self) -> dict[str, str]:
        """Named events: lower-cased name -> its terms as written in sysfs."""
        d = self.path / "events"
        out: dict[str, str] = {}
        try:
            entries = sorted(os.listdir(d))
        except OSError:
            return out
        for name in entries:
            if name.endswith(_EVENT_FILE_SUFFIXES):
                continue
            try:
                out[name.lower()] = (d / name).read_text().strip()
            except OSError:
                continue
        return out

    def event_extra(self, event: str) -> tuple[float, str]:
        """(scale, unit) of a named event; (1.0, '') when sysfs gives none."""
        scale, unit = 1.0, ""
        base = self.path / "events"
        for name in os.listdir(base) if base.is_dir() else []:
            if name.lower() == f"{event}.scale":
                try:
                    scale = float((base / name).read_text().strip())
                except (OSError, ValueError):
                    pass
            elif name.lower() == f"{event}.unit":
                try:
                    unit = (base / name).read_text().strip()
                except OSError:
                    pass
        return scale, unit

    def encode(self, terms: list[tuple[str, str | None]], event_text: str) -> tuple[int, int, int]:
        """Place each term's value in the bits its format file names."""
        values = {"config": 0, "config1": 0, "config2": 0}
        # a term given twice: the later one wins, so terms written after a named event's
        # own (cpu/mem-loads,ldlat=30/) replace them instead of OR-ing into them
        last = {key: i for i, (key, _) in enumerate(terms)}
        terms = [t for i, t in enumerate(terms) if last[t[0]] == i]
        for key, raw in terms:
            if key in CONFIG_FIELDS:   # direct config=..., always allowed
                if raw is None:
                    raise EventSyntaxError(f"{event_text}: '{key}' needs a value ({key}=0x...)")
                value = _int_term(raw, key, event_text)
                if value >> 64:
                    raise EventSyntaxError(f"{event_text}: {key}={raw} does not fit in 64 bits")
                values[key] = value
                continue
            fmt = self.formats.get(key)
            if fmt is None:
                known = ", ".join(sorted(self.formats)) or "none"
                raise EventSyntaxError(
                    f"{event_text}: PMU '{self.name}' has no term '{key}' "
                    f"(its terms: {known}; see {self.path / 'format'})")
            value = 1 if raw is None else _int_term(raw, key, event_text)
            # as perf's pmu_format_value: the value's bits fill the format's bits from the
            # lowest up, whatever order the ranges are written in and if they overlap
            positions = sorted({(f, b) for f, lo, hi in fmt for b in range(lo, hi + 1)},
                               key=lambda fb: (CONFIG_FIELDS.index(fb[0]), fb[1]))
            width = len(positions)
            if value >> width:
                raise EventSyntaxError(
                    f"{event_text}: {key}={raw} does not fit in the {width} bits "
                    f"PMU '{self.name}' gives it")
            for i, (field_name, bit) in enumerate(positions):
                if value >> i & 1:
                    values[field_name] |= 1 << bit
        return values["config"], values["config1"], values["config2"]


def _int_term(raw: str, key: str, event_text: str) -> int:
    if raw == "?":   # sysfs marks a value the user must give, e.g. a channel mask
        raise EventSyntaxError(f"{event_text}: the event needs a value for '{key}'; "
                               f"add {key}=N between the slashes")
    try:
        value = parse_int(raw)
    except ValueError:
        raise EventSyntaxError(f"{event_text}: {key}={raw} is not a number") from None
    if value < 0:
        raise EventSyntaxError(f"{event_text}: {key}={raw} is negative")
    return value


class Sysfs:
    """The PMUs under <root>/bus/event_source/devices, read lazily."""

    def __init__(self, root: str | os.PathLike[str] = "/sys"):
        self.root = Path(root)

    @cached_property
    def pmus(self) -> dict[str, Pmu]:
        base = self.root / DEVICES
        out: dict[str, Pmu] = {}
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return out
        for name in names:
            d = base / name
            try:
                pmu_type = int((d / "type").read_text().strip())
            except (OSError, ValueError):
                continue
            formats = {}
            fdir = d / "format"
            for term in sorted(os.listdir(fdir)) if fdir.is_dir() else []:
                try:
                    formats[term] = parse_format((fdir / term).read_text())
                except (OSError, ValueError):
                    continue   # a format we do not understand: the term stays unusable
            out[name] = Pmu(name, pmu_type, d, formats)
        return out

    def core_pmus(self) -> list[Pmu]:
        return [p for p in self.pmus.values() if p.is_core]

    def find_event(self, name: str) -> list[tuple[Pmu, str]]:
        """Core PMUs that name this event in sysfs: [(pmu, terms)]."""
        key = name.lower()
        return [(p, p.events[key]) for p in self.core_pmus() if key in p.events]
