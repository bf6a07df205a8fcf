"""The roofline's attribution of time to ops, on small Kineto traces put through the real
converter: kernels to the op that launched them, wrappers (linear over addmm) counting no
FLOPs, unmodelled children inside a modelled op, a bias add_ inside a convolution kept as its
own row, CPU self time when there are no kernels, bounds and roof fractions from the ceilings."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from kineto_traces import X, launch, write_trace

from counterprof.analysis.roofline import busy_split, roofline
from counterprof.collectors.torch_trace.convert import TraceConversion

CEIL = {"source": "measured", "device": "gpu", "kind": "gpu",
        "peaks": {"fp32": 10e12, "bf16": 100e12}, "bandwidth_bytes_per_s": 1e12}


def _spans(tmp_path, events) -> pa.Table:
    path = write_trace(tmp_path / "t.json", events, {"schemaVersion": 1, "baseTimeNanoseconds": 10 ** 18})
    return pa.Table.from_batches(list(TraceConversion(path)))


def op(name, ts, dur, dims, types, concrete=None, tid=100):
    args = {"Input Dims": dims, "Input type": types}
    if concrete:
        args["Concrete Inputs"] = concrete
    return X("cpu_op", name, ts, dur, tid=tid, **args)


def linear_step(t0, corr):
    """aten::linear -> (aten::t, aten::addmm -> kernel 100 µs)"""
    return [op("aten::linear", t0, 50, [[64, 512], [256, 512], [256]], ["float"] * 3),
            op("aten::t", t0 + 1, 3, [[256, 512]], ["float"]),
            op("aten::addmm", t0 + 10, 30, [[256], [64, 512], [512, 256], [], []], ["float"] * 3 + ["Scalar"] * 2),
            *launch("gemm_kernel", t0 + 20, 5, corr, t0 + 30, 100)]


def test_kernels_go_to_the_innermost_modelled_op(tmp_path):
    events = linear_step(1000, 1) + linear_step(2000, 2) + [
        op("aten::gelu", 3000, 20, [[64, 256], []], ["float", ""]),
        *launch("gelu_kernel", 3005, 5, 3, 3010, 7),
        op("fbgemm::mystery", 4000, 20, [[10]], ["float"]),
        *launch("mystery_kernel", 4005, 5, 4, 4010, 13),
    ]
    r = roofline(_spans(tmp_path, events), CEIL)
    assert r.basis == "gpu kernel time" and r.total_time_ns == 200_000 + 7_000 + 13_000
    rows = {o.name: o for o in r.ops}
    assert set(rows) == {"aten::addmm", "aten::gelu"}            # linear is a wrapper: no row
    mm = rows["aten::addmm"]
    assert mm.calls == 2 and mm.time_ns == 200_000 and mm.flops_per_call == 2 * 64 * 512 * 256
    assert mm.input_dims == [[256], [64, 512], [512, 256], [], []]
    assert mm.achieved_flops_per_s == pytest.approx(2 * mm.flops_per_call / 200e-6)
    nbytes = 4 * (256 + 64 * 512 + 512 * 256 + 64 * 256)
    assert mm.intensity == pytest.approx(mm.flops_per_call / nbytes)
    assert mm.ridge == pytest.approx(10.0) and mm.bound == "compute"
    assert mm.roof_fraction == pytest.approx(mm.achieved_flops_per_s / 10e12)
    gelu = rows["aten::gelu"]
    assert gelu.bound == "memory" and gelu.roof_fraction == pytest.approx(
        gelu.achieved_flops_per_s / (gelu.intensity * 1e12))
    assert r.unmodelled["ops"] == [{"name": "fbgemm::mystery", "calls": 1, "time_ns": 13_000,
                                    "why": "no cost model", "share": pytest.approx(13 / 220)}]
    assert r.modelled_share == pytest.approx(207 / 220)
    share, evidence, missing = busy_split(r, CEIL)
    assert share == pytest.approx(200 / 207) and not missing
    assert "aten::addmm 91% of busy time, compute-bound" in evidence[1]["text"]
    assert r.mfu["dtype"] == "fp32" and r.mfu["steps"][0]["step"] == "(whole trace)"


def test_convolution_keeps_its_children_and_its_bias_add(tmp_path):
    conv_dims = [[1, 3, 32, 32], [8, 3, 3, 3], [8], [], [], [], [], [], []]
    conv_types = ["float"] * 3 + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"]
    concrete = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    events = [op("aten::convolution", 100, 100, conv_dims, conv_types, concrete),
              op("aten::_convolution", 105, 90, conv_dims + [[]] * 4, conv_types + ["Scalar"] * 4),
              op("aten::cudnn_convolution", 110, 40, conv_dims[:2], ["float", "float"]),
              *launch("conv_kernel", 115, 5, 1, 300, 50),
              op("aten::add_", 160, 20, [[1, 8, 32, 32], [1, 8, 1, 1]], ["float", "float"]),
              *launch("bias_kernel", 165, 5, 2, 360, 4)]
    r = roofline(_spans(tmp_path, events), CEIL)
    rows = {o.name: o for o in r.ops}
    assert rows["aten::convolution"].time_ns == 50_000
    assert rows["aten::convolution"].flops_per_call == 2 * 32 * 32 * 9 * 8 * 3
    assert rows["aten::add_"].time_ns == 4_000
    assert not r.unmodelled["ops"]


def test_cpu_self_time_without_kernels(tmp_path):
    events = [op("aten::matmul", 0, 100, [[64, 128], [128, 32]], ["float", "float"]),
              op("aten::mm", 10, 80, [[64, 128], [128, 32]], ["float", "float"]),
              op("aten::resolve_conj", 20, 5, [[64, 32]], ["float"]),
              X("cpu_op", "ProfilerStep#3", 0, 200, tid=100)]
    cpu = {"source": "measured", "device": "cpu", "kind": "cpu", "peaks": {"fp32": 1e11},
           "bandwidth_bytes_per_s": 1e10}
    r = roofline(_spans(tmp_path, events), cpu)
    assert r.basis == "cpu self time"
    (mm,) = r.ops
    assert mm.name == "aten::mm" and mm.time_ns == 80_000        # its own 75 µs + resolve_conj's 5
    assert r.unmodelled["ops"][0]["name"] == "aten::matmul"
    assert r.unmodelled["ops"][0]["why"] == "costed in its children"
    assert r.unmodelled["ops"][0]["time_ns"] == 20_000
    (step,) = r.mfu["steps"]
    assert step["step"] == "ProfilerStep#3" and step["flops"] == 2 * 64 * 128 * 32
    assert step["mfu_measured"] == pytest.approx(2 * 64 * 128 * 32 / 200e-6 / 1e11)


def test_no_ceilings_no_shapes(tmp_path):
    events = [X("cpu_op", "aten::mm", 0, 100, tid=100)]
    r = roofline(_spans(tmp_path, events), None)
    assert any("counterprof calibrate" in m for m in r.missing)
    assert any("record_shapes" in m for m in r.missing)
    assert r.unmodelled["ops"][0]["why"] == "shapes not recorded or not usable"
    share, _, missing = busy_split(r, None)
    assert share is None and missing


def test_a_dtype_without_a_ceiling_has_no_bound(tmp_path):
    events = [op("aten::mm", 0, 100, [[64, 128], [128, 32]], ["c10::Half", "c10::Half"])]
    r = roofline(_spans(tmp_path, events), {"source": "measured", "peaks": {"fp32": 1e11},
                                            "bandwidth_bytes_per_s": 1e10})
    assert r.ops[0].bound is None and r.ops[0].dtype == "fp16"
    assert any("fp16 matmul peak" in m for m in r.missing)


def test_json_shape(tmp_path):
    r = roofline(_spans(tmp_path, linear_step(0, 1)), CEIL)
    j = json.loads(json.dumps(r.to_json()))
    assert set(j) >= {"device", "ceilings", "ops", "unmodelled", "mfu"}
    assert set(j["ops"][0]) >= {"name", "input_dims", "input_types", "calls", "flops_per_call", "bytes_per_call",
                                "time_ns", "achieved_flops_per_s", "achieved_bytes_per_s", "intensity", "bound",
                                "roof_fraction"}


def test_host_device_copies_are_bound_by_the_link(tmp_path):
    n = 1 << 20
    events = [op("aten::copy_", 0, 100, [[n], [n], []], ["float", "float", "Scalar"]),
              *launch("Memcpy HtoD (Pinned -> Device)", 10, 5, 1, 20, 400, cat="gpu_memcpy", bytes=4 * n)]
    ceil = {**CEIL, "host_device": {"h2d_pinned": {"bytes_per_s": 20e9}, "d2h_pinned": {"bytes_per_s": 25e9}}}
    (row,) = roofline(_spans(tmp_path, events), ceil).ops
    assert row.bound == "host link" and row.link_time_ns == row.time_ns == 400_000
    assert row.roof_fraction == pytest.approx(4 * n / 400e-6 / 25e9)
    (row,) = roofline(_spans(tmp_path, events), CEIL).ops           # no link ceiling: no fraction
    assert row.bound == "host link" and row.roof_fraction is None


def test_busy_split_per_window_from_one_roofline(tmp_path):
    base = 10 ** 18
    events = linear_step(1000, 1) + [op("aten::gelu", 3000, 20, [[64, 256], []], ["float", ""]),
                                     *launch("gelu_kernel", 3005, 5, 3, 3010, 7)]
    r = roofline(_spans(tmp_path, events), CEIL)
    share, ev, _ = busy_split(r, CEIL, (base + 2_500_000, base + 4_000_000))     # the gelu only
    assert share == 0.0 and "aten::gelu 100% of busy time, memory-bound" in ev[1]["text"]
    share, _, _ = busy_split(r, CEIL, (base, base + 2_000_000))                  # the addmm only
    assert share == 1.0
    assert busy_split(r, CEIL)[0] == pytest.approx(100 / 107)
