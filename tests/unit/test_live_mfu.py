"""The live view's MFU: real GPU traces (../shared/traces, with shapes) converted batch by
batch into a LiveWindow as the torch collector emits them; the figure is the one `counterprof
roofline` gives the imported trace (against the datasheet of the device it names)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli

from counterprof.collectors.torch_trace.convert import TraceConversion
from counterprof.live.frame import live_figures
from counterprof.live.render import plain_line
from counterprof.live.window import LiveWindow

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
if not TRACES.is_dir():
    TRACES = Path("/work/shared/traces")


@pytest.fixture(autouse=True)
def no_cached_ceilings(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))


def _fed(name: str, rank: int = 0) -> LiveWindow:
    w = LiveWindow()
    versions = []
    for batch in TraceConversion(TRACES / name, default_rank=rank):
        w.write("spans", batch, rank)
        versions.append(w.version)
    # the figure comes when the window span (the last batch) is in, not before
    assert versions[-1] == 1 and set(versions[:-1]) <= {0}
    return w


def _imported_mfu(name: str, tmp_path: Path) -> dict:
    run = tmp_path / "run"
    proc = run_cli("import", str(TRACES / name), "-o", str(run), "-q", timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("roofline", str(run), "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["mfu"]


@pytest.mark.parametrize("name, dtype", [("tracelens/h100_vit_nsfw.json.gz", "bf16"),
                                         ("a100_rank3of8.json.gz", None)])
def test_a_trace_windows_mfu_is_the_rooflines(name, dtype, tmp_path):
    want = _imported_mfu(name, tmp_path)
    w = _fed(name)
    snap = w.snapshot()
    (win,) = snap.mfu
    got = win["mfu"]
    assert got["dtype"] == want["dtype"] and (dtype is None or got["dtype"] == dtype)
    assert got["mfu_datasheet"] == pytest.approx(want["mfu_datasheet"], rel=1e-9)
    assert [s["flops"] for s in got["steps"]] == [s["flops"] for s in want["steps"]]
    assert got["mfu_measured"] is None            # nothing measured for that machine here

    figs = live_figures(snap, {}, {}, points=20)
    panel = next(p for p in figs.panels if p.title == "torch trace")
    sheet = next(f for f in panel.figures if f.key == "torch.mfu_datasheet")
    assert sheet.value == pytest.approx(100 * want["mfu_datasheet"], rel=1e-9)
    assert sheet.headline and sheet.unit == "percent" and f"{len(want['steps'])} steps" in sheet.detail
    assert sum(v is not None for v in sheet.history) == 1      # one window, one point
    assert "torch trace MFU sheet" in plain_line(figs, 1.0)


def test_a_trace_without_a_known_device_says_to_calibrate():
    """sampled_rank0of128 has shapes but no deviceProperties: no datasheet, no ceilings: the
    FLOP/s is shown, the MFU is not guessed."""
    w = _fed("sampled_rank0of128.json.gz")
    (win,) = w.snapshot().mfu
    assert win["mfu"]["mfu_measured"] is None and win["mfu"]["mfu_datasheet"] is None
    panel = next(p for p in live_figures(w.snapshot(), {}, {}, points=10).panels if p.title == "torch trace")
    assert [f.key for f in panel.figures] == ["torch.flops"] and panel.figures[0].value > 0
    assert any("counterprof calibrate" in n for n in panel.notes)


def test_ranks_each_give_their_window_and_the_panel_takes_the_median():
    w = LiveWindow()
    for rank, name in ((0, "sampled_rank0of128.json.gz"), (1, "sampled_rank1of128.json.gz")):
        for batch in TraceConversion(TRACES / name, default_rank=rank):
            w.write("spans", batch, rank)
    snap = w.snapshot()
    assert [x["rank"] for x in snap.mfu] == [0, 1]
    rates = sorted(x["mfu"]["flops_per_s"] for x in snap.mfu)
    panel = next(p for p in live_figures(snap, {}, {}, points=10).panels if p.title == "torch trace")
    assert panel.figures[0].value == pytest.approx(sum(rates) / 2)


def test_no_trace_no_panel():
    w = LiveWindow()
    assert not any(p.title == "torch trace" for p in live_figures(w.snapshot(), {}, {}, points=10).panels)
