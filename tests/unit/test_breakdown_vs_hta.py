"""The breakdowns agree with HTA 0.5.0 on the real GPU traces, within 0.1 percentage point.

HTA's numbers are a fixture (tests/data/hta_reference.json), computed once in a separate
virtual environment by tests/tools/hta_reference.py, so this test needs no HTA. They were taken
with HTA_DISABLE_NS_ROUNDING=1: HTA's default rounds nanosecond-resolution timestamps inward to
whole µs (start up, end down), while counterprof keeps exact ns.

Deliberate differences, checked here rather than hidden:
- kernel classes: where counterprof's rules and HTA's give a kernel different classes (listed in
  DIFFERENT_CLASSES), the comparison uses HTA's rules (rules="hta"); where they agree, both.
- HTA floors each segment of its kernel-type sweep to whole µs (astype(int)); on ns-resolution
  traces that shifts the shares by up to ~0.35 pp, so the kernel-type comparison floors the
  same way (unit_ns=1000), and the exact figures are checked to stay close.
- a100_triton_example: HTA counts every event with a "stream" arg as GPU work, including
  Inductor's Triton launcher cpu_op; counterprof counts GPU spans only.
- CPU-only traces: HTA raises (IndexError); counterprof says there is no GPU activity.
"""
from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

from counterprof.analysis import breakdown as bd
from counterprof.ground.kernels import hta_kernel_class, kernel_class
from counterprof.collectors.torch_trace.convert import TraceConversion
from helpers import REPO
from kineto_traces import needs_shared_traces, shared, shared_traces

REFERENCE = json.loads((REPO / "tests/data/hta_reference.json").read_text())["traces"]
TOLERANCE_PP = 0.1
DIFFERENT_CLASSES = {
    "a100_alexnet_cuda_sync.json.gz": {("sync", "Stream Wait Event", "other", "compute")},
    "a100_simple_add.json.gz": {("sync", "Stream Wait Event", "other", "compute")},
}
SELECTION_DIFFERS = {"a100_triton_example.json.gz"}
HTA_LABELS = {"COMPUTATION": "compute", "COMMUNICATION": "communication", "MEMORY": "memory"}

_cache: dict[str, pa.Table] = {}


def spans_of(name: str) -> pa.Table:
    if name not in _cache:
        _cache[name] = pa.Table.from_batches(list(TraceConversion(shared(name))))
    return _cache[name]


def hta_types(ref: dict) -> dict[str, float]:
    """HTA's kernel-type sums (µs) as shares, in counterprof's labels."""
    total = sum(ref.values())
    out = {}
    for label, us in ref.items():
        ours = " + ".join(HTA_LABELS[p] for p in label.split(" overlapping "))
        out[ours] = 100.0 * us / total
    return out


def class_differences(t: pa.Table) -> set[tuple]:
    out = set()
    for n, c in zip(t["name"].to_pylist(), t["category"].to_pylist()):
        if c in ("kernel", "memcpy", "memset", "sync") and kernel_class(c, n) != hta_kernel_class(c, n):
            out.add((c, n, kernel_class(c, n), hta_kernel_class(c, n)))
    return out


def within(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float]:
    """Labels whose shares differ by more than the tolerance (0 for absent labels)."""
    return {k: round(ours.get(k, 0.0) - theirs.get(k, 0.0), 4) for k in set(ours) | set(theirs)
            if abs(ours.get(k, 0.0) - theirs.get(k, 0.0)) > TOLERANCE_PP}


pytestmark = needs_shared_traces
TRACES = [p.name for p in shared_traces()]


def test_every_trace_has_a_reference():
    assert TRACES and set(TRACES) == set(REFERENCE)


@pytest.mark.parametrize("name", TRACES)
def test_kernel_class_differences_are_the_documented_ones(name):
    assert class_differences(spans_of(name)) == DIFFERENT_CLASSES.get(name, set())


def rule_sets(name):
    return ["hta"] if name in DIFFERENT_CLASSES else ["hta", "counterprof"]


@pytest.mark.parametrize("name", sorted(set(TRACES) - SELECTION_DIFFERS))
def test_temporal_breakdown_agrees(name):
    ref = REFERENCE[name]["exact"]["temporal"]
    if "error" in ref:      # CPU-only: HTA fails, counterprof says why
        with pytest.raises(bd.NoGpuWork, match="no GPU activity"):
            bd.gpu_work(spans_of(name))
        return
    for rules in rule_sets(name):
        tb = bd.temporal_breakdown(bd.gpu_work(spans_of(name), rules=rules))
        # HTA holds epoch µs in float64: 0.25 µs steps at 1.7e15 µs (older absolute traces)
        assert tb.kernel_time_ns / 1000 == pytest.approx(ref["kernel_time"], abs=0.5)
        for ours, key in ((tb.idle_ns, "idle_time"), (tb.compute_ns, "compute_time"),
                          (tb.non_compute_ns, "non_compute_time")):
            assert abs(tb.pct(ours) - 100 * ref[key] / ref["kernel_time"]) <= TOLERANCE_PP, (rules, key)


@pytest.mark.parametrize("name", sorted(set(TRACES) - SELECTION_DIFFERS))
@pytest.mark.parametrize("memory", [False, True], ids=["hta-default", "with-memory"])
def test_kernel_type_breakdown_agrees(name, memory):
    ref = REFERENCE[name]["exact"]["kernel_types_with_memory" if memory else "kernel_types"]
    if not ref:
        with pytest.raises(bd.NoGpuWork):
            bd.gpu_work(spans_of(name))
        return
    for rules in rule_sets(name):
        work = bd.gpu_work(spans_of(name), rules=rules)
        floored = bd.percentages(bd.kernel_type_breakdown(work, include_memory=memory, unit_ns=1000))
        assert within(floored, hta_types(ref)) == {}, rules
        exact = bd.percentages(bd.kernel_type_breakdown(work, include_memory=memory))
        assert all(abs(v) < 1.5 for v in within(exact, hta_types(ref)).values())


@pytest.mark.parametrize("name", sorted(set(TRACES) - SELECTION_DIFFERS))
def test_comm_comp_overlap_agrees(name):
    ref = REFERENCE[name]["exact"]["comm_comp_overlap"]["pct"]
    try:
        work = bd.gpu_work(spans_of(name))
    except bd.NoGpuWork:
        assert math.isnan(ref)
        return
    pct = bd.comm_comp_overlap(work).pct
    if math.isnan(ref):
        assert pct is None       # no communication kernels
    else:
        assert abs(pct - ref) <= TOLERANCE_PP


def test_triton_trace_differs_only_by_what_counts_as_gpu_work():
    t = spans_of("a100_triton_example.json.gz")
    ref = REFERENCE["a100_triton_example.json.gz"]["exact"]["temporal"]
    rows = t.select(["name", "category"]).to_pylist()
    idx = [i for i, r in enumerate(rows) if r["name"] == "triton_poi_fused_add_cos_sin_0"]
    durations = {rows[i]["category"]: (t["end"][i].value - t["start"][i].value) / 1000 for i in idx}
    # HTA's GPU-active time is the launcher cpu_op's duration (it has a "stream" arg) ...
    assert ref["kernel_time"] == pytest.approx(durations["cpu_op"], abs=0.01)
    # ... counterprof's is the kernel's
    tb = bd.temporal_breakdown(bd.gpu_work(t))
    assert tb.kernel_time_ns / 1000 == pytest.approx(durations["kernel"]) and tb.compute_ns == tb.kernel_time_ns


@pytest.mark.parametrize("name", ["a100_rank3of8.json.gz", "sampled_rank0of128.json.gz",
                                  "a100_alexnet_cuda_sync.json.gz"])
def test_idle_time_and_launch_statistics_agree_on_whole_microsecond_traces(name):
    """Not part of the 0.1 pp agreement asked for, but the same definitions: per stream idle
    time by category, and the kernel launch totals."""
    ref = REFERENCE[name]["exact"]
    work = bd.gpu_work(spans_of(name), rules="hta")
    ours = {str(s.stream): s for s in bd.idle_time_breakdown(work)}
    for stream, cats in ref["idle_time"].items():
        total = sum(cats.values())
        mine = ours[stream]
        assert mine.idle_ns / 1000 == pytest.approx(total, rel=0.01, abs=1), stream
        assert mine.host_wait_ns / 1000 == pytest.approx(cats.get("host_wait", 0), rel=0.01, abs=1)
    ls = ref["launch_stats"]
    mine = bd.launch_statistics(work)
    # HTA only counts cudaLaunchKernel(ExC)/cudaMemcpyAsync/cudaMemsetAsync launches
    assert mine.launches >= ls["count"]
    if mine.launches == ls["count"]:
        assert mine.gpu_duration.total_ns / 1000 == pytest.approx(ls["gpu_duration_sum"])
