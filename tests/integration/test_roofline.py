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

from browser import CHROMIUM, SKIP_REASON, check_layout, layout, render   # noqa: E402
from helpers import calibrated, run_cli                                      # noqa: E402
from kineto_traces import SHARED as TRACES, needs_shared_traces             # noqa: E402

from counterprof.analysis.roofline import busy_split             # noqa: E402
from counterprof.calibrate import MODES, measure                 # noqa: E402

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
    # every roof raised 4-fold, the ridge where it was: what is tested is which side of the ridge
    # the ops fall on; a matmul on a quieter moment than calibrate's would pass a roof measured
    # under load, and busy_split then rightly decides nothing (tests/unit/test_ceilings_fit.py)
    raised = {**cpu, "peaks": {k: 4 * v for k, v in cpu["peaks"].items()},
              "bandwidth_bytes_per_s": 4 * cpu["bandwidth_bytes_per_s"]}
    share, evidence, missing = busy_split(spans, raised)
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


@needs_shared_traces
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
    chart = json.loads(re.search(r"<script type='application/json' id='cp-data'>(.*?)</script>",
                                 html.read_text(), re.S).group(1))["charts"][0]
    assert len(chart["points"]) == sum(1 for o in r["ops"] if o["intensity"] and o["achieved_flops_per_s"])
    assert [f["name"] for f in chart["roofs"]][0] == "memory" and any("bf16" in f["name"] for f in chart["roofs"])


@needs_shared_traces
def test_unmodelled_time_is_named_not_dropped(imported):
    r = _roofline_json(imported["mi300x_resnet_act_checkpoint"], os.environ)
    u = r["unmodelled"]
    names = {x["name"]: x for x in u["ops"]}
    assert "aten::native_batch_norm_backward" in names
    assert names["aten::native_batch_norm_backward"]["why"] == "no cost model"
    assert sum(o["time_ns"] for o in r["ops"]) + u["time_ns"] == r["total_time_ns"]
    assert r["modelled_share"] == pytest.approx(1 - u["share"])


@needs_shared_traces
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


MIXED = """
import torch, counterprof
a, b = torch.randn(512, 512), torch.randn(512, 512)
x, y = torch.rand(4 * 1024 * 1024), torch.rand(4 * 1024 * 1024)
for step in range(6):
    torch.mm(a, b)
    torch.add(x, y)
    torch.mul(x, y)
    torch.relu(x)
    torch.softmax(a, dim=1)
    counterprof.step()
"""


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_roofline_page_labels_its_ops_and_says_their_figures(tmp_path):
    """roofline --html in a real browser: a dot per op with FLOPs and time, the memory roof and the
    fp32 peak, the largest ops named beside their dots (where a name fits without covering
    anything), tick labels in FLOP/B and FLOP/s, and no text over other text."""
    run = _profiled(tmp_path, os.environ, MIXED)
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"device": "cpu", "kind": "cpu", "peaks": {"fp32": 2e11}, "bandwidth_bytes_per_s": 2e10}))
    r = _roofline_json(run, os.environ, "--ceilings", str(f))
    ops = [o for o in r["ops"] if o["intensity"] and o["achieved_flops_per_s"]]
    assert len(ops) >= 3
    html = tmp_path / "roof.html"
    proc = run_cli("roofline", str(run), "--ceilings", str(f), "--html", str(html), timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = layout(render(html, tmp_path, height=1200))
    check_layout(found)
    (c,) = found["charts"]
    assert c["points"] == len(ops) and c["series"] == 2          # the memory roof and the fp32 peak
    texts = [lb["text"] for lb in c["labels"]]
    assert any(t.startswith("memory 20 GB/s") for t in texts) and any(t.startswith("fp32 peak 200 GFLOP/s")
                                                                       for t in texts)
    largest = max(ops, key=lambda o: o["time_ns"])
    assert c["named"] >= 1 and largest["name"] in texts
    for lb in c["labels"]:                        # every op label's title holds its op's figures
        if lb["text"].startswith("aten::"):
            assert "FLOP/B" in lb["title"] and "calls" in lb["title"], lb
    assert all(t.endswith("FLOP/s") for t in c["y_ticks"]) and len(c["x_ticks"]) >= 3


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


def _busy_s(cpus: set[int]) -> float:
    """Busy CPU seconds of `cpus` since boot (/proc/stat: user, nice, system, irq, softirq, and
    steal, the time the hypervisor gave other guests)."""
    busy = 0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *v = line.split()
                if int(name[3:]) in cpus:
                    v = [int(x) for x in v] + [0] * 10
                    busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return busy / os.sysconf("SC_CLK_TCK")


class OthersShare:
    """The share of this process's CPUs that other processes (and other guests) held while the
    block ran: the CPUs' busy time less this process's own (all its threads), over its wall time.
    Measured here, apart from calibrate's own load record, so the test does not take calibrate's
    word for how quiet the machine was."""

    def __enter__(self):
        self.cpus = os.sched_getaffinity(0)
        t = os.times()
        self.t0, self.b0, self.own0 = time.perf_counter(), _busy_s(self.cpus), t.user + t.system
        return self

    def __exit__(self, *exc):
        t = os.times()
        wall = time.perf_counter() - self.t0
        others = _busy_s(self.cpus) - self.b0 - (t.user + t.system - self.own0)
        self.share = min(max(others, 0.0) / (len(self.cpus) * wall), 1.0)


# The calibration is held on a quiet machine, as calibrate itself holds it: it does not save ceilings
# measured while other processes held a quarter of the CPUs (thresholds.calibrate_others_share;
# on this 2-core VM half a core takes a matmul on both cores ~25% low). A measurement during which
# others held QUIET or more (OthersShare: measured here, whatever the measurement gave) is not
# counted and is measured again, up to QUIET_BUDGET_S; too few quiet ones is a skip that says how
# loaded the machine was, and both tests are `required`: CI, a machine to itself, fails on it.
# Beside others' load no band holds (measured on this shared VM, 2026-12-06, 100 pairs at load
# average 3-6.4, others holding about one of the 2 CPUs: calibrate / plain loop per pair 0.44-2.7
# (matmul) and 0.22-3.6 (copy), the median of 5 consecutive pairs as low as 0.74 and 0.61;
# consecutive calibrations moved 28% (median) and up to 3.3x, the plain loops as much).
QUIET = 0.25
QUIET_BUDGET_S = 120


def quiet_measurements(n: int, fn) -> list:
    """n results of fn(), each measured while other processes held under QUIET of the CPUs."""
    got, loaded = [], []
    t0 = time.perf_counter()
    moved = 0
    while len(got) < n and time.perf_counter() - t0 < QUIET_BUDGET_S:
        with OthersShare() as q:
            x = fn()
        if q.share >= QUIET:
            loaded.append(round(q.share, 2))
        elif x is None:
            moved += 1
        else:
            got.append(x)
    if len(got) < n:
        pytest.skip(f"the machine was not quiet: other processes held {QUIET:.0%} or more of its CPUs during "
                    f"{len(loaded)} of {len(loaded) + len(got) + moved} measurements in {QUIET_BUDGET_S} s "
                    f"(shares {loaded}), and its own speed moved past {STEADY:.0%} during {moved}; "
                    "calibrate would not save ceilings measured so either")
    return got


# Interleaved (plain loop, calibrate) pairs, each measured on a quiet machine; both tests read them.
# ACCURACY: calibrate's figure over the plain loop's, the median of the PAIRS ratios, within 15% of
# 1 (calibrate's bias). REPEAT: that ratio from one pair to the next, the median move, within REPEAT
# (calibrate's repeatability, the machine's own moves taken out: a VM's all-core copy bandwidth
# switches between modes for seconds to minutes at a time, 29-36 or 45-58 GB/s on the 2-core VM,
# and moves a plain loop timed beside it as much). Both figures are this file's from quiet runs
# before (then one batch of 5 pairs, 3 calibrations); measured here, 2026-12-06, on the one quiet
# pair among 40 whose others' share was measured (and none in 25 minutes of waiting for quiet):
# ratios 1.01 (matmul) and 0.94 (copy).
# Not a band measured here yet: a failure gives the pairs, and pytest -s prints them on a pass.
# The plain loop is timed before and after calibrate's figure, which is held against their geometric
# mean; a pair whose two plain loops differ by over STEADY is the machine moving under it (measured
# on the quiet CI machine, 2026-12-06: the plain matmul loop against itself 0.95-1.14 within a
# minute, and calibrate over the loop before it alone moved 13-17% (median) from pair to pair;
# bracketed, 7%) and is measured again.
# Measured again on 2026-12-06 (stop 41), three batches on the quiet 2-core VM: the median move
# from pair to pair was (matmul, copy) (0.13, 0.23), (0.05, 0.13) and (0.03, 0.04): the copy figure
# beside a plain copy loop moves with the VM's bandwidth modes even when the loop before and after
# it agree within STEADY, and the matmul within 15%. A calibrate that lost its way would be off by
# far more (a stale ceiling gave "MFU 255%").
PAIRS = 5
ACCURACY = 0.15
REPEAT = {"matmul": 0.15, "copy": 0.25}
STEADY = 0.06


@pytest.fixture(scope="module")
def quiet_pairs() -> list[tuple[float, float]]:
    """(calibrate / plain loop) for the fp32 matmul and the copy bandwidth, PAIRS times."""
    def bracketed(reference, calibrated):
        def pair():
            before, cal, after = reference(), calibrated(), reference()
            if abs(after / before - 1) > STEADY:
                return None                      # the machine itself moved: not calibrate's doing
            return cal / (before * after) ** 0.5
        return pair

    mm = quiet_measurements(PAIRS, bracketed(
        _reference_matmul,
        lambda: measure.cpu_matmul("fp32", [2048], 5, MODES[True]["min_s"])["flops_per_s"]))
    bw = quiet_measurements(PAIRS, bracketed(
        _reference_copy,
        lambda: measure.cpu_stream(5, MODES[True]["stream_min_s"])["copy"]["bytes_per_s"]))
    pairs = list(zip(mm, bw))
    print("\ncalibrate / plain loop on a quiet machine (matmul, copy):",
          [(round(a, 3), round(b, 3)) for a, b in pairs])
    return pairs


@pytest.mark.required
def test_calibration_agrees_with_plain_loops(quiet_pairs):
    """The median ratio within ACCURACY, measured once (no batch measured again because it missed)."""
    mm = statistics.median(p[0] for p in quiet_pairs)
    bw = statistics.median(p[1] for p in quiet_pairs)
    assert abs(mm - 1) < ACCURACY and abs(bw - 1) < ACCURACY, (mm, bw, quiet_pairs)


@pytest.mark.required
def test_two_calibrations_agree(quiet_pairs):
    """From one calibration to the next, its figure over the plain loop beside it moves by under
    REPEAT (the median move), measured once."""
    def move(xs: list[float]) -> float:
        return statistics.median(abs(y / x - 1) for x, y in zip(xs, xs[1:]))

    mm, bw = move([p[0] for p in quiet_pairs]), move([p[1] for p in quiet_pairs])
    assert mm < REPEAT["matmul"] and bw < REPEAT["copy"], (mm, bw, quiet_pairs)
