"""Reading one run in the current layout (a dataset per table) and in the older one (a folder
per rank), side by side: counterprof's reader and the report's DuckDB scan (pyarrow.dataset and
the other one-liners read the current layout only: that is the point of it).

    python benchmarks/layout_read.py [--ranks 16] [--minutes 2] [--repeats 5]

Writes a synthetic run (benchmarks/synthetic_run.py), copies it into the older layout, then
times each read on both, alternating, and prints the medians and their ratio (older / current).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from helpers import to_older_layout  # noqa: E402


def reads(run: Path) -> dict:
    import counterprof
    from counterprof.store.query import RunQuery

    def reader():
        counterprof.load(run).samples()

    def query():
        q = RunQuery(run)
        q.groups()
        q.close()

    return {"Run.samples()": reader, "RunQuery.groups()": query}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        new, old = Path(tmp) / "current", Path(tmp) / "older"
        subprocess.run([sys.executable, str(HERE / "synthetic_run.py"), "-o", str(new), "--ranks",
                        str(args.ranks), "--minutes", str(args.minutes), "--hz", "100"], check=True)
        shutil.copytree(new, old)
        to_older_layout(old)
        times = {name: {"current": [], "older": []} for name in reads(new)}
        for i in range(args.repeats + 1):
            pair = [("current", new), ("older", old)]
            for layout, run in pair if i % 2 else pair[::-1]:      # each goes first in turn
                for name, fn in reads(run).items():
                    t0 = time.perf_counter()
                    fn()
                    if i:                                  # the first round warms the caches
                        times[name][layout].append(time.perf_counter() - t0)
        for name, t in times.items():
            cur, older = statistics.median(t["current"]), statistics.median(t["older"])
            print(f"{name:20s} current {cur * 1e3:8.1f} ms   older {older * 1e3:8.1f} ms   "
                  f"older/current {older / cur:5.2f}")


if __name__ == "__main__":
    main()
