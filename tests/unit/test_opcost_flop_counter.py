"""Every op with a cost model that FlopCounterMode also counts has FlopCounterMode's FLOPs:
convolution backward and the CPU's attention backward from real torch autograd on this CPU (the
shapes as Kineto recorded them), and the GPU-only kernels (flash / efficient / cudnn attention
forward and backward, _scaled_mm) through FlopCounterMode's own formulas, fed the shapes a GPU
trace records for them (their aten schemas' argument order). The forward GEMMs, convolutions and
CPU attention are in test_opcost.py."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F                                      # noqa: E402
import torch.utils.flop_counter as fc                                # noqa: E402
from torch.utils.flop_counter import FlopCounterMode                 # noqa: E402

from counterprof.ground.opcost import FORMULAS, op_cost            # noqa: E402


def _recorded_backward(make, op: str, tmp_path) -> tuple[list[dict], int]:
    """(the args Kineto records for `op` during the backward of make()'s loss, the FLOPs
    FlopCounterMode counts for that op in the same backward)."""
    from torch.profiler import ProfilerActivity, profile
    loss = make()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        loss.backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    found = [e["args"] for e in json.loads(path.read_text())["traceEvents"]
             if e.get("cat") == "cpu_op" and e.get("name") == op]
    assert found, f"{op} not in the backward's trace"
    loss = make()
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    counts = counter.get_flop_counts().get("Global", {})      # empty when it counts none of them
    return found, sum(v for k, v in counts.items() if str(k).split(".")[-1] == op.split("::")[-1])


def _t(*shape, grad=True):
    return torch.randn(*shape, requires_grad=grad)


CONV_BACKWARD = {
    "conv2d": lambda: F.conv2d(_t(2, 4, 12, 12), _t(8, 4, 3, 3), _t(8), padding=1).sum(),
    "conv2d_groups_stride": lambda: F.conv2d(_t(2, 6, 15, 15), _t(9, 2, 3, 3), stride=2, groups=3).sum(),
    "conv1d_no_input_grad": lambda: F.conv1d(_t(2, 4, 33, grad=False), _t(6, 4, 5), padding=2).sum(),
    "conv_transpose2d": lambda: F.conv_transpose2d(_t(2, 4, 7, 7), _t(4, 3, 3, 3), stride=2).sum(),
    "conv3d": lambda: F.conv3d(_t(1, 2, 6, 6, 6), _t(3, 2, 3, 3, 3)).sum(),
}


@pytest.mark.parametrize("case", sorted(CONV_BACKWARD))
def test_convolution_backward_equals_flop_counter_mode(case, tmp_path):
    rows, reference = _recorded_backward(CONV_BACKWARD[case], "aten::convolution_backward", tmp_path)
    ours = 0
    for args in rows:
        cost = op_cost("aten::convolution_backward", args["Input Dims"], args["Input type"],
                       args.get("Concrete Inputs"))
        assert cost is not None, args["Input Dims"]
        ours += cost.flops
    assert reference > 0 and ours == reference


def test_cpu_attention_backward_equals_flop_counter_modes_formula(tmp_path):
    """The CPU's fused attention backward is not in FlopCounterMode's registry: its formula
    (sdpa_backward_flop_count) is held to the shapes the real backward recorded."""
    q, k, v = (_t(2, 4, 64, 32) for _ in range(3))
    rows, _ = _recorded_backward(lambda: F.scaled_dot_product_attention(q, k, v).sum(),
                                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward", tmp_path)
    (args,) = rows
    cost = op_cost("aten::_scaled_dot_product_flash_attention_for_cpu_backward", args["Input Dims"],
                   args["Input type"], args.get("Concrete Inputs"))
    dims = args["Input Dims"]
    assert cost.flops == fc.sdpa_backward_flop_count(dims[0], dims[1], dims[2], dims[3])


Q, KV = [4, 8, 256, 64], [4, 8, 512, 64]
GO = OUT = Q
BF = "c10::BFloat16"
# the shapes a GPU trace records for each op, in its schema's order (tensors, then scalars as [])
GPU_ONLY = {
    "aten::_scaled_dot_product_flash_attention": (
        [Q, KV, KV, [], [], [], []], [BF] * 3 + ["Scalar", "Scalar", "Scalar", ""],
        lambda: fc.sdpa_flop_count(Q, KV, KV)),
    "aten::_scaled_dot_product_efficient_attention": (
        [Q, KV, KV, [], [], [], [], []], [BF] * 3 + ["", "Scalar", "Scalar", "Scalar", ""],
        lambda: fc.sdpa_flop_count(Q, KV, KV)),
    "aten::_scaled_dot_product_cudnn_attention": (
        [Q, KV, KV, [], [], [], [], [], []], [BF] * 3 + ["", "Scalar", "Scalar", "Scalar", "Scalar", ""],
        lambda: fc.sdpa_flop_count(Q, KV, KV)),
    "aten::_scaled_dot_product_flash_attention_backward": (
        [GO, Q, KV, KV, OUT, [4, 8, 256], [], [], [], [], [], [], [], [], []],
        [BF] * 5 + ["float"] + [""] * 2 + ["Scalar"] * 4 + [""] * 3,
        lambda: fc.sdpa_backward_flop_count(GO, Q, KV, KV)),
    "aten::_scaled_dot_product_efficient_attention_backward": (
        [GO, Q, KV, KV, [], OUT, [4, 8, 256], [], [], [], [], [], []],
        [BF] * 4 + ["", BF, "float", "", "", "Scalar", "Scalar", "Scalar", ""],
        lambda: fc.sdpa_backward_flop_count(GO, Q, KV, KV)),
    "aten::_scaled_mm": (
        [[4096, 2048], [2048, 1024], [], [], [], [], [], []],
        ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float", "", "", "ScalarType", "Scalar"],
        lambda: fc.mm_flop([4096, 2048], [2048, 1024])),
}


@pytest.mark.parametrize("name", sorted(GPU_ONLY))
def test_gpu_kernels_equal_flop_counter_modes_formulas(name):
    dims, types, reference = GPU_ONLY[name]
    assert name in FORMULAS
    cost = op_cost(name, dims, types)
    assert cost is not None and cost.flops == reference() > 0
