"""Reading a threads collector's run back, for the integration tests of its states and ranks:
`counterprof run` of a command, the run's samples with each row's interval in CLOCK_MONOTONIC ns,
and the rows inside a workload's own window (as tests/integration/test_threads.py does)."""
import json

import counterprof
from helpers import REPO, run_cli

WORKLOADS = str(REPO / "tests" / "thread_workloads.py")
JOBS = REPO / "tests" / "jobs"


def frame(run, rank=None):
    """Samples as a DataFrame with each row's interval in CLOCK_MONOTONIC ns (start, end)."""
    t = run.samples(rank=rank).to_pandas()
    t["metric"] = t["metric"].astype(str)
    t["entity"] = t["entity"].astype(str)
    t["end"] = t["time"].astype("int64") - run.meta["clock_offset_ns"]
    t["start"] = t["end"] - t["duration_ns"].fillna(0).astype("int64")
    return t


def in_window(t, w):
    """Rows wholly inside the workload's own [t0, t1]: the sums, and the seconds they cover."""
    inside = t[(t["start"] >= w["t0"]) & (t["end"] <= w["t1"])]
    sums = inside.groupby("metric")["value"].sum().to_dict()
    covered = inside[inside["metric"] == "thread.main.running"]["duration_ns"].sum() / 1e9
    return inside, sums, covered


def profile_cli(run_dir, *cmd, extra=(), collectors="threads", env=None):
    """`counterprof run -q` of cmd; the run and the last JSON line the command printed (None)."""
    proc = run_cli("run", "-q", "--collectors", collectors, *extra, "-o", str(run_dir), "--", *cmd, timeout=240,
                   env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return counterprof.load(run_dir), json.loads(lines[-1]) if lines else None
