"""The perf_event_attr each counter is opened with, decoded by the ABI layout the way
perf's own attr tests read theirs (tools/perf/tests/attr)."""
import pytest

from counterprof.collectors.perf import native
from counterprof.collectors.perf.events import parse_events

GROUP_READ = 0b1011   # TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING | GROUP


def attr(event_text, *, leader=True, enable_on_exec=False, inherit=True, member=0):
    spec = parse_events(event_text)[0].events[member]
    flags = native.OpenFlags(leader=leader, enable_on_exec=enable_on_exec, inherit=inherit)
    return native.decode_attr(native.attr_bytes(spec, flags))


def test_launched_workload_leader_waits_for_exec():
    a = attr("cycles", enable_on_exec=True)
    assert (a["type"], a["config"]) == (0, 0)
    assert a["disabled"] == 1 and a["enable_on_exec"] == 1 and a["inherit"] == 1
    assert a["read_format"] == GROUP_READ
    assert a["sample_period"] == 0 and a["sample_type"] == 0 and a["freq"] == 0   # counting, not sampling
    assert a["exclude_user"] == a["exclude_kernel"] == a["exclude_hv"] == 0
    assert a["size"] == native.lib.cp_attr_size() and a["size"] >= 64


def test_group_member_follows_its_leader():
    a = attr("{cycles,instructions}", leader=False, enable_on_exec=True, member=1)
    assert (a["type"], a["config"]) == (0, 1)
    assert a["disabled"] == 0 and a["enable_on_exec"] == 0   # the leader enables the group
    assert a["inherit"] == 1


def test_attached_counters_are_enabled_by_ioctl_not_exec():
    a = attr("task-clock", enable_on_exec=False)
    assert (a["type"], a["config"]) == (1, 1)
    assert a["disabled"] == 1 and a["enable_on_exec"] == 0


def test_system_wide_counters_do_not_inherit():
    assert attr("cpu-clock", inherit=False)["inherit"] == 0


@pytest.mark.parametrize("text, user, kernel, hv", [
    ("cycles:u", 0, 1, 1),
    ("cycles:k", 1, 0, 1),
    ("cycles:uk", 0, 0, 1),
    ("cycles:h", 1, 1, 0),
    ("cycles", 0, 0, 0),
])
def test_privilege_modifiers(text, user, kernel, hv):
    a = attr(text)
    assert (a["exclude_user"], a["exclude_kernel"], a["exclude_hv"]) == (user, kernel, hv)


def test_other_modifiers():
    a = attr("cycles:GIDpp")
    assert a["exclude_host"] == 1 and a["exclude_guest"] == 0
    assert a["exclude_idle"] == 1 and a["pinned"] == 1 and a["precise_ip"] == 2
    assert attr("cycles:H")["exclude_guest"] == 1


def test_hw_cache_and_raw_configs():
    a = attr("LLC-load-misses")
    assert a["type"] == 3 and a["config"] == 2 | (0 << 8) | (1 << 16)
    a = attr("r01c2")
    assert a["type"] == 4 and a["config"] == 0x1C2


def test_user_only_fallback_attr():
    spec = parse_events("task-clock")[0].leader.with_user_only()
    a = native.decode_attr(native.attr_bytes(spec, native.OpenFlags(True, False, True)))
    assert a["exclude_kernel"] == 1 and a["exclude_hv"] == 1 and a["exclude_user"] == 0


def test_pinned_only_on_leaders():
    a = attr("{cycles,instructions}:D", leader=False, member=1)
    assert a["pinned"] == 0


def test_ungrouped_software_events_are_read_as_one_group():
    from counterprof.collectors.perf.counters import pack_software
    groups = parse_events("cycles,task-clock,{instructions,branches},page-faults,context-switches")
    packed = pack_software(groups)
    assert [tuple(e.name for e in g.events) for g in packed] == [
        ("task-clock", "page-faults", "context-switches"), ("cycles",), ("instructions", "branches")]
    assert not packed[0].grouped          # a failing member does not take the others down
    assert pack_software(parse_events("cycles,task-clock")) == parse_events("cycles,task-clock")
