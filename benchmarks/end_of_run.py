"""End of run: the wall time of Session.stop() (the journal's compaction, meta.json, the catalog)
for -I 1 runs of several lengths, two checkouts side by side (before: --before's python).

    python benchmarks/end_of_run.py --before /work/base/.venv/bin/python --seconds 10 60 600 --rounds 3

A run of any length is built by replay, so that a 10-minute run takes less than 10 minutes: a
real `counterprof run -I 1 -- sleep 3` gives the template (its samples, ~6k rows a second),
and each child process replays it, tiled and shifted in time (and sent twice or more, 1 ns
apart, to reach --rows-per-s), into an in-process Session (no
collectors) at --speed times the real rate, batch by batch as a collector emits them (every
0.1 s of run time), then times stop(). The background compaction runs as it would in the real
run (it is fed by the journal's rotations), just --speed times faster. Each round runs every
(checkout, length) once, in random order; the table shows medians [min-max] and the median of
the per-round ratios after/before. CPU: the child's process CPU over replay + stop, per second
of run replayed (the replay's own cost is the same in both checkouts).

--real also times `counterprof run -I 1 -- sleep N` from outside (wall minus N: start-up plus
the end of the run) for each length in --real-seconds.
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
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
from pathlib import Path
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
from counterprof.session import Session

template, out, seconds, speed = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
rows_per_s = float(sys.argv[5])
t = pq.read_table(template).combine_chunks()
times = t.column("time").cast("int64").to_numpy()
span = int(times.max() - times.min()) + 1
# the template's rate brought to rows_per_s: each batch sent `copies` times, 1 ns apart
copies = max(1, round(rows_per_s / (t.num_rows / (span / 1e9))))
rel = pa.array(times - times.min(), pa.int64())
s = Session(out, collectors=[], rank=0, on_warning=lambda m: None)
s.start()
cpu0, wall0 = time.process_time(), time.perf_counter()
tick = 100_000_000                     # a collector's batch: 0.1 s of run time
t0 = s.start_ns
bounds = list(range(0, span, tick)) + [span]
pieces = [t.filter(pc.and_(pc.greater_equal(rel, a), pc.less(rel, b))) for a, b in zip(bounds, bounds[1:])]
emitted, run_ns, k = 0, 0, 0
while run_ns < seconds * 1e9:
    piece = pieces[k % len(pieces)]
    # keep times rising, tile by tile
    for c in range(copies):
        times_k = pc.add(pc.subtract(piece.column("time").cast("int64"), int(times.min())),
                         t0 + (k // len(pieces)) * span + c)
        b = piece.set_column(0, "time", times_k.cast(t.schema.field("time").type))
        for rb in b.to_batches():
            s.emit("samples", rb)
            emitted += rb.num_rows
    k += 1
    run_ns += tick
    due = wall0 + run_ns / 1e9 / speed
    now = time.perf_counter()
    if due > now:
        time.sleep(due - now)
replay_wall = time.perf_counter() - wall0
w = time.perf_counter()
s.stop()
stop_s = time.perf_counter() - w
cpu = time.process_time() - cpu0
files = sorted(str(p.name) for p in (out / "samples").glob("rank=0/*.parquet"))
rows = sum(pq.read_metadata(out / "samples" / "rank=0" / f).num_rows for f in files)
import counterprof
print(json.dumps({"counterprof": counterprof.__file__, "stop_s": stop_s, "emitted": emitted,
                  "rows": rows, "files": len(files),
                  "cpu_per_run_s": cpu / seconds, "replay_wall_s": replay_wall}))
"""


def template(python: str, workdir: Path) -> Path:
    run = workdir / "template"
    subprocess.run([python, "-m", "counterprof", "run", "-I", "1", "--no-interval-rows", "-o", str(run), "--",
                    "sleep", "3"],
                   check=True, capture_output=True, cwd=workdir)
    (f,) = list((run / "samples").glob("rank=0/*.parquet"))
    return f


def child(python: str, tmpl: Path, out: Path, seconds: float, speed: float, rate: float) -> dict:
    r = subprocess.run([python, "-c", CHILD, str(tmpl), str(out), str(seconds), str(speed), str(rate)],
                       capture_output=True, text=True, cwd=out.parent,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if r.returncode != 0:
        raise SystemExit(f"{python}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def real(python: str, out: Path, seconds: float) -> dict:
    t = time.perf_counter()
    subprocess.run([python, "-m", "counterprof", "run", "-I", "1", "--no-interval-rows", "-o", str(out), "--", "sleep",
                    str(seconds)], check=True, capture_output=True, cwd=out.parent)   # not this checkout's
    wall = time.perf_counter() - t
    meta = json.loads((out / "meta.json").read_text())
    return {"stop_s": wall - seconds, "cpu_per_run_s": meta["profiler"]["cpu_s"] / seconds}


def med(v: list[float]) -> str:
    return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the other checkout's python")
    ap.add_argument("--after", default=sys.executable)
    ap.add_argument("--seconds", type=float, nargs="+", default=[10, 60, 600])
    ap.add_argument("--speed", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows-per-s", type=float, default=6350.0,
                    help="samples a second of run (6350: a 60 s -I 1 run's 381k rows)")
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--real-seconds", type=float, nargs="+", default=[10, 60])
    a = ap.parse_args()
    pythons = {"before": a.before, "after": a.after}
    res: dict[tuple[str, str, float], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="endrun-") as tmp:
        work = Path(tmp)
        tmpl = template(a.after, work)
        for r in range(a.rounds):
            jobs = [("replay", who, s) for who in pythons for s in a.seconds]
            if a.real:
                jobs += [("real", who, s) for who in pythons for s in a.real_seconds]
            random.shuffle(jobs)
            for i, (kind, who, s) in enumerate(jobs):
                out = work / f"r{r}-{i}"
                got = (child(pythons[who], tmpl, out, s, a.speed, a.rows_per_s) if kind == "replay"
                       else real(pythons[who], out, s))
                res.setdefault((kind, who, s), []).append(got)
                subprocess.run(["rm", "-rf", str(out)], check=True)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    for who in pythons:      # which checkout each side imported (a cwd on sys.path would mislead)
        print(who, next(v[0]["counterprof"] for k, v in res.items() if k[1] == who and k[0] == "replay"))
    print(f"{'run':>14} {'stop() s before':>22} {'stop() s after':>22} {'after/before':>12} "
          f"{'CPU s/run s before':>22} {'CPU s/run s after':>22} files rows")
    for kind in ("replay", "real"):
        for s in sorted({k[2] for k in res if k[0] == kind}):
            b, f = res[(kind, "before", s)], res[(kind, "after", s)]
            ratio = statistics.median(x["stop_s"] / y["stop_s"] for x, y in zip(f, b))
            print(f"{kind + ' ' + str(int(s)) + ' s':>14} {med([x['stop_s'] for x in b]):>22} "
                  f"{med([x['stop_s'] for x in f]):>22} {ratio:>12.3f} "
                  f"{med([x['cpu_per_run_s'] for x in b]):>22} {med([x['cpu_per_run_s'] for x in f]):>22} "
                  f"{f[0].get('files', '')}/{b[0].get('files', '')} {f[0].get('rows', '')}")


if __name__ == "__main__":
    main()
