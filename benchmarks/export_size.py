"""Bytes and time of `counterprof export` to Perfetto's protobuf format (.pftrace) against the
Chrome-trace JSON (.json.gz, and the JSON's own bytes before gzip), on one synthetic run.

    python benchmarks/export_size.py --ranks 8 --minutes 1 --rounds 5
    python benchmarks/export_size.py --run /tmp/big --rounds 3 --window 300:310

Without --run a run is written to a temporary directory with benchmarks/synthetic_run.py (100 Hz,
20 metrics). Each round exports .json.gz and .pftrace (and .pftrace.gz) once each, in random
order, each in a fresh process (wall time from outside); the table shows medians over the
rounds, and the ratios are medians of each round's own ratio (paired rounds).
"""
from __future__ import annotations

import argparse
import gzip
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = {"json.gz": "t.json.gz", "pftrace": "t.pftrace", "pftrace.gz": "t.pftrace.gz"}


def export(run: str, out: Path, extra: list[str]) -> float:
    started = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "counterprof", "export", run, "--perfetto", str(out), *extra],
                       capture_output=True, text=True)
    wall = time.perf_counter() - started
    if p.returncode != 0:
        sys.exit(f"export to {out.name} failed: {p.stderr.strip()}")
    return wall


def inflated(path: Path) -> int:
    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += len(chunk)
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", help="an existing run (default: write a synthetic one)")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--minutes", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--window", help="--window for every export")
    p.add_argument("--export-ranks", help="--ranks for every export")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="export-size-"))
    run = args.run
    if run is None:
        run = str(tmp / "run")
        subprocess.run([sys.executable, str(HERE / "synthetic_run.py"), "-o", run, "--ranks", str(args.ranks),
                        "--minutes", str(args.minutes), "--hz", "100", "--metrics", "20"], check=True)
    extra = (["--window", args.window] if args.window else []) + \
            (["--ranks", args.export_ranks] if args.export_ranks else [])
    walls: dict[str, list[float]] = {m: [] for m in MODES}
    sizes: dict[str, list[int]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        order = list(MODES)
        random.shuffle(order)
        for mode in order:
            out = tmp / MODES[mode]
            walls[mode].append(export(run, out, extra))
            sizes[mode].append(out.stat().st_size)
            if mode != "json.gz":
                out.unlink()
        json_bytes = inflated(tmp / MODES["json.gz"])
        sizes.setdefault("json", []).append(json_bytes)
        (tmp / MODES["json.gz"]).unlink()
    print(f"run {run}{' ' + ' '.join(extra) if extra else ''}; {args.rounds} rounds, medians")
    print(f"{'format':<12}{'bytes':>16}{'seconds':>10}")
    print(f"{'json':<12}{statistics.median(sizes['json']):>16,.0f}{'(inside json.gz)':>18}")
    for mode in MODES:
        print(f"{mode:<12}{statistics.median(sizes[mode]):>16,.0f}{statistics.median(walls[mode]):>10.2f}")

    def ratio(a: list[float] | list[int], b: list[float] | list[int]) -> float:
        return statistics.median(x / y for x, y in zip(a, b))
    print(f"bytes pftrace / json       {ratio(sizes['pftrace'], sizes['json']):.3f}")
    print(f"bytes pftrace / json.gz    {ratio(sizes['pftrace'], sizes['json.gz']):.3f}")
    print(f"bytes pftrace.gz / json.gz {ratio(sizes['pftrace.gz'], sizes['json.gz']):.3f}")
    print(f"time pftrace / json.gz     {ratio(walls['pftrace'], walls['json.gz']):.3f}")
    print(f"time pftrace.gz / json.gz  {ratio(walls['pftrace.gz'], walls['json.gz']):.3f}")


if __name__ == "__main__":
    main()
