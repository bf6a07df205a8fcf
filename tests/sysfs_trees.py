"""Fake sysfs trees shaped like real machines, for the event parser and PMU tests.

Each builder writes <root>/bus/event_source/devices/<pmu>/{type,format/*,events/*} the way
the kernel lays them out (one value per file, trailing newline) and returns <root>, ready
for Sysfs(root). Formats and events are copied from what those machines expose, trimmed
to what the tests need.
"""
from __future__ import annotations

from pathlib import Path

DEVICES = "bus/event_source/devices"


def write_pmu(root: Path, name: str, type_: int | str | None, formats: dict[str, str] | None = None,
              events: dict[str, str] | None = None) -> Path:
    """One PMU directory. `events` may hold companions too: "energy-pkg.scale": "2.3e-10".
    type_=None leaves the type file out (a PMU the kernel half-registered)."""
    d = Path(root) / DEVICES / name
    d.mkdir(parents=True, exist_ok=True)
    if type_ is not None:
        (d / "type").write_text(f"{type_}\n")
    if formats is not None:
        (d / "format").mkdir(exist_ok=True)
        for term, spec in formats.items():
            (d / "format" / term).write_text(f"{spec}\n")
    if events is not None:
        (d / "events").mkdir(exist_ok=True)
        for ev, terms in events.items():
            (d / "events" / ev).write_text(f"{terms}\n")
    return d


def _software_pmus(root: Path) -> None:
    # always there, never core: a bare event name must not resolve through them
    write_pmu(root, "software", 1)
    write_pmu(root, "tracepoint", 2)
    write_pmu(root, "breakpoint", 5, {"bp_type": "config:0-3"})


# ---- Intel Icelake / Sapphire Rapids -------------------------------------------------

ICX_CPU_TYPE = 4
ICX_POWER_TYPE = 23
ICX_FORMATS = {
    "event": "config:0-7",
    "umask": "config:8-15",
    "edge": "config:18",
    "pc": "config:19",
    "any": "config:21",
    "inv": "config:23",
    "cmask": "config:24-31",
    "in_tx": "config:32",
    "in_tx_cp": "config:33",
    "frontend": "config1:0-23",
    "ldlat": "config1:0-15",
    "offcore_rsp": "config1:0-63",
}
ICX_EVENTS = {
    "cpu-cycles": "event=0x3c",
    "instructions": "event=0xc0",
    "branch-instructions": "event=0xc4",
    "branch-misses": "event=0xc5",
    "bus-cycles": "event=0x3c,umask=0x01",
    "cache-misses": "event=0x2e,umask=0x41",
    "cache-references": "event=0x2e,umask=0x4f",
    "ref-cycles": "event=0x00,umask=0x03",
    "topdown-retiring": "event=0x00,umask=0x80",
    "topdown-bad-spec": "event=0x00,umask=0x81",
    "topdown-fe-bound": "event=0x00,umask=0x82",
    "topdown-be-bound": "event=0x00,umask=0x83",
    "slots": "event=0x00,umask=0x4",
    "mem-loads": "event=0xcd,umask=0x1,ldlat=3",
    "mem-stores": "event=0xcd,umask=0x2",
}
# RAPL: energy in units of 2^-32 J; the core PMU list never includes it
ICX_POWER_EVENTS = {
    "energy-pkg": "event=0x02",
    "energy-pkg.scale": "2.3283064365386962890625e-10",
    "energy-pkg.unit": "Joules",
    "energy-ram": "event=0x03",
    "energy-ram.scale": "6.103515625e-05",
    "energy-ram.unit": "Joules",
}


def intel_icelake(root: Path) -> Path:
    root = Path(root)
    write_pmu(root, "cpu", ICX_CPU_TYPE, ICX_FORMATS, ICX_EVENTS)
    write_pmu(root, "power", ICX_POWER_TYPE, {"event": "config:0-7"}, ICX_POWER_EVENTS)
    write_pmu(root, "msr", 11, {"event": "config:0-63"}, {"tsc": "event=0x00", "aperf": "event=0x01"})
    write_pmu(root, "uncore_imc_0", 14, {"event": "config:0-7", "umask": "config:8-15"},
              {"cas_count_read": "event=0x04,umask=0x0f", "cas_count_read.scale": "64",
               "cas_count_read.unit": "Bytes"})
    _software_pmus(root)
    return root


# ---- AMD Zen --------------------------------------------------------------------------

ZEN_CPU_TYPE = 4
ZEN_DF_TYPE = 10
ZEN_FORMATS = {
    "event": "config:0-7,32-35",    # 12-bit event select split across two ranges
    "umask": "config:8-15",
    "edge": "config:18",
    "inv": "config:23",
    "cmask": "config:24-31",
}
ZEN_EVENTS = {
    "cpu-cycles": "event=0x76",
    "instructions": "event=0xc0",
    "branch-instructions": "event=0xc2",
    "branch-misses": "event=0xc3",
}


def amd_zen(root: Path) -> Path:
    root = Path(root)
    write_pmu(root, "cpu", ZEN_CPU_TYPE, ZEN_FORMATS, ZEN_EVENTS)
    # data fabric: a 14-bit event select in three ranges
    write_pmu(root, "amd_df", ZEN_DF_TYPE, {"event": "config:0-7,32-35,59-60", "umask": "config:8-15"})
    write_pmu(root, "amd_l3", 11, {"event": "config:0-7", "umask": "config:8-15",
                                   "slicemask": "config:48-51", "threadmask": "config:56-63"})
    write_pmu(root, "ibs_op", 12, {"cnt_ctl": "config:19"})
    _software_pmus(root)
    return root


# ---- Arm Neoverse -----------------------------------------------------------------------

ARM_PMU = "armv8_pmuv3_0"
ARM_CPU_TYPE = 8
ARM_CMN_TYPE = 10
ARM_FORMATS = {
    "event": "config:0-15",
    "long": "config1:0",            # chain into a 64-bit counter
}
ARM_EVENTS = {
    "cpu_cycles": "event=0x0011",
    "inst_retired": "event=0x0008",
    "br_mis_pred": "event=0x0010",
    "l1d_cache_refill": "event=0x0003",
    "stall_frontend": "event=0x0023",
    "stall_backend": "event=0x0024",
    "stall_backend_mem": "event=0x4005",
    "stall_slot": "event=0x003f",
}


def arm_neoverse(root: Path) -> Path:
    root = Path(root)
    write_pmu(root, ARM_PMU, ARM_CPU_TYPE, ARM_FORMATS, ARM_EVENTS)
    write_pmu(root, "arm_cmn_0", ARM_CMN_TYPE,
              {"type": "config:0-15", "eventid": "config:16-26", "nodeid": "config:32-47"},
              {"hnf_cache_miss": "type=0x0005,eventid=0x0001"})
    _software_pmus(root)
    return root


# ---- Intel hybrid (Alder Lake-like) ----------------------------------------------------

HYBRID_CORE_TYPE = 4
HYBRID_ATOM_TYPE = 10


def intel_hybrid(root: Path) -> Path:
    """cpu_core (P cores) and cpu_atom (E cores) both name topdown-retiring, with different
    encodings and types; slots is P-core only."""
    root = Path(root)
    write_pmu(root, "cpu_core", HYBRID_CORE_TYPE, ICX_FORMATS, {
        "cpu-cycles": "event=0x3c",
        "topdown-retiring": "event=0x00,umask=0x80",
        "topdown-be-bound": "event=0x00,umask=0x83",
        "slots": "event=0x00,umask=0x4",
    })
    write_pmu(root, "cpu_atom", HYBRID_ATOM_TYPE, {
        "event": "config:0-7", "umask": "config:8-15", "edge": "config:18",
        "inv": "config:23", "cmask": "config:24-31",
    }, {
        "cpu-cycles": "event=0x3c",
        "topdown-retiring": "event=0xc2,umask=0x0",
        "topdown-be-bound": "event=0x74,umask=0x0",
    })
    _software_pmus(root)
    return root
