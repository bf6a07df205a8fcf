"""Ranks of any launcher: a DDP job started by torch.multiprocessing.spawn (ranks known only once
each calls init_process_group, announced by the torch driver), the same job under torchrun
(ranks in the environment), and a multiprocessing job naming its ranks with COUNTERPROF_RANK.
Each rank's CPU as counterprof counts it is held to the rank's own time.process_time()."""
import json
import os
import stat

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import counterprof
from helpers import PYTHON, REPO, free_port, run_cli

WORKLOADS = REPO / "tests" / "rank_workloads.py"
TORCHRUN = os.path.join(os.path.dirname(PYTHON), "torchrun")
STEPS = "20"


def rank_reports(out):
    return {d["rank"]: d for d in (json.loads(p.read_text()) for p in out.glob("rank*.json"))}


def task_clock_s(run, rank, from_ns=None, to_ns=None):
    """perf's task-clock of one rank partition, over the intervals that meet [from_ns, to_ns]."""
    s = run.samples(rank=rank)
    tc = s.filter(pc.equal(s["metric"].cast("string"), "task-clock"))
    if from_ns is not None:
        end = tc["time"].cast(pa.int64())
        start = pc.subtract(end, tc["duration_ns"])
        tc = tc.filter(pc.and_(pc.greater(end, from_ns), pc.less(start, to_ns)))
    return (pc.sum(tc["value"]).as_py() or 0) / 1e9


def assert_own_cpu(run, reports):
    """Each rank's counted CPU over its own measured span is its own, within 15%."""
    for rank, rep in reports.items():
        counted = task_clock_s(run, rank, rep["from_ns"], rep["to_ns"])
        assert counted == pytest.approx(rep["cpu_s"], rel=0.15), (rank, counted, rep)


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """The DDP job launched with torch.multiprocessing.spawn, --torch, no --per-rank."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("spawn")
    out, run_dir = base / "out", base / "run"
    out.mkdir()
    proc = run_cli("run", "-q", "--torch", "-o", str(run_dir), "--", PYTHON, str(WORKLOADS),
                   "ddp", str(out), STEPS, str(free_port()), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return counterprof.load(run_dir), rank_reports(out), proc


def test_spawned_ranks_are_announced_and_counted_on_their_own(spawned):
    run, reports, proc = spawned
    assert sorted(reports) == [0, 1]
    assert run.ranks() == [0, 1]
    meta = run.meta
    assert meta["per_rank"] == "auto"
    ranks = meta["ranks"]
    assert {int(r): e["pid"] for r, e in ranks.items()} == {r: d["pid"] for r, d in reports.items()}
    for entry in ranks.values():
        assert entry["source"] == "torch.distributed" and entry["world_size"] == 2
        assert entry["collectors"]["perf"]["status"] == "ok"
    switch = meta["rank_switch"]
    assert switch["root_pid"] == meta["target"]["pid"] not in {d["pid"] for d in reports.values()}
    assert switch["trigger"]["source"] == "torch.distributed"
    assert set(switch["root_collectors_stopped"]) >= {"perf", "host"}
    assert meta["start_ns"] < switch["at_ns"] < min(d["from_ns"] for d in reports.values()) + 2e9
    assert_own_cpu(run, reports)
    # rank 0 holds the tree only until the switch: not rank 1's CPU too; rank 1 is not empty
    r0, r1 = task_clock_s(run, 0), task_clock_s(run, 1)
    assert r1 >= 0.85 * reports[1]["cpu_s"]
    assert r0 < 0.8 * (r0 + r1)
    assert "named a rank" not in proc.stderr


def test_announcements_are_the_owners_alone(spawned):
    run, reports, _ = spawned
    folder = run.path / ".ranks"
    assert stat.S_IMODE(folder.lstat().st_mode) == 0o700
    for d in reports.values():
        f = folder / f"{d['pid']}.json"
        assert stat.S_IMODE(f.lstat().st_mode) == 0o600
        doc = json.loads(f.read_text())
        assert doc["rank"] == d["rank"] and doc["world_size"] == 2 and doc["local_rank"] is doc["cuda_device"] is None


def test_spawned_ranks_with_explicit_per_rank(tmp_path):
    """--per-rank: the launcher (the spawning process) is not counted, the announced ranks are."""
    pytest.importorskip("torch")
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    proc = run_cli("run", "-q", "--torch", "--per-rank", "-o", str(run_dir), "--", PYTHON,
                   str(WORKLOADS), "ddp", str(out), "5", str(free_port()), timeout=300)
    assert proc.returncode == 0, proc.stderr
    run, reports = counterprof.load(run_dir), rank_reports(out)
    assert run.meta["per_rank"] is True and "rank_switch" not in run.meta
    assert {int(r): e["pid"] for r, e in run.meta["ranks"].items()} == {
        r: d["pid"] for r, d in reports.items()}
    assert_own_cpu(run, reports)


def test_the_same_job_under_torchrun(tmp_path):
    pytest.importorskip("torch")
    if not os.path.exists(TORCHRUN):
        pytest.skip("torchrun is not installed next to this interpreter")
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    proc = run_cli("run", "-q", "--torch", "-o", str(run_dir), "--", TORCHRUN, "--standalone",
                   "--nproc_per_node", "2", str(WORKLOADS), "ddp", str(out), STEPS, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run, reports = counterprof.load(run_dir), rank_reports(out)
    meta = run.meta
    assert meta["per_rank"] is True and "rank_switch" not in meta
    for r, d in reports.items():       # found from RANK; the announcement agrees, no warning
        entry = meta["ranks"][str(r)]
        assert (entry["pid"], entry["source"], entry["gpu"]) == (d["pid"], "environment", r)
    assert not [w for w in meta["warnings"] if "rank" in w], meta["warnings"]
    assert_own_cpu(run, reports)


def test_multiprocessing_ranks_named_by_counterprof_rank(tmp_path):
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    proc = run_cli("run", "-q", "--per-rank", "-o", str(run_dir), "--", PYTHON, str(WORKLOADS),
                   "mp", str(out), "0.8", timeout=120)
    assert proc.returncode == 0, proc.stderr
    run, reports = counterprof.load(run_dir), rank_reports(out)
    assert sorted(reports) == run.ranks() == [0, 1]
    assert {int(r): (e["pid"], e["source"]) for r, e in run.meta["ranks"].items()} == {
        r: (d["pid"], "environment") for r, d in reports.items()}
    assert_own_cpu(run, reports)
    assert "named a rank" not in proc.stderr


def test_per_rank_that_finds_no_rank_says_how_to_name_one(tmp_path):
    proc = run_cli("run", "-q", "--per-rank", "-o", str(tmp_path / "run"), "--", PYTHON, "-c",
                   "pass", timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if "named a rank" in ln)
    assert "COUNTERPROF_RANK" in line and "torch.distributed" in line


ONE_PROCESS = """
import json, os, sys, torch, torch.distributed as dist
run = os.environ["COUNTERPROF_RUN_DIR"]
folder = os.path.join(run, ".ranks")
if sys.argv[1] == "link":                 # the announcement folder swapped for a link
    os.rename(folder, folder + "-real")
    os.mkdir(os.path.join(run, "elsewhere"))
    os.symlink(os.path.join(run, "elsewhere"), folder)
init = dist.distributed_c10d.init_process_group
if sys.argv[1] == "unwrapped":            # a process group made without our wrapper
    init = init.__wrapped__
init("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
seen = {"after_init": sorted(os.listdir(folder))}
model = torch.nn.Linear(4, 4)
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 4)).sum().backward()
opt.step()
seen["after_step"] = sorted(os.listdir(folder))
dist.destroy_process_group()
print(json.dumps({"pid": os.getpid(), **seen}))
"""


def one_process(tmp_path, how):
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    proc = run_cli("run", "-q", "--torch", "-o", str(run_dir), "--", PYTHON, "-c", ONE_PROCESS,
                   how, str(free_port()), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return counterprof.load(run_dir), json.loads(proc.stdout), proc.stderr


def test_a_one_process_job_announces_itself_and_nothing_switches(tmp_path):
    run, seen, _ = one_process(tmp_path, "wrapped")
    name = f"{seen['pid']}.json"
    assert seen["after_init"] == [name]                 # right after init_process_group returned
    assert json.loads((run.path / ".ranks" / name).read_text())["world_size"] == 1
    assert run.meta["per_rank"] == "auto"
    assert "rank_switch" not in run.meta and "ranks" not in run.meta   # the root counted it all
    assert run.ranks() == [0] and task_clock_s(run, 0) > 0


def test_a_process_group_made_around_the_wrapper_is_announced_at_the_first_step(tmp_path):
    _, seen, _ = one_process(tmp_path, "unwrapped")
    assert seen["after_init"] == [] and seen["after_step"] == [f"{seen['pid']}.json"]


def test_a_linked_announcement_folder_is_refused_and_the_job_goes_on(tmp_path):
    run, seen, stderr = one_process(tmp_path, "link")
    assert seen["after_step"] == [] and os.listdir(run.path / "elsewhere") == []
    assert f"could not announce the rank of pid {seen['pid']}" in stderr
    assert (f"rank announcement {run.path / '.ranks'}: is a symbolic link: no announcement in it "
            "is read; ignored") in stderr
