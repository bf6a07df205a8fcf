"""A recommendation-style model on a GPU: a large embedding table (dense gradients) feeding a
small MLP, trained with fused AdamW. Each step's optimizer update streams the whole table, its
gradient and both Adam moments through memory while doing a few FLOPs per byte: the job is
memory-bound, as DLRM-style training with dense embedding gradients is.

    python gpu_embedding_train.py [--steps N] [--rows R] [--device cuda] [--smoke]

The job's own truth (truth.py): its loop time; the GPU time of its optimizer steps (CUDA
events around each) and the bytes they move (fused AdamW over fp32, one kernel: parameter, gradient and two
moments read, parameter and moments written: 28 bytes per element), as a share of a
device-to-device copy rate it times itself first.
"""
from truth import record

import argparse
import time

import torch
from torch import nn


class EmbeddingMLP(nn.Module):
    def __init__(self, rows: int, dim: int = 128):
        super().__init__()
        self.table = nn.Embedding(rows, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, ids):
        return self.mlp(self.table(ids).sum(dim=1)).squeeze(-1)


def copy_rate(device: str, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device-to-device copy bytes/s (read + write), CUDA events, after a warm-up."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * nbytes * reps / (start.elapsed_time(end) / 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="a small table for a CPU check of the script")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    rows = 10_000 if args.smoke else args.rows

    torch.manual_seed(0)
    with torch.device(args.device):        # the 10 GB table initialised on the GPU, not the CPU
        model = EmbeddingMLP(rows)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=cuda)
    peak = copy_rate(args.device) if cuda else None
    elements = sum(p.numel() for p in model.parameters())

    opt_gpu_s = 0.0
    loop_start = time.perf_counter()
    for step in range(args.steps):
        ids = torch.randint(0, rows, (args.batch, 16), device=args.device)
        target = torch.rand(args.batch, device=args.device)
        loss = nn.functional.mse_loss(model(ids), target)
        loss.backward()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        optimizer.step()
        if cuda:
            b.record()
        optimizer.zero_grad(set_to_none=False)      # keep the dense gradient buffers, as DLRM does
        if cuda:
            b.synchronize()
            opt_gpu_s += a.elapsed_time(b) / 1e3
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if cuda:
        torch.cuda.synchronize()
    loop_s = time.perf_counter() - loop_start
    moved = 28 * elements * args.steps
    rate = moved / opt_gpu_s if opt_gpu_s else None
    print(f"{args.steps} steps in {loop_s:.2f} s; optimizer {opt_gpu_s:.2f} s of GPU time"
          + (f" at {rate / 1e9:.0f} GB/s, {rate / peak:.0%} of a measured copy's {peak / 1e9:.0f}"
             if rate and peak else ""), flush=True)
    record("gpu_embedding_train", steps=args.steps, loop_s=loop_s, elements=elements,
           optimizer_gpu_s=opt_gpu_s, optimizer_bytes_per_s=rate, copy_bytes_per_s=peak,
           bandwidth_share=rate / peak if rate and peak else None)


if __name__ == "__main__":
    main()
