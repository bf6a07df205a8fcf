"""Run.rank_meta: each rank's own meta.json when it joined another process's run, else the
run's; the ranks' folders listed once for a command's thousand calls (a listing per call was
quadratic in the ranks), and again when a rank joins a live run."""
from __future__ import annotations

import json
import os

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


def test_each_rank_reads_its_own_meta_from_one_listing(tmp_path, monkeypatch):
    run = Run(_run(tmp_path / "run", range(1, 257)))
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
    path = _run(tmp_path / "run", [1])
    run = Run(path)
    assert run.rank_meta(2)["host"]["hostname"] == "launcher"
    d = path / "_ranks" / "rank=2"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"status": "running", "rank": 2, "host": {"hostname": "late"}}))
    os.utime(path / "_ranks", ns=(0, (path / "_ranks").stat().st_mtime_ns + 1))   # (a coarse clock)
    assert run.rank_meta(2)["host"]["hostname"] == "late"
