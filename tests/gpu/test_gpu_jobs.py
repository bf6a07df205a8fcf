"""On a real NVIDIA GPU: the verdict of `counterprof run --torch` + `report` on jobs written as
ML engineers write them (tests/jobs/gpu_*.py), held to what each job measured of itself:

  gpt2_train         GPT-2 (XL width, 6 layers) in bf16 autocast, fused AdamW   -> compute
  embedding_train    a 20M-row embedding with dense gradients under AdamW       -> memory
  small_batch_serve  batch-1 eager inference, .item() per request               -> host
  dataloader_bound   a conv net fed by 2 DataLoader workers decoding in Python  -> host

Each verdict is held to what the job's own figures allow (gpu_jobs.allowed_verdicts): the GPT-2
job's to its tensor-core share (its matmuls and flash attention timed alone at the step's shapes,
over a steady step): compute from 60 %; the embedding job's to its optimizer's share of the loop
and the bandwidth it reached against a copy it timed: memory from 60 % of the loop at 50 % of the
copy's bandwidth. Shares are held within 15 points of the job's own range (gpu_jobs.check): host
1 - the GPU time per request from a CUDA-graph replay of the same forward; at least the time
waiting in the DataLoader's __next__; memory at least the optimizer's GPU time.

Skipped, with the reason, where torch has no CUDA device. `pytest -s tests/gpu` prints the
table; COUNTERPROF_GPU_OUT=DIR keeps the runs and gpu_jobs.json there.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import gpu_jobs

torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device (CPU build or no driver)"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = Path(os.environ.get("COUNTERPROF_GPU_OUT") or tmp_path_factory.mktemp("gpu-jobs")) / "jobs"
    res = {}
    for name in gpu_jobs.SPECS:
        r = gpu_jobs.run_job(name, out)
        if name in ("gpt2_train", "small_batch_serve"):
            r["alone"] = gpu_jobs.run_alone(name, out)
        res[name] = r
    (out / "gpu_jobs.json").write_text(json.dumps(list(res.values()), indent=1, default=str))
    print("\n" + gpu_jobs.table(list(res.values())))
    return res


def _step(r: dict) -> dict:
    assert r["rc"] == 0, f"{r['job']}: counterprof run exited {r['rc']}"
    assert "report_error" not in r, r.get("report_error")
    assert r["step"] is not None, f"{r['job']}: no ProfilerStep region in the report"
    return r["step"]


@pytest.mark.parametrize("name", ["gpt2_train", "embedding_train"])
def test_busy_jobs(results, name):
    r = results[name]
    v = _step(r)
    print(f"\n{name}: {v['verdict']} {v['shares']}; {gpu_jobs._evidence(v)}; "
          f"{gpu_jobs.own_figure(name, r['truth'])}")
    problems = gpu_jobs.check(r)
    assert not problems, problems


@pytest.mark.parametrize("name", ["small_batch_serve", "dataloader_bound"])
def test_host_bound_jobs(results, name):
    r = results[name]
    v = _step(r)
    lo, hi = gpu_jobs.expected_host_share(name, r["truth"])
    print(f"\n{name}: {v['verdict']} {v['shares']}, the job's own host share {lo:.0%}..{hi:.0%}")
    assert gpu_jobs.allowed_verdicts(name, r["truth"]) == {"host"}
    problems = gpu_jobs.check(r)
    assert not problems, problems
