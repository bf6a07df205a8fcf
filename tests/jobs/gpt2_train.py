"""Train a tiny GPT-2 (HuggingFace transformers, random weights, nothing downloaded) with
AdamW, as a user would; optionally sleep in every step (a stand-in for a blocking logger, a
rate limiter, a synchronous checkpoint upload).

    python gpt2_train.py [--steps N] [--sleep-share F]

--sleep-share F: after each step's work the loop sleeps F/(1-F) of the time that work took,
so that about F of every step is asleep whatever the machine's speed. The job times its
sleeps and its steps itself (each step's start and end, its sleep, its main thread's run
delay) and writes them to $JOB_TRUTH (truth.py).
"""
from truth import main_thread, record

import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sleep-share", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=args.seq,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)

    slept = 0.0
    steps = []            # per step: start and end (Unix ns), its sleep, its main thread's run delay
    loop_start, (_, delay_before) = time.perf_counter(), main_thread()
    for step in range(args.steps):
        t, start_ns, (_, delay0) = time.perf_counter(), time.time_ns(), main_thread()
        input_ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        nap = 0.0
        if args.sleep_share:
            work = time.perf_counter() - t
            t = time.perf_counter()
            time.sleep(work * args.sleep_share / (1 - args.sleep_share))
            nap = time.perf_counter() - t
            slept += nap
        steps.append((start_ns, time.time_ns(), nap, main_thread()[1] - delay0))
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    loop_s = time.perf_counter() - loop_start
    record("gpt2_train", steps=args.steps, sleep_s=slept, loop_s=loop_s,
           loop_run_delay_s=main_thread()[1] - delay_before, step_log=steps)

if __name__ == "__main__":
    main()
