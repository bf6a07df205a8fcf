"""Ceilings that do not fit a run, end to end: a torch CPU job under `counterprof run --torch`
with ceilings saved too low (as an earlier `calibrate` on a loaded host saves them) gets a note
in `roofline` and `report` (text, --json, --html) naming the op, the figure and where the
ceilings came from, and no verdict rests on its roofline; the same job with ceilings that fit
gets its split. A run keeps the ceilings it started with: neither a later ceilings file nor a
real `counterprof calibrate` changes an old run's roofline or report. `calibrate --quick`
against two busy-loop contenders refuses to save (--force saves), and on its own agrees with an
observer outside it on how loaded the machine was.

The machine is shared: figures are printed (pytest -s), assertions are wide where timing
enters and exact where it does not."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from helpers import run_cli                                           # noqa: E402

from counterprof.analysis.roofline import MISFIT                     # noqa: E402
from counterprof.analysis.roofline_run import TODAYS                 # noqa: E402
from counterprof.ground.thresholds import value                    # noqa: E402

LIMIT = value("roofline_over_roof")
HERE = socket.gethostname()

WORK = """
import torch, counterprof
a, b = torch.randn(512, 512), torch.randn(512, 512)
n = 8 * 1024 * 1024                       # 32 MB of fp32 per tensor
x, y, z = torch.rand(n), torch.rand(n), torch.empty(n)
for step in range(8):
    for _ in range(4):
        torch.mm(a, b)                    # compute-bound (85 FLOP/B)
    torch.add(x, y, out=z)                # memory-bound (0.083 FLOP/B)
    counterprof.step()
"""

# what an earlier `calibrate --quick --force` on a loaded host saved: far below what this
# machine does (a 512x512 fp32 mm runs at 10-100 GFLOP/s here, a 32 MB add at 3-10 GB/s)
LOADED = {"cpus": 2, "others_share": 0.48, "others_cpus": 0.96, "steal_share": 0.0,
          "worst": {"phase": "the CPU fp32 matmul", "others_share": 0.61, "others_cpus": 1.22},
          "loadavg_before": [3.1, 2.0, 1.0], "loadavg_after": [3.4, 2.1, 1.0], "loaded": True,
          "threshold": 0.25, "saved_anyway": True}
TOO_LOW = {"schema": 1, "source": "measured", "host": HERE, "device": "cpu", "kind": "cpu",
           "measured_at": "2026-12-01T09:00:00Z", "quick": True, "peaks": {"fp32": 2e9},
           "bandwidth_bytes_per_s": 1e8, "memory": {"llc_bytes": 32 << 20, "bytes_per_s": 1e8},
           "load": LOADED}
# a later change of the saved ceilings: far above anything this machine does (everything fits)
HIGH = {**TOO_LOW, "measured_at": "2026-12-02T09:00:00Z", "peaks": {"fp32": 1e13},
        "bandwidth_bytes_per_s": 1e12, "load": {**LOADED, "others_share": 0.02, "loaded": False,
                                                 "saved_anyway": False}}


def _save(xdg: Path, doc: dict) -> Path:
    """A ceilings file where `counterprof calibrate` saves it ($XDG_CACHE_HOME/counterprof/
    ceilings/<host>-cpu.json, the README's layout)."""
    slug = re.sub(r"[^a-z0-9]+", "-", HERE.lower()).strip("-")
    path = xdg / "counterprof" / "ceilings" / f"{slug}-cpu.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _record(tmp: Path, env: dict, name: str) -> Path:
    script = tmp / "work.py"
    script.write_text(textwrap.dedent(WORK))
    run = tmp / name
    proc = run_cli("run", "--torch", "--torch-window", "3/8", "-q", "-o", str(run), "--",
                   sys.executable, str(script), timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return run


def _json(env, *args) -> dict:
    proc = run_cli(*args, "--json", timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _verdicts(rep: dict) -> list[dict]:
    """Every verdict of a report: the run's, its phases', regions', windows', ranks'."""
    out = [rep["overall"], *(rep.get("phases") or []), *(rep.get("windows") or []),
           *(rg["verdict"] for rg in rep.get("regions") or []), *(rep.get("rank_verdicts") or [])]
    return [v for v in out if isinstance(v, dict)]


def _metrics(rep: dict) -> set[str]:
    return {e["metric"] for v in _verdicts(rep) for e in v.get("evidence") or []}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """run_low recorded under the too-low ceilings, its roofline and report then; the saved
    ceilings changed afterwards (HIGH) and run_high recorded under them."""
    tmp = tmp_path_factory.mktemp("fit")
    xdg = tmp / "xdg"
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg)}
    cache = _save(xdg, TOO_LOW)
    low = _record(tmp, env, "run_low")
    before = {"roofline": _json(env, "roofline", str(low)), "report": _json(env, "report", str(low))}
    _save(xdg, HIGH)                                   # a later change of the saved ceilings
    high = _record(tmp, env, "run_high")
    return {"tmp": tmp, "xdg": xdg, "env": env, "cache": cache, "low": low, "high": high, "before": before}


def test_ceilings_below_the_run_are_named_and_no_verdict_rests_on_them(runs):
    env, low = runs["env"], runs["low"]
    meta = json.loads((low / "meta.json").read_text())
    assert meta["ceilings"]["cpu"] == TOO_LOW                    # copied in at its start, load and all
    r = runs["before"]["roofline"]
    rows = {o["name"]: o for o in r["ops"]}
    print(f"\ntoo-low ceilings: mm at {100 * rows['aten::mm']['roof_fraction']:.0f}%, add at "
          f"{100 * rows['aten::add']['roof_fraction']:.0f}%, MFU {100 * r['mfu']['mfu_measured']:.0f}%")
    fit = r["ceilings_fit"]
    assert fit["fits"] is False and fit["threshold"] == LIMIT
    named = {x["name"] for x in fit["over_roof"] if x["what"] == "op"}
    assert named == {"aten::mm", "aten::add"}
    assert all(x["fraction"] > LIMIT for x in fit["over_roof"])
    assert r["mfu"]["mfu_measured"] > LIMIT and any(x["what"] == "mfu" for x in fit["over_roof"])
    assert r["ceilings"]["load"]["others_share"] == 0.48 and r["ceilings"]["origin"].startswith(
        "ceilings copied into the run at its start")
    (note,) = [n for n in r["notes"] if n.startswith(MISFIT)]
    assert "aten::mm (512x512, 512x512) ran at" in note and "of the measured fp32 matmul peak" in note
    assert "of the measured memory bandwidth" in note
    assert ("measured 2026-12-01T09:00:00Z on " + HERE) in note
    assert "other processes held 48% of its 2 CPU(s)" in note and "copied into the run at its start" in note

    # `roofline`: the note in front, and no figure above 100% printed as a plain fact
    proc = run_cli("roofline", str(low), timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "! " + MISFIT in text
    for m in re.finditer(r"(\d+\.\d)% of the (measured peak|datasheet's)[^,\n]*", text):
        if float(m.group(1)) > 100:
            assert "(above the peak" in m.group(0), m.group(0)
    for line in text.splitlines():
        m = re.search(r"(compute|memory)\s+(\d+\.\d)%( !)?\s*$", line)
        if m and float(m.group(2)) > 100 * LIMIT:
            assert m.group(3), line                          # the table marks it

    # `report --json`: the roofline note; no verdict splits busy time by the roofline
    rep = runs["before"]["report"]
    assert any(n.startswith(MISFIT) for n in rep["roofline"]["notes"])
    metrics = _metrics(rep)
    assert "roofline_over_roof" in metrics
    assert not metrics & {"roofline_compute", "roofline_op"}, metrics
    over = next(e for e in rep["overall"]["evidence"] if e["metric"] == "roofline_over_roof")
    assert over["threshold"] == LIMIT and over["value"] > LIMIT
    # the report's text and HTML say it too, in front
    proc = run_cli("report", str(low), timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "! " + MISFIT in proc.stdout
    assert re.search(r"MFU \d+\.\d% of the measured fp32 peak \(above the peak: the ceilings do not fit", proc.stdout)
    html = runs["tmp"] / "low.html"
    proc = run_cli("report", str(low), "--html", str(html), timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    page = html.read_text()
    assert page.count("class='caveat'") >= 2 and MISFIT in page


def test_ceilings_that_fit_split_the_same_job(runs):
    """The control: the same job recorded under ceilings it stays below gets its roofline split
    (what the too-low ceilings' run is denied)."""
    env, high = runs["env"], runs["high"]
    assert json.loads((high / "meta.json").read_text())["ceilings"]["cpu"] == HIGH
    r = _json(env, "roofline", str(high))
    assert r["ceilings_fit"] == {"fits": True, "threshold": LIMIT, "min_op_share": value("roofline_over_roof_share"),
                                 "over_roof": []}
    assert not any(n.startswith(MISFIT) for n in r["notes"])
    rep = _json(env, "report", str(high))
    metrics = _metrics(rep)
    assert "roofline_compute" in metrics and "roofline_over_roof" not in metrics, metrics


def test_a_later_change_of_the_ceilings_leaves_an_old_run_as_it_was(runs):
    """run_low after the saved ceilings were changed (HIGH, which run_high took): the same
    roofline and the same report's roofline and verdicts; then after a real `counterprof
    calibrate`, the same again."""
    env, low, before = runs["env"], runs["low"], runs["before"]

    def same():
        r = _json(env, "roofline", str(low))
        assert r == before["roofline"]
        rep = _json(env, "report", str(low))
        assert rep["roofline"] == before["report"]["roofline"]
        assert rep["overall"] == before["report"]["overall"]
    same()
    proc = run_cli("calibrate", "--quick", "--no-collectives", "--force", timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(runs["cache"].read_text())
    assert saved["measured_at"] != TOO_LOW["measured_at"] and saved["peaks"] != TOO_LOW["peaks"]
    assert isinstance(saved["load"]["others_share"], float)
    same()


def test_a_run_older_than_the_copy_says_its_ceilings_are_todays(runs, tmp_path):
    """A run from before counterprof copied the ceilings (no "ceilings" in its meta.json) is
    held to this host's cache as it is today, and `roofline` and `report` say so; a run that
    started with none (null) stays without, whatever was saved since."""
    env = runs["env"]
    today = json.loads(runs["cache"].read_text())
    old = tmp_path / "old"
    shutil.copytree(runs["low"], old)
    meta = json.loads((old / "meta.json").read_text())
    del meta["ceilings"]
    (old / "meta.json").write_text(json.dumps(meta))
    r = _json(env, "roofline", str(old))
    assert r["ceilings"]["peaks"] == today["peaks"] and r["ceilings"]["measured_at"] == today["measured_at"]
    assert r["notes"][0].startswith(TODAYS)
    proc = run_cli("report", str(old), timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "! " + TODAYS in proc.stdout

    none = tmp_path / "none"
    shutil.copytree(runs["low"], none)
    meta["ceilings"] = None
    (none / "meta.json").write_text(json.dumps(meta))
    r = _json(env, "roofline", str(none))
    assert r["ceilings"] is None and all(o["bound"] is None for o in r["ops"])
    assert any("no ceilings when this run started" in n for n in r["notes"])
    rep = _json(env, "report", str(none))
    assert not _metrics(rep) & {"roofline_compute", "roofline_op", "roofline_over_roof"}


# ---- calibrate: how loaded the machine was --------------------------------------------------

def _proc_stat_busy() -> tuple[float, float]:
    """(busy s, steal s) of all CPUs, as /proc/stat counts them."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]] + [0] * 10
    tick = os.sysconf("SC_CLK_TCK")
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / tick, v[7] / tick


def _observed(cmd_env: dict, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """`counterprof ARGS` and the share of the CPUs that processes other than it held meanwhile,
    as an observer outside it sees them (the machine's busy time less the command's, whose
    CPU time this process gets when it waits for it)."""
    t0, (b0, s0), c0 = time.monotonic(), _proc_stat_busy(), os.times()
    proc = run_cli(*args, timeout=300, env=cmd_env)
    t1, (b1, s1), c1 = time.monotonic(), _proc_stat_busy(), os.times()
    mine = (c1.children_user + c1.children_system + c1.user + c1.system) - \
        (c0.children_user + c0.children_system + c0.user + c0.system)
    ncpu = len(os.sched_getaffinity(0))
    return proc, max(b1 - b0 - mine + (s1 - s0), 0.0) / (ncpu * (t1 - t0))


@pytest.fixture
def contenders():
    """Two busy loops (as many as this VM has cores), ended by their ids afterwards."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    time.sleep(0.5)
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the load is read from /proc/stat (Linux)")
def test_calibrate_with_busy_loops_beside_it_refuses_to_save(tmp_path, contenders):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    saved = tmp_path / "xdg" / "counterprof" / "ceilings"
    proc, seen = _observed(env, "calibrate", "--quick", "--no-collectives", "--json")
    assert proc.returncode == 1, proc.stderr
    load = json.loads(proc.stdout)["cpu"]["load"]
    print(f"\ncalibrate beside 2 busy loops: others {100 * load['others_share']:.0f}% (observer "
          f"{100 * seen:.0f}%), worst {load['worst']}, own {load['own_cpus']} CPUs")
    assert load["loaded"] is True and load["worst"]["others_share"] >= value("calibrate_others_share")
    assert load["others_share"] >= 0.3                 # two loops beside its two threads: ~half the CPUs
    assert abs(load["others_share"] - seen) < 0.2
    err = proc.stderr
    assert "the machine was busy while calibrate measured: other processes held" in err
    assert "Not saved" in err and "--force" in err and "Traceback" not in err
    assert not saved.exists() or not list(saved.glob("*.json"))
    # --force: saved, and the document says it was
    proc = run_cli("calibrate", "--quick", "--no-collectives", "--force", timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Saved anyway (--force)" in proc.stderr and "saved " in proc.stderr
    (path,) = saved.glob("*-cpu.json")
    doc = json.loads(path.read_text())
    assert doc["load"]["loaded"] is True and doc["load"]["saved_anyway"] is True
    assert "while measuring: other processes held" in proc.stdout     # the table says it too


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the load is read from /proc/stat (Linux)")
def test_calibrate_alone_counts_only_others(tmp_path):
    """Without contenders of ours: calibrate's own threads (both cores' matmul) are not others.
    What it reports agrees with the observer outside it, and it saves exactly when others held
    less than the threshold in its busiest step (on a quiet machine: saved, exit 0, no warning;
    this VM is shared, so either may come)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    proc, seen = _observed(env, "calibrate", "--quick", "--no-collectives", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    load = json.loads(proc.stdout)["cpu"]["load"]
    print(f"\ncalibrate alone: others {100 * load['others_share']:.0f}% (observer {100 * seen:.0f}%), "
          f"worst {load['worst']}, own {load['own_cpus']} CPUs, load average {load['loadavg_before']}")
    assert load["own_cpus"] > 0.5                      # its matmul and copies: its own, not others'
    assert abs(load["others_share"] - seen) < 0.2
    saved = list((tmp_path / "xdg" / "counterprof" / "ceilings").glob("*-cpu.json"))
    if load["worst"]["others_share"] < value("calibrate_others_share"):
        assert load["loaded"] is False and proc.returncode == 0 and len(saved) == 1
        assert "busy while calibrate measured" not in proc.stderr
    else:
        assert load["loaded"] is True and proc.returncode == 1 and not saved
