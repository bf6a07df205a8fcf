"""`counterprof run -q -- true` start to finish: two counterprof builds side by side, paired.

    python benchmarks/startup_pair.py NEW BASE [--rounds 21]

NEW and BASE are counterprof executables, e.g. a script per checkout that runs its package
folder the same way (an editable install against a package folder would measure the install,
not the code):

    pip install --no-deps --target /tmp/newpkg .          (in each checkout; then a script:)
    PYTHONPATH=/tmp/newpkg exec python -P -m counterprof "$@"

Each round runs both once in a random order (bytecode written by an unmeasured first run);
the figure is the median of the rounds' NEW/BASE wall-time ratios, with each side's median.
"""
from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def once(exe: str, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run([exe, "run", "-q", "-o", str(out), "--", "true"], capture_output=True, check=True)
    took = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("new")
    ap.add_argument("base")
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    sides = {"new": args.new, "base": args.base}
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run"
        for exe in sides.values():
            once(exe, out)                       # bytecode, page cache
        times: dict[str, list[float]] = {k: [] for k in sides}
        ratios = []
        for _ in range(args.rounds):
            order = list(sides)
            random.shuffle(order)
            got = {k: once(sides[k], out) for k in order}
            for k, v in got.items():
                times[k].append(v)
            ratios.append(got["new"] / got["base"])
    print(f"run -q -- true, {args.rounds} paired rounds: new {1e3 * statistics.median(times['new']):.0f} ms, "
          f"base {1e3 * statistics.median(times['base']):.0f} ms (medians); new/base "
          f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
