"""Train a tiny GPT-2 (HuggingFace transformers, random weights) the way many notebooks do:
no DataLoader, each batch's text is tokenized and collated in pure Python on the main thread
inside the loop (a byte-pair-ish tokenizer written in Python, padding, a list of lists turned
into a tensor), then forward, backward and AdamW. Most of each step is that Python.

    python gpt2_tokenize.py [--steps N] [--docs D] [--region]

--region wraps the tokenization in `counterprof.region("tokenize")` when counterprof is
importable (as a user marks a phase), and the model's part in `region("model")`.
The job times its own phases (perf_counter around tokenization and around the model's part,
and its main thread's run delay in each from schedstat) and writes them to $JOB_TRUTH
(truth.py).
"""
from truth import main_thread, record

import argparse
import contextlib
import random
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 2048
WORDS = ["the", "model", "learns", "tokens", "from", "text", "and", "gradients", "flow", "back",
         "through", "layers", "attention", "heads", "mix", "positions", "while", "loss", "falls"]


def make_merges(rng: random.Random) -> dict[tuple[str, str], str]:
    """A small table of pair merges, as a BPE tokenizer learns them."""
    chars = sorted({c for w in WORDS for c in w})
    merges: dict[tuple[str, str], str] = {}
    for _ in range(200):
        a, b = rng.choice(chars), rng.choice(chars)
        merges[(a, b)] = a + b
    return merges


def tokenize(text: str, merges: dict[tuple[str, str], str], vocab: dict[str, int]) -> list[int]:
    """Greedy pair merges over each word's characters, then ids: pure Python, as slow as
    the tokenizers people write in a hurry."""
    ids = []
    for word in text.split():
        parts = list(word)
        changed = True
        while changed:
            changed = False
            for i in range(len(parts) - 1):
                m = merges.get((parts[i], parts[i + 1]))
                if m is not None:
                    parts[i:i + 2] = [m]
                    changed = True
                    break
        for p in parts:
            ids.append(vocab.setdefault(p, len(vocab) % VOCAB))
    return ids


def collate(rows: list[list[int]], seq: int) -> torch.Tensor:
    """Pad or cut each row to seq tokens, as a collate_fn does."""
    out = [(r + [0] * seq)[:seq] for r in rows]
    return torch.tensor(out, dtype=torch.long)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--docs", type=int, default=8, help="documents per batch")
    ap.add_argument("--words", type=int, default=20000, help="words per document")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--region", action="store_true")
    args = ap.parse_args()

    region = lambda name: contextlib.nullcontext()      # noqa: E731
    if args.region:
        try:
            import counterprof
            region = counterprof.region
        except ImportError:
            pass

    torch.manual_seed(0)
    rng = random.Random(0)
    merges, vocab = make_merges(rng), {}
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=args.seq,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    tok_s = model_s = tok_delay = model_delay = 0.0
    steps = []
    loop_start, (_, delay_before) = time.perf_counter(), main_thread()
    for step in range(args.steps):
        start_ns = time.time_ns()
        t0, (_, d0) = time.perf_counter(), main_thread()
        with region("tokenize"):
            docs = [" ".join(rng.choice(WORDS) for _ in range(args.words)) for _ in range(args.docs)]
            batch = collate([tokenize(d, merges, vocab) for d in docs], args.seq)
        t1, (_, d1) = time.perf_counter(), main_thread()
        with region("model"):
            loss = model(batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        t2, (_, d2) = time.perf_counter(), main_thread()
        tok_s += t1 - t0
        model_s += t2 - t1
        tok_delay += d1 - d0          # the phase's run delay: runnable, no CPU (a busy machine)
        model_delay += d2 - d1
        steps.append((start_ns, time.time_ns(), t1 - t0, t2 - t1))
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    loop_s = time.perf_counter() - loop_start
    record("gpt2_tokenize", steps=args.steps, tokenize_s=tok_s, model_s=model_s, loop_s=loop_s,
           tokenize_run_delay_s=tok_delay, model_run_delay_s=model_delay,
           loop_run_delay_s=main_thread()[1] - delay_before, step_log=steps)


if __name__ == "__main__":
    main()
