"""A torch CPU training loop starved by a slow data loader.

Each batch takes the loader ~200 ms to produce (decoding and augmentation stood in for by a
sleep, as when reading from slow storage), while the model step takes a few ms: the training
loop waits on its input most of the time.

Expected verdict: host (off-CPU waiting for data); the "dataloader" region is host-bound,
the "train_step" region is busy CPU.
Usage: python examples/dataloader_starved.py [STEPS]   (default 100)
"""
import sys
import time

import torch

import counterprof


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.2 / 16)           # per-sample decode cost: 200 ms per batch of 16
        return torch.randn(64), torch.randint(0, 10, ())


def main(steps: int) -> float:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(torch.utils.data.DataLoader(SlowDataset(), batch_size=16, num_workers=0))
    loss = torch.tensor(0.0)
    for _ in range(steps):
        with counterprof.region("dataloader"):
            x, y = next(loader)
        with counterprof.region("train_step"):
            for _ in range(30):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
    return float(loss.detach())


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print(f"final loss {main(steps):.3f}")
