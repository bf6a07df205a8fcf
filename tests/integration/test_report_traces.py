"""Verdicts on the real GPU traces in ../shared/traces (imported: spans, no samples), each held
to its breakdown, and the 2-rank gloo example under `counterprof run --torch`.

The host share is held to the GPU's idle share as HTA 0.5.0 computed it on the same trace
(tests/data/hta_reference.json, an independent implementation), not only to the report's own
breakdown: the two come from one code path, and the check would be circular without HTA's."""
import json
import math

import pytest

from helpers import REPO, EXAMPLES, PYTHON, run_cli
from kineto_traces import needs_shared_traces, shared

HTA = json.loads((REPO / "tests" / "data" / "hta_reference.json").read_text())["traces"]

# trace -> (verdict, undecided, why), reasoning from each trace's HTA-style breakdown
EXPECTED = {
    "a100_alexnet_cuda_sync": ("host", [], "the GPU is idle 99% of its active span: cuda_sync waits "
                               "and tiny kernels; the host sets the pace"),
    "a100_nccl_rank0of2": ("host", [], "idle 77% of the span (all of it host wait) against 18% compute "
                           "and 6% exposed NCCL communication"),
    "a100_rank3of8": ("unknown", ["compute", "memory"], "kernels fill ~60% of the span, idle 16%, "
                      "exposed communication 19%: a busy GPU, and compute vs memory needs GPM"),
    "a100_simple_add": ("host", [], "a handful of short kernels in an otherwise idle span"),
    "a100_triton_example": ("unknown", ["compute", "memory"], "one Triton kernel fills the span: busy, "
                            "and nothing in a trace says whether it is compute- or memory-bound"),
    "cpu_only_gloo_rank34": ("collectives", [], "no GPU; 88% of the traced time inside gloo collectives"),
    "mi250_rocm62_minitoy": ("host", [], "idle 98% of the span, most kernels shorter than 10 µs: launch-bound"),
    "no_rank_info": ("unknown", [], "no GPU, 3% in collectives, and no CPU counters for the rest"),
    "sampled_rank0of128": ("host", [], "idle 55% vs 28% exposed communication vs 17% kernels"),
    "sampled_rank1of128": ("host", [], "idle 53% vs 25% exposed communication vs 22% kernels"),
    "v100_ns_resolution_rank0of1": ("unknown", ["compute", "memory"], "kernels fill 98% of the span"),
}


def hta_idle_share(name: str) -> float | None:
    """HTA's temporal breakdown: the GPU's idle time over its whole kernel time span (None where
    HTA found no GPU work)."""
    t = HTA[f"{name}.json.gz"]["exact"]["temporal"]
    if "error" in t or not t.get("kernel_time"):
        return None
    return t["idle_time"] / t["kernel_time"]


def test_every_trace_has_an_expected_verdict():
    assert {f"{n}.json.gz" for n in EXPECTED} == set(HTA), "a shared trace without its expected verdict, or gone"


@needs_shared_traces
@pytest.mark.required
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_verdict_of_each_shared_trace_follows_its_breakdown(tmp_path, name):
    run_dir = tmp_path / "r"
    assert run_cli("import", str(shared(f"{name}.json.gz")), "-o", str(run_dir)).returncode == 0
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    o = r["overall"]
    verdict, undecided, why = EXPECTED[name]
    assert (o["verdict"], o["undecided"] if verdict == "unknown" and undecided else []) == (verdict, undecided), why
    bd = r["gpu_breakdown"]
    hta_idle = hta_idle_share(name)
    if bd is None:
        assert o["device"] == "cpu" and hta_idle is None, (o["device"], hta_idle)
        return
    # the host share is the GPU's idle share: the report's own breakdown's, and HTA's on the same
    # trace (within the last-step rule HTA applies: 5 points)
    idle = bd["temporal"]["idle_pct"] / 100
    assert hta_idle is not None and not math.isnan(hta_idle)
    assert idle == pytest.approx(hta_idle, abs=0.001), (idle, hta_idle)
    assert o["shares"].get("host", 0.0) == pytest.approx(hta_idle, abs=0.05), (o["shares"], hta_idle, why)
    if verdict == "host":
        assert hta_idle >= 0.5 and any("host wait" in e["text"] for e in o["evidence"])


def test_two_rank_gloo_job_is_collectives_bound(tmp_path):
    pytest.importorskip("torch")
    run_dir = tmp_path / "r"
    proc = run_cli("run", "-q", "--torch", "-o", str(run_dir), "--", PYTHON,
                   str(EXAMPLES / "gloo_allreduce.py"), "30", timeout=300)
    assert proc.returncode == 0, proc.stderr
    rep = run_cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    # every step is timed: the steps are collectives (most of each is inside all_reduce); the
    # whole run of a 30-step job is mostly torch's start-up, which is not
    step = next(g["verdict"] for g in r["regions"] if g["kind"] == "step")
    assert step["verdict"] == "collectives" and step["shares"]["collectives"] > 0.5, step
    o = r["overall"]
    assert o["shares"]["collectives"] > 0.05, o
    text = " ".join(e["text"] for e in o["evidence"])
    assert "the main thread of each rank" in text and "waiting on collectives with no own compute" in text
