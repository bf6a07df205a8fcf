"""Serve one request at a time from a small model on a GPU, eagerly: batch 1, a dozen small
layers, the answer read back with .item() per request. Each kernel runs for a few
microseconds and the Python that launches it takes longer: the GPU waits for the host
(launch-bound), the usual first finding on a small-batch inference service.

    python gpu_small_batch_serve.py [--requests N] [--device cuda] [--smoke]

The job's own truth (truth.py): its loop time per request, and the GPU time of one request
measured apart from the launches: the same forward captured once in a CUDA graph and replayed
(its kernels back to back, no Python between them), timed with CUDA events. GPU time over loop
time is the share of the loop the GPU was busy; the rest it waited for the host.
"""
from truth import record

import argparse
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class SmallModel(nn.Module):
    def __init__(self, dim: int = 256, depth: int = 12, classes: int = 1000):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim) for _ in range(depth)))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.blocks(x))


def graph_time(model, x, reps: int = 200) -> float:
    """Seconds of GPU time per forward, replayed from a CUDA graph (no launches in between)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        model(x)
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="a few requests for a CPU check of the script")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    requests = 20 if args.smoke else args.requests

    torch.manual_seed(0)
    model = SmallModel().to(args.device).eval()
    answers = 0
    with torch.inference_mode():
        x = torch.randn(1, 256, device=args.device)
        per_request_gpu_s = graph_time(model, x) if cuda else None
        loop_start = time.perf_counter()
        for _ in range(requests):
            request = torch.randn(1, 256, device=args.device)
            answers += int(model(request).argmax().item())
        loop_s = time.perf_counter() - loop_start
    gpu_s = per_request_gpu_s * requests if per_request_gpu_s else None
    print(f"{requests} requests in {loop_s:.2f} s"
          + (f"; GPU busy {gpu_s / loop_s:.0%} of it ({per_request_gpu_s * 1e6:.0f} µs a request)"
             if gpu_s else ""), flush=True)
    record("gpu_small_batch_serve", requests=requests, loop_s=loop_s, gpu_busy_s=gpu_s,
           gpu_busy_share=gpu_s / loop_s if gpu_s else None)


if __name__ == "__main__":
    main()
