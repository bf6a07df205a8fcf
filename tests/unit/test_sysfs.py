"""PMU discovery and term encoding from sysfs (format/, events/, type), on fake trees."""
from __future__ import annotations

from pathlib import Path

import pytest

from counterprof.collectors.perf.sysfs import Pmu, Sysfs, parse_format, parse_int, parse_terms
from counterprof.ground.errors import EventSyntaxError

import sysfs_trees as trees  # tests/, on sys.path through pytest's pythonpath


# ---- parse_format -------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("config:18", [("config", 18, 18)]),
    ("config:0-7", [("config", 0, 7)]),
    ("config:0-7,32-35", [("config", 0, 7), ("config", 32, 35)]),
    ("config:0-7,32-35,59-60", [("config", 0, 7), ("config", 32, 35), ("config", 59, 60)]),
    ("config1:0-23", [("config1", 0, 23)]),
    ("config1:0", [("config1", 0, 0)]),
    ("config2:0-63", [("config2", 0, 63)]),
    ("config:63", [("config", 63, 63)]),
    ("config:0-7\n", [("config", 0, 7)]),     # as read from the file
    ("  config:24-31  ", [("config", 24, 31)]),
])
def test_parse_format(text, expected):
    assert parse_format(text) == expected


@pytest.mark.parametrize("text", [
    "", "config", "config:", "config:a-b", "config:7-0", "config:0-64", "config:64",
    "config:0-7,", "config:0-7;8", "conf:0-7", "config4:0-7", "0-7", "config:-1", "config:0--7",
])
def test_parse_format_rejects_malformed(text):
    with pytest.raises(ValueError):
        parse_format(text)


# ---- parse_terms / parse_int ------------------------------------------------------------------

def test_parse_terms():
    assert parse_terms("event=0x3c,umask=0x1,inv") == [("event", "0x3c"), ("umask", "0x1"), ("inv", None)]
    assert parse_terms(" event = 0x3c , cmask=1 \n") == [("event", "0x3c"), ("cmask", "1")]
    assert parse_terms("") == []
    assert parse_terms("a,,b") == [("a", None), ("b", None)]
    assert parse_terms("name=x=y") == [("name", "x=y")]


@pytest.mark.parametrize("text, value", [
    ("0x3c", 0x3C), ("0X3C", 0x3C), ("60", 60), ("0", 0), ("0x0000", 0),
    ("010", 10),        # perf reads digits in base 10, leading zeros or not
    ("0010", 10),
    ("3c", 0x3C),       # bare hex digits: taken as hex
    (" 0x4005\n", 0x4005),
    ("0xffffffffffffffff", (1 << 64) - 1),
])
def test_parse_int(text, value):
    assert parse_int(text) == value


@pytest.mark.parametrize("text", ["", "0xzz", "abcg", "?", "1.5"])
def test_parse_int_rejects(text):
    with pytest.raises(ValueError):
        parse_int(text)


# ---- discovery --------------------------------------------------------------------------------

def test_missing_root_has_no_pmus(tmp_path):
    sysfs = Sysfs(str(tmp_path / "nope"))
    assert sysfs.pmus == {}
    assert sysfs.core_pmus() == []
    assert sysfs.find_event("cpu-cycles") == []


def test_root_without_devices_dir_has_no_pmus(tmp_path):
    (tmp_path / "bus").mkdir()
    assert Sysfs(tmp_path).pmus == {}


def test_icelake_pmus(tmp_path):
    sysfs = Sysfs(str(trees.intel_icelake(tmp_path)))
    assert sorted(sysfs.pmus) == ["breakpoint", "cpu", "msr", "power", "software", "tracepoint",
                                  "uncore_imc_0"]
    assert {n: p.type for n, p in sysfs.pmus.items()} == {
        "breakpoint": 5, "cpu": 4, "msr": 11, "power": 23, "software": 1, "tracepoint": 2,
        "uncore_imc_0": 14}
    assert [p.name for p in sysfs.core_pmus()] == ["cpu"]
    cpu = sysfs.pmus["cpu"]
    assert cpu.path == tmp_path / "bus/event_source/devices/cpu"
    assert cpu.formats == {
        "event": [("config", 0, 7)], "umask": [("config", 8, 15)], "edge": [("config", 18, 18)],
        "pc": [("config", 19, 19)], "any": [("config", 21, 21)], "inv": [("config", 23, 23)],
        "cmask": [("config", 24, 31)], "in_tx": [("config", 32, 32)],
        "in_tx_cp": [("config", 33, 33)], "frontend": [("config1", 0, 23)],
        "ldlat": [("config1", 0, 15)], "offcore_rsp": [("config1", 0, 63)],
    }
    assert cpu.events == trees.ICX_EVENTS
    assert sysfs.pmus["software"].formats == {} and sysfs.pmus["software"].events == {}


def test_events_skip_companion_files_and_lowercase_names(tmp_path):
    trees.write_pmu(tmp_path, "power", 23, {"event": "config:0-7"}, {
        "energy-pkg": "event=0x02", "energy-pkg.scale": "2.3283064365386962890625e-10",
        "energy-pkg.unit": "Joules", "energy-pkg.per-pkg": "1", "energy-pkg.snapshot": "1",
        "Energy-Cores": "event=0x01",
    })
    (tmp_path / "bus/event_source/devices/power/events/subdir").mkdir()   # unreadable as a file
    power = Sysfs(tmp_path).pmus["power"]
    assert power.events == {"energy-pkg": "event=0x02", "energy-cores": "event=0x01"}


def test_event_scale_and_unit(tmp_path):
    sysfs = Sysfs(trees.intel_icelake(tmp_path))
    power = sysfs.pmus["power"]
    assert power.event_extra("energy-pkg") == (2.3283064365386962890625e-10, "Joules")
    assert power.event_extra("energy-ram") == (6.103515625e-05, "Joules")
    assert sysfs.pmus["uncore_imc_0"].event_extra("cas_count_read") == (64.0, "Bytes")
    assert sysfs.pmus["cpu"].event_extra("cpu-cycles") == (1.0, "")
    assert sysfs.pmus["software"].event_extra("anything") == (1.0, "")   # no events dir


def test_bad_scale_falls_back_to_one(tmp_path):
    trees.write_pmu(tmp_path, "power", 23, {"event": "config:0-7"},
                    {"energy-pkg": "event=0x02", "energy-pkg.scale": "lots", "energy-pkg.unit": "J"})
    assert Sysfs(tmp_path).pmus["power"].event_extra("energy-pkg") == (1.0, "J")


def test_pmu_without_usable_type_is_skipped(tmp_path):
    trees.write_pmu(tmp_path, "cpu", 4, {"event": "config:0-7"})
    trees.write_pmu(tmp_path, "half", None, {"event": "config:0-7"})
    trees.write_pmu(tmp_path, "garbled", "four", {"event": "config:0-7"})
    assert sorted(Sysfs(tmp_path).pmus) == ["cpu"]


def test_unparseable_format_leaves_the_other_terms_usable(tmp_path):
    trees.write_pmu(tmp_path, "cpu", 4, {"event": "config:0-7", "weird": "config5:0-3",
                                         "bad": "nonsense"})
    cpu = Sysfs(tmp_path).pmus["cpu"]
    assert cpu.formats == {"event": [("config", 0, 7)]}
    assert cpu.encode([("event", "0x3c")], "cpu/event=0x3c/") == (0x3C, 0, 0)
    with pytest.raises(EventSyntaxError, match="no term 'weird'"):
        cpu.encode([("weird", "1")], "cpu/weird=1/")


@pytest.mark.parametrize("name, core", [
    ("cpu", True), ("cpu_core", True), ("cpu_atom", True), ("armv8_pmuv3_0", True),
    ("armv8_cortex_a72", True), ("armv9_cortex_x2", True),
    ("power", False), ("msr", False), ("uncore_imc_0", False), ("amd_df", False),
    ("arm_cmn_0", False), ("software", False), ("tracepoint", False), ("cpum_cf", False),
])
def test_is_core(name, core):
    assert Pmu(name, 4, Path("/nonexistent")).is_core is core


def test_find_event_only_in_core_pmus(tmp_path):
    sysfs = Sysfs(trees.intel_icelake(tmp_path))
    [(pmu, terms)] = sysfs.find_event("topdown-retiring")
    assert (pmu.name, terms) == ("cpu", "event=0x00,umask=0x80")
    [(pmu, terms)] = sysfs.find_event("TopDown-Retiring")    # sysfs names match case-blind
    assert terms == "event=0x00,umask=0x80"
    assert sysfs.find_event("energy-pkg") == []       # power is no core PMU
    assert sysfs.find_event("cas_count_read") == []


def test_find_event_on_hybrid_lists_each_core_pmu(tmp_path):
    sysfs = Sysfs(trees.intel_hybrid(tmp_path))
    found = sysfs.find_event("topdown-retiring")
    assert [(p.name, p.type, t) for p, t in found] == [
        ("cpu_atom", 10, "event=0xc2,umask=0x0"), ("cpu_core", 4, "event=0x00,umask=0x80")]
    assert [p.name for p, _ in sysfs.find_event("slots")] == ["cpu_core"]


# ---- encode -------------------------------------------------------------------------------------

@pytest.fixture
def icx_cpu(tmp_path) -> Pmu:
    return Sysfs(trees.intel_icelake(tmp_path)).pmus["cpu"]


@pytest.fixture
def zen(tmp_path) -> Sysfs:
    return Sysfs(trees.amd_zen(tmp_path))


def test_encode_intel_fields(icx_cpu):
    terms = parse_terms("event=0xa3,umask=0x14,edge,inv,cmask=1,any,pc,in_tx,in_tx_cp")
    config = 0xA3 | 0x14 << 8 | 1 << 18 | 1 << 19 | 1 << 21 | 1 << 23 | 1 << 24 | 1 << 32 | 1 << 33
    assert icx_cpu.encode(terms, "t") == (config, 0, 0)
    assert icx_cpu.encode(parse_terms("event=0xcd,umask=0x1,ldlat=3"), "t") == (0x1CD, 3, 0)
    assert icx_cpu.encode(parse_terms("frontend=0x400406"), "t") == (0, 0x400406, 0)
    assert icx_cpu.encode(parse_terms("event=0xb7,umask=0x1,offcore_rsp=0x3fbfc00001"), "t") == \
        (0x1B7, 0x3FBFC00001, 0)


def test_encode_direct_config_fields(icx_cpu):
    assert icx_cpu.encode([("config", "0x1234")], "t") == (0x1234, 0, 0)
    assert icx_cpu.encode([("config", "0x1"), ("config1", "0x2"), ("config2", "3")], "t") == (1, 2, 3)
    assert icx_cpu.encode([("config", "0xffffffffffffffff")], "t") == ((1 << 64) - 1, 0, 0)


def test_encode_amd_split_event_field(zen):
    cpu = zen.pmus["cpu"]
    # low 8 bits of the event select in config:0-7, the next 4 in config:32-35
    assert cpu.encode([("event", "0x1c0")], "t") == (0xC0 | 0x1 << 32, 0, 0)
    assert cpu.encode([("event", "0xfff")], "t") == (0xFF | 0xF << 32, 0, 0)
    assert cpu.encode([("event", "0xc0")], "t") == (0xC0, 0, 0)
    assert cpu.encode(parse_terms("event=0x1c0,umask=0x2,inv,edge,cmask=3"), "t") == \
        (0xC0 | 0x2 << 8 | 1 << 18 | 1 << 23 | 3 << 24 | 1 << 32, 0, 0)
    with pytest.raises(EventSyntaxError, match="12 bits"):
        cpu.encode([("event", "0x1000")], "cpu/event=0x1000/")


def test_encode_three_range_field(zen):
    df = zen.pmus["amd_df"]
    # 0x1c07: 0x07 -> bits 0-7, 0xc -> bits 32-35, 0x1 -> bits 59-60
    assert df.encode([("event", "0x1c07")], "t") == (0x07 | 0xC << 32 | 1 << 59, 0, 0)
    assert df.encode([("event", "0x3fff")], "t") == (0xFF | 0xF << 32 | 0x3 << 59, 0, 0)
    with pytest.raises(EventSyntaxError, match="14 bits"):
        df.encode([("event", "0x4000")], "t")


def test_encode_ranges_fill_from_the_lowest_bit_whatever_the_written_order(tmp_path):
    # perf's pmu_format_value walks the format's bitmap from bit 0 up
    trees.write_pmu(tmp_path, "x", 30, {"event": "config:32-35,0-7", "ov": "config:0-7,4-11"})
    x = Sysfs(tmp_path).pmus["x"]
    assert x.encode([("event", "0x1c0")], "t") == (0xC0 | 0x1 << 32, 0, 0)
    assert x.encode([("ov", "0xfff")], "t") == (0xFFF, 0, 0)    # 12 distinct bits
    with pytest.raises(EventSyntaxError, match="12 bits"):
        x.encode([("ov", "0x1000")], "t")


def test_encode_arm(tmp_path):
    arm = Sysfs(trees.arm_neoverse(tmp_path)).pmus[trees.ARM_PMU]
    assert arm.encode([("event", "0x4005"), ("long", None)], "t") == (0x4005, 1, 0)
    assert arm.encode([("event", "0xffff")], "t") == (0xFFFF, 0, 0)
    with pytest.raises(EventSyntaxError, match="16 bits"):
        arm.encode([("event", "0x10000")], "t")


@pytest.mark.parametrize("terms, message", [
    ([("event", "0x100")], "event=0x100 does not fit in the 8 bits PMU 'cpu' gives it"),
    ([("edge", "2")], "edge=2 does not fit in the 1 bits"),
    ([("cmask", "256")], "cmask=256 does not fit in the 8 bits"),
    ([("offcore_rsp", "0x10000000000000000")], "does not fit in the 64 bits"),
    ([("config", "0x10000000000000000")], "config=0x10000000000000000 does not fit in 64 bits"),
    ([("event", "-1")], "event=-1 is negative"),
    ([("event", "banana")], "event=banana is not a number"),
    ([("config", None)], "'config' needs a value"),
    ([("ldlat", "?")], "needs a value for 'ldlat'"),
])
def test_encode_rejects(icx_cpu, terms, message):
    with pytest.raises(EventSyntaxError, match=message.replace("(", r"\(").replace("?", r"\?")):
        icx_cpu.encode(terms, "cpu/x/")


def test_encode_unknown_term_lists_the_pmus_terms(icx_cpu):
    with pytest.raises(EventSyntaxError) as exc:
        icx_cpu.encode([("foo", "1")], "cpu/foo=1/")
    msg = str(exc.value)
    assert msg.startswith("cpu/foo=1/: PMU 'cpu' has no term 'foo'")
    assert "(its terms: any, cmask, edge, event, frontend, in_tx, in_tx_cp, inv, ldlat, " \
           "offcore_rsp, pc, umask;" in msg
    assert exc.value.exit_code == 2


def test_encode_later_term_replaces_earlier(icx_cpu):
    # a named event's terms come first; what the user writes after them wins
    assert icx_cpu.encode(parse_terms("event=0xcd,umask=0x1,ldlat=3,ldlat=30"), "t") == (0x1CD, 30, 0)
    assert icx_cpu.encode(parse_terms("event=0x3c,event=0xc0"), "t") == (0xC0, 0, 0)
    # a '?' a later term fills in is no error
    assert icx_cpu.encode(parse_terms("event=0x1,umask=?,umask=0x2"), "t") == (0x201, 0, 0)
