"""The labelled jobs (tests/jobs/) side by side with what `counterprof report` says of them:
the README's table of labelled workloads.

    python benchmarks/verdict_jobs.py [--rounds N]

Each job runs under `counterprof run --torch` and keeps its own accounting (tests/jobs/truth.py):
what it waited for (its sleeps, its DataLoader waits, its main thread's run delay, its reducer
wait), over its own loop. The report's step region (`ProfilerStep`: every step, timed by the
driver) is the part of the run that is the loop, so its shares are held to the loop's truth;
the headline (`overall`) is the steps' too, start-up apart. The share shown is the job's class:
host for the sleeping, loading, contended and tokenizing jobs, collectives for DDP. Medians over
rounds; the truth is measured in the same run, so a busy machine moves both.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "jobs"
PY = sys.executable


def profile(tmp: Path, name: str, *cmd: str, env: dict | None = None, prefix=()) -> tuple[dict, list[dict]]:
    run, truth = tmp / name, tmp / f"{name}.jsonl"
    truth.unlink(missing_ok=True)
    e = {**os.environ, "JOB_TRUTH": str(truth), **(env or {})}
    subprocess.run([PY, "-m", "counterprof", "run", "-q", "--torch", "-o", str(run), "--force", "--",
                    *prefix, *cmd], env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rep = subprocess.run([PY, "-m", "counterprof", "report", str(run), "--json"], check=True,
                         capture_output=True, text=True)
    lines = [json.loads(x) for x in truth.read_text().splitlines()]
    return json.loads(rep.stdout), [x for x in lines if "loop_s" in x or "reducer_wait_s" in x]


def step_region(report: dict) -> dict:
    return next((r["verdict"] for r in report["regions"] if r["kind"] == "step"), {})


def host(v: dict) -> float:
    return v.get("shares", {}).get("host", 0.0)


def coll(v: dict) -> float:
    return v.get("shares", {}).get("collectives", 0.0)


def words(v: dict) -> str:
    verdict = v.get("verdict", "?")
    if verdict == "unknown":
        return "unknown (" + "|".join(v.get("undecided") or []) + ")"
    parts = v.get("host_parts") or {}
    top = max(parts.items(), key=lambda kv: kv[1])[0] if verdict == "host" and parts else ""
    return verdict + (f": {top}" if top else "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows: dict[str, list[tuple]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(args.rounds):
            r, t = profile(tmp, "gpt2", PY, str(JOBS / "gpt2_train.py"), "--steps", "12", "--sleep-share", "0.4")
            (t,) = t
            truth = (t["sleep_s"] + t["main_run_delay_s"]) / t["loop_s"]
            rows.setdefault("GPT-2 (HF, AdamW), 40% of each step asleep", []).append(
                (truth, host(step_region(r)), host(r["overall"]), words(step_region(r))))
            r, t = profile(tmp, "loader", PY, str(JOBS / "dataloader_bound.py"))
            (t,) = t
            truth = t["next_wait_s"] / t["loop_s"]
            rows.setdefault("DataLoader, 2 workers tokenizing in Python", []).append(
                (truth, host(step_region(r)), host(r["overall"]), words(step_region(r))))
            r, t = profile(tmp, "loader_io", PY, str(JOBS / "dataloader_io.py"))
            (t,) = t
            truth = t["next_wait_s"] / t["loop_s"]
            rows.setdefault("DataLoader, 2 workers fetching over HTTP (40 ms)", []).append(
                (truth, host(step_region(r)), host(r["overall"]), words(step_region(r))))
            busy = subprocess.Popen(["taskset", "-c", "0", PY, "-c", "while True: pass"])
            try:
                r, t = profile(tmp, "contended", PY, str(JOBS / "gpt2_train.py"), "--steps", "8",
                               prefix=("taskset", "-c", "0"))
            finally:
                busy.kill()
                busy.wait()
            (t,) = t
            truth = t["main_run_delay_s"] / t["wall_s"]
            rows.setdefault("GPT-2 sharing CPU 0 with a busy loop", []).append(
                (truth, host(step_region(r)), host(r["overall"]), words(step_region(r))))
            r, t = profile(tmp, "tokenize", PY, str(JOBS / "gpt2_tokenize.py"), "--steps", "30", "--region")
            (t,) = t
            truth = (t["tokenize_s"] + t["model_run_delay_s"]) / t["loop_s"]
            rows.setdefault("GPT-2, each batch tokenized in Python in the loop", []).append(
                (truth, host(step_region(r)), host(r["overall"]), words(r["overall"])))
            for launcher in ("torchrun", "spawn"):
                cmd = ((str(Path(PY).parent / "torchrun"), "--standalone", "--nproc_per_node", "2",
                        str(JOBS / "ddp_big_grads.py")) if launcher == "torchrun"
                       else (PY, str(JOBS / "ddp_big_grads.py"), "--spawn", "2", "--port", str(29600 + 17 * i)))
                r, t = profile(tmp, f"ddp_big_{launcher}", *cmd)
                truth = statistics.mean(x["collectives_s"] / x["loop_s"] for x in t)
                rows.setdefault(f"DDP gloo, 67 MB of grads, {launcher}", []).append(
                    (truth, coll(step_region(r)), coll(r["overall"]), words(r["overall"])))
            r, t = profile(tmp, "ddp", PY, str(JOBS / "ddp_train.py"), "--spawn", "2",
                           "--port", str(29500 + 17 * i + 3))
            truth = statistics.mean(x["reducer_wait_s"] / x["loop_s"] for x in t)
            rows.setdefault("DDP gloo, 2 ranks via mp.spawn: collectives", []).append(
                (truth, coll(step_region(r)), coll(r["overall"]), words(step_region(r))
                 + f"; {len(r['rank_verdicts'])} rank verdicts"))
    print(f"{'job':<50} {'truth':>6} {'steps':>6} {'headline':>8}  verdict   (medians of {args.rounds})")
    for job, vals in rows.items():
        med = [statistics.median(v[k] for v in vals) for k in range(3)]
        print(f"{job:<50} {med[0]:6.0%} {med[1]:6.0%} {med[2]:8.0%}  {vals[len(vals) // 2][3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
