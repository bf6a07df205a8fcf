"""Event lists in perf's syntax, parsed into what perf_event_open needs.

  cycles,instructions            generic hardware events
  task-clock,page-faults         software events
  L1-dcache-load-misses          hardware-cache events: <cache>-<op>-<result>
  r01c2                          raw PMU config
  cpu/event=0x3c,umask=0x0/      PMU terms, resolved through sysfs format files
  cpu/topdown-retiring/, stall_backend_mem   named PMU events from sysfs
  {cycles,instructions}          a group: scheduled onto the PMU together
  cycles:u  {a,b}:k              modifiers: u k h (user/kernel/hypervisor), G H, I, D, e, p
"""
from __future__ import annotations

import re
from dataclasses import field, replace

from counterprof.ground.errors import EventSyntaxError

from .sysfs import Pmu, Sysfs, parse_terms
from counterprof.ground.record import record

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_TRACEPOINT = 2
PERF_TYPE_HW_CACHE = 3
PERF_TYPE_RAW = 4

# name -> (type, config, unit, description)
HARDWARE = {
    "cycles": (0, "CPU cycles"),
    "cpu-cycles": (0, "CPU cycles"),
    "instructions": (1, "instructions retired"),
    "cache-references": (2, "cache accesses (usually last-level cache)"),
    "cache-misses": (3, "cache misses (usually last-level cache)"),
    "branches": (4, "branch instructions retired"),
    "branch-instructions": (4, "branch instructions retired"),
    "branch-misses": (5, "mispredicted branches"),
    "bus-cycles": (6, "bus cycles"),
    "stalled-cycles-frontend": (7, "cycles the frontend delivered no uops"),
    "idle-cycles-frontend": (7, "cycles the frontend delivered no uops"),
    "stalled-cycles-backend": (8, "cycles the backend accepted no uops"),
    "idle-cycles-backend": (8, "cycles the backend accepted no uops"),
    "ref-cycles": (9, "reference cycles (unscaled by frequency)"),
}
SOFTWARE = {
    "cpu-clock": (0, "ns", "CPU time, per-CPU timer"),
    "task-clock": (1, "ns", "CPU time of the task"),
    "page-faults": (2, "", "page faults"),
    "faults": (2, "", "page faults"),
    "context-switches": (3, "", "context switches"),
    "cs": (3, "", "context switches"),
    "cpu-migrations": (4, "", "migrations to another CPU"),
    "migrations": (4, "", "migrations to another CPU"),
    "minor-faults": (5, "", "minor page faults (no I/O)"),
    "major-faults": (6, "", "major page faults (needed I/O)"),
    "alignment-faults": (7, "", "alignment faults"),
    "emulation-faults": (8, "", "emulation faults"),
    "dummy": (9, "", "a placeholder event that counts nothing"),
    "cgroup-switches": (11, "", "switches between cgroups"),
}
CACHES = {
    0: ("L1-dcache", ("l1-dcache", "l1-d", "l1d", "l1-data")),
    1: ("L1-icache", ("l1-icache", "l1-i", "l1i", "l1-instruction")),
    2: ("LLC", ("llc", "l2")),
    3: ("dTLB", ("dtlb", "d-tlb", "data-tlb")),
    4: ("iTLB", ("itlb", "i-tlb", "instruction-tlb")),
    5: ("branch", ("branch", "branches", "bpu", "btb", "bpc")),
    6: ("node", ("node",)),
}
CACHE_OPS = {
    0: ("load", ("load", "loads", "read")),
    1: ("store", ("store", "stores", "write")),
    2: ("prefetch", ("prefetch", "prefetches", "speculative-read", "speculative-load")),
}
CACHE_RESULTS = {
    0: ("access", ("refs", "reference", "ops", "access")),
    1: ("miss", ("misses", "miss")),
}
# the ops perf accepts per cache (its evsel__hw_cache_stat): L1I reads and prefetches,
# iTLB and branch reads only; the kernel has no encoding for the rest
CACHE_VALID_OPS = {0: (0, 1, 2), 1: (0, 2), 2: (0, 1, 2), 3: (0, 1, 2), 4: (0,), 5: (0,),
                   6: (0, 1, 2)}
_OP_PLURAL = {"load": "loads", "store": "stores", "prefetch": "prefetches"}
# perf stat's default list
DEFAULT_EVENTS = ("task-clock,context-switches,cpu-migrations,page-faults,"
                  "cycles,instructions,branches,branch-misses")

_MODIFIER = re.compile(r"^[ukhHGIDpPSWe]*$")
_RAW = re.compile(r"^r([0-9a-fA-F]{1,16})$")


@record(frozen=True)
class Modifiers:
    exclude_user: bool = False
    exclude_kernel: bool = False
    exclude_hv: bool = False
    exclude_idle: bool = False
    exclude_host: bool = False
    exclude_guest: bool = False
    pinned: bool = False
    exclusive: bool = False
    precise_ip: int = 0
    text: str = ""          # as written, e.g. "u"; empty when none

    @property
    def explicit(self) -> bool:
        return bool(self.text)


def check_modifiers(text: str, event_text: str) -> None:
    """One modifier list as written (after ':' or '}:'); perf rejects a letter given twice."""
    if not _MODIFIER.match(text):
        bad = sorted(set(text) - set("ukhHGIDpPSWe"))
        raise EventSyntaxError(
            f"{event_text}: unknown modifier {''.join(bad)!r} (known: u user, k kernel, "
            "h hypervisor, G guest, H host, I exclude idle, D pinned, e exclusive, p precise)")
    for ch in set(text) - {"p"}:
        if text.count(ch) > 1:
            raise EventSyntaxError(f"{event_text}: modifier '{ch}' is given twice")


def parse_modifiers(text: str, event_text: str) -> Modifiers:
    """Modifiers of an event and of its group together: the union of what each includes,
    which is what perf gets by applying the group's list on top of the member's."""
    if not _MODIFIER.match(text):
        check_modifiers(text, event_text)   # raises, naming the unknown letters
    if text.count("p") > 3:   # precise_ip is 2 bits; perf refuses rather than clamps
        raise EventSyntaxError(f"{event_text}: at most 3 'p' modifiers (precise_ip is 0-3)")
    u, k, h = "u" in text, "k" in text, "h" in text
    any_ukh = u or k or h
    g, host = "G" in text, "H" in text
    any_gh = g or host
    return Modifiers(
        exclude_user=any_ukh and not u,
        exclude_kernel=any_ukh and not k,
        exclude_hv=any_ukh and not h,
        exclude_idle="I" in text,
        exclude_guest=any_gh and not g,
        exclude_host=any_gh and not host,
        pinned="D" in text,
        exclusive="e" in text,
        precise_ip=text.count("p"),
        text=text,
    )


@record(frozen=True)
class EventSpec:
    """One event as perf_event_open takes it, and how to name and present it."""

    name: str               # as stored in samples.metric: the user's text, normalized
    type: int
    config: int
    config1: int = 0
    config2: int = 0
    modifiers: Modifiers = field(default_factory=Modifiers)
    pmu: str | None = None
    unit: str = ""
    scale: float = 1.0
    description: str = ""

    def with_user_only(self) -> EventSpec:
        """perf's fallback when kernel counting is refused: count user space only."""
        mods = replace(self.modifiers, exclude_kernel=True, exclude_hv=True)
        return replace(self, modifiers=mods)


@record(frozen=True)
class EventGroup:
    events: tuple[EventSpec, ...]
    grouped: bool           # written as {a,b}: scheduled onto the PMU together

    @property
    def leader(self) -> EventSpec:
        return self.events[0]


# ---- splitting the list --------------------------------------------------------------

def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside {...} or pmu/.../."""
    items: list[str] = []
    cur: list[str] = []
    depth, in_pmu = 0, False
    for ch in text:
        if ch == "{" and not in_pmu:
            depth += 1
        elif ch == "}" and not in_pmu:
            depth -= 1
            if depth < 0:
                raise EventSyntaxError(f"{text}: '}}' without a matching '{{'")
        elif ch == "/":
            in_pmu = not in_pmu
        if ch == "," and depth == 0 and not in_pmu:
            items.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth != 0:
        raise EventSyntaxError(f"{text}: '{{' without a matching '}}'")
    if in_pmu:
        raise EventSyntaxError(f"{text}: a PMU event must end with '/' (pmu/terms/)")
    items.append("".join(cur))
    return [i.strip() for i in items]


def _split_modifiers(item: str) -> tuple[str, str]:
    """'cycles:u' -> ('cycles', 'u'); 'cpu/event=1/u' -> ('cpu/event=1/', 'u')."""
    if "/" in item:
        last = item.rfind("/")
        body, rest = item[: last + 1], item[last + 1:]
        return body, rest[1:] if rest.startswith(":") else rest
    if ":" in item:
        body, mods = item.split(":", 1)
        return body, mods
    return item, ""


# ---- the parser ----------------------------------------------------------------------

class EventParser:
    def __init__(self, sysfs: Sysfs | None = None):
        self.sysfs = sysfs if sysfs is not None else Sysfs()

    def parse(self, text: str) -> list[EventGroup]:
        if not text or not text.strip():
            raise EventSyntaxError("empty event list; name at least one event (e.g. -e task-clock)")
        groups: list[EventGroup] = []
        for item in _split_top(text.strip()):
            if not item:
                raise EventSyntaxError(f"{text}: empty entry in the event list (two commas?)")
            if item.startswith("{"):
                close = item.rfind("}")
                inner, after = item[1:close], item[close + 1:]
                if after and not after.startswith(":"):
                    raise EventSyntaxError(f"{item}: expected ':modifiers' after '}}'")
                if after == ":":
                    raise EventSyntaxError(f"{item}: nothing after ':' (modifiers: u k h G H I D e p W)")
                group_mods = after[1:]
                check_modifiers(group_mods, item)
                members = [m for m in _split_top(inner)]
                if not all(members):
                    raise EventSyntaxError(f"{item}: empty entry in the group")
                specs = tuple(self.parse_one(m, group_mods) for m in members)
                groups.append(EventGroup(specs, grouped=True))
            else:
                groups.append(EventGroup((self.parse_one(item),), grouped=False))
        seen: set[str] = set()
        for g in groups:
            for e in g.events:
                if e.name in seen:
                    raise EventSyntaxError(f"{e.name} is listed twice; list each event once")
                seen.add(e.name)
        return groups

    def parse_one(self, item: str, group_mods: str = "") -> EventSpec:
        item = item.strip()
        if item.startswith("{"):
            raise EventSyntaxError(f"{item}: groups cannot be nested")
        if item.endswith(":"):
            raise EventSyntaxError(f"{item}: nothing after ':' (modifiers: u k h G H I D e p)")
        body, mods_text = _split_modifiers(item)
        body = body.strip()
        try:
            spec = self._resolve(body, item)
        except EventSyntaxError:
            # 'sched:sched_switch': what follows ':' is no modifier list, so a tracepoint
            if "/" not in body and mods_text and not _MODIFIER.match(mods_text):
                raise EventSyntaxError(
                    f"{item}: not a known event with modifiers, and tracepoints "
                    "(subsystem:event) are not supported; use a counter event") from None
            raise
        check_modifiers(mods_text, item)
        if "W" in mods_text:   # perf: "Weak modifier is for use with groups"
            raise EventSyntaxError(f"{item}: 'W' (weak group) applies to a group: {{a,b}}:W")
        all_mods = mods_text + group_mods
        mods = parse_modifiers(all_mods, item)
        if spec.name != body:   # a name= term: the user's own name, as perf shows it
            name = spec.name
        elif not all_mods:
            name = body
        else:   # normalized: cycles:uk, cpu/event=0x3c/u
            name = f"{body}{all_mods}" if body.endswith("/") else f"{body}:{all_mods}"
        return replace(spec, name=name, modifiers=mods)

    def _resolve(self, body: str, item: str) -> EventSpec:
        low = body.lower()
        if low in HARDWARE:
            cfg, desc = HARDWARE[low]
            return EventSpec(body, PERF_TYPE_HARDWARE, cfg, description=desc)
        if low in SOFTWARE:
            cfg, unit, desc = SOFTWARE[low]
            return EventSpec(body, PERF_TYPE_SOFTWARE, cfg, unit=unit, description=desc)
        cache = _parse_cache(low, item)
        if cache is not None:
            return EventSpec(body, PERF_TYPE_HW_CACHE, cache[0], description=cache[1])
        m = _RAW.match(body)
        if m:
            return EventSpec(body, PERF_TYPE_RAW, int(m.group(1), 16), description="raw PMU event")
        if "/" in body:
            return self._resolve_pmu(body, item)
        found = self.sysfs.find_event(body)
        if len(found) > 1:
            # hybrid CPUs (cpu_core + cpu_atom, big.LITTLE Arm) name it in each core PMU with
            # its own type; one counter counts only the cores of one PMU, so any pick is wrong
            # for a workload that runs on the others: make the user choose
            spellings = " or ".join(f"{p.name}/{low}/" for p, _ in found)
            raise EventSyntaxError(
                f"{item}: '{body}' is an event of several core PMUs "
                f"({', '.join(p.name for p, _ in found)}), each counting its own cores; "
                f"name the PMU: {spellings}")
        if found:
            pmu, terms = found[0]
            return self._pmu_event(pmu, parse_terms(terms), body, event_alias=low)
        raise EventSyntaxError(self._unknown_message(body))

    def _resolve_pmu(self, body: str, item: str) -> EventSpec:
        if not (body.count("/") == 2 and body.endswith("/")):
            raise EventSyntaxError(f"{item}: write PMU events as pmu/term=value,.../")
        pmu_name, term_text = body[:-1].split("/", 1)
        pmus = self.sysfs.pmus
        pmu = pmus.get(pmu_name)
        if pmu is None:
            known = ", ".join(sorted(pmus)) or "none (is /sys mounted?)"
            close = _close_matches(pmu_name, list(pmus), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise EventSyntaxError(f"{item}: no PMU named '{pmu_name}'{hint} (PMUs here: {known})")
        terms = parse_terms(term_text)
        if not terms:
            raise EventSyntaxError(f"{item}: no terms between the slashes")
        expanded: list[tuple[str, str | None]] = []
        alias = None
        display = None
        for key, value in terms:
            if key == "name":
                display = (value or "").strip("'\"")
                if not display:
                    raise EventSyntaxError(f"{item}: 'name' needs a value (name=my_event)")
            elif value is None and key not in pmu.formats and key.lower() in pmu.events:
                if alias is not None:
                    raise EventSyntaxError(f"{item}: two named events ({alias}, {key}) in one; "
                                           "list them as separate events")
                alias = key.lower()
                # first, so that terms the user writes override the named event's
                # (perf mem writes cpu/mem-loads,ldlat=30/ over mem-loads' ldlat=3)
                expanded[:0] = parse_terms(pmu.events[alias])
            elif key in ("period", "freq", "sample_period", "sample_freq", "call-graph", "stack-size"):
                raise EventSyntaxError(f"{item}: '{key}' is a sampling term; counterprof counts")
            elif value is None and key not in pmu.formats and key not in ("config", "config1",
                                                                            "config2"):
                close = _close_matches(key.lower(), list(pmu.events), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                known = ", ".join(sorted(pmu.formats)) or "none"
                raise EventSyntaxError(
                    f"{item}: PMU '{pmu.name}' has no term or event '{key}'{hint} "
                    f"(its terms: {known})")
            else:
                expanded.append((key, value))
        spec = self._pmu_event(pmu, expanded, body, event_alias=alias)
        return replace(spec, name=display) if display else spec

    def _pmu_event(self, pmu: Pmu, terms: list[tuple[str, str | None]], text: str,
                   event_alias: str | None) -> EventSpec:
        terms = [(k, v) for k, v in terms if k not in ("period", "percore")]
        config, config1, config2 = pmu.encode(terms, text)
        scale, unit = pmu.event_extra(event_alias) if event_alias else (1.0, "")
        return EventSpec(text, pmu.type, config, config1, config2, pmu=pmu.name, unit=unit,
                         scale=scale, description=f"{pmu.name} PMU event")

    def known_names(self) -> list[str]:
        names = list(HARDWARE) + list(SOFTWARE) + cache_event_names()
        for pmu in self.sysfs.core_pmus():
            names.extend(pmu.events)
        return names

    def _unknown_message(self, body: str) -> str:
        # match case-blind, suggest as perf spells them (L1-dcache-load-misses), each once
        names: dict[str, str] = {}
        for n in self.known_names():
            names.setdefault(n.lower(), n)
        close = _close_matches(body.lower(), list(names), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(names[c] for c in close)}?" if close else ""
        return (f"unknown event '{body}'{hint} (`counterprof list` shows the events this "
                "machine knows; raw events: rNNNN or pmu/event=0x..,umask=0x../)")


def _cache_word(words: list[str], i: int, table: dict[int, tuple[str, tuple[str, ...]]]) -> tuple[int, int] | None:
    """(id, words used) if words[i:] starts with one of the table's names."""
    for width in (2, 1):   # speculative-read spans two words
        if i + width > len(words):
            continue
        word = "-".join(words[i:i + width])
        for tid, (_, aliases) in table.items():
            if word in aliases:
                return tid, width
    return None


def _parse_cache(low: str, text: str = "") -> tuple[int, str] | None:
    """'l1-dcache-load-misses' -> (config, description); None if not a cache event.

    As perf's parse_events__decode_legacy_cache: <cache>[-<op>][-<result>], op and result
    in either order, op defaulting to load and result to access."""
    for cid, (cname, caliases) in CACHES.items():
        for alias in sorted(caliases, key=len, reverse=True):
            if low == alias:
                words: list[str] = []
            elif low.startswith(alias + "-"):
                words = low[len(alias) + 1:].split("-")
            else:
                continue
            op = result = None
            i = 0
            while i < len(words):
                if op is None and (hit := _cache_word(words, i, CACHE_OPS)):
                    op = hit[0]
                elif result is None and (hit := _cache_word(words, i, CACHE_RESULTS)):
                    result = hit[0]
                else:
                    return None
                i += hit[1]
            op = 0 if op is None else op
            result = 0 if result is None else result
            if op not in CACHE_VALID_OPS[cid]:
                ops = ", ".join(_OP_PLURAL[CACHE_OPS[o][0]] for o in CACHE_VALID_OPS[cid])
                raise EventSyntaxError(f"{text or low}: perf has no {cname} "
                                       f"{CACHE_OPS[op][0]} events ({cname} counts {ops})")
            what = "accesses" if result == 0 else "misses"
            return cid | (op << 8) | (result << 16), f"{cname} {CACHE_OPS[op][0]} {what}"
    return None


def cache_event_names() -> list[str]:
    """The canonical hardware-cache names perf lists (L1-dcache-load-misses, ...)."""
    names = []
    for cid, (cname, _) in CACHES.items():
        for oid, (oname, _) in CACHE_OPS.items():
            if oid not in CACHE_VALID_OPS[cid]:
                continue
            names.append(f"{cname}-{_OP_PLURAL[oname]}")
            names.append(f"{cname}-{oname}-misses")
    return names


def parse_events(text: str, sysfs: Sysfs | None = None) -> list[EventGroup]:
    return EventParser(sysfs).parse(text)


def _close_matches(word: str, candidates: list[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """difflib's suggestions, imported only when a name is wrong (difflib is ~0.6 ms of every
    run's start-up otherwise)."""
    import difflib
    return difflib.get_close_matches(word, candidates, n=n, cutoff=cutoff)
