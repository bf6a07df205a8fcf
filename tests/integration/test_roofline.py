"""The roofline end to end: labelled CPU workloads under `counterprof run --torch` against
ceilings that `counterprof calibrate` measured (copied into the run at its start), imported GPU
traces against the datasheet, calibration against plain reference loops written here.

Timing-based assertions use ratios measured interleaved in one process (the machine may be
shared) with wide margins; the figures themselves are printed (pytest -s)."""
from __future__ import annotations

import json
import os
import re
import statistics
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from helpers import calibrated, run_cli                                      # noqa: E402

from counterprof.analysis.roofline import busy_split             # noqa: E402
from counterprof.calibrate import MODES, measure                 # noqa: E402

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
if not TRACES.is_dir():
    TRACES = Path("/work/shared/traces")

MATMUL = """
import torch, counterprof
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
for step in range(8):
    for _ in range(3):
        c = torch.mm(a, b)
    counterprof.step()
"""
ELEMENTWISE = """
import torch, counterprof
n = 16 * 1024 * 1024                     # 64 MB of fp32 per tensor
a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
for step in range(8):
    for _ in range(3):
        torch.add(a, b, out=c)
        torch.mul(a, b, out=c)
    counterprof.step()
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """XDG_CACHE_HOME with this machine's ceilings, as `counterprof calibrate --quick` saves them."""
    return calibrated(tmp_path_factory.mktemp("xdg"))


def _profiled(tmp_path, env, script: str) -> Path:
    path = tmp_path / "workload.py"
    path.write_text(textwrap.dedent(script))
    run = tmp_path / "run"
    proc = run_cli("run", "--torch", "--torch-window", "3/8", "-q", "-o", str(run), "--",
                   sys.executable, str(path), timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return run


def _roofline_json(run: Path, env, *extra: str) -> dict:
    proc = run_cli("roofline", str(run), "--json", *extra, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_matmul_loop_is_compute_bound(tmp_path, cache):
    env, cpu = cache
    run = _profiled(tmp_path, env, MATMUL)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["ceilings"]["cpu"]["peaks"] == cpu["peaks"]       # copied in at the run's start
    r = _roofline_json(run, env)
    assert r["ceilings"]["source"] == "measured" and r["basis"] == "cpu self time"
    mm = [o for o in r["ops"] if o["name"] == "aten::mm"]
    assert len(mm) == 1 and mm[0]["input_dims"] == [[1024, 1024], [1024, 1024]]
    row = mm[0]
    assert row["calls"] >= 6 and row["flops_per_call"] == 2 * 1024 ** 3
    assert row["bound"] == "compute" and row["intensity"] > row["ridge"]
    print(f"\nmatmul loop: {row['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s = "
          f"{100 * row['roof_fraction']:.0f}% of the measured fp32 peak "
          f"({cpu['peaks']['fp32'] / 1e9:.1f} GFLOP/s)")
    # the same kernel as calibrate's sweep: near the peak (wide: the machine is shared)
    assert 0.3 < row["roof_fraction"] < 1.6
    assert r["modelled_share"] > 0.9
    # MFU of the steps the window recorded (2 whole ones in a 3-step window; untraced steps have
    # no ops, their MFU is unknown, not 0)
    assert r["mfu"]["dtype"] == "fp32" and len(r["mfu"]["steps"]) >= 2
    assert 0 < r["mfu"]["mfu_measured"] <= 1.6


def test_elementwise_loop_is_memory_bound(tmp_path, cache):
    env, cpu = cache
    run = _profiled(tmp_path, env, ELEMENTWISE)
    r = _roofline_json(run, env)
    rows = {o["name"]: o for o in r["ops"]}
    assert {"aten::add", "aten::mul"} <= set(rows)
    for name in ("aten::add", "aten::mul"):
        row = rows[name]
        n = 16 * 1024 * 1024
        assert row["bytes_per_call"] == 3 * 4 * n and row["flops_per_call"] == n
        assert row["bound"] == "memory" and row["intensity"] < row["ridge"]
        print(f"\n{name} on 64 MB tensors: {row['achieved_bytes_per_s'] / 1e9:.2f} GB/s = "
              f"{100 * row['roof_fraction']:.0f}% of the measured bandwidth "
              f"({cpu['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s)")
        assert 0.2 < row["roof_fraction"] < 2.0


def test_busy_split_from_the_spans(tmp_path, cache):
    """What the classifier gets: compute share of busy time with its evidence."""
    from counterprof.store.query import RunQuery
    env, cpu = cache
    spans = RunQuery(_profiled(tmp_path, env, MATMUL)).spans()
    share, evidence, missing = busy_split(spans, cpu)
    assert share is not None and share > 0.9 and not missing
    assert any("aten::mm" in e["text"] and "compute-bound" in e["text"] and "measured fp32 matmul peak" in e["text"]
               for e in evidence), evidence
    share, evidence, missing = busy_split(spans, None)
    assert share is None and any("counterprof calibrate" in m for m in missing)


def test_run_without_ceilings_says_calibrate(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "empty")}
    run = _profiled(tmp_path, env, MATMUL)
    proc = run_cli("roofline", str(run), timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "run `counterprof calibrate`" in proc.stdout
    r = _roofline_json(run, env)
    assert r["ceilings"] is None and all(o["bound"] is None for o in r["ops"])
    assert any(o["name"] == "aten::mm" and o["flops_per_call"] == 2 * 1024 ** 3 for o in r["ops"])


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = {}
    for name in ("tracelens/h100_vit_nsfw", "tracelens/mi300x_resnet_act_checkpoint", "mi250_rocm62_minitoy"):
        run = tmp_path_factory.mktemp("imp") / "run"
        proc = run_cli("import", str(TRACES / f"{name}.json.gz"), "-o", str(run), timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[name.split("/")[-1]] = run
    return out


def test_imported_trace_uses_the_datasheet_and_matches_tracelens_kernel_time(imported, tmp_path):
    r = _roofline_json(imported["h100_vit_nsfw"], os.environ)
    assert r["device"] == "NVIDIA H100 80GB HBM3" and r["basis"] == "gpu kernel time"
    assert r["ceilings"]["source"] == "datasheet" and r["ceilings"]["datasheet_entry"] == "H100 SXM"
    ref = json.loads((TRACES / "tracelens" / "tracelens_reference.json").read_text())["traces"]
    ref_rows = {(x["name"], x["input_dims"]): x for x in ref["h100_vit_nsfw.json.gz"]["ops"]}
    matched = 0
    for o in r["ops"]:
        key = (o["name"], repr(tuple(tuple(d) for d in o["input_dims"])).replace(",)", ",)"))
        x = ref_rows.get(key)
        if x is None:
            continue
        matched += 1
        assert o["calls"] == x["calls"], key
        mine = o["time_ns"]
        if o["name"] == "aten::convolution":
            # TraceLens counts the bias's aten::add_ kernel in the convolution; here that add_
            # has its own row (its own FLOPs and bytes)
            mine += next(b["time_ns"] for b in r["ops"] if b["name"] == "aten::add_"
                         and b["input_dims"][0][1] == o["input_dims"][1][0])
        assert mine / 1e3 == pytest.approx(x["kernel_time_us_sum"], rel=0.01), key
    assert matched >= 8
    gemm = [o for o in r["ops"] if o["name"] == "aten::addmm"]
    assert gemm and all(o["bound"] in ("compute", "memory") and 0 < o["roof_fraction"] < 1 for o in gemm)
    assert r["mfu"]["dtype"] == "bf16" and 0 < r["mfu"]["mfu_datasheet"] < 1
    assert r["mfu"]["mfu_measured"] is None            # no measured ceilings for that machine
    html = tmp_path / "roof.html"
    proc = run_cli("roofline", str(imported["h100_vit_nsfw"]), "--html", str(html), timeout=120)
    assert proc.returncode == 0, proc.stderr
    page = html.read_text()
    assert page.count('class="op"') == sum(1 for o in r["ops"] if o["intensity"] and o["achieved_flops_per_s"])
    assert 'class="roof memory"' in page and re.search(r'data-dtype="[^"]*bf16', page) and "<script" not in page


def test_unmodelled_time_is_named_not_dropped(imported):
    r = _roofline_json(imported["mi300x_resnet_act_checkpoint"], os.environ)
    u = r["unmodelled"]
    names = {x["name"]: x for x in u["ops"]}
    assert "aten::native_batch_norm_backward" in names
    assert names["aten::native_batch_norm_backward"]["why"] == "no cost model"
    assert sum(o["time_ns"] for o in r["ops"]) + u["time_ns"] == r["total_time_ns"]
    assert r["modelled_share"] == pytest.approx(1 - u["share"])


def test_unknown_device_asks_for_a_ceilings_file(imported, tmp_path, cache):
    """mi250's trace names its device "AMD Radeon Graphics": no datasheet entry, never guessed."""
    proc = run_cli("roofline", str(imported["mi250_rocm62_minitoy"]), timeout=120)
    assert proc.returncode == 0 and "pass --ceilings FILE" in proc.stdout
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"device": "MI250 GCD", "kind": "gpu", "peaks": {"fp32": 45.3e12},
                             "bandwidth_bytes_per_s": 1.6e12}))
    r = _roofline_json(imported["mi250_rocm62_minitoy"], os.environ, "--ceilings", str(f))
    assert r["ceilings"]["source"] == "file" and any(o["bound"] for o in r["ops"])
    f.write_text("{}")
    proc = run_cli("roofline", str(imported["mi250_rocm62_minitoy"]), "--ceilings", str(f), timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("counterprof: --ceilings")


# ---- calibration against references written here ----------------------------------------------

def _median_rate(fn, work: float, segments: int = 5, seconds: float = 0.2) -> float:
    """work / time of fn, median over `segments` timed loops of `seconds` each."""
    fn()
    rates = []
    for _ in range(segments):
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            calls += 1
        rates.append(work * calls / (time.perf_counter() - t0))
    return statistics.median(rates)


def _best_rate(fn, work: float, seconds: float = 2.0, segment: float = 0.02) -> float:
    """work / time of fn, the best of timed loops of `segment` seconds each over `seconds`: a
    ceiling as STREAM reports it (and as calibrate's copy and triad are: the best repetition).
    On a VM the all-core copy bandwidth comes in modes that switch within seconds (the vCPUs'
    placement on the host); over the ~2 s that calibrate's copy and triad span, the best of
    short loops sees the fast mode whenever the machine visits it, as calibrate's figure does."""
    fn()
    best, t_start = 0.0, time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < segment:
            fn()
            calls += 1
        best = max(best, work * calls / (time.perf_counter() - t0))
    return best


def _reference_matmul(n: int = 2048) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return _median_rate(lambda: torch.matmul(a, b), 2 * n ** 3)


def _reference_copy() -> float:
    """STREAM copy over 4x the last-level cache, all cores (torch's parallel copy), the best of
    short loops like calibrate's (a median of long ones is a sample of the machine's mode)."""
    n = max(4 * (measure.llc_bytes() or 32 << 20), 64 << 20) // 8
    src, dst = torch.rand(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    return _best_rate(lambda: dst.copy_(src), 2 * 8 * n)


def _idle_enough() -> None:
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > cpus:
        pytest.skip(f"the machine is busy (load average {load:.1f} on {cpus} CPUs): calibration "
                    "cannot be held to 10-15% here")


def test_calibration_agrees_with_plain_loops():
    """Interleaved (reference, calibrate) pairs, the median ratio within 15%. Needs the cores to
    itself: with other heavy processes on them (a load average above the CPU count) each figure
    swings by more than that (seen: ratios from 0.85 to 2.4 at load 3 on 2 CPUs). A VM's
    neighbours move it even when idle here, so a batch of pairs that misses is measured again
    (up to 3 batches): a calibrate that is off misses every time."""
    _idle_enough()
    batches = []
    for _attempt in range(3):
        mm_ratio, bw_ratio = [], []
        for _ in range(5):
            ref = _reference_matmul()
            cal = measure.cpu_matmul("fp32", [2048], 5, MODES[True]["min_s"])["flops_per_s"]
            mm_ratio.append(cal / ref)
            ref = _reference_copy()
            cal = measure.cpu_stream(5, MODES[True]["stream_min_s"])["copy"]["bytes_per_s"]
            bw_ratio.append(cal / ref)
        mm, bw = statistics.median(mm_ratio), statistics.median(bw_ratio)
        batches.append((round(mm, 3), round(bw, 3)))
        if abs(mm - 1) < 0.15 and abs(bw - 1) < 0.15:
            break
    print(f"\ncalibrate / reference (matmul, copy), per batch of 5 pairs: {batches}")
    assert abs(mm - 1) < 0.15 and abs(bw - 1) < 0.15, batches


def test_two_calibrations_agree():
    """One calibration's figures (matmul: a median; copy: the best repetition) against the next
    one's: within 10%. On a machine shared with other jobs the machine itself moves more than
    that (seen at load 1.4 on 2 CPUs: 69 to 172 GFLOP/s between consecutive calibrations, while
    the reference loop moved with them; on an idle 2-core VM, copy 33 or 52 GB/s as the vCPUs'
    placement on the host switches, for seconds to minutes at a time), so
    each batch times the plain reference loops between the calibrations: a batch that misses is
    measured again (up to 5 batches), and when every batch that missed saw the reference loops
    move by 10% or more themselves, the bound cannot be held on this machine then, said as a
    skip. A calibrate that moves while the plain loops hold still fails."""
    _idle_enough()
    seen, machine_moved = [], []

    def move(runs: list[float]) -> float:
        return statistics.median(abs(b / a - 1) for a, b in zip(runs, runs[1:]))

    for _attempt in range(5):
        mm, bw, ref_mm, ref_bw = [], [], [], []
        for _ in range(3):
            mm.append(measure.cpu_matmul("fp32", [2048], 5, MODES[True]["min_s"])["flops_per_s"])
            ref_mm.append(_reference_matmul())
            bw.append(measure.cpu_stream(5, MODES[True]["stream_min_s"])["copy"]["bytes_per_s"])
            ref_bw.append(_reference_copy())
        moves = [move(mm), move(bw)]
        ref_moves = [move(ref_mm), move(ref_bw)]
        seen.append(([round(x / 1e9, 1) for x in mm], [round(x / 1e9, 2) for x in bw],
                     [round(x, 3) for x in moves], [round(x, 3) for x in ref_moves]))
        if max(moves) < 0.10:
            break
        # the machine was not quiet enough to hold 10% in this batch: a plain loop timed between
        # the calibrations moved by that much itself
        machine_moved.append(max(ref_moves) >= 0.10)
    print(f"\ncalibrations (GFLOP/s, GB/s, moves, the reference loops' moves) per batch: {seen}")
    if max(moves) >= 0.10 and all(machine_moved):
        pytest.skip(f"the machine itself moved by 10% or more in every batch (the plain loops too): {seen}")
    assert max(moves) < 0.10, seen
