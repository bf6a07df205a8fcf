"""The verdict and the roofline on runs recorded on a real NVIDIA H200 (2026-12-04, through
tests/gpu/device_checks.sh): the four labelled GPU jobs of tests/jobs/gpu_*.py under
`counterprof run --torch`, kept as their Parquet samples and spans (tests/data/h200/<job>/,
the raw Kineto traces left out) with each job's own accounting (truth.json). So CI, which has
no GPU, holds the analysis to real NVML, GPM and CUPTI data:

  gpt2_train         1B-parameter GPT-2, bf16, fused AdamW: matmuls and attention 72% of a
                     steady step (the job's own CUDA-event timing)                 -> compute
  embedding_train    20M-row embedding, dense gradients, fused AdamW at 61% of a copy's
                     bandwidth; GPM: tensor cores 0.9%, DRAM 55%                   -> memory
  small_batch_serve  batch-1 eager inference: GPU busy 15% of the loop alone, 3% of the
                     recorded loop, which the profiler slowed 4.75x (CUDA-graph replay) -> host
  dataloader_bound   2 DataLoader workers decoding in Python: 67% of the loop in __next__ -> host

The recordings say how they were made (truth.json's "recording"): with the torch windows' old
exact 5/50 schedule, which the paced default replaced in the same change; for small_batch_serve
that meant 61 windows and a loop 4.75x its time alone, so its truth is held both as recorded and
as the job measured itself alone. A GPU lent later re-makes them (tests/gpu/device_checks.sh).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import gpu_jobs
from helpers import REPO, run_cli

DATA = REPO / "tests" / "data" / "h200"
JOBS = ("gpt2_train", "embedding_train", "small_batch_serve", "dataloader_bound")


def recorded(tmp_path: Path, job: str) -> tuple[Path, dict]:
    run = tmp_path / job
    shutil.copytree(DATA / job, run)       # report may write beside the data: work on a copy
    return run, json.loads((run / "truth.json").read_text())


def step_verdict(run: Path) -> dict:
    rep = run_cli("report", str(run), "--json")
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    step = next(r for r in report["regions"] if r["name"] == "ProfilerStep")
    return step["verdict"]


@pytest.mark.parametrize("job", JOBS)
def test_the_verdict_on_a_real_h200_run_follows_the_jobs_own_accounting(tmp_path, job):
    """gpu_jobs.check: the verdict one the job's own figures allow, its host (or memory) share
    within 15 points of the range they give; where the job was also timed alone, that truth too."""
    run, t = recorded(tmp_path, job)
    v = step_verdict(run)
    for truth in (t["truth"], t.get("alone")):
        if truth:
            problems = gpu_jobs.check({"job": job, "rc": 0, "step": v, "truth": truth})
            assert not problems, problems


@pytest.mark.parametrize("job", JOBS)
def test_each_recording_says_how_it_was_made(job):
    """A recording is marked with what it is: the date, the device, the torch windows' schedule,
    its trace count, and its loop's slowdown under the profiler where the job also ran alone; a
    slowdown over 1.5x (the profiler's cost is then part of the truth) must say so in a note."""
    t = json.loads((DATA / job / "truth.json").read_text())
    meta = json.loads((DATA / job / "meta.json").read_text())
    rec = t.get("recording")
    assert rec and rec.get("torch_windows") and rec.get("date") and rec.get("device") == meta["gpus"][0]["name"], rec
    assert rec["traces"] == meta["collectors"]["torch"]["traces"], (rec, meta["collectors"]["torch"])
    alone = t.get("alone")
    if alone:
        slowdown = t["truth"]["loop_s"] / alone["loop_s"]
        assert rec["loop_under_profiler_vs_alone"] == pytest.approx(slowdown, abs=0.01), rec
        if slowdown > 1.5:
            assert "note" in rec and f"{t['truth']['loop_s']:.2f} s" in rec["note"] \
                and f"{alone['loop_s']:.2f} s" in rec["note"], rec


def test_gpm_percentages_under_one_percent_are_read_as_percentages(tmp_path):
    """The embedding job's tensor cores averaged 0.9% (GPM records percent); read as a fraction
    (90%) it was once called compute-bound."""
    run, _ = recorded(tmp_path, "embedding_train")
    v = step_verdict(run)
    tensor = next(e for e in v["evidence"] if e["metric"] == "gpm_tensor")
    assert tensor["value"] < 0.05, tensor
    assert v["verdict"] == "memory"


def test_small_batch_serving_is_called_launch_bound(tmp_path):
    run, _ = recorded(tmp_path, "small_batch_serve")
    v = step_verdict(run)
    assert any("launch-bound" in e["text"] for e in v["evidence"]), [e["text"] for e in v["evidence"]]


def test_the_rooflines_model_flops_match_the_jobs_own_count(tmp_path):
    """MFU from the traced ops' FLOPs over the traced steps' time, held to the job's own count
    (6 x parameters x tokens plus attention, per step) over a steady step it timed itself."""
    run, t = recorded(tmp_path, "gpt2_train")
    roof = run_cli("roofline", str(run), "--json")
    assert roof.returncode == 0, roof.stderr
    mfu = json.loads(roof.stdout)["mfu"]
    truth = t["truth"]
    per_step = truth["model_flops_per_s"] * truth["loop_s"] / truth["steps"]
    own = per_step / truth["steady_step_s"]
    assert mfu["dtype"] == "bf16"
    assert mfu["flops_per_s"] == pytest.approx(own, rel=0.10), (mfu["flops_per_s"] / 1e12, own / 1e12)
