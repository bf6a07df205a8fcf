"""MFU beyond the report, as users get it: `compare` (each side's MFU per traced step and its
change, judged like every metric), `history` (recorded per run, shown by default) and the live
view (`run --live --torch`: a figure once a trace window is in). Real runs: a torch matmul loop
under `counterprof run --torch`, against ceilings `counterprof calibrate` measured here.

The expected MFU is computed here from the run's spans, independently of the roofline: each
step that a trace window recorded, 3 x 2 x 1024^3 FLOPs (three 1024^2 fp32 mm) over the step's
wall time, over the fp32 peak the run copied into its meta.json."""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from counterprof.analysis.roofline import MISFIT
from helpers import COUNTERPROF, calibrated, run_cli

MATMUL = """
import os, time, torch, counterprof
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
pause = os.environ.get("PAUSE_S", "0")
for step in range(int(os.environ.get("STEPS", "10"))):
    t0 = time.perf_counter()
    for _ in range(3):
        c = torch.mm(a, b)
    # "4x": four times as long as the matmuls took: the MFU falls to a fifth at the same speed,
    # and stays well below the baseline's even if the machine's load moved its speed 3x between runs
    time.sleep(4 * (time.perf_counter() - t0) if pause == "4x" else float(pause))
    counterprof.step()
"""
STEP_FLOPS = 3 * 2 * 1024 ** 3


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return calibrated(tmp_path_factory.mktemp("xdg"))[0]


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "mm.py"
    path.write_text(textwrap.dedent(MATMUL))
    return path


def _run(out: Path, env: dict, script: Path, pause: str = "0", steps: int = 10, *extra: str) -> Path:
    env = {**env, "PAUSE_S": str(pause), "STEPS": str(steps)}
    proc = run_cli("run", "--torch", "--torch-window", "7/50", "-q", *extra, "-o", str(out), "--",
                   sys.executable, str(script), timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache, script):
    d = tmp_path_factory.mktemp("mfu")
    # the candidate sleeps after the same matmuls 4x as long as they took: its MFU falls
    return {"base": _run(d / "base", cache, script), "cand": _run(d / "cand", cache, script, pause="4x")}


def expected_mfu(run: Path, at_least: int = 5) -> list[float]:
    """Per traced step, in percent: its mm FLOPs / its wall time / the copied fp32 peak."""
    from counterprof.store.query import RunQuery
    peak = json.loads((run / "meta.json").read_text())["ceilings"]["cpu"]["peaks"]["fp32"]
    q = RunQuery(run)
    steps = q.arrow("""SELECT epoch_ns(start) AS a, epoch_ns("end") AS b FROM spans
                       WHERE category::VARCHAR = 'step'""").to_pylist()
    windows = q.arrow("""SELECT epoch_ns(start) AS a, epoch_ns("end") AS b FROM spans
                         WHERE category::VARCHAR = 'window'""").to_pylist()
    mm = [r["t"] for r in q.arrow("""SELECT epoch_ns(start) AS t FROM spans
                                     WHERE category::VARCHAR = 'cpu_op' AND name = 'aten::mm'""").to_pylist()]
    q.close()
    out = []
    for s in steps:
        inside = sum(max(0, min(s["b"], w["b"]) - max(s["a"], w["a"])) for w in windows)
        if inside < 0.5 * (s["b"] - s["a"]):
            continue                     # not recorded: its MFU is unknown, not 0
        calls = sum(1 for t in mm if s["a"] <= t < s["b"])
        assert calls == 3, (s, calls)
        out.append(100 * STEP_FLOPS / ((s["b"] - s["a"]) / 1e9) / peak)
    assert len(out) >= at_least, out
    return out


def _row(cmp: dict, key: str) -> dict:
    return next(r for r in cmp["rows"] if r["key"] == key and r["rank"] is None)


def test_compare_gives_each_sides_mfu_and_its_change(runs, cache):
    proc = run_cli("compare", str(runs["base"]), str(runs["cand"]), "--json", timeout=300, env=cache)
    assert proc.returncode == 0, proc.stderr
    cmp = json.loads(proc.stdout)
    mfu = _row(cmp, "metric:roofline.mfu")
    base, cand = expected_mfu(runs["base"]), expected_mfu(runs["cand"])
    assert mfu["n_base"] == len(base) and mfu["n_cand"] == len(cand)
    assert mfu["base_median"] == pytest.approx(statistics.median(base), rel=1e-6)
    assert mfu["cand_median"] == pytest.approx(statistics.median(cand), rel=1e-6)
    assert mfu["unit"] == "percent"
    # steps 5x as long for the same FLOPs: -80% at one speed (wide: the machine is shared)
    assert -0.95 < mfu["change"] < -0.3
    assert mfu["status"] == "changed" and mfu["ci"][1] < 0
    flops = _row(cmp, "metric:roofline.flops_per_s")
    assert flops["change"] == pytest.approx(mfu["change"], rel=1e-6)     # one peak on both sides
    # no datasheet for a CPU: that series is left out, not 0
    assert not any(r["key"] == "metric:roofline.mfu_datasheet" for r in cmp["rows"])
    # the verdicts use the roofline as report's do: the same word for the same run's steps
    rep = json.loads(run_cli("report", str(runs["base"]), "--json", timeout=300, env=cache).stdout)
    step = next(g["verdict"] for g in rep["regions"] if g["kind"] == "step")
    word = step["verdict"] + (f" ({'|'.join(step['undecided'])})" if step["verdict"] == "unknown"
                              and step.get("undecided") else "")
    assert _row(cmp, "step_time")["verdict"][0] == word
    # That much the roofline decides, on ceilings that fit. This VM's matmul rate moves 140-180
    # GFLOP/s within seconds (10 quick calibrations in a row, 2026-12-06), so a job can run its mm
    # past 105% of a calibration taken a minute before: then the report must say the ceilings do
    # not fit and leave compute|memory open, never split on them.
    misfit = any(n.startswith(MISFIT) for n in rep["roofline"]["notes"])
    assert ("compute|memory" in word) == misfit, (word, rep["roofline"]["notes"])
    text = run_cli("compare", str(runs["base"]), str(runs["cand"]), timeout=300, env=cache)
    assert text.returncode == 0
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith("roofline.mfu "))
    assert f"{statistics.median(base):.1f}%" in line and "changed" in line


def test_compare_of_a_run_with_itself_leaves_mfu_unchanged(runs, cache):
    proc = run_cli("compare", str(runs["base"]), str(runs["base"]), "--json", timeout=300, env=cache)
    row = _row(json.loads(proc.stdout), "metric:roofline.mfu")
    # a few noisy steps: the interval may be too wide to call, never a change
    assert row["change"] == 0 and row["status"] in ("unchanged", "inconclusive")


def test_history_records_mfu_per_run_and_shows_it(runs, cache, tmp_path):
    db = tmp_path / "h.duckdb"
    proc = run_cli("history", "add", str(runs["base"]), str(runs["cand"]), "--db", str(db), timeout=300, env=cache)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("history", "show", "--db", str(db), "--json", timeout=120, env=cache)
    assert proc.returncode == 0, proc.stderr
    trends = json.loads(proc.stdout)
    series = next(t for t in trends["series"] if t["series"] == "metric:roofline.mfu")
    want = [statistics.median(expected_mfu(runs[k])) for k in ("base", "cand")]
    assert [p["value"] for p in series["points"]] == pytest.approx(want, rel=1e-6)
    assert series["unit"] == "percent"
    text = run_cli("history", "show", "--db", str(db), timeout=120, env=cache).stdout
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("metric:roofline.mfu "))
    assert f"{want[0]:.1f}%" in line and f"{want[1]:.1f}%" in line


def test_a_run_without_torch_ops_has_no_mfu_rows(tmp_path, cache):
    run = tmp_path / "plain"
    proc = run_cli("run", "-q", "-o", str(run), "--", sys.executable, "-c", "sum(range(10**6))", env=cache)
    assert proc.returncode == 0, proc.stderr
    cmp = json.loads(run_cli("compare", str(run), str(run), "--json", env=cache).stdout)
    assert not any(r["key"].startswith("metric:roofline.") for r in cmp["rows"])


def test_live_view_shows_the_trace_windows_mfu(tmp_path, cache, script):
    """Lines mode (stderr is a pipe): after the trace window is converted, each line carries
    the MFU of its steps, the same figure `counterprof roofline` gives the run afterwards."""
    run = tmp_path / "live"
    env = {**cache, "PAUSE_S": "0.3", "STEPS": "16"}
    p = subprocess.run([*COUNTERPROF, "run", "--live", "--torch", "--torch-window", "5/50", "-o", str(run),
                        "--", sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if re.match(r"counterprof: +\d+\.\d+ s ", ln)]
    shown = [float(m.group(1)) for ln in lines if (m := re.search(r"torch trace MFU ([\d.]+)%", ln))]
    assert shown, "\n".join(lines)
    assert not re.search(r"MFU", lines[0])          # nothing before a window is in
    r = json.loads(run_cli("roofline", str(run), "--json", env=cache).stdout)
    assert shown[-1] == pytest.approx(100 * r["mfu"]["mfu_measured"], abs=0.051)
    assert statistics.median(expected_mfu(run, at_least=3)) == pytest.approx(shown[-1], abs=0.051)


def test_imported_gpu_traces_compare_and_record_their_datasheet_mfu(tmp_path):
    """A real A100 trace (shapes recorded, ProfilerStep marks), imported twice: compare has
    its datasheet MFU per step on both sides, unchanged; history keeps its median, the figure
    `counterprof roofline` gives. No measured ceilings for that machine: no measured MFU row."""
    trace = Path(__file__).resolve().parents[2] / "shared" / "traces" / "a100_rank3of8.json.gz"
    if not trace.exists():
        trace = Path("/work/shared/traces/a100_rank3of8.json.gz")
    runs = []
    for name in ("a", "b"):
        runs.append(tmp_path / name)
        proc = run_cli("import", str(trace), "-o", str(runs[-1]), "-q", timeout=120)
        assert proc.returncode == 0, proc.stderr
    want = json.loads(run_cli("roofline", str(runs[0]), "--json").stdout)["mfu"]
    assert want["peak_datasheet_flops_per_s"] == 19.5e12 and want["mfu_measured"] is None
    # (each import records its own command line: --force)
    cmp = json.loads(run_cli("compare", *map(str, runs), "--force", "--json", timeout=300).stdout)
    row = _row(cmp, "metric:roofline.mfu_datasheet")
    assert row["n_base"] == row["n_cand"] == len(want["steps"]) >= 5
    assert row["base_median"] == pytest.approx(100 * want["mfu_datasheet"], rel=1e-9)
    assert row["change"] == 0 and row["status"] in ("unchanged", "inconclusive")
    assert not any(r["key"] == "metric:roofline.mfu" for r in cmp["rows"])
    db = tmp_path / "h.duckdb"
    assert run_cli("history", "add", str(runs[0]), "--db", str(db), timeout=300).returncode == 0
    shown = json.loads(run_cli("history", "show", "--db", str(db), "--json").stdout)
    s = next(t for t in shown["series"] if t["series"] == "metric:roofline.mfu_datasheet")
    assert s["points"][0]["value"] == pytest.approx(100 * want["mfu_datasheet"], rel=1e-9)
