"""A killed `counterprof run --torch`: the first command that reads the run recovers it the way
`counterprof recover` does, torch traces included, and a later `counterprof recover` still
converts a trace that recovery had to leave pending."""
from __future__ import annotations

import json
import subprocess
import textwrap
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import counterprof
from helpers import COUNTERPROF, PYTHON, ClaimHeldElsewhere, run_cli, traces_dir

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

WORK = """
import atexit, os, sys, time
go, done = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(done, "w").close())    # runs after torch's last window is written
import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
def train_step():
    opt.zero_grad(); model(x).square().mean().backward(); opt.step()
for _ in range(4):
    train_step()
print("ready", flush=True)
while not os.path.exists(go):           # the profiler is killed meanwhile
    time.sleep(0.05)
for _ in range(9):
    train_step()
"""


def windows(run: Path) -> Counter:
    spans = counterprof.load(run).table("spans")
    w = spans.filter(pc.equal(spans["category"].cast(pa.string()), "window"))
    return Counter(w["name"].to_pylist())


def test_report_of_a_killed_run_converts_its_pending_traces(tmp_path):
    work = tmp_path / "work.py"
    work.write_text(textwrap.dedent(WORK))
    run, go, done = tmp_path / "run", tmp_path / "go", tmp_path / "done"
    prof = subprocess.Popen([*COUNTERPROF, "run", "--torch", "--torch-window", "2/3", "-q", "-o",
                             str(run), "--", PYTHON, str(work), str(go), str(done)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert prof.stdout.readline().strip() == "ready", prof.stderr.read()
    finally:
        prof.kill()                     # SIGKILL: no last sweep, no compaction, no final meta
        prof.wait()
    go.touch()                          # the orphaned workload records its next windows
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.exists()
    prof.stdout.close()
    prof.stderr.close()
    traces = sorted(p.name for p in traces_dir(run).glob("*.pt.trace.json"))
    assert len(traces) >= 4
    assert json.loads((run / "meta.json").read_text())["status"] == "running"
    # a converter (say, a second reader) holds the last trace while report recovers the run
    held = traces_dir(run) / traces[-1]
    with ClaimHeldElsewhere(held) as holder:
        rep = run_cli("report", str(run))
        assert rep.returncode == 0, rep.stderr
        assert "the profiler that wrote it is gone" in rep.stderr
        assert "torch: converted" in rep.stderr
        assert f"{traces[-1]} (rank 0): being converted by another process; left to it" in rep.stderr
        assert json.loads((run / "meta.json").read_text())["status"] == "recovered"
        assert windows(run) == Counter(traces[:-1])         # every other trace, once
        holder.die()             # it died before finishing
    # recovered already; a later recover still converts what was left pending
    rec = run_cli("recover", str(run), "-q")
    assert rec.returncode == 0, rec.stderr
    assert f"torch: converted {traces[-1]}" in rec.stderr
    assert windows(run) == Counter(traces)
    assert run_cli("recover", str(run), "-q").stderr.count("torch: converted") == 0
    assert run_cli("report", str(run)).stderr.count("torch: converted") == 0


def test_a_child_forked_during_a_conversion_does_not_keep_the_claim(tmp_path):
    """A DataLoader worker forked while its parent converts a trace: the claim goes with the
    parent's release, not with the worker's life."""
    import os
    import signal
    from counterprof.collectors.torch_trace.claim import Claim
    trace = tmp_path / "t.pt.trace.json"
    trace.write_text("{}")
    claim = Claim.take(trace)
    assert claim is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                       # the worker: lives on past the parent's release
        import time
        os.write(w, b"up")             # (the fork hooks have run by now)
        time.sleep(30)
        os._exit(0)
    try:
        assert os.read(r, 2) == b"up"
        claim.release()
        again = Claim.take(trace)
        assert again is not None, "the forked child still holds the claim"
        again.release()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
