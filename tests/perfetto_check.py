"""A structural check of Chrome-trace/Perfetto JSON, written from the format's rules (the Trace
Event Format document, and what Perfetto's JSON importer reads), independent of the exporter.

`check(path)` parses the file (gzip or not) and raises AssertionError naming the first broken
rule; it returns a `Trace` with the events sorted out for the tests' own assertions.
"""
from __future__ import annotations

import bisect
import gzip
import itertools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
U32 = 2 ** 32


@dataclass
class Trace:
    raw: dict
    processes: dict = field(default_factory=dict)        # pid -> name
    threads: dict = field(default_factory=dict)          # (pid, tid) -> name
    slices: dict = field(default_factory=lambda: defaultdict(list))     # (pid, tid) -> [X events]
    counters: dict = field(default_factory=lambda: defaultdict(list))   # (pid, track name) -> [(ts, v)]
    flows: dict = field(default_factory=lambda: defaultdict(list))      # id -> [s/f events]

    def process(self, name: str) -> int:
        pids = [p for p, n in self.processes.items() if n == name]
        assert len(pids) == 1, (name, self.processes)
        return pids[0]

    def threads_of(self, pid: int) -> dict:
        return {tid: n for (p, tid), n in self.threads.items() if p == pid}

    def counter_names(self, pid: int) -> set:
        return {n for p, n in self.counters if p == pid}


def load(path) -> dict:
    path = Path(path)
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    assert gz == path.name.endswith(".gz"), f"{path}: gzip'd is {gz}, but the name says otherwise"
    opener = gzip.open if gz else open
    with opener(path, "rt") as f:
        return json.load(f)


def ns(us: float) -> int:
    return round(us * 1000)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check(path) -> Trace:
    doc = load(path)
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), "no traceEvents array"
    t = Trace(doc)
    thread_tids = {}
    used_pids, used_threads = set(), set()
    for i, e in enumerate(doc["traceEvents"]):
        where = f"event {i} {e}"
        ph = e.get("ph")
        assert ph in ("M", "X", "C", "s", "f"), where
        assert isinstance(e.get("name"), str), where
        assert isinstance(e.get("pid"), int) and 0 < e["pid"] < U32, where
        assert isinstance(e.get("tid"), int) and 0 < e["tid"] < U32, where
        pid, tid = e["pid"], e["tid"]
        if ph == "M":
            assert e["name"] in METADATA, where
            args = e.get("args")
            assert isinstance(args, dict), where
            if e["name"] == "process_name":
                assert isinstance(args.get("name"), str) and args["name"], where
                assert pid not in t.processes, f"process {pid} named twice: {where}"
                t.processes[pid] = args["name"]
            elif e["name"] == "thread_name":
                assert isinstance(args.get("name"), str) and args["name"], where
                # Perfetto's importer keys thread names by tid alone: tids must be unique
                assert tid not in thread_tids, f"tid {tid} named twice: {where}"
                assert tid not in t.processes, f"tid {tid} is also a pid: {where}"
                thread_tids[tid] = pid
                t.threads[(pid, tid)] = args["name"]
            else:
                assert isinstance(args.get("sort_index"), int), where
            continue
        assert _num(e.get("ts")), where
        used_pids.add(pid)
        if ph == "X":
            assert _num(e.get("dur")) and e["dur"] >= 0, where
            assert isinstance(e.get("args", {}), dict), where
            used_threads.add((pid, tid))
            t.slices[(pid, tid)].append(e)
        elif ph == "C":
            args = e.get("args")
            assert isinstance(args, dict) and args, where
            for key, value in args.items():
                assert _num(value), where
                t.counters[(pid, f"{e['name']} {key}")].append((e["ts"], value))
        else:
            assert "id" in e and isinstance(e.get("cat"), str), where
            if ph == "f":
                assert e.get("bp") == "e", where
            used_threads.add((pid, tid))
            t.flows[e["id"]].append(e)
    for pid in used_pids:
        assert pid in t.processes, f"pid {pid} is used but has no process_name"
    for key in used_threads:
        assert key in t.threads, f"track {key} is used but has no thread_name"
    for key, events in t.slices.items():      # Perfetto drops a slice that does not nest
        stack = []     # in integer ns, as Perfetto compares them (µs * 1000, rounded)
        for e in sorted(events, key=lambda e: (ns(e["ts"]), -ns(e["dur"]))):
            start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
            if end == start:
                continue
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], \
                f"slice {e} on {t.threads[key]!r} overlaps another without nesting in it"
            stack.append(end)
    for key, points in t.counters.items():
        ts = [p[0] for p in points]
        assert all(a < b for a, b in zip(ts, ts[1:])), f"counter track {key} is not monotonic in time"
    spans = {}      # per track: slice starts (sorted) and the running max of their ends
    for key, events in t.slices.items():
        ordered = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in events)
        spans[key] = ([a for a, _ in ordered], list(itertools.accumulate((b for _, b in ordered), max)))
    for fid, events in t.flows.items():
        phases = sorted(e["ph"] for e in events)
        assert phases[0] == "f" and phases.count("s") == 1, f"flow {fid}: {phases}"
        for e in events:      # each end lies inside a slice of its track (so it binds to one)
            starts, ends = spans.get((e["pid"], e["tid"]), ([], []))
            i = bisect.bisect_right(starts, ns(e["ts"]))
            assert i and ends[i - 1] >= ns(e["ts"]), \
                f"flow {fid}'s {e['ph']} at {e['ts']} is in no slice of its track"
    return t


# -- the protobuf format ------------------------------------------------------------------
UNIT_NAMES = {1: "ns", 2: "count", 3: "bytes"}      # CounterDescriptor.Unit, as the JSON names them


@dataclass
class Timeline:
    """A trace as Perfetto reads it, keyed by names (the JSON's and the protobuf's ids differ):
    slices[(process, thread)] = sorted [(name, start ns, dur ns, category)], counters[(process,
    "name [unit]")] = [(epoch ns, value)] in time order, flows = sorted [(from slice name, to
    slice name)]."""
    slices: dict = field(default_factory=lambda: defaultdict(list))
    counters: dict = field(default_factory=lambda: defaultdict(list))
    flows: list = field(default_factory=list)
    args: dict = field(default_factory=dict)            # (process, thread, start ns, name) -> args


def json_timeline(t: Trace) -> Timeline:
    """The JSON's slices, counters and flows (a flow end binds to the deepest slice around it)."""
    base = t.raw["otherData"]["base_time_ns"]
    out = Timeline()
    for (pid, tid), events in t.slices.items():
        key = (t.processes[pid], t.threads[(pid, tid)])
        for e in events:
            out.slices[key].append((e["name"], base + ns(e["ts"]), ns(e["dur"]), e.get("cat")))
            args = {k: v for k, v in e.get("args", {}).items() if k != "rank"}
            out.args[(*key, base + ns(e["ts"]), e["name"])] = args
        out.slices[key].sort()
    for (pid, name), points in t.counters.items():
        out.counters[(t.processes[pid], name)] = [(base + ns(ts), v) for ts, v in points]
    for events in t.flows.values():
        ends = {}
        for e in events:
            at = ns(e["ts"])
            inside = [x for x in t.slices[(e["pid"], e["tid"])] if ns(x["ts"]) <= at <= ns(x["ts"]) + ns(x["dur"])]
            ends[e["ph"]] = min(inside, key=lambda x: ns(x["dur"]))["name"]
        out.flows.append((ends["s"], ends["f"]))
    out.flows.sort()
    return out


def proto_timeline(path) -> Timeline:
    """Decode a protobuf trace with Perfetto's published protos (the `perfetto` package) and
    read it as trace_processor does: interned strings resolved in file order on their sequence,
    every event sorted by time (ties in file order), each track's BEGIN/END paired by a stack.
    Raises AssertionError naming the first broken rule."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    path = Path(path)
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        assert data[:2] == b"\x1f\x8b", f"{path}: the name says gzip'd"
        data = gzip.decompress(data)
    trace = pb.Trace()
    trace.ParseFromString(data)
    realtime = None
    tracks, events = {}, []          # uuid -> descriptor; (ts, file order, uuid, TrackEvent, names)
    interned: dict = {}
    cleared = False
    for i, p in enumerate(trace.packet):
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c.timestamp for c in p.clock_snapshot.clocks}
            assert clocks.get(6) == 0 and 1 in clocks, "the clock snapshot maps BOOTTIME 0 to REALTIME"
            realtime = clocks[1]
        if p.sequence_flags & 1:
            interned, cleared = {}, True
        if p.HasField("interned_data"):
            assert p.trusted_packet_sequence_id == 1 and cleared, f"packet {i}: interned data off the sequence"
            d = p.interned_data
            for kind, entries in (("cat", d.event_categories), ("name", d.event_names),
                                  ("ann", d.debug_annotation_names)):
                for e in entries:
                    interned[(kind, e.iid)] = e.name
            for e in d.debug_annotation_string_values:
                interned[("str", e.iid)] = e.str.decode()
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            assert td.uuid and td.uuid not in tracks, f"packet {i}: track {td.uuid} described twice"
            tracks[td.uuid] = td
        if p.HasField("track_event"):
            te = p.track_event
            assert p.HasField("timestamp") and te.track_uuid in tracks, f"packet {i}: {p}"
            names = {}
            if te.type == te.TYPE_SLICE_BEGIN:
                assert p.sequence_flags & 2, f"packet {i}: uses interned data without saying so"
                names["name"] = interned[("name", te.name_iid)]          # KeyError: not interned before
                names["cat"] = ",".join(interned[("cat", c)] for c in te.category_iids)
                args = {}
                for a in te.debug_annotations:
                    key = interned[("ann", a.name_iid)]
                    kind = a.WhichOneof("value")
                    args[key] = (interned[("str", a.string_value_iid)] if kind == "string_value_iid"
                                 else json.loads(a.legacy_json_value) if kind == "legacy_json_value"
                                 else getattr(a, kind))
                names["args"] = args
            events.append((p.timestamp, i, te.track_uuid, te, names))
    assert realtime is not None, "no clock snapshot"

    def process_name(uuid):
        td = tracks[uuid]
        return td.process.process_name if td.HasField("process") else process_name(td.parent_uuid)

    out = Timeline()
    stacks = defaultdict(list)
    launches, lands = {}, {}
    for ts, i, uuid, te, names in sorted(events, key=lambda e: (e[0], e[1])):
        td = tracks[uuid]
        proc = process_name(uuid)
        if te.type == te.TYPE_COUNTER:
            assert td.HasField("counter"), f"packet {i}: a counter value on a track that is not a counter"
            c = td.counter
            unit = c.unit_name or UNIT_NAMES.get(c.unit, "value")
            value = te.counter_value if te.WhichOneof("counter_value_field") == "counter_value" \
                else te.double_counter_value
            out.counters[(proc, f"{td.name} [{unit}]")].append((realtime + ts, value))
            continue
        key = (proc, td.thread.thread_name)
        assert td.HasField("thread"), f"packet {i}: a slice on a track that is not a thread's"
        if te.type == te.TYPE_SLICE_BEGIN:
            stacks[uuid].append((ts, names))
            out.args[(*key, realtime + ts, names["name"])] = names["args"]
            for f in te.flow_ids:
                launches[f] = names["name"]
            for f in te.terminating_flow_ids:
                lands[f] = names["name"]
        else:
            assert te.type == te.TYPE_SLICE_END and stacks[uuid], f"packet {i}: an END with no open slice"
            start, names = stacks[uuid].pop()
            out.slices[key].append((names["name"], realtime + start, ts - start, names["cat"]))
    assert not any(stacks.values()), "slices left open"
    assert launches.keys() == lands.keys(), "a flow with one end"
    out.flows = sorted((launches[f], lands[f]) for f in launches)
    for v in out.slices.values():
        v.sort()
    return out
