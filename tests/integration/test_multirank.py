"""A real 2-rank gloo job through torchrun under `counterprof run --torch`: one partition per
rank with its own perf, host and torch data, per-rank verdicts, and the straggler found."""
import json
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pytest

import counterprof
from helpers import EXAMPLES, PYTHON, run_cli

torch = pytest.importorskip("torch")
TORCHRUN = Path(PYTHON).parent / "torchrun"


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    if not TORCHRUN.exists():
        pytest.skip("torchrun is not installed next to this interpreter")
    run_dir = tmp_path_factory.mktemp("mr") / "r"
    proc = run_cli("run", "-q", "--torch", "--torch-window", "10/20", "-o", str(run_dir), "--",
                   str(TORCHRUN), "--nproc_per_node", "2", str(EXAMPLES / "gloo_allreduce.py"), "20", "40",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc


def test_each_rank_has_its_own_partition(straggler_run):
    run_dir, proc = straggler_run
    run = counterprof.load(run_dir)
    assert run.ranks() == [0, 1]
    meta = run.meta
    assert meta["per_rank"] is True
    assert set(meta["ranks"]) == {"0", "1"}
    assert meta["ranks"]["0"]["pid"] != meta["ranks"]["1"]["pid"]
    assert meta["ranks"]["1"]["collectors"]["perf"]["status"] == "ok"
    for r in (0, 1):
        s = run.samples(rank=r)
        metrics = set(s["metric"].cast("string").to_pylist())
        assert {"task-clock", "proc.rss"} <= metrics
        tc = s.filter(pc.equal(s["metric"].cast("string"), "task-clock"))
        assert set(tc["entity"].cast("string").to_pylist()) == {"process"}
        assert pc.sum(tc["value"]).as_py() > 0.2e9        # each rank's own CPU, not the sum
        spans = run.table("spans", rank=r)
        assert spans.filter(pc.equal(spans["category"].cast("string"), "collective")).num_rows > 0
    # the unsupported events are said once, not once per rank
    assert proc.stderr.count("<not supported> here") <= 1


def test_report_finds_the_straggler_and_gives_a_verdict_per_rank(straggler_run):
    run_dir, _ = straggler_run
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    assert [v["scope"] for v in r["rank_verdicts"]] == ["rank 0", "rank 1"]
    assert r["rank_verdicts"][0]["verdict"] == "collectives"      # rank 0 waits in all_reduce
    ra = r["rank_analysis"]
    assert ra["straggler"] == 1 and ra["steps"] >= 8
    ranks = {f["rank"]: f for f in ra["ranks"]}
    assert ranks[1]["slowest_in"] >= 0.8 * ra["steps"]
    assert ranks[0]["waited_s_per_step"] == pytest.approx(0.040, rel=0.5)
    assert any("rank 1 is the straggler" in e["text"] for e in r["overall"]["secondary"])
    text = run_cli("report", str(run_dir))
    assert "ranks (per step" in text.stdout and "1 ◀" in text.stdout


def test_per_rank_without_ranks_says_so(tmp_path):
    proc = run_cli("run", "-q", "--per-rank", "-o", str(tmp_path / "r"), "--", "true")
    assert proc.returncode == 0
    assert "no process of the workload named a rank" in proc.stderr
