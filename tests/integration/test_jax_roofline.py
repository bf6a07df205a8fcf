"""`counterprof roofline` on JAX runs: XLA's cost analysis of each op (attached at conversion,
collectors/jax_trace/convert.py) against the measured ceilings. Real jax on the CPU, recorded
with jax.profiler.trace and StepTraceAnnotation, imported with `counterprof import`; each job
prints XLA's own compile().cost_analysis() of its function, the figure the op must match.

- matmul: a jitted 512x512 fp32 matmul per step -> the dot op's FLOPs are 2*M*N*K and within 2%
  of cost_analysis; MFU per step > 0 and at most 105% of the measured fp32 peak.
- stream: a jitted x*1.0001+1 over 64 MB arrays -> memory-bound against the ceilings.
- a cut profile: imported, no costs, the reason said, no traceback.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytest.importorskip("google.protobuf")

from helpers import COUNTERPROF, calibrated, run_cli

N = 512

JOB = r"""
import json, sys
import jax, jax.numpy as jnp
kind, out = sys.argv[1], sys.argv[2]
if kind == "matmul":
    f = jax.jit(lambda a, b: a @ b)
    a = jnp.ones((N, N), jnp.float32)
    args = (a, a)
else:
    f = jax.jit(lambda x: x * 1.0001 + 1)
    args = (jnp.ones((16 * 1024 * 1024,), jnp.float32),)      # 64 MB in, 64 MB out
ca = f.lower(*args).compile().cost_analysis()
ca = ca[0] if isinstance(ca, list) else ca
jax.block_until_ready(f(*args))
with jax.profiler.trace(out):
    for i in range(8):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            jax.block_until_ready(f(*args))
print(json.dumps({"flops": ca.get("flops"), "bytes": ca.get("bytes accessed")}))
""".replace("N, N", f"{N}, {N}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("jax_roofline")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    procs = {k: subprocess.Popen([sys.executable, "-c", JOB, k, str(root / f"{k}-prof")], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in ("matmul", "stream")}
    cal_env, cpu = calibrated(root / "xdg")
    ceil = str(next((root / "xdg" / "counterprof" / "ceilings").glob("*-cpu.json")))
    out: dict = {"env": cal_env, "cpu": cpu, "root": root, "ceilings": ceil}
    for kind, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr[-3000:]
        run = root / f"{kind}-run"
        imp = run_cli("import", "-o", str(run), str(root / f"{kind}-prof"), check=True)
        assert "Traceback" not in imp.stderr
        # (an imported run names no host: its ceilings are given)
        rl = run_cli("roofline", "--json", "--ceilings", ceil, str(run), env=cal_env, check=True)
        out[kind] = (json.loads(stdout.strip().splitlines()[-1]), json.loads(rl.stdout), run)
    return out


def test_matmul_flops_match_xla_and_mfu(runs) -> None:
    truth, doc, run = runs["matmul"]
    dots = [o for o in doc["ops"] if o["input_types"] == "dot fusion" or "dot" in o["name"]]
    assert dots, doc["ops"]
    dot = dots[0]
    assert dot["flops_per_call"] == 2 * N * N * N
    assert dot["flops_per_call"] == pytest.approx(truth["flops"], rel=0.02)
    assert dot["bytes_per_call"] == pytest.approx(truth["bytes"], rel=0.02)
    assert dot["intensity"] == pytest.approx(dot["flops_per_call"] / dot["bytes_per_call"])
    assert dot["achieved_flops_per_s"] > 0 and dot["bound"] in ("compute", "memory")
    mfu = doc["mfu"]
    assert mfu is not None and len(mfu["steps"]) == 8, mfu
    peak = runs["cpu"]["peaks"]["fp32"]
    assert mfu["peak_measured_flops_per_s"] == pytest.approx(peak)
    for s in mfu["steps"]:
        assert s["flops"] == 2 * N * N * N, s
        assert s["mfu_measured"] > 0, s
    # at most 105% of the measured peak, or the fit check says the ceilings do not fit this run
    # (calibrate --quick on a shared, loaded 2-core machine measures a peak below the real one)
    over = doc["ceilings_fit"]["over_roof"]
    print("MFU median", mfu["mfu_measured"], "peak", peak, "over_roof", over)
    assert mfu["mfu_measured"] <= 1.05 or any(x["what"] in ("mfu", "step", "op") for x in over), (mfu, over)
    text = run_cli("roofline", "--ceilings", runs["ceilings"], str(run), env=runs["env"], check=True).stdout
    assert "MFU" in text and dot["name"] in text, text


def test_stream_is_memory_bound(runs) -> None:
    truth, doc, _ = runs["stream"]
    op = max(doc["ops"], key=lambda o: o["time_ns"])
    assert op["bytes_per_call"] == pytest.approx(truth["bytes"], rel=0.02)
    assert op["bytes_per_call"] >= 128 * 1024 * 1024
    assert op["bound"] == "memory", op
    assert op["intensity"] < op["ridge"]


def test_correlate_holds_xla_ops_to_their_roofline(runs) -> None:
    """`correlate --model roofline` on a JAX run: each XLA op with a cost is an item predicted at
    its roof (its mean time over the prediction is 1 / the roof fraction `roofline` reports; the
    ratio is of the median); the run against itself is exact."""
    for kind in ("matmul", "stream"):
        _, doc, run = runs[kind]
        proc = run_cli("correlate", str(run), "--model", "roofline", "--ceilings", runs["ceilings"], "--json",
                       env=runs["env"], check=True)
        c = json.loads(proc.stdout)
        fraction = {o["name"]: o["roof_fraction"] for o in doc["ops"] if o["roof_fraction"]}
        top = max(c["items"], key=lambda i: i["measured_total_us"])
        assert top["name"] in fraction and top["calls"] == 8, c["items"]
        mean_ratio = top["measured_total_us"] / top["calls"] / top["predicted_us"]
        assert mean_ratio * fraction[top["name"]] == pytest.approx(1, rel=0.01)      # the same roof
        assert top["p10_us"] <= top["measured_us"] <= top["p90_us"]
        assert top["ratio"] == pytest.approx(top["measured_us"] / top["predicted_us"], rel=0.01)
        same = json.loads(run_cli("correlate", str(run), "--predictions", str(run), "--json", check=True).stdout)
        assert same["mape"] == 0 and {i["kind"] for i in same["items"]} >= {"op", "step"}


def test_cut_profile_has_no_costs(runs, tmp_path) -> None:
    src = next((runs["root"] / "matmul-prof").rglob("*.xplane.pb"))
    data = src.read_bytes()
    cut = tmp_path / "prof" / "plugins" / "profile" / "2026_01_01_00_00_00"
    cut.mkdir(parents=True)
    (cut / src.name).write_bytes(data[: len(data) * 2 // 3])
    proc = run_cli("import", "-o", str(tmp_path / "run"), str(tmp_path / "prof"))
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode != 0:          # nothing of it readable: said, not crashed
        assert proc.stderr.strip()
        return
    rl = run_cli("roofline", "--json", "--ceilings", runs["ceilings"], str(tmp_path / "run"), env=runs["env"],
                 check=True)
    doc = json.loads(rl.stdout)
    assert not doc["ops"] or all(o["flops_per_call"] >= 0 for o in doc["ops"])


def test_cost_failure_is_a_reason(tmp_path) -> None:
    """XLA's analysis failing (a damaged module, its process killed, a timeout) -> no costs and
    the reason, never a crash of the conversion."""
    from counterprof.collectors.jax_trace.convert import costs_in_subprocess
    costs, info = costs_in_subprocess({("m", 0): b"\x0a\xff\xff not an HloProto"})
    assert costs is None or costs == {("m", 0): {}} or not any(costs.values()), costs
    if costs is None:
        assert info["status"] == "none" and info["reason"], info
    costs, info = costs_in_subprocess({("m", 0): b""}, timeout=0.001)
    assert costs is None and "did not finish" in info["reason"], info


def test_xla_split_by_roofline_when_given() -> None:
    """The report's compute-vs-memory split of XLA busy time: the roofline's where it decides
    (facts["roofline"], from analysis/roofline.busy_split), else the ops' HLO category, said."""
    from counterprof.analysis.classify import _classify_xla
    from counterprof.analysis.signals import Signal
    sig = {"xla_active_share": Signal(0.9, "spans", ""), "xla_idle": Signal(0.2, "spans", ""),
           "xla_compute": Signal(0.6, "spans", ""), "xla_memory": Signal(0.2, "spans", "")}
    by_kind = _classify_xla(dict(sig), "run")
    assert by_kind.shares["compute"] == pytest.approx(0.6)
    assert any("by HLO category" in e.text for e in by_kind.evidence)
    roof = (0.25, [{"metric": "roofline_compute", "value": 0.25, "threshold": None, "source": "roofline",
                    "text": "ops with a roofline: 100% of busy op time, 25% of it compute-bound"}], [])
    by_roof = _classify_xla(dict(sig), "run", {"roofline": roof})
    assert by_roof.shares["compute"] == pytest.approx(0.2)
    assert by_roof.shares["memory"] == pytest.approx(0.6)
    assert by_roof.verdict == "memory"
    assert any("split compute vs memory by the roofline" in e.text for e in by_roof.evidence)


LIVE_JOB = r"""
import time
import jax, jax.numpy as jnp
f = jax.jit(lambda a, b: a @ b)
a = jnp.ones((N, N), jnp.float32)
for i in range(40):
    with jax.profiler.StepTraceAnnotation("train", step_num=i):
        jax.block_until_ready(f(a, a))
    time.sleep(0.1)
""".replace("N, N", f"{N}, {N}")


def test_live_view_shows_the_jax_trace_windows_mfu(runs, tmp_path) -> None:
    """`run --live --jax` (lines mode: stderr is a pipe): once a step window is converted, the
    line carries its MFU under "jax trace", the figure `counterprof roofline` gives the run."""
    import re
    run = tmp_path / "live"
    env = {**runs["env"], "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run([*COUNTERPROF, "run", "--live", "--jax", "-o", str(run), "--", sys.executable, "-c",
                        LIVE_JOB], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if re.match(r"counterprof: +\d+\.\d+ s ", ln)]
    shown = [float(m.group(1)) for ln in lines if (m := re.search(r"jax trace MFU ([\d.]+)%", ln))]
    assert shown, "\n".join(lines)
    assert "torch trace" not in p.stderr
    r = json.loads(run_cli("roofline", str(run), "--json", env=env).stdout)
    assert r["mfu"] and shown[-1] == pytest.approx(100 * r["mfu"]["mfu_measured"], abs=0.051), (shown, r["mfu"])
