"""The event-list parser against perf's syntax and semantics: generic, software,
hardware-cache and raw events, modifiers, groups, and PMU events through fake sysfs trees.

Reference: include/uapi/linux/perf_event.h for the numbers, tools/perf/util/parse-events.*
and evsel.c (hw-cache names) for the syntax."""
from __future__ import annotations


import pytest

from counterprof.collectors.perf.events import (
    DEFAULT_EVENTS, PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE,
    EventParser, EventSpec, cache_event_names, parse_events)
from counterprof.collectors.perf.sysfs import Sysfs
from counterprof.ground.errors import EventSyntaxError, UsageError

import sysfs_trees as trees  # tests/, on sys.path through pytest's pythonpath


@pytest.fixture
def empty(tmp_path) -> EventParser:
    """A machine with no PMUs in sysfs: never the host's /sys, so results are the same anywhere."""
    return EventParser(Sysfs(str(tmp_path / "no-sys")))


@pytest.fixture
def icx(tmp_path) -> EventParser:
    return EventParser(Sysfs(str(trees.intel_icelake(tmp_path))))


@pytest.fixture
def zen(tmp_path) -> EventParser:
    return EventParser(Sysfs(str(trees.amd_zen(tmp_path))))


@pytest.fixture
def arm(tmp_path) -> EventParser:
    return EventParser(Sysfs(str(trees.arm_neoverse(tmp_path))))


@pytest.fixture
def hybrid(tmp_path) -> EventParser:
    return EventParser(Sysfs(str(trees.intel_hybrid(tmp_path))))


def one(parser: EventParser, text: str) -> EventSpec:
    [group] = parser.parse(text)
    [spec] = group.events
    assert not group.grouped
    return spec


def error(parser: EventParser, text: str) -> str:
    with pytest.raises(EventSyntaxError) as exc:
        parser.parse(text)
    assert isinstance(exc.value, UsageError) and exc.value.exit_code == 2
    return str(exc.value)


def excludes(spec: EventSpec) -> tuple[bool, bool, bool]:
    m = spec.modifiers
    return m.exclude_user, m.exclude_kernel, m.exclude_hv


# ---- generic hardware and software events -------------------------------------------------

def test_type_numbers_match_the_uapi():
    assert (PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW) == (0, 1, 3, 4)


@pytest.mark.parametrize("name, config", [
    ("cycles", 0), ("cpu-cycles", 0),                   # PERF_COUNT_HW_CPU_CYCLES
    ("instructions", 1),
    ("cache-references", 2), ("cache-misses", 3),
    ("branches", 4), ("branch-instructions", 4),        # PERF_COUNT_HW_BRANCH_INSTRUCTIONS
    ("branch-misses", 5), ("bus-cycles", 6),
    ("stalled-cycles-frontend", 7), ("idle-cycles-frontend", 7),
    ("stalled-cycles-backend", 8), ("idle-cycles-backend", 8),
    ("ref-cycles", 9),                                   # PERF_COUNT_HW_REF_CPU_CYCLES
])
def test_hardware_events(empty, name, config):
    spec = one(empty, name)
    assert (spec.name, spec.type, spec.config, spec.config1, spec.config2) == \
        (name, PERF_TYPE_HARDWARE, config, 0, 0)
    assert spec.pmu is None and spec.scale == 1.0 and spec.unit == ""
    assert excludes(spec) == (False, False, False) and not spec.modifiers.explicit


@pytest.mark.parametrize("name, config, unit", [
    ("cpu-clock", 0, "ns"), ("task-clock", 1, "ns"),
    ("page-faults", 2, ""), ("faults", 2, ""),
    ("context-switches", 3, ""), ("cs", 3, ""),
    ("cpu-migrations", 4, ""), ("migrations", 4, ""),
    ("minor-faults", 5, ""), ("major-faults", 6, ""),
    ("alignment-faults", 7, ""), ("emulation-faults", 8, ""),
    ("dummy", 9, ""), ("cgroup-switches", 11, ""),
])
def test_software_events(empty, name, config, unit):
    spec = one(empty, name)
    assert (spec.name, spec.type, spec.config, spec.unit) == (name, PERF_TYPE_SOFTWARE, config, unit)


def test_legacy_names_win_over_sysfs_aliases(icx, zen, arm):
    # perf keeps cycles/instructions generic even where the core PMU names them too
    for parser in (icx, zen):
        spec = one(parser, "cpu-cycles")
        assert (spec.type, spec.config, spec.pmu) == (PERF_TYPE_HARDWARE, 0, None)
        assert one(parser, "instructions").type == PERF_TYPE_HARDWARE
    assert (one(arm, "cycles").type, one(arm, "cycles").config) == (PERF_TYPE_HARDWARE, 0)


def test_default_list(empty):
    groups = empty.parse(DEFAULT_EVENTS)
    assert [(g.grouped, [(e.name, e.type, e.config) for e in g.events]) for g in groups] == [
        (False, [("task-clock", 1, 1)]), (False, [("context-switches", 1, 3)]),
        (False, [("cpu-migrations", 1, 4)]), (False, [("page-faults", 1, 2)]),
        (False, [("cycles", 0, 0)]), (False, [("instructions", 0, 1)]),
        (False, [("branches", 0, 4)]), (False, [("branch-misses", 0, 5)]),
    ]


def test_parse_events_helper(tmp_path):
    groups = parse_events("cycles,{instructions,branches}", Sysfs(str(tmp_path)))
    assert [[e.name for e in g.events] for g in groups] == [["cycles"], ["instructions", "branches"]]
    assert [g.grouped for g in groups] == [False, True]
    assert groups[1].leader.name == "instructions"


# ---- hardware-cache events ----------------------------------------------------------------

L1D, L1I, LL, DTLB, ITLB, BPU, NODE = range(7)
READ, WRITE, PREFETCH = range(3)
ACCESS, MISS = range(2)


def cache(c, op, result):
    return c | op << 8 | result << 16


@pytest.mark.parametrize("name, config", [
    ("L1-dcache-loads", cache(L1D, READ, ACCESS)),
    ("L1-dcache-load-misses", cache(L1D, READ, MISS)),
    ("L1-dcache-stores", cache(L1D, WRITE, ACCESS)),
    ("L1-dcache-store-misses", cache(L1D, WRITE, MISS)),
    ("L1-dcache-prefetches", cache(L1D, PREFETCH, ACCESS)),
    ("L1-dcache-prefetch-misses", cache(L1D, PREFETCH, MISS)),
    ("L1-icache-loads", cache(L1I, READ, ACCESS)),
    ("L1-icache-load-misses", cache(L1I, READ, MISS)),
    ("L1-icache-prefetches", cache(L1I, PREFETCH, ACCESS)),
    ("LLC-loads", cache(LL, READ, ACCESS)),
    ("LLC-load-misses", 0x10002),
    ("LLC-stores", 0x102),
    ("LLC-store-misses", 0x10102),
    ("LLC-prefetch-misses", 0x10202),
    ("dTLB-loads", cache(DTLB, READ, ACCESS)),
    ("dTLB-load-misses", 0x10003),
    ("dTLB-store-misses", 0x10103),
    ("iTLB-loads", cache(ITLB, READ, ACCESS)),
    ("iTLB-load-misses", 0x10004),
    ("branch-loads", cache(BPU, READ, ACCESS)),
    ("branch-load-misses", 0x10005),
    ("node-loads", 0x6),
    ("node-load-misses", 0x10006),
    ("node-stores", 0x106),
    ("node-prefetch-misses", 0x10206),
])
def test_cache_events(empty, name, config):
    spec = one(empty, name)
    assert (spec.name, spec.type, spec.config) == (name, PERF_TYPE_HW_CACHE, config)


@pytest.mark.parametrize("name, config", [
    # the aliases of perf's evsel__hw_cache* tables
    ("l1d-loads", cache(L1D, READ, ACCESS)),
    ("l1-d-load-misses", cache(L1D, READ, MISS)),
    ("L1-data-load-misses", cache(L1D, READ, MISS)),
    ("l1i-load-misses", cache(L1I, READ, MISS)),
    ("L1-instruction-loads", cache(L1I, READ, ACCESS)),
    ("L2-load-misses", cache(LL, READ, MISS)),
    ("d-tlb-loads", cache(DTLB, READ, ACCESS)),
    ("Data-TLB-load-misses", cache(DTLB, READ, MISS)),
    ("i-tlb-load-misses", cache(ITLB, READ, MISS)),
    ("Instruction-TLB-loads", cache(ITLB, READ, ACCESS)),
    ("bpu-load-misses", cache(BPU, READ, MISS)),
    ("btb-loads", cache(BPU, READ, ACCESS)),
    ("bpc-load-misses", cache(BPU, READ, MISS)),
    ("branches-load-misses", cache(BPU, READ, MISS)),
    ("L1-dcache-read-miss", cache(L1D, READ, MISS)),
    ("L1-dcache-write-refs", cache(L1D, WRITE, ACCESS)),
    ("L1-dcache-store-Reference", cache(L1D, WRITE, ACCESS)),
    ("L1-dcache-load-ops", cache(L1D, READ, ACCESS)),
    ("L1-dcache-load-access", cache(L1D, READ, ACCESS)),
    ("L1-dcache-speculative-read-misses", cache(L1D, PREFETCH, MISS)),
    ("LLC-speculative-load", cache(LL, PREFETCH, ACCESS)),
    # op defaults to read, result to access
    ("L1-dcache", cache(L1D, READ, ACCESS)),
    ("LLC", cache(LL, READ, ACCESS)),
    ("node", cache(NODE, READ, ACCESS)),
    ("LLC-misses", cache(LL, READ, MISS)),
    ("dTLB-stores", cache(DTLB, WRITE, ACCESS)),
    # perf takes the result first too
    ("L1-dcache-misses-store", cache(L1D, WRITE, MISS)),
])
def test_cache_aliases(empty, name, config):
    spec = one(empty, name)
    assert (spec.type, spec.config) == (PERF_TYPE_HW_CACHE, config)


def test_cache_event_names_are_perfs_list():
    names = cache_event_names()
    # perf list's hw-cache names: only the ops each cache has (evsel__hw_cache_stat)
    assert len(names) == len(set(names)) == 32
    assert names[:6] == ["L1-dcache-loads", "L1-dcache-load-misses", "L1-dcache-stores",
                         "L1-dcache-store-misses", "L1-dcache-prefetches",
                         "L1-dcache-prefetch-misses"]
    assert "L1-icache-prefetches" in names and "iTLB-load-misses" in names
    for absent in ("L1-icache-stores", "iTLB-stores", "iTLB-prefetches", "branch-stores",
                   "branch-prefetch-misses"):
        assert absent not in names


def test_every_listed_cache_name_parses(empty):
    for name in cache_event_names():
        spec = one(empty, name)
        assert spec.type == PERF_TYPE_HW_CACHE, name
        assert spec.config >> 16 == (1 if name.endswith("-misses") else 0), name
        assert spec.config >> 8 & 0xFF == (0 if "load" in name else 1 if "store" in name else 2), name


@pytest.mark.parametrize("name, why", [
    ("L1-icache-stores", "no L1-icache store events (L1-icache counts loads, prefetches)"),
    ("L1-icache-store-misses", "no L1-icache store events"),
    ("iTLB-stores", "no iTLB store events (iTLB counts loads)"),
    ("iTLB-prefetch-misses", "no iTLB prefetch events"),
    ("branch-stores", "no branch store events"),
])
def test_cache_ops_perf_refuses(empty, name, why):
    assert why in error(empty, name)


@pytest.mark.parametrize("name", [
    "L1-dcache-load-load", "L1-dcache-misses-misses", "L1-dcache-load-misses-refs",
    "L1-dcache-bogus", "LLC-", "L3-loads", "L1-dcache-loads-x",
])
def test_not_cache_events(empty, name):
    assert f"unknown event '{name}'" in error(empty, name)


# ---- raw events -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, config", [
    ("r01c2", 0x1C2), ("r0", 0), ("rc0", 0xC0), ("r1A2b", 0x1A2B),
    ("rffffffffffffffff", (1 << 64) - 1),
])
def test_raw_events(empty, text, config):
    spec = one(empty, text)
    assert (spec.name, spec.type, spec.config) == (text, PERF_TYPE_RAW, config)


@pytest.mark.parametrize("text", ["r", "r01g2", "r1ffffffffffffffff", "R01c2", "r0x1c2"])
def test_not_raw_events(empty, text):
    assert "unknown event" in error(empty, text)


# ---- modifiers --------------------------------------------------------------------------------

@pytest.mark.parametrize("mods, user, kernel, hv", [
    # perf: the first of u/k/h excludes all three, each then includes its own
    ("u", False, True, True),
    ("k", True, False, True),
    ("h", True, True, False),
    ("uk", False, False, True),
    ("ku", False, False, True),
    ("uh", False, True, False),
    ("kh", True, False, False),
    ("ukh", False, False, False),
])
def test_privilege_modifiers(empty, mods, user, kernel, hv):
    spec = one(empty, f"cycles:{mods}")
    assert excludes(spec) == (user, kernel, hv)
    assert spec.name == f"cycles:{mods}" and spec.modifiers.text == mods and spec.modifiers.explicit
    assert not spec.modifiers.exclude_guest and not spec.modifiers.exclude_host   # u no longer implies exclude_guest


@pytest.mark.parametrize("mods, guest, host", [
    ("G", False, True),     # count in the guest only
    ("H", True, False),     # count on the host only
    ("GH", False, False),
    ("HG", False, False),
])
def test_guest_host_modifiers(empty, mods, guest, host):
    m = one(empty, f"instructions:{mods}").modifiers
    assert (m.exclude_guest, m.exclude_host) == (guest, host)
    assert (m.exclude_user, m.exclude_kernel, m.exclude_hv) == (False, False, False)


def test_other_modifiers(empty):
    m = one(empty, "cycles:I").modifiers
    assert m.exclude_idle and not m.pinned and not m.exclusive and m.precise_ip == 0
    assert one(empty, "cycles:D").modifiers.pinned
    assert one(empty, "cycles:e").modifiers.exclusive
    assert [one(empty, f"cycles:{'p' * n}").modifiers.precise_ip for n in (1, 2, 3)] == [1, 2, 3]
    m = one(empty, "cycles:ukGIDepp").modifiers
    assert (m.exclude_user, m.exclude_kernel, m.exclude_hv, m.exclude_guest, m.exclude_host) == \
        (False, False, True, False, True)
    assert (m.exclude_idle, m.pinned, m.exclusive, m.precise_ip) == (True, True, True, 2)
    # accepted and without effect on counting: P (max precise), S (sample read)
    m = one(empty, "cycles:PS").modifiers
    assert (m.precise_ip, m.exclude_user, m.exclude_kernel) == (0, False, False) and m.explicit


def test_modifiers_on_every_kind_of_event(icx):
    for text in ("task-clock:u", "LLC-load-misses:u", "r01c2:u", "cpu/event=0x3c/u",
                 "cpu/event=0x3c/:u", "topdown-retiring:u", "cpu/topdown-retiring/u"):
        spec = one(icx, text)
        assert excludes(spec) == (False, True, True), text
    assert one(icx, "cpu/event=0x3c/:u").name == "cpu/event=0x3c/u"    # normalized


@pytest.mark.parametrize("text, bad", [
    ("cycles:x", "'x'"), ("cycles:ub", "'b'"), ("cycles:R", "'R'"), ("cycles:U", "'U'"),
    ("cycles:u:k", "':'"), ("cycles:u k", "' '"), ("cpu/event=0x3c/z", "'z'"),
    ("r01c2:q", "'q'"),
])
def test_unknown_modifier_letters(icx, text, bad):
    msg = error(icx, text)
    assert f"unknown modifier {bad}" in msg and msg.startswith(text)


@pytest.mark.parametrize("text, message", [
    ("cycles:pppp", "at most 3 'p' modifiers"),
    ("cycles:uu", "modifier 'u' is given twice"),
    ("cycles:kuk", "modifier 'k' is given twice"),
    ("cycles:W", "'W' (weak group) applies to a group"),
    ("cycles:", "nothing after ':'"),
    ("{cycles,instructions}:", "nothing after ':'"),
    ("{cycles,instructions}:GG", "modifier 'G' is given twice"),
    ("{cycles:pp,instructions}:pp", "at most 3 'p' modifiers"),   # perf adds them up
])
def test_modifier_errors(empty, text, message):
    assert message in error(empty, text)


def test_with_user_only():
    # the fallback when perf_event_paranoid refuses kernel counting (events without modifiers)
    spec = parse_events("task-clock", Sysfs("/nonexistent"))[0].leader
    user = spec.with_user_only()
    assert excludes(user) == (False, True, True)
    assert (user.name, user.type, user.config) == (spec.name, spec.type, spec.config)
    assert excludes(spec) == (False, False, False)     # the original is untouched


# ---- groups -------------------------------------------------------------------------------------

def test_group(empty):
    [g] = empty.parse("{cycles,instructions}")
    assert g.grouped and [(e.name, e.config) for e in g.events] == [("cycles", 0), ("instructions", 1)]
    assert g.leader.name == "cycles"
    assert all(not e.modifiers.explicit for e in g.events)


def test_single_member_group_is_still_a_group(empty):
    [g] = empty.parse("{cycles}")
    assert g.grouped and [e.name for e in g.events] == ["cycles"]


def test_group_modifiers_apply_to_every_member(empty):
    [g] = empty.parse("{cycles,instructions}:u")
    assert [e.name for e in g.events] == ["cycles:u", "instructions:u"]
    assert [excludes(e) for e in g.events] == [(False, True, True)] * 2
    assert all(e.modifiers.explicit for e in g.events)


def test_group_modifiers_add_to_member_modifiers(empty):
    # perf applies the group's list on top of the member's: k+u counts both
    [g] = empty.parse("{cycles:k,instructions,branches:p}:uD")
    a, b, c = g.events
    assert (a.name, excludes(a)) == ("cycles:kuD", (False, False, True))
    assert (b.name, excludes(b)) == ("instructions:uD", (False, True, True))
    assert (c.name, excludes(c), c.modifiers.precise_ip) == ("branches:puD", (False, True, True), 1)
    assert all(e.modifiers.pinned for e in g.events)
    [g] = empty.parse("{cycles:pp}:p")
    assert g.leader.modifiers.precise_ip == 3
    [g] = empty.parse("{cycles:u}:u")
    assert excludes(g.leader) == (False, True, True)


def test_weak_group(empty):
    [g] = empty.parse("{cycles,instructions}:W")
    assert [e.name for e in g.events] == ["cycles:W", "instructions:W"]
    assert excludes(g.leader) == (False, False, False)


def test_groups_and_singles_mixed(icx):
    text = ("task-clock,{cycles,instructions}:u,page-faults,"
            "{cpu/event=0xc4,umask=0x0/,cpu/topdown-retiring/,branch-misses},r01c2:k")
    groups = icx.parse(text)
    assert [(g.grouped, [e.name for e in g.events]) for g in groups] == [
        (False, ["task-clock"]),
        (True, ["cycles:u", "instructions:u"]),
        (False, ["page-faults"]),
        (True, ["cpu/event=0xc4,umask=0x0/", "cpu/topdown-retiring/", "branch-misses"]),
        (False, ["r01c2:k"]),
    ]
    members = groups[3].events
    assert [(e.type, e.config) for e in members] == [(4, 0xC4), (4, 0x8000), (0, 5)]


def test_commas_inside_pmu_terms_do_not_split(icx):
    groups = icx.parse("cpu/event=0x3c,umask=0x0,cmask=1/,cpu/event=0xc0,umask=0x0/k")
    assert [(e.name, e.config) for g in groups for e in g.events] == [
        ("cpu/event=0x3c,umask=0x0,cmask=1/", 0x3C | 1 << 24), ("cpu/event=0xc0,umask=0x0/k", 0xC0)]


def test_spaces_around_entries(empty):
    groups = empty.parse(" cycles , { instructions , branches }:u ")
    assert [[e.name for e in g.events] for g in groups] == [["cycles"], ["instructions:u", "branches:u"]]


@pytest.mark.parametrize("text, message", [
    ("{cycles,instructions", "'{' without a matching '}'"),
    ("cycles,{instructions", "'{' without a matching '}'"),
    ("cycles}", "'}' without a matching '{'"),
    ("{cycles}},instructions", "'}' without a matching '{'"),
    ("cpu/event=0x3c", "a PMU event must end with '/'"),
    ("cycles,cpu/event=0x3c,instructions", "a PMU event must end with '/'"),
    ("cpu/event=0x3c/extra/", "a PMU event must end with '/'"),
    ("{cycles}u", "expected ':modifiers' after '}'"),
    ("{cycles,{instructions,branches}}", "groups cannot be nested"),
    ("{}", "empty entry in the group"),
    ("{cycles,}", "empty entry in the group"),
    ("{,cycles}", "empty entry in the group"),
    ("cycles,,instructions", "empty entry in the event list"),
    ("cycles,", "empty entry in the event list"),
    (",cycles", "empty entry in the event list"),
])
def test_malformed_lists(icx, text, message):
    assert message in error(icx, text)


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_empty_list(empty, text):
    assert "empty event list" in error(empty, text)


@pytest.mark.parametrize("text, dup", [
    ("cycles,cycles", "cycles"),
    ("cycles,instructions,cycles", "cycles"),
    ("{cycles,instructions},cycles", "cycles"),
    ("{cycles,cycles}", "cycles"),
    ("cycles:u,{cycles,instructions}:u", "cycles:u"),
    ("cpu/event=0x3c/,cpu/event=0x3c/", "cpu/event=0x3c/"),
])
def test_duplicates_rejected(icx, text, dup):
    assert error(icx, text) == f"{dup} is listed twice; list each event once"


def test_same_event_with_other_modifiers_is_no_duplicate(empty):
    groups = empty.parse("cycles,cycles:u,cycles:k,cpu-cycles")
    assert [g.leader.name for g in groups] == ["cycles", "cycles:u", "cycles:k", "cpu-cycles"]


# ---- unknown events ---------------------------------------------------------------------------

@pytest.mark.parametrize("typo, suggestion", [
    ("instrutions", "instructions"),
    ("task-clok", "task-clock"),
    ("cyles", "cycles"),
    ("page-fault", "page-faults"),
    ("context-switch", "context-switches"),
    ("brnach-misses", "branch-misses"),
])
def test_unknown_event_suggests(empty, typo, suggestion):
    msg = error(empty, typo)
    assert msg.startswith(f"unknown event '{typo}'; did you mean {suggestion}")
    assert "counterprof list" in msg


def test_suggestions_keep_perfs_spelling(empty):
    msg = error(empty, "l1-dcache-load-mises")
    assert "did you mean L1-dcache-load-misses" in msg


def test_no_suggestion_for_nonsense(empty):
    msg = error(empty, "zzqqxxkk")
    assert msg.startswith("unknown event 'zzqqxxkk' (") and "did you mean" not in msg


def test_suggestions_include_core_pmu_events(icx, arm):
    assert "did you mean topdown-retiring" in error(icx, "topdown-retirng")
    assert "did you mean stall_backend_mem" in error(arm, "stall_backend_mme")


def test_suggestions_are_not_repeated(hybrid):
    msg = error(hybrid, "topdown-retirng")
    assert msg.count("topdown-retiring") == 1


def test_typo_with_modifiers_names_the_event(empty):
    msg = error(empty, "instrutions:u")
    assert msg.startswith("unknown event 'instrutions'; did you mean instructions")


def test_tracepoints_are_refused_clearly(empty):
    msg = error(empty, "sched:sched_switch")
    assert msg.startswith("sched:sched_switch: ") and "tracepoints (subsystem:event) are not supported" in msg


# ---- PMU events: Intel ------------------------------------------------------------------------

def test_pmu_terms(icx):
    spec = one(icx, "cpu/event=0x3c,umask=0x00/")
    assert (spec.name, spec.type, spec.config, spec.config1, spec.config2, spec.pmu) == \
        ("cpu/event=0x3c,umask=0x00/", 4, 0x3C, 0, 0, "cpu")
    assert (spec.scale, spec.unit, spec.description) == (1.0, "", "cpu PMU event")


@pytest.mark.parametrize("text, config, config1", [
    ("cpu/config=0x1234/", 0x1234, 0),
    ("cpu/config=0x1234,config1=0x5/", 0x1234, 5),
    ("cpu/event=0xa3,umask=0x14,inv,edge,cmask=1/", 0xA3 | 0x14 << 8 | 1 << 23 | 1 << 18 | 1 << 24, 0),
    ("cpu/event=0xc0,umask=0x0,any,in_tx,in_tx_cp/", 0xC0 | 1 << 21 | 1 << 32 | 1 << 33, 0),
    ("cpu/event=0xc6,umask=0x1,frontend=0x400406/", 0x1C6, 0x400406),
    ("cpu/event=0xb7,umask=0x1,offcore_rsp=0x10003c0001/", 0x1B7, 0x10003C0001),
    ("cpu/event=0x3c,cmask=010/", 0x3C | 10 << 24, 0),      # digits are decimal, as in perf
    ("cpu/topdown-retiring/", 0x8000, 0),
    ("cpu/topdown-bad-spec/", 0x8100, 0),
    ("cpu/topdown-fe-bound/", 0x8200, 0),
    ("cpu/topdown-be-bound/", 0x8300, 0),
    ("cpu/slots/", 0x400, 0),
    ("cpu/cpu-cycles/", 0x3C, 0),                  # the sysfs alias, not the generic event
    ("cpu/mem-loads/", 0x1CD, 3),
    ("cpu/mem-loads,ldlat=30/", 0x1CD, 30),        # perf mem's spelling: the user's ldlat wins
    ("cpu/ldlat=30,mem-loads/", 0x1CD, 30),
    ("cpu/topdown-retiring,cmask=2/", 0x8000 | 2 << 24, 0),
    ("cpu/TopDown-Retiring/", 0x8000, 0),
])
def test_pmu_event_configs(icx, text, config, config1):
    spec = one(icx, text)
    assert (spec.type, spec.config, spec.config1, spec.config2, spec.pmu) == (4, config, config1, 0, "cpu")
    assert spec.name == text


@pytest.mark.parametrize("name, config", [
    ("topdown-retiring", 0x8000), ("topdown-bad-spec", 0x8100), ("topdown-fe-bound", 0x8200),
    ("topdown-be-bound", 0x8300), ("slots", 0x400), ("mem-stores", 0x2CD),
])
def test_bare_names_resolve_through_the_core_pmu(icx, name, config):
    spec = one(icx, name)
    assert (spec.name, spec.type, spec.config, spec.pmu) == (name, 4, config, "cpu")


def test_bare_name_keeps_all_its_terms(icx):
    spec = one(icx, "mem-loads:u")
    assert (spec.name, spec.config, spec.config1) == ("mem-loads:u", 0x1CD, 3)
    assert excludes(spec) == (False, True, True)


def test_name_term(icx):
    spec = one(icx, "cpu/event=0x3c,name=my_cycles/")
    assert (spec.name, spec.config) == ("my_cycles", 0x3C)
    spec = one(icx, "cpu/event=0x3c,umask=0x0,name=cyc_user/u")
    assert (spec.name, spec.config) == ("cyc_user", 0x3C)
    assert excludes(spec) == (False, True, True)
    assert one(icx, "cpu/topdown-retiring,name='retiring'/").name == "retiring"
    [g] = icx.parse("{cpu/event=0x3c,name=a/,cpu/event=0xc0,name=b/}:k")
    assert [e.name for e in g.events] == ["a", "b"]


def test_name_term_names_count_as_duplicates(icx):
    assert error(icx, "cpu/event=0x3c,name=x/,cpu/event=0xc0,name=x/") == \
        "x is listed twice; list each event once"


@pytest.mark.parametrize("text, message", [
    ("cpu/event=0x100/", "event=0x100 does not fit in the 8 bits PMU 'cpu' gives it"),
    ("cpu/event=0x3c,cmask=256/", "cmask=256 does not fit in the 8 bits"),
    ("cpu/event=0x3c,edge=2/", "edge=2 does not fit in the 1 bits"),
    ("cpu/config=0x10000000000000000/", "does not fit in 64 bits"),
    ("cpu/event=0x3c,foo=1/", "PMU 'cpu' has no term 'foo'"),
    ("cpu/event=pizza/", "event=pizza is not a number"),
    ("cpu/event=0x3c,period=100000/", "'period' is a sampling term"),
    ("cpu/event=0x3c,freq=1000/", "'freq' is a sampling term"),
    ("cpu//", "no terms between the slashes"),
    ("cpu/,/", "no terms between the slashes"),
    ("cpu/event=0x3c/extra/x/", "write PMU events as pmu/term=value,.../"),
    ("cpu/event=0x3c,name=/", "'name' needs a value"),
    ("cpu/topdown-retiring,slots/", "two named events (topdown-retiring, slots)"),
    ("cpu/config/", "'config' needs a value"),
])
def test_pmu_event_errors(icx, text, message):
    msg = error(icx, text)
    assert message in msg and msg.startswith(text.split("/")[0])


def test_unknown_term_lists_the_pmus_terms(icx):
    msg = error(icx, "cpu/event=0x3c,foo=1/")
    assert "(its terms: any, cmask, edge, event, frontend, in_tx, in_tx_cp, inv, ldlat, " \
           "offcore_rsp, pc, umask;" in msg


def test_unknown_flag_suggests_named_events(icx):
    msg = error(icx, "cpu/topdown-retirin/")
    assert "PMU 'cpu' has no term or event 'topdown-retirin'; did you mean topdown-retiring" in msg
    assert "its terms: any, cmask, edge, event" in msg


def test_unknown_pmu(icx):
    msg = error(icx, "cpuu/event=0x3c/")
    assert msg.startswith("cpuu/event=0x3c/: no PMU named 'cpuu'; did you mean cpu")
    assert "(PMUs here: breakpoint, cpu, msr, power, software, tracepoint, uncore_imc_0)" in msg


def test_unknown_pmu_on_a_machine_without_sysfs(empty):
    assert "PMUs here: none (is /sys mounted?)" in error(empty, "cpu/event=0x3c/")


def test_energy_event_with_scale_and_unit(icx):
    spec = one(icx, "power/energy-pkg/")
    assert (spec.name, spec.type, spec.config, spec.pmu) == ("power/energy-pkg/", 23, 0x2, "power")
    assert spec.scale == 2.3283064365386962890625e-10 and spec.unit == "Joules"
    spec = one(icx, "power/energy-ram/")
    assert (spec.config, spec.scale, spec.unit) == (0x3, 6.103515625e-05, "Joules")
    # written as terms it is no named event: no scale, raw counts
    spec = one(icx, "power/event=0x02/")
    assert (spec.config, spec.scale, spec.unit) == (0x2, 1.0, "")
    # scale survives modifiers and groups
    [g] = icx.parse("{power/energy-pkg/,power/energy-ram/}")
    assert [e.unit for e in g.events] == ["Joules", "Joules"]


def test_uncore_scale_and_unit(icx):
    spec = one(icx, "uncore_imc_0/cas_count_read/")
    assert (spec.type, spec.config, spec.scale, spec.unit) == (14, 0xF04, 64.0, "Bytes")


def test_non_core_pmu_events_need_the_pmu_syntax(icx):
    assert error(icx, "energy-pkg").startswith("unknown event 'energy-pkg'")
    assert error(icx, "cas_count_read").startswith("unknown event 'cas_count_read'")


def test_known_names(icx):
    names = icx.known_names()
    assert {"cycles", "task-clock", "L1-dcache-load-misses", "topdown-retiring", "slots"} <= set(names)
    assert "energy-pkg" not in names and "tsc" not in names


def test_placeholder_value_must_be_given(tmp_path):
    trees.write_pmu(tmp_path, "cpu", 4, {"event": "config:0-7", "umask": "config:8-15"},
                    {"needs-umask": "event=0x10,umask=?"})
    parser = EventParser(Sysfs(tmp_path))
    assert "needs a value for 'umask'" in error(parser, "cpu/needs-umask/")
    assert "needs a value for 'umask'" in error(parser, "needs-umask")
    assert one(parser, "cpu/needs-umask,umask=0x3/").config == 0x310


# ---- PMU events: AMD --------------------------------------------------------------------------

def test_amd_split_event_select(zen):
    spec = one(zen, "cpu/event=0x1c0/")
    # low 8 bits in config:0-7, the next 4 in config:32-35
    assert (spec.type, spec.config) == (4, 0xC0 | 0x1 << 32)
    assert spec.config == 0x1000000C0
    spec = one(zen, "cpu/event=0x1c0,umask=0x2,inv,cmask=1/k")
    assert spec.config == 0xC0 | 0x2 << 8 | 1 << 23 | 1 << 24 | 1 << 32
    assert excludes(spec) == (True, False, True)
    assert "event=0x1000 does not fit in the 12 bits" in error(zen, "cpu/event=0x1000/")


def test_amd_sysfs_alias_and_uncore(zen):
    assert (one(zen, "cpu/cpu-cycles/").type, one(zen, "cpu/cpu-cycles/").config) == (4, 0x76)
    spec = one(zen, "amd_df/event=0x1c07,umask=0x1/")
    assert (spec.type, spec.config, spec.pmu) == (10, 0x07 | 0x1 << 8 | 0xC << 32 | 1 << 59, "amd_df")
    spec = one(zen, "amd_l3/event=0x4,umask=0xff,slicemask=0xf,threadmask=0xff/")
    assert spec.config == 0x4 | 0xFF << 8 | 0xF << 48 | 0xFF << 56
    assert "no term 'ldlat'" in error(zen, "cpu/event=0xc0,ldlat=3/")   # Intel-only term


# ---- PMU events: Arm --------------------------------------------------------------------------

@pytest.mark.parametrize("name, config", [
    ("cpu_cycles", 0x11), ("inst_retired", 0x8), ("stall_frontend", 0x23),
    ("stall_backend", 0x24), ("stall_backend_mem", 0x4005), ("stall_slot", 0x3F),
    ("br_mis_pred", 0x10), ("l1d_cache_refill", 0x3),
])
def test_arm_named_events(arm, name, config):
    spec = one(arm, name)
    assert (spec.name, spec.type, spec.config, spec.config1, spec.pmu) == \
        (name, 8, config, 0, "armv8_pmuv3_0")
    spec = one(arm, f"armv8_pmuv3_0/{name}/")
    assert (spec.type, spec.config) == (8, config)


def test_arm_terms(arm):
    spec = one(arm, "armv8_pmuv3_0/event=0x4005,long/")
    assert (spec.config, spec.config1) == (0x4005, 1)
    spec = one(arm, "armv8_pmuv3_0/stall_backend_mem,long/u")
    assert (spec.config, spec.config1, excludes(spec)) == (0x4005, 1, (False, True, True))
    assert "event=0x10000 does not fit in the 16 bits" in error(arm, "armv8_pmuv3_0/event=0x10000/")


def test_arm_group_and_case(arm):
    [g] = arm.parse("{cpu_cycles,STALL_BACKEND_MEM,stall_slot}:u")
    assert [(e.name, e.config) for e in g.events] == [
        ("cpu_cycles:u", 0x11), ("STALL_BACKEND_MEM:u", 0x4005), ("stall_slot:u", 0x3F)]


def test_arm_uncore_is_not_core(arm):
    assert error(arm, "hnf_cache_miss").startswith("unknown event 'hnf_cache_miss'")
    spec = one(arm, "arm_cmn_0/hnf_cache_miss/")
    assert (spec.type, spec.config) == (10, 0x5 | 0x1 << 16)
    spec = one(arm, "arm_cmn_0/type=0x5,eventid=0x1,nodeid=0x68/")
    assert spec.config == 0x5 | 0x1 << 16 | 0x68 << 32


# ---- PMU events: hybrid -----------------------------------------------------------------------

def test_hybrid_bare_name_in_both_core_pmus_is_refused(hybrid):
    # one counter counts only the cores of its PMU: the user picks which
    msg = error(hybrid, "topdown-retiring")
    assert msg == ("topdown-retiring: 'topdown-retiring' is an event of several core PMUs "
                   "(cpu_atom, cpu_core), each counting its own cores; name the PMU: "
                   "cpu_atom/topdown-retiring/ or cpu_core/topdown-retiring/")
    assert "cpu_core/topdown-be-bound/" in error(hybrid, "{topdown-be-bound,slots}")


def test_hybrid_explicit_pmu(hybrid):
    core = one(hybrid, "cpu_core/topdown-retiring/")
    atom = one(hybrid, "cpu_atom/topdown-retiring/")
    assert (core.type, core.config, core.pmu) == (4, 0x8000, "cpu_core")
    assert (atom.type, atom.config, atom.pmu) == (10, 0xC2, "cpu_atom")


def test_hybrid_event_of_one_core_pmu(hybrid):
    spec = one(hybrid, "slots")
    assert (spec.type, spec.config, spec.pmu) == (4, 0x400, "cpu_core")
    spec = one(hybrid, "cycles")    # generic events stay generic
    assert (spec.type, spec.config, spec.pmu) == (PERF_TYPE_HARDWARE, 0, None)
