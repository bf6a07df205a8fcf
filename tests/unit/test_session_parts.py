"""The session's parts apart from its lifecycle: meta.json's document (run_meta.MetaDocument),
catalog.json's (run_meta.Catalog), the disk space kept for the last meta.json
(store/reserve.py), the end's compaction (store/compact.compact_run), and the rank watcher
over the small interface it needs of a session (ranks.RankSession)."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from counterprof.collector import Collector, SessionContext, Target
from counterprof.ground.clock import Clock
from counterprof.ground.schema import Metric
from counterprof.ranks import RankSession, RankWatcher
from counterprof.run_meta import Catalog, MetaDocument
from counterprof.store import reserve
from counterprof.store.compact import CompactionReport, compact_run


class Counting(Collector):
    name = "counting"
    per_rank = True

    def start(self, ctx: SessionContext) -> None:
        pass


def test_meta_keeps_the_order_fields_were_first_set_and_shares_the_statuses(tmp_path):
    doc = MetaDocument(threading.RLock())
    doc.collector_unavailable("nvml", "no GPU", {"interval_ms": 100})
    doc.begin(doc.initial(run_id="r", command=["x"], start_ns=1, clock_offset_ns=2, rank=0, job=None,
                          target=Target("self")))
    doc.set(status="complete", stopped_because="q")
    doc.set(status="running")             # set again: stays where it was first set
    doc.collector_failed("perf", "no PMU", {})
    doc.write(tmp_path / "meta.json")
    written = json.loads((tmp_path / "meta.json").read_text())
    keys = list(written)
    assert keys[:3] == ["id", "counterprof_version", "status"] and keys[-1] == "stopped_because"
    assert written["status"] == "running" and "stopped_because" in doc and doc["rank"] == 0
    # "collectors" is the statuses object itself: a status set after begin() is in it
    assert written["collectors"] == {
        "nvml": {"status": "unavailable", "reason": "no GPU", "config": {"interval_ms": 100}},
        "perf": {"config": {}, "status": "failed", "reason": "no PMU"}}


def test_a_ranks_collector_is_under_ranks_and_mirrored_for_the_first_rank():
    doc = MetaDocument(threading.RLock())
    col = Counting()
    col.details = {"events": 3}
    doc.rank_collector(1, {"pid": 11, "source": "environment", "world_size": 2, "gpu": None}, col, "ok", "")
    doc.rank_collector(0, {"pid": 10, "source": "torch.distributed", "world_size": 2, "gpu": 0},
                       col, "ok", "")
    ranks = doc["ranks"]
    assert ranks["1"] == {"collectors": {"counting": {"status": "ok", "reason": "", "events": 3}},
                          "pid": 11, "source": "environment", "world_size": 2}      # no gpu: left out
    assert ranks["0"]["gpu"] == 0
    assert doc.statuses["counting"] == {"config": {}, "status": "ok", "reason": "", "per_rank": True,
                                        "events": 3}
    doc.rank_collector(0, None, col, "failed", "stop failed: gone")       # a failure is always said
    assert doc.statuses["counting"]["status"] == "failed"
    assert ranks["0"]["collectors"]["counting"]["reason"] == "stop failed: gone"


def test_the_catalog_is_written_when_it_changed(tmp_path):
    catalog = Catalog(threading.RLock())
    path = tmp_path / "catalog.json"
    m = Metric("cycles", "count", "delta", "CPU cycles", "perf")
    assert catalog.add([m]) and not catalog.add([m])     # the same again: nothing new
    catalog.write(path)
    first = path.stat().st_ino
    catalog.write(path)                                  # unchanged: not rewritten
    assert path.stat().st_ino == first
    catalog.add([Metric("a", "count", "gauge", "", "host")])
    catalog.write(path)
    assert [e["name"] for e in json.loads(path.read_text())] == ["a", "cycles"]    # by source, name


def test_the_reserve_is_kept_and_released(tmp_path):
    path = tmp_path / ".reserve"
    reserve.keep(path)
    assert path.stat().st_blocks * 512 >= reserve.RESERVE_BYTES
    reserve.keep(path)          # one there already: nothing kept, nothing said
    reserve.release(path)
    assert not path.exists()
    reserve.release(path)       # none kept: nothing to do


def test_compacting_a_run_says_what_it_met(tmp_path):
    said: list[str] = []
    report = CompactionReport(damaged=["rank=0/journal/x: 2 batches left out (bad)"])
    assert compact_run(tmp_path, report, said.append)           # no partition: complete
    assert said == ["journal damaged: rank=0/journal/x: 2 batches left out (bad)"]


class Books:
    """A RankSession of its own: what the watcher asks of a session, recorded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.clock = Clock()
        self.config: dict[str, dict[str, Any]] = {}
        self.said: list[str] = []
        self.owned: dict[str, int] = {}
        self.statuses: list[tuple[int, str, str, Any]] = []
        self.switched: list[dict[str, Any]] = []

    def warn(self, message: str) -> None:
        self.said.append(message)

    def own_entity(self, entity: str, rank: int) -> None:
        self.owned[entity] = rank

    def rank_context(self, rank: int, target: Target) -> SessionContext:
        return SessionContext(clock=self.clock, target=target, config={}, rank=rank,
                              emit=lambda *a: None, add_metrics=lambda m: None,
                              fail=lambda n, r: None, warn=self.warn, run_path=self.path)

    def stop_root_per_rank(self, classes: list[type[Collector]]) -> list[str]:
        return [c.name for c in classes]

    def rank_switched(self, facts: dict[str, Any]) -> None:
        self.switched.append(facts)

    def rank_status(self, rank: int, col: Collector, status: str, reason: str,
                    found: dict[str, Any] | None) -> None:
        self.statuses.append((rank, col.name, status, found and found["pid"]))


def test_the_watcher_needs_only_the_rank_session_interface(tmp_path):
    books = Books(tmp_path)
    session: RankSession = books             # all a watcher needs (a static check)
    watcher = RankWatcher(session, [Counting], root=1, mode="auto")
    watcher._found(0, os.getpid(), "torch.distributed", 2, 1)       # below the root: the switch
    assert books.switched[0]["root_collectors_stopped"] == ["counting"]
    assert books.owned == {"gpu:1": 0}
    watcher.stop()
    assert books.statuses == [(0, "counting", "ok", os.getpid()), (0, "counting", "ok", os.getpid())]
