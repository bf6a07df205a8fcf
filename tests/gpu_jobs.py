"""The labelled GPU jobs (tests/jobs/gpu_*.py) under `counterprof run --torch`, side by side with
what each job measured of itself: the README's GPU table.

    python tests/gpu_jobs.py [--out DIR] [--only NAME,...] [--alone]

Each job keeps its own accounting (truth.py): the GPT-2 job its MFU against a bf16 matmul it
times itself, the embedding job its optimizer's bytes/s against a copy it times itself, the
small-batch service its GPU time per request from a CUDA-graph replay of the same forward, the
DataLoader job its waits in __next__. The report's step region (every step, timed) is held to
that; `roofline --json` adds the measured-ceiling view (MFU) where the trace has FLOPs.
--alone also runs each job without the profiler: the loop-time cost of `run --torch`.

Needs a CUDA GPU; tests/gpu/test_gpu_jobs.py holds the verdicts to the truth with it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "jobs"
PY = sys.executable

# name -> (script, args, the verdict its own accounting calls for)
SPECS = {
    "gpt2_train": ("gpu_gpt2_train.py", [], "compute"),
    "embedding_train": ("gpu_embedding_train.py", [], "memory"),
    "small_batch_serve": ("gpu_small_batch_serve.py", [], "host"),
    "dataloader_bound": ("gpu_dataloader_bound.py", [], "host"),
}


def _truth(path: Path) -> dict:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return lines[-1] if lines else {}


def expected_host_share(name: str, truth: dict) -> tuple[float, float] | None:
    """The share of the loop the GPU waited for the host, by the job's own accounting, as a
    range: the small-batch service's GPU time per request is known (a CUDA-graph replay), so
    its host share is 1 minus it; the DataLoader job's wait in __next__ is a lower bound (the
    GPU also waits while the step's Python launches its kernels)."""
    if name == "small_batch_serve" and truth.get("gpu_busy_share") is not None:
        share = max(0.0, 1 - truth["gpu_busy_share"])
        return share, share
    if name == "dataloader_bound" and truth.get("loop_s"):
        return truth["next_wait_s"] / truth["loop_s"], 1.0
    return None


def allowed_verdicts(name: str, truth: dict) -> set[str]:
    """What the job's own figures allow the step region's verdict to be. The GPT-2 job: its
    matmuls and attention over a steady step (>= 60 %: compute; 40-60 %: compute or unknown,
    the rest being memory-bound elementwise work; less: memory or unknown)."""
    if name == "gpt2_train":
        share = truth.get("tensor_core_share")
        if share is None:
            return {"compute", "unknown"}
        return {"compute"} if share >= 0.6 else {"compute", "unknown"} if share >= 0.4 else {"memory", "unknown"}
    return {SPECS[name][2]}


def run_job(name: str, out: Path, extra: list[str] | None = None, timeout: float = 240) -> dict:
    """One job under `counterprof run --torch`, then report and roofline: everything as a dict."""
    script, args, expect = SPECS[name]
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    run_dir, truth_file = d / "run", d / "truth.jsonl"
    truth_file.unlink(missing_ok=True)
    env = {**os.environ, "JOB_TRUTH": str(truth_file)}
    t = time.perf_counter()
    with open(d / "stdout", "w") as so, open(d / "stderr", "w") as se:
        rc = subprocess.run([PY, "-m", "counterprof", "run", "--torch", "-q", "-o", str(run_dir), "--force",
                             "--", PY, str(JOBS / script), *args, *(extra or [])],
                            env=env, stdout=so, stderr=se, timeout=timeout).returncode
    res: dict = {"job": name, "expect": expect, "rc": rc, "wall_s": time.perf_counter() - t,
                 "truth": _truth(truth_file)}
    rep = subprocess.run([PY, "-m", "counterprof", "report", str(run_dir), "--json"],
                         capture_output=True, text=True, timeout=timeout)
    if rep.returncode != 0:
        res["report_error"] = rep.stderr[-2000:]
        return res
    (d / "report.json").write_text(rep.stdout)
    report = json.loads(rep.stdout)
    step = next((r for r in report["regions"] if r["name"] == "ProfilerStep"), None)
    res["overall"] = report["overall"]
    res["step"] = step["verdict"] if step else None
    res["gpu_breakdown"] = report.get("gpu_breakdown")
    res["devices"] = report.get("devices")
    roof = subprocess.run([PY, "-m", "counterprof", "roofline", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=timeout)
    if roof.returncode == 0:
        (d / "roofline.json").write_text(roof.stdout)
        r = json.loads(roof.stdout)
        res["roofline"] = {k: r.get(k) for k in ("mfu", "basis", "modelled_share", "missing", "notes")}
    else:
        res["roofline_error"] = roof.stderr[-1000:]
    return res


def run_alone(name: str, out: Path, extra: list[str] | None = None, timeout: float = 240) -> dict:
    script, args, _ = SPECS[name]
    truth_file = out / name / "alone.jsonl"
    truth_file.parent.mkdir(parents=True, exist_ok=True)
    truth_file.unlink(missing_ok=True)
    subprocess.run([PY, str(JOBS / script), *args, *(extra or [])], timeout=timeout, check=True,
                   env={**os.environ, "JOB_TRUTH": str(truth_file)}, stdout=subprocess.DEVNULL)
    return _truth(truth_file)


def own_figure(job: str, t: dict) -> str:
    """The job's own measurement, in words."""
    try:
        if job == "gpt2_train":
            return (f"MFU {t['mfu']:.0%} ({t['model_flops_per_s'] / 1e12:.0f} TFLOP/s), matmuls and attention "
                    f"{t['tensor_core_share']:.0%} of a steady step")
        if job == "embedding_train":
            return f"optimizer at {t['bandwidth_share']:.0%} of a copy's bandwidth"
        if job == "small_batch_serve":
            return f"GPU busy {t['gpu_busy_share']:.0%} of the loop"
        return f"waiting for data {t['next_wait_s'] / t['loop_s']:.0%} of the loop"
    except (KeyError, TypeError, ZeroDivisionError):
        return "-"


def _evidence(v: dict | None) -> str:
    if not v:
        return "-"
    return "; ".join(e["text"] for e in v.get("evidence", [])[:4])


def table(results: list[dict]) -> str:
    rows = ["| job | expected | step region's verdict | shares | the job's own figure | roofline: model FLOP/s, MFU | "
            "loop under run --torch vs alone |", "|---|---|---|---|---|---|---|"]
    for r in results:
        v = r.get("step") or r.get("overall") or {}
        shares = ", ".join(f"{k} {x:.0%}" for k, x in sorted((v.get("shares") or {}).items(), key=lambda kv: -kv[1]))
        t = r.get("truth", {})
        own_text = own_figure(r["job"], t)
        mfu = (r.get("roofline") or {}).get("mfu") or {}
        mfu_text = "-"
        if mfu.get("flops_per_s"):
            mfu_text = f"{mfu['flops_per_s'] / 1e12:.0f} TFLOP/s {mfu.get('dtype', '')}"
            for key, what in (("mfu_measured", "measured"), ("mfu_datasheet", "datasheet")):
                if mfu.get(key) is not None:
                    mfu_text += f", {mfu[key]:.0%} of {what}"
        slow = "-"
        if r.get("alone", {}).get("loop_s") and t.get("loop_s"):
            slow = f"{t['loop_s'] / r['alone']['loop_s']:.2f}x"
        verdict = v.get("verdict", "error") + (f" {v['undecided']}" if v.get("undecided") else "")
        expect = "/".join(sorted(allowed_verdicts(r['job'], t)))
        rows.append(f"| {r['job']} | {expect} | {verdict} | {shares} | {own_text} | {mfu_text} | {slow} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu-jobs", help="folder for the runs and gpu_jobs.json (default ./gpu-jobs)")
    p.add_argument("--only", default=",".join(SPECS), help="jobs, comma-separated")
    p.add_argument("--alone", action="store_true", help="also time each job without the profiler")
    p.add_argument("--job-args", default="", help="more arguments for every job (e.g. '--device cpu --smoke' "
                                                  "to try this script without a GPU)")
    args = p.parse_args(argv)
    out = Path(args.out)
    results = []
    for name in args.only.split(","):
        t = time.perf_counter()
        try:
            r = run_job(name, out, args.job_args.split())
            if args.alone:
                r["alone"] = run_alone(name, out, args.job_args.split())
        except Exception as exc:        # one job's failure must not cost the others' figures
            r = {"job": name, "expect": SPECS[name][2], "error": repr(exc)}
        results.append(r)
        print(f"{name}: {time.perf_counter() - t:.0f} s, "
              f"{(r.get('step') or r.get('overall') or {}).get('verdict', r.get('error', 'no report'))}", flush=True)
        (out / "gpu_jobs.json").write_text(json.dumps(results, indent=1, default=str))
    print(table(results))
    for r in results:
        v = r.get("step") or r.get("overall")
        print(f"\n{r['job']}: {_evidence(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
