"""Run.rank_meta: each rank's own meta.json when it joined another process's run, else the
run's; the ranks' folders listed once for a command's thousand calls (a listing per call was
quadratic in the ranks), and again when a rank joins a live run."""
from __future__ import annotations

import json
import os
import time

from counterprof.store.reader import Run


def _run(path, ranks):
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"status": "complete", "host": {"hostname": "launcher"}}))
    for r in ranks:
        d = path / "_ranks" / f"rank={r}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"status": "complete", "rank": r,
                                                 "host": {"hostname": f"node{r // 8}"}}))
    return path


def _finished_an_hour_ago(path):
    old = time.time_ns() - 3600 * 10**9
    for folder in (path, path / "_ranks"):
        os.utime(folder, ns=(old, old))
    return path


def test_each_rank_reads_its_own_meta_from_one_listing(tmp_path, monkeypatch):
    run = Run(_finished_an_hour_ago(_run(tmp_path / "run", range(1, 257))))
    listed = []
    real = os.scandir

    def counting(p=".", *a, **kw):
        listed.append(os.fspath(p))
        return real(p, *a, **kw)
    monkeypatch.setattr(os, "scandir", counting)
    hosts = {r: run.rank_meta(r)["host"]["hostname"] for r in range(0, 257)}
    assert hosts[0] == "launcher"                       # no folder of its own: the run's
    assert hosts[1] == "node0" and hosts[9] == "node1" and hosts[256] == "node32"
    assert listed.count(str(tmp_path / "run" / "_ranks")) == 1, len(listed)


def test_a_rank_joining_later_is_found(tmp_path):
    path = _finished_an_hour_ago(_run(tmp_path / "run", [1]))
    run = Run(path)
    assert run.rank_meta(2)["host"]["hostname"] == "launcher"
    _join(path, 2, "late")                              # the folder's mtime moves on
    assert run.rank_meta(2)["host"]["hostname"] == "late"


def test_a_rank_joining_in_the_listings_clock_tick_is_found(tmp_path):
    """A coarse clock (jiffies, FAT, NFS) can give the folder the same mtime after a rank
    joined as at the listing before: a folder changed within 2 s of its listing is listed again."""
    path = _run(tmp_path / "run", [1])
    run = Run(path)
    assert run.rank_meta(2)["host"]["hostname"] == "launcher"
    tick = (path / "_ranks").stat().st_mtime_ns
    _join(path, 2, "same tick")
    os.utime(path / "_ranks", ns=(tick, tick))
    assert run.rank_meta(2)["host"]["hostname"] == "same tick"


def _join(path, rank, host):
    d = path / "_ranks" / f"rank={rank}"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"status": "running", "rank": rank, "host": {"hostname": host}}))
