"""Train a small convolutional classifier on a GPU from images that a DataLoader's 2 worker
processes decode and augment in Python and numpy: the GPU finishes each batch long before the
next one is ready, and the loop waits for its data (host-bound, the most common finding on a
single-GPU training job).

    python gpu_dataloader_bound.py [--batches N] [--device cuda] [--smoke]

The loop measures its data time as the PyTorch ImageNet example does (from the end of one step
to the start of the next: waiting inside the DataLoader's __next__) and writes it to
$JOB_TRUTH (truth.py); the step itself ends in loss.item(), so its GPU work is inside the step.
"""
from truth import record

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    """Synthetic 'JPEGs': a per-pixel Python decode loop over a strip, then numpy crops and flips."""

    def __init__(self, n: int, size: int = 64):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        raw = rng.integers(0, 255, (self.size + 8, self.size + 8, 3), dtype=np.uint8)
        acc = 0
        for v in raw[:24].reshape(-1).tolist():          # the slow, GIL-bound "entropy decode"
            acc = (acc * 31 + v) & 0xFFFFFF
        y, x = rng.integers(0, 8, 2)
        img = raw[y:y + self.size, x:x + self.size]
        if rng.random() < 0.5:
            img = img[:, ::-1]
        img = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div_(255)
        return img, (acc + i) % 10


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.BatchNorm2d(256), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="a few batches for a CPU check of the script")
    args = ap.parse_args()
    batches = 4 if args.smoke else args.batches

    torch.manual_seed(0)
    net = model().to(args.device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(SlowImages(batches * args.batch_size), batch_size=args.batch_size,
                        num_workers=args.workers, shuffle=True, pin_memory=args.device.startswith("cuda"))

    data_time, steps = 0.0, 0
    loop_start = end = time.perf_counter()
    for images, labels in loader:
        data_time += time.perf_counter() - end
        images = images.to(args.device, non_blocking=True)
        labels = labels.to(args.device, non_blocking=True)
        loss = nn.functional.cross_entropy(net(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        steps += 1
        end = time.perf_counter()
    loop_s = time.perf_counter() - loop_start
    print(f"{steps} steps, data time {data_time:.2f} s of {loop_s:.2f} s", flush=True)
    record("gpu_dataloader_bound", steps=steps, next_wait_s=data_time, loop_s=loop_s)


if __name__ == "__main__":
    main()
