"""Serve one request at a time from a small transformer, eagerly, on the CPU: batch 1, a
16-token prompt, the next token read back with .item() per request, under
torch.inference_mode(). Each request is a few hundred microseconds of small ops: the loop a
profiler's windows cost the most, relative to the work they record.

    python serve_batch1.py [--seconds S | --requests N] [--threads T]

The job's own truth (truth.py): every request's start and end (time.perf_counter_ns, with the
offset that puts them on the Unix clock), their count and the loop's time. Nothing here knows
counterprof: each request is one outermost call of a module with parameters, which is how an
unmodified serving loop is found to have steps.
"""
from truth import record

import argparse
import time

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 128, depth: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True)
                                    for _ in range(depth))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x[:, -1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0, help="serve for this long")
    ap.add_argument("--requests", type=int, default=0, help="or serve this many (0: --seconds)")
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TinyLM().eval()
    clock = time.perf_counter_ns
    to_unix = time.time_ns() - clock()
    starts: list[int] = []
    ends: list[int] = []
    with torch.inference_mode():
        for _ in range(20):                       # warm-up: the allocator, the first calls
            model(torch.randint(0, 1000, (1, 16))).argmax().item()
        loop_start = clock()
        stop_at = loop_start + int(args.seconds * 1e9)
        while True:
            t = clock()
            if (len(starts) >= args.requests) if args.requests else t >= stop_at:
                break
            prompt = torch.randint(0, 1000, (1, 16))
            next_token = model(prompt).argmax().item()
            starts.append(t)
            ends.append(clock())
        loop_ns = clock() - loop_start
    print(f"{len(starts)} requests in {loop_ns / 1e9:.2f} s; last token {next_token}", flush=True)
    record("serve_batch1", requests=len(starts), loop_s=loop_ns / 1e9, iters=len(starts),
           to_unix_ns=to_unix, request_start_ns=starts, request_end_ns=ends)


if __name__ == "__main__":
    main()
