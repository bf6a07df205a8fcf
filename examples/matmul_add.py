"""A small PyTorch CPU loop for `counterprof correlate`'s example: per step, four 384 x 384
matmuls inside a region and four adds of 16 MB tensors.

    counterprof run --torch -o run -- python examples/matmul_add.py
    counterprof correlate run --predictions examples/predictions.csv
"""
import torch

import counterprof

torch.set_num_threads(1)
a, b = torch.randn(384, 384), torch.randn(384, 384)
n = 4 * 1024 * 1024                      # 16 MB of fp32 per tensor
x, y, z = torch.rand(n), torch.rand(n), torch.empty(n)
for _step in range(10):
    with counterprof.region("matmul"):
        for _ in range(4):
            torch.mm(a, b)
    for _ in range(4):
        torch.add(x, y, out=z)
    counterprof.step()
