"""On a real GPU: `counterprof calibrate`'s GPU ceilings are near the datasheet (where the device
is in the table) and the roofline of a bf16 matmul loop is compute-bound against them.

Skipped, with the reason, where torch has no CUDA/ROCm device. `pytest -s tests/gpu` shows the figures.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device (CPU build or no driver)"),
    pytest.mark.slow,
]


def test_gpu_ceilings_near_the_datasheet():
    from counterprof.calibrate import datasheet, measure
    g = measure.gpu_device(0, [4096, 8192], 5, 0.2)
    sheet = datasheet.lookup(g["device"], g.get("arch"))
    print(f"\n{g['device']}: " + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in g["peaks"].items())
          + f"; D2D {g['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s; "
          + ", ".join(f"{k} {v['bytes_per_s'] / 1e9:.1f} GB/s" for k, v in g["host_device"].items()))
    assert g["peaks"]["bf16"] > g["peaks"]["fp32"]
    assert g["host_device"]["h2d_pinned"]["bytes_per_s"] >= 0.8 * g["host_device"]["h2d_pageable"]["bytes_per_s"]
    if sheet is None:
        pytest.skip(f"{g['device']} is not in the datasheet table: no reference to hold to")
    # dense bf16 GEMM reaches 50-95% of the datasheet; D2D copies 60-95% of the HBM figure
    assert 0.4 < g["peaks"]["bf16"] / sheet["peaks"]["bf16"] < 1.05
    assert 0.5 < g["bandwidth_bytes_per_s"] / sheet["bandwidth_bytes_per_s"] < 1.05
