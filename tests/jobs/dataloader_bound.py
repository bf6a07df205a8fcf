"""A small classifier trained on text that its Dataset tokenizes in pure Python, loaded by a
DataLoader with 2 worker processes: the workers cannot keep up, and the training loop waits
for its batches.

    python dataloader_bound.py [--batches N]

The loop measures its data time the way the PyTorch ImageNet example does (the time from the
end of one step to the start of the next: waiting inside the DataLoader's `__next__`) and
writes it to $JOB_TRUTH (truth.py) with its step count.
"""
from truth import main_thread, record

import argparse
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards box "
         "and quartz nymphs vex a jock's big flask of mixed juice").split()
VOCAB = 4096


class TokenizedText(Dataset):
    """Synthetic documents, tokenized on the fly by a byte-pair-ish loop in pure Python."""

    def __init__(self, n: int, seq: int = 128, words: int = 20000):
        self.n, self.seq, self.words = n, seq, words

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = random.Random(i)
        text = " ".join(rng.choice(WORDS) for _ in range(self.words))
        ids = []
        for word in text.split():
            h = 0
            for ch in word:                      # a hash per character: the slow, GIL-bound part
                h = (h * 131 + ord(ch)) % 1_000_003
            for k in range(0, len(word), 3):
                ids.append((h + k * 7919) % VOCAB)
        ids = ids[: self.seq] + [0] * max(0, self.seq - len(ids))
        label = sum(ids) % 4
        return torch.tensor(ids), torch.tensor(label)


class BagOfEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, 64)
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, ids):
        return self.head(self.embed(ids))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)      # the 2 cores are the workers': one intra-op thread is plenty here
    model = BagOfEmbeddings()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(TokenizedText(args.batches * args.batch_size), batch_size=args.batch_size,
                        num_workers=2, shuffle=True)

    data_time = 0.0
    steps = 0
    loop_start = end = time.perf_counter()
    delay_before = main_thread()[1]      # the loop's own run delay (truth.py)
    for ids, labels in loader:
        data_time += time.perf_counter() - end
        loss = nn.functional.cross_entropy(model(ids), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        end = time.perf_counter()
    loop_s = time.perf_counter() - loop_start
    print(f"{steps} steps, data time {data_time:.2f} s of {loop_s:.2f} s", flush=True)
    record("dataloader_bound", steps=steps, next_wait_s=data_time, loop_s=loop_s,
           loop_run_delay_s=main_thread()[1] - delay_before)


if __name__ == "__main__":
    main()
