"""What `counterprof run --jax` costs a JAX loop: issue 29's bound (the loop under --jax at most
1.10x alone), on a labelled Flax/optax training loop (StepTraceAnnotation steps: the default
paced step windows) and an unmarked jitted matmul loop (the adaptive time windows).

    python benchmarks/jax_cost.py [--rounds 7] [--modes alone,run,jax,jax-nocost] [--steps 600]
                                   [--seconds 5] [--jobs flax,matmul] [--json PATH]

A script, not a timed test: the machine is usually shared. Each round runs every job in every
mode once, in a random order, and each ratio is taken within a round (mode / alone), so a
slower minute of the machine weighs on both sides. A job's figure is its own loop as it
measures it: the training loop's seconds from the end of its first (compiling) step to its
last, per step; the unmarked loop's seconds per iteration over a fixed wall time; beside each,
the process's CPU time over the same loop (time.process_time(): every thread of the workload,
XLA's pool and counterprof's driver included). Summaries:
  wall   the median of the rounds' ratios (min-max)
  best   the ratio of the modes' fastest rounds (the least disturbed ones)
  CPU    the median of the rounds' ratios of CPU time per iteration (min-max): on a shared
         machine the wall time swings with the neighbours' load; what the workload itself
         spends does not, and the driver's recording, start, stop and export are in it

Modes (--modes; default alone,run,jax):
  alone  the job by itself
  run    `counterprof run -q` (the default collectors, no --jax): what is not jax's
  jax    `counterprof run -q --jax` (the default collectors and the default, paced schedules)
  jax-nocost  the same with COUNTERPROF_JAX_COST_TIMEOUT=0: the profiles converted without XLA's
         cost analysis (a child process per profile that imports jaxlib): what that costs a
         loop on a machine whose cores the job fills
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PY = sys.executable
MODES = ("alone", "run", "jax", "jax-nocost")
BOUND = 1.10

FLAX = """
    import json, os, time
    import jax, jax.numpy as jnp
    import flax.linen as nn
    import optax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(512)(x))
            x = nn.relu(nn.Dense(512)(x))
            return nn.Dense(10)(x)

    model = MLP()
    key, data_key = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(data_key, (256, 256))
    y = jax.random.randint(data_key, (256,), 0, 10)
    params = model.init(key, x)
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, x, y):
        def loss_fn(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    for step in range(STEPS):
        if step == 1:
            t0, c0 = time.perf_counter(), time.process_time()     # after the compiling step
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            params, opt_state, loss = train_step(params, opt_state, x, y)
            if step % 10 == 0:
                loss = float(loss)          # a logging loop's wait every 10 steps
    jax.block_until_ready(params)
    loop, cpu, n = time.perf_counter() - t0, time.process_time() - c0, STEPS - 1
"""
MATMUL = """
    import json, os, time
    import jax, jax.numpy as jnp
    @jax.jit
    def f(a, b):
        return jnp.tanh(a @ b) + 1.0
    a = jnp.ones((512, 512)); b = jnp.ones((512, 512)) / 512
    f(a, b).block_until_ready()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < SECONDS:
        a = f(a, b).block_until_ready()
        n += 1
    loop, cpu = time.perf_counter() - t0, time.process_time() - c0
"""
WRITE_TRUTH = """
with open(os.environ["JOB_TRUTH"], "w") as f:
    f.write(json.dumps({"iters": n, "loop_s": loop, "cpu_s": cpu}))
"""


def jobs(tmp: Path, steps: int, seconds: float) -> dict[str, Path]:
    out = {}
    for name, body in (("flax_mlp train (StepTraceAnnotation)", FLAX), ("jitted matmul (unmarked)", MATMUL)):
        path = tmp / f"job{len(out)}.py"
        path.write_text(textwrap.dedent(body).replace("STEPS", str(steps)).replace("SECONDS", repr(seconds))
                        + WRITE_TRUTH)
        out[name] = path
    return out


def run_once(tmp: Path, job: Path, mode: str, tag: str) -> dict:
    truth = tmp / f"{tag}.json"
    truth.unlink(missing_ok=True)
    env = {**os.environ, "JOB_TRUTH": str(truth)}
    if mode == "jax-nocost":
        env["COUNTERPROF_JAX_COST_TIMEOUT"] = "0"
    run = tmp / f"run-{tag}"
    cmd = [PY, str(job)]
    if mode != "alone":
        cmd = [PY, "-m", "counterprof", "run", "-q", "-o", str(run), "--force",
               *(["--jax"] if mode.startswith("jax") else []), "--", *cmd]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          cwd=str(tmp), timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} -> exit {proc.returncode}\n{proc.stderr[-2000:]}")
    got = json.loads(truth.read_text())
    rec = {"figure": got["loop_s"] / got["iters"], "cpu": got["cpu_s"] / got["iters"],
           "iters": got["iters"]}
    if mode.startswith("jax"):
        meta = json.loads((run / "meta.json").read_text())
        st = meta["collectors"].get("jax", {})
        profiles = [p for p in run.rglob("*.jaxprof") if p.is_dir()]
        rec.update(status=st.get("status"), reason=st.get("reason"), problems=st.get("problems"),
                   profiles=len(profiles), steps=st.get("steps"),
                   profile_mb=sum(f.stat().st_size for p in profiles for f in p.rglob("*") if f.is_file()) / 1e6,
                   profiler_cpu_s=(meta.get("profiler") or {}).get("cpu_s"))
    return rec


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f}x ({min(values):.2f}-{max(values):.2f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--modes", default="alone,run,jax")
    ap.add_argument("--steps", type=int, default=600, help="the training loop's steps (default 600)")
    ap.add_argument("--seconds", type=float, default=5.0, help="the unmarked loop's wall time (default 5)")
    ap.add_argument("--jobs", default=None, metavar="WORDS",
                    help="only the jobs whose name holds one of these comma-separated words")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    modes = [m for m in MODES if m in args.modes.split(",")]
    if not modes or modes[0] != "alone":
        ap.error("--modes must include alone: it is every ratio's denominator")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    raw: dict = {}
    with tempfile.TemporaryDirectory(prefix="counterprof-jax-cost-") as d:
        tmp = Path(d)
        todo = jobs(tmp, args.steps, args.seconds)
        if args.jobs:
            words = [w.strip() for w in args.jobs.split(",") if w.strip()]
            todo = {k: v for k, v in todo.items() if any(w in k for w in words)}
        for rnd in range(args.rounds):
            order = [(job, mode) for job in todo for mode in modes]
            rng.shuffle(order)
            for i, (job, mode) in enumerate(order):
                rec = run_once(tmp, todo[job], mode, f"r{rnd}-{i}")
                raw.setdefault(job, {}).setdefault(mode, []).append(rec)
                extra = (f"  {rec['status']}, {rec['profiles']} profiles, {rec['profile_mb']:.1f} MB, "
                         f"profiler CPU {rec['profiler_cpu_s']} s" if mode.startswith("jax") else "")
                if mode.startswith("jax") and rec["status"] != "ok":
                    extra += f" ({rec['reason']})"
                print(f"round {rnd + 1}/{args.rounds}: {job:38s} {mode:6s} {rec['figure'] * 1e3:.4f} ms/iter"
                      + extra, file=sys.stderr, flush=True)
    print(f"\nloop time under each mode / alone: {args.rounds} paired rounds; seed {seed}; "
          f"load {os.getloadavg()[0]:.1f} at the end; {os.cpu_count()} CPUs")
    print("wall: median (min-max) of the rounds' ratios; best: fastest / fastest; CPU: the same of the "
          "job's process CPU time per iteration (every thread of the workload, the driver's included; "
          "what other processes take from a shared machine is not in it)\n")
    print("| job | alone (ms/iter, median) | "
          + " | ".join(f"{m} wall | {m} best | {m} CPU" for m in modes[1:]) + " |")
    print("|---|---|" + "---|---|---|" * (len(modes) - 1))
    summary = {}
    for job, by_mode in raw.items():
        alone = [r["figure"] for r in by_mode["alone"]]
        alone_cpu = [r["cpu"] for r in by_mode["alone"]]
        cells = [f"{statistics.median(alone) * 1e3:.3f}"]
        summary[job] = {"alone_s_per_iter": statistics.median(alone)}
        for m in modes[1:]:
            mine = [r["figure"] for r in by_mode[m]]
            ratios = [a / b for a, b in zip(mine, alone)]
            cpu = [a["cpu"] / b for a, b in zip(by_mode[m], alone_cpu)]
            best = min(mine) / min(alone)
            cells += [fmt(ratios), f"{best:.3f}x", fmt(cpu)]
            summary[job][m] = {"median": statistics.median(ratios), "min": min(ratios),
                               "max": max(ratios), "best": best, "cpu_median": statistics.median(cpu),
                               "cpu_min": min(cpu), "cpu_max": max(cpu)}
        print(f"| {job} | " + " | ".join(cells) + " |")
    jax_runs = [r for by_mode in raw.values() for r in by_mode.get("jax", [])]
    if jax_runs:
        print(f"\n--jax runs: status {sorted({r['status'] for r in jax_runs})}, profiles per run "
              f"{min(r['profiles'] for r in jax_runs)}-{max(r['profiles'] for r in jax_runs)}, "
              f"{max(r['profile_mb'] for r in jax_runs):.1f} MB at most")
    for key, what in (("median", "wall"), ("cpu_median", "CPU")):
        worst = max((s["jax"][key] for s in summary.values() if "jax" in s), default=None)
        if worst is not None:
            print(f"bound {BOUND:.2f}x, {what}: {'met' if worst <= BOUND else 'MISSED'} "
                  f"(worst median {worst:.3f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"seed": seed, "rounds": args.rounds, "summary": summary,
                                               "raw": raw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
