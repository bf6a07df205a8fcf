"""Pre-train a 1B-parameter GPT-2-style model (HuggingFace transformers, built from its config,
random weights) on one GPU the way nanoGPT does: width 4096, no dropout, tanh-GELU, bf16
autocast, fused AdamW. The matmuls and flash attention take most of each step: the job is
compute-bound. (HF's GPT-2 small as configured by default, dropout and the Python gelu_new in
fp32, spends half its GPU time in elementwise kernels: mixed, not compute-bound.)

    python gpu_gpt2_train.py [--steps N] [--device cuda] [--smoke]

The job's own truth (truth.py): its model FLOP/s (6 x parameters x tokens per step plus
attention, the usual MFU count) against a bf16 matmul it times itself; and, after the loop,
its tensor-core share: the CUDA-event time of every matmul of a step (each Linear/Conv1D's
forward, input-gradient and weight-gradient products at the step's shapes) and of flash
attention forward and backward, over a steady step's time (10 steps, synchronized).
"""
from truth import record

import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def matmul_rate(device: str, n: int = 8192, reps: int = 20) -> float:
    """bf16 FLOP/s of an n x n x n matmul on this GPU (CUDA events, after a warm-up)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    end.synchronize()
    return 2 * n ** 3 * reps / (start.elapsed_time(end) / 1e3)


def cuda_time(fn, *args, reps: int = 10) -> float:
    fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def tensor_core_seconds(model, config, batch: int, seq: int, device: str) -> float:
    """GPU seconds per training step in matmuls and attention, timed at the step's shapes."""
    m = batch * seq
    shapes = []
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if type(mod).__name__ == "Conv1D":          # HF GPT-2's projections: weight (in, out)
            shapes.append((w.shape[0], w.shape[1]))
        elif isinstance(mod, torch.nn.Linear):
            shapes.append((mod.in_features, mod.out_features))
    total = 0.0
    for k, n in shapes:
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        wt = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        g = torch.randn(m, n, device=device, dtype=torch.bfloat16)
        total += (cuda_time(torch.matmul, x, wt) + cuda_time(torch.matmul, g, wt.t())
                  + cuda_time(torch.matmul, x.t(), g))
    heads, hd = config.n_head, config.n_embd // config.n_head
    q, k_, v = (torch.randn(batch, heads, seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3))

    def attention():
        out = torch.nn.functional.scaled_dot_product_attention(q, k_, v, is_causal=True)
        out.backward(torch.ones_like(out))
    total += config.n_layer * cuda_time(attention)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="a tiny model for a CPU check of the script")
    args = ap.parse_args()

    torch.manual_seed(0)
    if args.smoke:
        config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1024, n_positions=args.seq)
    else:   # nanoGPT's settings at width 4096: no dropout, tanh-GELU in one kernel
        config = GPT2Config(n_layer=4, n_embd=4096, n_head=32, vocab_size=50304, n_positions=args.seq,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            activation_function="gelu_pytorch_tanh")
    with torch.device(args.device):        # built on the GPU: no 1B-parameter init on the CPU
        model = GPT2LMHeadModel(config)
    model.train()
    fused = args.device.startswith("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=fused)
    peak = matmul_rate(args.device) if fused else None

    params = sum(p.numel() for p in model.parameters())
    tokens = args.batch * args.seq
    flops_per_step = 6 * params * tokens + 12 * config.n_layer * config.n_embd * args.seq * tokens
    def train_step():
        input_ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=args.device)
        with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16):
            loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    loop_start = time.perf_counter()
    for step in range(args.steps):
        loss = train_step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    if fused:
        torch.cuda.synchronize()
    loop_s = time.perf_counter() - loop_start
    achieved = flops_per_step * args.steps / loop_s
    truth = {"steps": args.steps, "loop_s": loop_s, "params": params, "model_flops_per_s": achieved,
             "matmul_flops_per_s": peak, "mfu": achieved / peak if peak else None}
    if fused:                 # a steady step, then the tensor-core work of one step alone
        t = time.perf_counter()
        for _ in range(10):
            train_step()
        torch.cuda.synchronize()
        truth["steady_step_s"] = (time.perf_counter() - t) / 10
        truth["tensor_core_s"] = tensor_core_seconds(model, config, args.batch, args.seq, args.device)
        truth["tensor_core_share"] = truth["tensor_core_s"] / truth["steady_step_s"]
    print(f"{args.steps} steps in {loop_s:.2f} s: {achieved / 1e12:.0f} TFLOP/s"
          + (f", MFU {achieved / peak:.0%} of a measured {peak / 1e12:.0f}; matmuls and attention "
             f"{truth['tensor_core_share']:.0%} of a step" if peak else ""), flush=True)
    record("gpu_gpt2_train", **truth)


if __name__ == "__main__":
    main()
