"""The breakdowns on hand-made spans with answers worked out by hand; kernel classes."""
from __future__ import annotations

import pyarrow as pa
import pytest

from counterprof.analysis import breakdown as bd
from counterprof.ground.kernels import hta_kernel_class, kernel_class
from counterprof.ground.schema import SPANS_SCHEMA

US = 1000


def spans(*rows) -> pa.Table:
    """rows: (category, name, start_us, end_us, **extra) with extra: kernel_class, stream, pid,
    correlation."""
    cols = {f.name: [] for f in SPANS_SCHEMA}
    for cat, name, s, e, *extra in rows:
        x = extra[0] if extra else {}
        cols["start"].append(int(s * US))
        cols["end"].append(int(e * US))
        cols["name"].append(name)
        cols["category"].append(cat)
        cls = x.get("cls")
        if cls is None and cat in ("kernel", "memcpy", "memset", "sync"):
            cls = kernel_class(cat, name)
        cols["kernel_class"].append(cls)
        cols["stream"].append(x.get("stream", 7 if cat in ("kernel", "memcpy", "memset", "sync") else None))
        cols["pid"].append(x.get("pid", 1))
        cols["correlation"].append(x.get("corr"))
        for k in ("device", "tid", "collective", "bytes", "group_size", "attrs"):
            cols[k].append(None)
    arrays = []
    for f in SPANS_SCHEMA:
        if pa.types.is_dictionary(f.type):
            arrays.append(pa.array(cols[f.name], pa.string()).dictionary_encode())
        elif pa.types.is_timestamp(f.type):
            arrays.append(pa.array(cols[f.name], pa.int64()).cast(f.type))
        else:
            arrays.append(pa.array(cols[f.name], f.type))
    return pa.Table.from_arrays(arrays, schema=SPANS_SCHEMA)


K = "kernel"
GEMM, NCCL = "sm80_gemm", "ncclKernel_AllReduce_RING_LL_Sum_float"


def test_merge_and_union():
    s, e = bd.merge(pa.array([5, 0, 2, 20, 10]).to_numpy(), pa.array([8, 3, 4, 25, 10]).to_numpy())
    assert s.tolist() == [0, 5, 10, 20] and e.tolist() == [4, 8, 10, 25]
    import numpy as np
    assert bd.union_ns(np.array([0, 0]), np.array([10, 5])) == 10
    assert bd.union_ns(np.array([], np.int64), np.array([], np.int64)) == 0


def test_temporal_breakdown():
    #  compute 0-10, 5-15 (union 15); communication 12-20; memcpy 30-35; idle 20-30 and 35-40? no:
    t = spans((K, GEMM, 0, 10), (K, GEMM, 5, 15), (K, NCCL, 12, 20), ("memcpy", "Memcpy HtoD", 30, 35),
              ("sync", "Stream Sync", 35, 40))
    tb = bd.temporal_breakdown(bd.gpu_work(t))
    assert tb.kernel_time_ns == 40 * US
    assert tb.idle_ns == 10 * US                # 20-30
    assert tb.compute_ns == 15 * US
    assert tb.non_compute_ns == 15 * US         # 15-20 comm, 30-35 memcpy, 35-40 sync
    assert tb.pct(tb.idle_ns) == 25.0


def test_kernel_types_with_overlaps_and_comm_comp_overlap():
    t = spans((K, GEMM, 0, 10), (K, NCCL, 5, 20), ("memcpy", "Memcpy DtoD", 8, 12))
    w = bd.gpu_work(t)
    assert bd.kernel_type_breakdown(w, include_memory=False) == {
        "compute": 5 * US, "compute + communication": 5 * US, "communication": 10 * US}
    assert bd.kernel_type_breakdown(w) == {
        "compute": 5 * US, "compute + communication": 3 * US,
        "compute + communication + memory": 2 * US, "communication + memory": 2 * US,
        "communication": 8 * US}
    o = bd.comm_comp_overlap(w)
    assert (o.communication_ns, o.overlapped_ns, o.pct) == (15 * US, 5 * US, pytest.approx(100 / 3))


def test_hta_truncates_each_segment_to_whole_microseconds():
    t = spans((K, GEMM, 0, 1.5), (K, NCCL, 1, 2.9))
    w = bd.gpu_work(t)
    assert bd.kernel_type_breakdown(w, include_memory=False) == {
        "compute": 1000, "compute + communication": 500, "communication": 1400}
    assert bd.kernel_type_breakdown(w, include_memory=False, unit_ns=1000) == {
        "compute": 1000, "compute + communication": 0, "communication": 1000}


def test_windows_are_analysed_apart_so_the_time_between_them_is_not_idle():
    t = spans(("window", "a.json", 0, 100), (K, GEMM, 10, 20), (K, GEMM, 30, 40),
              ("window", "b.json", 1000, 1100), (K, GEMM, 1010, 1020), (K, GEMM, 1050, 1060))
    w = bd.gpu_work(t)
    assert w.windows == 2
    tb = bd.temporal_breakdown(w)
    assert tb.kernel_time_ns == (30 + 50) * US and tb.idle_ns == (10 + 30) * US


def test_windows_of_different_processes_overlapping_in_time():
    t = spans(("window", "a.json", 0, 100, {"pid": 1}), ("window", "b.json", 50, 150, {"pid": 2}),
              (K, GEMM, 60, 70, {"pid": 1}), (K, GEMM, 90, 95, {"pid": 1}),
              (K, GEMM, 60, 61, {"pid": 2}), (K, GEMM, 140, 141, {"pid": 2}))
    w = bd.gpu_work(t)
    assert sorted(zip(w.window.tolist(), w.start.tolist())) == [
        (0, 60 * US), (0, 90 * US), (1, 60 * US), (1, 140 * US)]
    assert bd.temporal_breakdown(w).kernel_time_ns == (35 + 81) * US


def test_work_launched_in_the_last_step_is_left_out_like_hta():
    t = spans(("step", "ProfilerStep#1", 0, 50), ("step", "ProfilerStep#2", 50, 100),
              ("runtime", "cudaLaunchKernel", 10, 11, {"corr": 1}), (K, GEMM, 20, 30, {"corr": 1}),
              ("runtime", "cudaLaunchKernel", 60, 61, {"corr": 2}), (K, GEMM, 70, 80, {"corr": 2}),
              (K, "no launch in the trace", 90, 95, {"corr": 3}))
    w = bd.gpu_work(t)
    assert w.start.tolist() == [20 * US] and w.excluded == 2
    assert len(bd.gpu_work(t, include_last_step=True)) == 3
    one_step = spans(("step", "ProfilerStep#1", 0, 50), (K, GEMM, 20, 30), (K, GEMM, 70, 80))
    assert len(bd.gpu_work(one_step)) == 2     # a single step: everything counts


def test_idle_time_per_stream():
    t = spans(
        ("runtime", "cudaLaunchKernel", 0, 1, {"corr": 1}), (K, GEMM, 2, 10, {"corr": 1}),
        # launched after the previous kernel ended: host wait (10 -> 50)
        ("runtime", "cudaLaunchKernel", 45, 46, {"corr": 2}), (K, GEMM, 50, 60, {"corr": 2}),
        # queued long before, short gap: kernel wait (60 -> 70)
        ("runtime", "cudaLaunchKernel", 5, 6, {"corr": 3}), (K, GEMM, 70, 80, {"corr": 3}),
        # queued before, long gap: other (80 -> 200)
        ("runtime", "cudaLaunchKernel", 6, 7, {"corr": 4}), (K, GEMM, 200, 210, {"corr": 4}),
        ("runtime", "cudaLaunchKernel", 7, 8, {"corr": 5}), (K, GEMM, 0, 300, {"corr": 5, "stream": 9}))
    idle = {s.stream: s for s in bd.idle_time_breakdown(bd.gpu_work(t))}
    assert (idle[7].host_wait_ns, idle[7].kernel_wait_ns, idle[7].other_ns) == (40 * US, 10 * US, 120 * US)
    assert idle[9].idle_ns == 0


def test_launch_statistics():
    t = spans(("runtime", "cudaLaunchKernel", 0, 5, {"corr": 1}), (K, GEMM, 105, 110, {"corr": 1}),
              ("runtime", "cudaLaunchKernel", 10, 70, {"corr": 2}), (K, GEMM, 71, 72, {"corr": 2}),
              (K, GEMM, 80, 90, {"corr": 3}))
    ls = bd.launch_statistics(bd.gpu_work(t))
    assert (ls.launches, ls.unlaunched) == (2, 1)
    assert ls.cpu_duration.total_ns == 65 * US and ls.gpu_duration.total_ns == 6 * US
    assert ls.launch_delay.max_ns == 100 * US and ls.launch_delay.total_ns == 101 * US
    assert (ls.slow_launches, ls.delayed_launches) == (1, 0)


def test_top_kernels():
    t = spans((K, "a", 0, 10), (K, "b", 10, 40), (K, "a", 40, 45), ("memcpy", "Memcpy HtoD", 50, 55))
    top = bd.top_kernels(bd.gpu_work(t), n=2)
    assert [(k.name, k.count, k.total_ns, k.kernel_class) for k in top] == [
        ("b", 1, 30 * US, "compute"), ("a", 2, 15 * US, "compute")]
    assert top[0].share_pct == pytest.approx(60.0)


def test_analyze_per_rank_and_summed():
    a = spans((K, GEMM, 0, 10), (K, NCCL, 5, 20))
    b = spans((K, GEMM, 0, 30))
    cpu_only = spans(("cpu_op", "aten::add", 0, 1))
    res = bd.analyze({0: a, 1: b, 2: cpu_only})
    assert [r.rank for r in res.ranks] == [0, 1] and 2 in res.skipped
    assert res.total.temporal.kernel_time_ns == 50 * US
    assert res.total.temporal.compute_ns == 40 * US
    assert res.total.overlap.communication_ns == 15 * US
    assert res.total.kernel_types["compute"] == 35 * US
    js = res.to_json()
    assert js["total"]["temporal"]["compute_pct"] == pytest.approx(80.0)


def test_no_gpu_work():
    with pytest.raises(bd.NoGpuWork):
        bd.gpu_work(spans(("cpu_op", "a", 0, 1)))
    assert bd.analyze({0: spans(("cpu_op", "a", 0, 1))}).total is None


# ---- kernel classes ---------------------------------------------------------------------------

@pytest.mark.parametrize("category,name,ours,hta", [
    ("kernel", "sm80_xmma_gemm_f32f32", "compute", "compute"),
    ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     "communication", "communication"),
    ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "communication", "communication"),
    ("kernel", "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "communication", "communication"),
    ("kernel", "void ncclKernel<...>", "communication", "compute"),
    ("kernel", "mscclKernel_Sum_float_LL", "communication", "compute"),
    ("kernel", "__amd_rocclr_copyBuffer", "memory", "compute"),
    ("kernel", "__amd_rocclr_fillBufferAligned", "memory", "compute"),
    ("kernel", "triton_poi_fused_add_cudaMemcpy_0", "compute", "other"),
    ("kernel", "cub::DeviceSegmentedSync", "compute", "other"),
    ("memcpy", "Memcpy HtoD (Pinned -> Device)", "memory", "memory"),
    ("memcpy", "CopyHostToDevice", "memory", "compute"),
    ("memset", "Memset (Device)", "memory", "memory"),
    ("sync", "Stream Sync", "other", "other"),
    ("sync", "Stream Wait Event", "other", "compute"),
    ("cpu_op", "aten::mm", None, None),
])
def test_kernel_classes_and_hta_rules(category, name, ours, hta):
    assert kernel_class(category, name) == ours
    assert hta_kernel_class(category, name) == hta
