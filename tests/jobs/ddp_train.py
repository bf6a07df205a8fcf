"""Data-parallel training of a small transformer language model on the CPU over gloo,
with gradient accumulation: two micro-batches per optimizer step, the first under
`model.no_sync()` (no all-reduce), the second synchronising the gradients.

    torchrun --standalone --nproc_per_node 2 ddp_train.py [--steps N]
    python ddp_train.py --spawn 2 --port PORT [--steps N]      (torch.multiprocessing.spawn)

Every rank times its own forward and `loss.backward()` calls, per step, with its main thread's
run delay in each (truth.py: schedstat). The no_sync backward does the same compute as the
synchronising one without the all-reduce, so the difference between the two (each less its run
delay) is the time the rank waited for DDP's reducer at the end of backward (communication not
hidden by the backward's compute). The forwards differ the other way: the first forward of a
step (under no_sync, after a synced backward) broadcasts the module's buffers from rank 0, the
second does not, so their difference is the broadcast's wait. Each rank appends its figures to
$JOB_TRUTH (truth.py), with each step's bounds on the unix clock so that a profiler's figures
over some of the steps can be held to the same steps.
"""
from truth import main_thread, record

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch import nn

VOCAB, SEQ = 2048, 64


class TinyLM(nn.Module):
    """Token and position embeddings, two pre-norm encoder layers with a causal mask, a head."""

    def __init__(self, d: int = 128, heads: int = 4, layers: int = 2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(SEQ, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, ids, labels):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        logits = self.head(self.blocks(x, mask=self.mask, is_causal=True))
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))


def train(rank: int, world_size: int, args) -> None:
    if args.spawn:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=world_size)
    else:
        dist.init_process_group("gloo")              # torchrun's environment
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    torch.manual_seed(0)
    model = DDP(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(rank)

    def micro_batch():
        return torch.randint(0, VOCAB, (4, SEQ), generator=gen)

    steps = []                           # per step: its bounds (unix ns) and its four timings
    loop_start = time.perf_counter()
    delay_before = main_thread()[1]      # the loop's own run delay (truth.py)
    for step in range(args.steps):
        start_ns, delay_at_start = time.time_ns(), main_thread()[1]
        ids = micro_batch()
        with model.no_sync():
            t0, d0 = time.perf_counter(), main_thread()[1]
            loss = model(ids, labels=ids) / 2     # broadcasts the buffers first
            t1, d1 = time.perf_counter(), main_thread()[1]
            loss.backward()
            t2, d2 = time.perf_counter(), main_thread()[1]
        ids = micro_batch()
        t3, d3 = time.perf_counter(), main_thread()[1]
        loss = model(ids, labels=ids) / 2
        t4, d4 = time.perf_counter(), main_thread()[1]
        loss.backward()                          # all-reduces the gradients in buckets
        t5, d5 = time.perf_counter(), main_thread()[1]
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {2 * loss.item():.3f}", flush=True)
        steps.append({"start_unix_ns": start_ns, "end_unix_ns": time.time_ns(),
                      "run_delay_s": main_thread()[1] - delay_at_start,
                      "forward_local_s": t1 - t0, "backward_local_s": t2 - t1,
                      "forward_synced_s": t4 - t3, "backward_synced_s": t5 - t4,
                      # each of the four's own run delay (runnable, no CPU): on a loaded machine
                      # it lengthens one and not the other by tens of ms, which is no wait for a
                      # collective (the truth counts it as host, through run_delay_s)
                      "forward_local_delay_s": d1 - d0, "backward_local_delay_s": d2 - d1,
                      "forward_synced_delay_s": d4 - d3, "backward_synced_delay_s": d5 - d4})
    loop_s = time.perf_counter() - loop_start
    backward_local = sum(s["backward_local_s"] for s in steps)
    backward_synced = sum(s["backward_synced_s"] for s in steps)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.module.buffers())
    dist.barrier()
    del model, optimizer                   # see tests/rank_workloads.py: gloo's teardown abort
    dist.destroy_process_group()
    record("ddp_train", rank=rank, world_size=world_size, steps=args.steps, loop_s=loop_s,
           loop_run_delay_s=main_thread()[1] - delay_before,
           backward_local_s=backward_local, backward_synced_s=backward_synced,
           reducer_wait_s=max(0.0, backward_synced - backward_local), per_step=steps,
           grad_bytes=grad_bytes, buffer_bytes=buffer_bytes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--spawn", type=int, default=0, help="start this many ranks with mp.spawn")
    ap.add_argument("--port", type=int, default=29511)
    args = ap.parse_args()
    if args.spawn:
        mp.spawn(train, args=(args.spawn, args), nprocs=args.spawn)
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


if __name__ == "__main__":
    main()
