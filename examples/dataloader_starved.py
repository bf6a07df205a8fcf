"""A torch CPU training loop starved by a slow data loader.

Each batch takes the loader ~100 ms to produce (decoding and augmentation stood in for by a
sleep, as when reading from slow storage), while the model step takes ~15 ms: the training
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
        time.sleep(0.1 / 16)           # per-sample decode cost: 100 ms per batch of 16
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
            for _ in range(50):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
    return float(loss)


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print(f"final loss {main(steps):.3f}")
