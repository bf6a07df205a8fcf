"""Batch inference with a small ResNet (basic residual blocks, written out by hand as
torchvision's resnet18 is built), in eval mode under torch.no_grad(): no optimizer, no
training steps, just forward passes over batches of images.

    python resnet_infer.py [--batches N]

The job times its forward passes and writes them to $JOB_TRUTH (truth.py).
"""
from truth import record

import argparse
import time

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64, 128), num_classes: int = 100):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [BasicBlock(cin, w, stride=1 if i == 0 else 2), BasicBlock(w, w)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = ResNet().eval()
    images = torch.randn(args.batches, args.batch_size, 3, 32, 32)
    predictions = []
    forward_s = 0.0
    with torch.no_grad():
        for batch in images:
            t = time.perf_counter()
            logits = model(batch)
            forward_s += time.perf_counter() - t
            predictions.append(logits.argmax(1))
    print(f"{args.batches} batches in {forward_s:.2f} s; first labels {predictions[0][:8].tolist()}", flush=True)
    record("resnet_infer", batches=args.batches, forward_s=forward_s)


if __name__ == "__main__":
    main()
