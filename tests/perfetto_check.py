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
