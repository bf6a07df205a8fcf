"""`counterprof collectives` on real gloo jobs whose truth is their own: tests/jobs/collective_skew.py
times each of its calls on every rank and makes its last rank late by a known sleep before
chosen all_reduces. Held: the late rank and its calls named with the skew the job saw, the
transfer (so busbw) of each call against the job's own timing of it, the all_to_all's split,
each call against the curve a real `calibrate` measured and the run copied; the imported NCCL
traces; bad input."""
import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from browser import CHROMIUM, SKIP_REASON, render
from helpers import COUNTERPROF, PYTHON, REPO, run_cli
from kineto_traces import MISSING, SHARED, shared

JOBS = REPO / "tests" / "jobs"
DELAY_MS = 40.0
NEEDS_DIST = pytest.mark.skipif(
    subprocess.run([PYTHON, "-c", "import torch.distributed as d; assert d.is_available()"],
                   capture_output=True).returncode != 0, reason="torch.distributed is not available")


def torchrun() -> list[str]:
    exe = Path(PYTHON).with_name("torchrun")
    return [str(exe)] if exe.exists() else [PYTHON, "-m", "torch.distributed.run"]


def profiled(out: Path, ranks: int, env: dict, steps: int = 24) -> tuple[dict, dict[int, dict], Path]:
    """The job under `counterprof run --torch` on RANKS ranks: (collectives --json, the job's
    truth per rank, the run directory)."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir, truth = out / "run", out / "truth.jsonl"
    env = dict(env, JOB_TRUTH=str(truth))
    proc = subprocess.run([*COUNTERPROF, "run", "--torch", "-q", "-o", str(run_dir), "--", *torchrun(),
                           "--standalone", "--nproc_per_node", str(ranks), str(JOBS / "collective_skew.py"),
                           "--steps", str(steps), "--delay-ms", str(DELAY_MS)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = run_cli("collectives", str(run_dir), "--json", env=env)
    assert rep.returncode == 0, rep.stderr
    lines = [json.loads(ln) for ln in truth.read_text().splitlines()]
    return json.loads(rep.stdout), {t["rank"]: t for t in lines}, run_dir


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> dict:
    """A real `calibrate --quick` (its collectives' sweep) saved where runs find it."""
    cache = tmp_path_factory.mktemp("cache")
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    proc = run_cli("calibrate", "--quick", "--force", timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return env


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, calibrated):
    return profiled(tmp_path_factory.mktemp("two"), 2, calibrated)


def job_calls(c: dict, truth: dict[int, dict]) -> dict[int, dict]:
    """The job's own record of a call on each rank: the same op in the same step (the trace's
    ProfilerStep#N is the job's step N: the driver counts optimizer steps as the job does)."""
    step = int(c["step"].split("#")[1])
    out = {}
    for r in c["ranks"]:
        out[r] = next(x for x in truth[r]["calls"] if x["op"] == c["op"] and x["step"] == step)
        arrival = c["start_ns"] + int(c["arrival_us"][str(r)] * 1e3)
        assert abs(out[r]["start_unix_ns"] - arrival) < 50e6, (c, out[r])     # the same call, in time too
    return out


@NEEDS_DIST
def test_the_late_rank_and_its_calls_are_named_with_the_skew_the_job_saw(two_ranks):
    j, truth, _ = two_ranks
    late = truth[0]["late_rank"]
    delayed = [c for c in j["calls"] if c["op"] == "all_reduce"
               and job_calls(c, truth)[late]["step"] in truth[late]["delayed_steps"]]
    assert len(delayed) >= 2, [c["step"] for c in j["calls"]]
    for c in j["calls"]:
        mine = job_calls(c, truth)
        starts = [m["start_unix_ns"] for m in mine.values()]
        seen = (max(starts) - min(starts)) / 1e3
        assert abs(c["skew_us"] - seen) < 5000, (c, seen)           # within 5 ms of the job's own
    for c in delayed:
        assert c["last_rank"] == late, c
        assert abs(c["skew_us"] / 1e3 - DELAY_MS) < 10, c            # the sleep, less the others' own lateness
        assert c["wait_us"][str(1 - late)] > 0.7 * DELAY_MS * 1e3, c
    by = {b["rank"]: b for b in j["by_rank"]}
    waited = sum(c["wait_us"][str(1 - late)] for c in delayed) / 1e6
    assert by[late]["others_waited_s"] >= waited * 0.99
    assert by[late]["others_waited_s"] == max(b["others_waited_s"] for b in by.values())


@NEEDS_DIST
def test_each_calls_transfer_and_busbw_match_the_jobs_own_timing(two_ranks):
    """The transfer is the shortest rank's time in the call: the job's perf_counter around the
    blocking call holds gloo's span (plus Python's dispatch, which a 4 MiB all_reduce dwarfs)."""
    j, truth, _ = two_ranks
    ratios = []
    for c in j["calls"]:
        own = min(m["duration_s"] for m in job_calls(c, truth).values()) * 1e6
        assert c["transfer_us"] <= own + 500, (c, own)                # the span lies inside the call
        if c["op"] == "all_reduce":
            ratios.append(c["transfer_us"] / own)
            factor = 2 * (2 - 1) / 2
            assert c["busbw_gbps"] == pytest.approx(c["bytes"] / (c["transfer_us"] / 1e6) * factor / 1e9, rel=1e-3)
            assert c["bytes"] == 4 << 20 and c["group_size"] == 2
    assert 0.8 <= statistics.median(ratios) <= 1.05, ratios


@NEEDS_DIST
def test_all_to_all_shows_its_uneven_split(two_ranks):
    j, _, _ = two_ranks
    a2a = [c for c in j["calls"] if c["op"] == "all_to_all"]
    assert a2a
    for c in a2a:                 # rank r sends (r + 1) x 64 KiB x 2: 128 and 256 KiB
        assert c["bytes_by_rank"] == {"0": 128 << 10, "1": 256 << 10}
        assert c["imbalance"] == pytest.approx(256 / 192, rel=1e-3)
    assert all(c["bytes"] == 512 << 10 for c in j["calls"] if c["op"] == "all_gather")   # 256 KiB x 2 gathered


@NEEDS_DIST
def test_each_call_is_held_to_the_curve_calibrate_measured(two_ranks, calibrated):
    j, _, run_dir = two_ranks
    assert j["curve"] == "gloo"
    ceilings = json.loads((run_dir / "meta.json").read_text())["ceilings"]
    sweep = ceilings["cpu"]["collectives"]["gloo"]["all_reduce"]["sizes"]
    sizes = sorted(sweep, key=int)
    assert int(sizes[0]) == 8 and int(sizes[-1]) >= 16 << 20 and len(sizes) >= 6
    # monotone within its noise: no size below half of what a smaller one reached
    best = 0.0
    for s in sizes:
        bw = sweep[s]["busbw_bytes_per_s"]
        assert bw >= 0.5 * best, (s, bw, best, sweep)
        best = max(best, bw)
    assert sweep[sizes[-1]]["busbw_bytes_per_s"] > 100 * sweep[sizes[0]]["busbw_bytes_per_s"]
    for c in j["calls"]:
        if c["op"] in ("all_reduce", "all_gather"):
            assert c["fraction_of_curve"] is not None and 0.01 < c["fraction_of_curve"] < 5, c
    s = {(x["op"], x["size"]): x for x in j["summary"]}
    assert s[("all_reduce", "4 MiB")]["median_fraction_of_curve"] is not None


@NEEDS_DIST
def test_text_names_the_late_rank_and_the_page_draws_every_call(two_ranks, tmp_path, calibrated):
    j, truth, run_dir = two_ranks
    late = truth[0]["late_rank"]
    html = tmp_path / "c.html"
    proc = run_cli("collectives", str(run_dir), "--html", str(html), env=calibrated)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "per operation, size and group" in out and "per rank" in out and f"rank {late} late" in out
    assert "curve: gloo (calibrate)" in out
    page = html.read_text()
    drawn = sum(1 for c in j["calls"] if c["busbw_gbps"])
    assert page.count('class="call"') == drawn and page.count("class='curve'") >= 2
    if CHROMIUM is not None:
        dom = render(html, tmp_path, height=1400)
        assert dom.count('class="call"') == drawn and 'class="skew"' in dom


@NEEDS_DIST
def test_the_report_names_the_same_late_rank_with_the_same_figures(two_ranks, calibrated):
    """One definition: the report's evidence, its ranks table and its straggler say what
    `collectives` says about who the others waited for."""
    j, truth, run_dir = two_ranks
    late = truth[0]["late_rank"]
    rep = run_cli("report", str(run_dir), "--json", env=calibrated)
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    assert r["collective_calls"]["by_rank"] == j["by_rank"]
    assert r["rank_analysis"]["straggler"] == late
    said = " ".join(e["text"] for e in r["overall"]["secondary"])
    assert f"rank {late} arrived last at" in said and "counterprof collectives" in said
    text = run_cli("report", str(run_dir), env=calibrated).stdout
    assert "last at calls" in text


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_page_renders_in_a_browser(two_ranks, tmp_path):
    _, _, run_dir = two_ranks
    html = tmp_path / "c.html"
    assert run_cli("collectives", str(run_dir), "--html", str(html)).returncode == 0
    dom = render(html, tmp_path, height=1400)
    assert "<svg" in dom and "bus bandwidth per call" in dom


@NEEDS_DIST
def test_four_ranks_on_two_cores_still_name_the_late_rank(tmp_path):
    """4 ranks oversubscribe the 2 cores: any rank may lose its CPU for a time slice, so only
    what does not depend on it is held: the late rank is last at most delayed all_reduces, by
    about the sleep."""
    j, truth, _ = profiled(tmp_path, 4, dict(os.environ), steps=18)
    late = truth[0]["late_rank"]
    assert j["ranks"] == [0, 1, 2, 3], (j["ranks"], j["notes"])
    delayed = [c for c in j["calls"] if c["op"] == "all_reduce" and len(c["ranks"]) == 4
               and job_calls(c, truth)[late]["step"] in truth[late]["delayed_steps"]]
    assert delayed, ([(c["op"], c["step"], c["ranks"]) for c in j["calls"]], j["unmatched"], j["notes"])
    named = [c for c in delayed if c["last_rank"] == late and abs(c["skew_us"] / 1e3 - DELAY_MS) < 20]
    assert len(named) >= 0.75 * len(delayed), [(c["step"], c["last_rank"], c["skew_us"]) for c in delayed]
    a2a = [c for c in j["calls"] if c["op"] == "all_to_all"]
    assert a2a and all(c["imbalance"] == pytest.approx(4 / 2.5, rel=1e-3) for c in a2a)


@NEEDS_DIST
def test_a_bucketed_ddp_job_all_reduces_its_gradients_once_a_step(tmp_path):
    """DDP's reducer all_reduces the gradients in buckets at the end of the synced backward
    (tests/jobs/ddp_train.py: one no_sync micro-batch, one synced, a step): per traced step the
    all_reduces' bytes add up to the model's gradient bytes, which the job counts itself, and
    the buffers' broadcast to the buffers' bytes."""
    out = tmp_path / "ddp"
    truth_file = tmp_path / "truth.jsonl"
    env = dict(os.environ, JOB_TRUTH=str(truth_file))
    proc = subprocess.run([*COUNTERPROF, "run", "--torch", "-q", "-o", str(out), "--", *torchrun(), "--standalone",
                           "--nproc_per_node", "2", str(JOBS / "ddp_train.py")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    truth = json.loads(truth_file.read_text().splitlines()[0])
    rep = run_cli("collectives", str(out), "--json")
    assert rep.returncode == 0, rep.stderr
    j = json.loads(rep.stdout)
    per_step: dict[str, list[dict]] = {}
    for c in j["calls"]:
        per_step.setdefault(c["step"], []).append(c)
    assert per_step, j
    for step, calls in per_step.items():
        assert all(c["complete"] and c["group_size"] == 2 for c in calls), calls
        reduced = sum(c["bytes"] for c in calls if c["op"] == "all_reduce")
        assert reduced == truth["grad_bytes"], (step, [(c["op"], c["bytes"]) for c in calls])
        buckets = [c for c in calls if c["op"] == "all_reduce"]
        assert len(buckets) >= 2, buckets                # bucketed: more than one all_reduce
        assert [c["bytes"] for c in calls if c["op"] == "broadcast"] == [truth["buffer_bytes"]]
    assert not j["unmatched"], j["unmatched"]


@pytest.mark.skipif(SHARED is None, reason=MISSING)
def test_an_imported_nccl_trace_gives_each_calls_bandwidth_from_its_kernel(tmp_path):
    run_dir = tmp_path / "imp"
    assert run_cli("import", str(shared("a100_nccl_rank0of2.json.gz")), "-o", str(run_dir)).returncode == 0
    proc = run_cli("collectives", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    assert j["calls_from"] == {"0": "device kernels"}
    sized = [c for c in j["calls"] if c["bytes"]]
    assert sized and all(c["group_size"] == 2 and not c["complete"] and c["skew_us"] is None for c in sized)
    assert {c["op"] for c in sized} >= {"all_reduce", "broadcast"}
    assert any("fewer ranks than their group" in n for n in j["notes"])
    text = run_cli("collectives", str(run_dir)).stdout
    assert "all_reduce" in text and "GB/s" in text


@NEEDS_DIST
def test_a_damaged_file_is_named_and_the_rest_is_read(two_ranks, tmp_path):
    import shutil
    _, _, run_dir = two_ranks
    cut = tmp_path / "cut"
    shutil.copytree(run_dir, cut)
    victim = sorted((cut / "spans" / "rank=1").glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:3000])
    proc = run_cli("collectives", str(cut), "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert victim.name in proc.stderr
    assert json.loads(proc.stdout)["ranks"] == [0]


def test_a_run_without_traces_is_one_line(tmp_path):
    run_dir = tmp_path / "r"
    assert run_cli("run", "-q", "--collectors", "host", "-o", str(run_dir), "--", "true").returncode == 0
    proc = run_cli("collectives", str(run_dir))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no torch trace spans" in proc.stderr and "counterprof run --torch" in proc.stderr
    wrong = run_cli("collectives", str(run_dir), "--rank", "9")
    assert wrong.returncode == 2 and "the run has rank(s)" in wrong.stderr, wrong.stderr
    missing = run_cli("collectives", str(tmp_path / "nowhere"))
    assert missing.returncode != 0 and "Traceback" not in missing.stderr and missing.stderr.count("\n") <= 2
