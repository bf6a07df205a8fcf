"""`counterprof roofline` streams a run's ops (store/op_rows.py), so its peak memory stays flat as
the trace grows: the largest shared trace, as it is and its events repeated 4x in time (the same
ops, shapes and kernels, so every per-op figure scales and nothing else changes). Before the
streaming, 4x the trace cost 131 MB more (245 -> 376 MB); streamed it costs ~16 MB more. Each
job runs in a fresh process, and the peak is that process's own ru_maxrss (a child's starts at
its parent's, so the trace is built in a child too and this process stays small)."""
import json
import subprocess

import pytest

from helpers import PYTHON, REPO
from kineto_traces import SHARED, shared_traces

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SHARED is None, reason="the shared traces are not here (set COUNTERPROF_TRACES)")]

# 4x the trace may cost at most this much more memory than 1x: a regression to holding every
# op row (as before the streaming) costs 131 MB here
MAX_GROWTH_MB = 40.0

PEAK = """
import json, resource, sys
from counterprof.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
      file=sys.stderr)
"""


def peak_of(argv: list[str]) -> float:
    p = subprocess.run([PYTHON, "-c", PEAK, *argv], capture_output=True, text=True, timeout=600)
    last = json.loads(p.stderr.strip().splitlines()[-1])
    assert p.returncode == 0 and last["rc"] == 0, p.stderr[-2000:]
    return last["peak_rss_mb"]


def test_roofline_memory_is_flat_in_the_traces_length(tmp_path):
    largest = max(shared_traces(), key=lambda p: p.stat().st_size)
    x4 = tmp_path / "x4.json"
    subprocess.run([PYTHON, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
                    "from kineto_traces import duplicated_trace; "
                    "duplicated_trace(Path(sys.argv[2]), 4, Path(sys.argv[3]))",
                    str(REPO / "tests"), str(largest), str(x4)], check=True, timeout=600)
    peaks = {}
    for label, trace in (("x1", largest), ("x4", x4)):
        run = tmp_path / f"run-{label}"
        subprocess.run([PYTHON, "-m", "counterprof", "import", str(trace), "-o", str(run), "-q"],
                       check=True, capture_output=True, timeout=600)
        peaks[label] = peak_of(["roofline", str(run), "--json"])
        out = subprocess.run([PYTHON, "-m", "counterprof", "roofline", str(run), "--json"],
                             capture_output=True, text=True, timeout=600, check=True)
        peaks[label + " ops"] = sum(op["calls"] for op in json.loads(out.stdout)["ops"])
    print(peaks)    # pytest -s shows the figures
    # the 4x run really holds 4x the ops (else flat memory proves nothing)
    assert peaks["x4 ops"] == 4 * peaks["x1 ops"], peaks
    assert peaks["x4"] - peaks["x1"] <= MAX_GROWTH_MB, (
        f"roofline's peak RSS grew {peaks['x4'] - peaks['x1']:.0f} MB for 4x the trace "
        f"({peaks['x1']:.0f} -> {peaks['x4']:.0f} MB; at most {MAX_GROWTH_MB:.0f} MB)")
