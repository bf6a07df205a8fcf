"""The dashboard as a user sees it: rendered by a rich Console of a fixed size, on a recorded
run and on batches shaped like a PMU's and a GPU's."""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from live_batches import MS, T0, catalog, gpu_batch, in_arrival_order, perf_batch, recorded
from rich.cells import cell_len
from rich.console import Console

from counterprof.live import render as R
from counterprof.live.figures import LiveFigures, LiveVerdict, PanelFigures
from counterprof.live.frame import live_figures
from counterprof.live.processes import ProcessRow
from counterprof.live.window import TICK_NS, LiveWindow


def screen(renderable, width: int) -> list[str]:
    """What a terminal `width` columns wide shows, as plain text lines."""
    console = Console(file=io.StringIO(), width=width, height=60, color_system=None,
                      legacy_windows=False, _environ={})
    with console.capture() as cap:
        console.print(renderable, no_wrap=True, crop=True, overflow="ellipsis")
    return cap.get().rstrip("\n").split("\n")


@pytest.fixture(scope="module")
def rec():
    table, cat, meta = recorded()
    w = LiveWindow()
    for b in in_arrival_order(table):
        w.write("samples", b, 0)
    return table, cat, meta, w


def _cpus_over_last(table: pa.Table, metric: str, ticks: int) -> float:
    """task-clock ns per ns over the last `ticks` display ticks up to the last tick every
    collector completed, straight from the table."""
    newest = -1 + min(max(table.filter(pc.equal(table["source"].cast(pa.string()), s))["time"]
                     .cast(pa.int64()).to_pylist()) // TICK_NS for s in ("perf", "host"))
    rows = table.filter(pc.equal(table["metric"].cast(pa.string()), metric))
    t = rows["time"].cast(pa.int64()).to_pylist()
    keep = [i for i, x in enumerate(t) if newest - ticks < x // TICK_NS <= newest]
    v, d = rows["value"].to_pylist(), rows["duration_ns"].to_pylist()
    return sum(v[i] for i in keep) / sum(d[i] for i in keep)


def test_recorded_run_dashboard(rec):
    table, cat, meta, w = rec
    h = R.Header("python examples/phases.py 2 1", 4.2, "runs/phases")
    figs = live_figures(w.snapshot(), cat, meta["collectors"], R.spark_width(100))
    lines = screen(R.full(figs, h, 100), 100)
    assert all(cell_len(ln) <= 100 for ln in lines)
    assert lines[0] == "counterprof ▸ python examples/phases.py 2 1".ljust(76) + " 0:04  q stops profiling"
    busy3 = _cpus_over_last(table, "task-clock", 12)         # the verdict: last 3 s
    assert lines[1].startswith(f"bottleneck host-bound ({100 * (1 - busy3):.0f}% of the time): "
                               f"the workload used {busy3:.2f} CPUs over the wall time")
    assert lines[2] == "run runs/phases"
    assert lines[3] == "╭─ perf " + "─" * 91 + "╮"
    busy1 = _cpus_over_last(table, "task-clock", 4)           # current values: the last second
    assert lines[4].startswith(f"│ {'CPU utilization':<16} {f'{busy1:.2f} CPUs':>11} ")
    assert lines[4].endswith(" │") and len(lines[4]) == 100
    assert lines[8] == "│ " + "not counted here: cycles, instructions, branches, branch-misses".ljust(96) + " │"
    assert lines[9] == "╰" + "─" * 98 + "╯"
    assert lines[10] == "╭─ host " + "─" * 91 + "╮"
    rss = table.filter(pc.equal(table["metric"].cast(pa.string()), "proc.rss")).sort_by("time")["value"][-1].as_py()
    assert lines[12].startswith("│ RSS             " + f"{rss / 2**20:.1f} MiB".rjust(12))
    labels = [ln[2:18].rstrip() for ln in lines[11:19]]
    assert labels == ["CPU (tree)", "RSS", "disk read", "disk write", "context switches", "threads",
                      "system CPU", "memory used"]


def _pmu_gpu_window(seconds: float = 3.0) -> LiveWindow:
    w = LiveWindow()
    for i in range(int(seconds * 10)):
        t = T0 + (i + 1) * 100 * MS
        w.write("samples", perf_batch(t, 100 * MS, {"task-clock": 100 * MS, "cycles": 3e8,
                                                     "instructions": 4.5e8}, quality=0.5), 0)
        w.write("samples", gpu_batch(t, 100 * MS, "gpu:0", {
            "gpu.util": 95.0, "gpu.power": 350.0, "gpu.power_limit": 700.0,
            "gpu.throttle_time": 20 * MS}), 0)
    return w


def test_pmu_and_gpu_panels_exact_lines():
    w = _pmu_gpu_window()
    h = R.Header("python train.py", 3.0, None)
    figs = live_figures(w.snapshot(), catalog(), {}, R.spark_width(100))
    lines = screen(R.full(figs, h, 100), 100)
    spark_w = R.spark_width(100)
    assert spark_w == 50

    def row(label, value, spark, detail):
        return f"│ {label:<16} {value:>11} {spark:>{spark_w}} {detail:<16} │"
    assert lines[1] == ("bottleneck unknown (busy GPU: compute vs memory cannot be told apart): "
                        "GPU busy 95% of the time (NV…")
    assert row("CPU utilization", "1.00 CPUs", "███", "") in lines
    assert row("IPC", "1.50", "███", "3.00 GHz") in lines
    assert row("multiplexed", "50.0%", "▄▄▄", "ran 50% of time") in lines
    assert "╭─ gpu:0 " + "─" * 90 + "╮" in lines
    assert row("util", "95.0%", "███", "") in lines
    assert row("power", "350 W", "▄▄▄", "of 700 W") in lines          # half of the limit
    assert row("throttle_time", "20.0%", "▂▂▂", "") in lines           # 20 ms of every 100 ms


def test_alerts_are_red():
    w = _pmu_gpu_window()
    figs = live_figures(w.snapshot(), catalog(), {}, R.spark_width(100))
    lines = R.to_lines(R.full(figs, R.Header("x", 1, None), 100), 100, "standard")
    throttle = next(ln for ln in lines if "throttle_time" in ln)
    util = next(ln for ln in lines if "│ \x1b[2mutil" in ln)
    assert "\x1b[31m" in throttle and "\x1b[31m" not in util


def test_sparkline_glyphs():
    assert R.sparkline([0, 1, 2, 3, 4, 5, 6, 7], 1.0) == "▁▁▂▃▅▆▇█"
    assert R.sparkline([None, 0.5, None, 1.0], 1.0) == " ▄ █"
    assert R.sparkline([0.5, 0.5], 2.0) == "▂▂"                    # a fixed scale (percent, limits)
    assert R.sparkline([0.0, 0.0], None) == "▁▁"                   # zero is shown, unknown is not
    assert R.sparkline([None, None], None) == "  "
    assert R.sparkline([0, 4, 9], 9, ascii_only=True) == ".=@"


@pytest.mark.parametrize("v, unit, text", [
    (None, "percent", "—"), (0.987, "cpus", "0.99 CPUs"), (1.5, "ratio", "1.50"),
    (99.84, "percent", "99.8%"), (13.1 * 2**20, "bytes", "13.1 MiB"), (512, "bytes/s", "512 B/s"),
    (2.5e6, "/s", "2.50M/s"), (3.0, "count", "3"), (1980.0, "MHz", "1980 MHz"), (65.26, "C", "65.3 C"),
    (68.0, "bitmask", "0x44"),
])
def test_values(v, unit, text):
    assert R.fmt_value(v, unit) == text


def test_compact_and_one_line_for_small_terminals(rec):
    table, cat, meta, w = rec
    h = R.Header("python examples/phases.py 2 1", 4.2, "runs/phases")
    figs_for = lambda p: live_figures(w.snapshot(), cat, meta["collectors"], p)  # noqa: E731
    form, lines = R.layout(figs_for, h, 70, 5, None)
    busy1 = _cpus_over_last(table, "task-clock", 4)
    busy3 = _cpus_over_last(table, "task-clock", 12)
    assert form == "compact" and len(lines) == 3
    assert lines[0] == "counterprof 0:04  q stops profiling  runs/phases"
    assert lines[1].startswith(f"task-clock {busy1:.2f} CPUs · CPU ") and lines[1].endswith("…")
    assert cell_len(lines[1]) == 70
    verdict = f"host-bound ({100 * (1 - busy3):.0f}% of the time): the workload used {busy3:.2f} CPUs"
    assert lines[2].startswith(verdict) and cell_len(lines[2]) <= 70
    form, lines = R.layout(figs_for, h, 70, 2, None)
    assert form == "line" and len(lines) == 1 and lines[0].startswith("0:04 " + verdict[:40])
    # wide enough for the panels but too short: compact too
    assert R.layout(figs_for, h, 120, 10, None)[0] == "compact"
    assert R.layout(figs_for, h, 120, 40, None)[0] == "full"


@pytest.mark.parametrize("width", [1, 2, 3, 10, 39, 59, 60, 61, 99, 119, 120, 121, 200, 400])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 20, 60])
def test_any_size_fits(rec, width, rows):
    table, cat, meta, w = rec
    h = R.Header("python " + "x" * 300, 3725.0, "/very/long/" + "d" * 300)
    h.warnings.append("w" * 500)
    figs_for = lambda p: live_figures(w.snapshot(), cat, meta["collectors"], p)  # noqa: E731
    procs = [ProcessRow(1, "n" * 300, 50.0, 1e9)]
    form, lines = R.layout(figs_for, h, width, rows, "256", processes=procs)
    assert 1 <= len(lines) <= max(rows, 1)
    for ln in lines:
        plain = Console(file=io.StringIO()).render_str(ln).plain if "\x1b" not in ln else _strip(ln)
        assert cell_len(plain) <= width


def _strip(s: str) -> str:
    import re
    return re.sub(r"\x1b\[[0-9;]*m", "", s)


def test_process_table_and_failed_panel():
    figs = LiveFigures([PanelFigures("host", status="failed", reason="cannot read /proc/stat: is "
                                     "/proc mounted? " + "more words " * 5)],
                       LiveVerdict("idle", "0.1 of 2 CPUs busy, no GPU"))
    procs = [ProcessRow(4242, "python train.py", 99.5, 2.5 * 2**30), ProcessRow(1, "init", None, 1e6)]
    lines = screen(R.full(figs, R.Header("this machine", 61, None, "q quits"), 80, processes=procs), 80)
    assert lines[0] == "counterprof ▸ this machine".ljust(66) + " 1:01  q quits"
    assert lines[1] == "bottleneck idle: 0.1 of 2 CPUs busy, no GPU"
    assert lines[3] == "│ " + "failed".ljust(76) + " │"
    assert lines[4] == "│ " + ("cannot read /proc/stat: is /proc mounted? "
                               "more words more words more words").ljust(76) + " │"
    assert lines[5] == "│ " + "more words more words".ljust(76) + " │"
    assert lines[7] == "╭─ processes by CPU " + "─" * 59 + "╮"
    assert lines[8] == "│ " + "     PID      CPU         RSS COMMAND".ljust(76) + " │"
    assert lines[9] == "│ " + "    4242    99.5%     2.5 GiB python train.py".ljust(76) + " │"
    assert lines[10] == "│ " + "       1        —   976.6 KiB init".ljust(76) + " │"


def test_plain_line():
    w = _pmu_gpu_window()
    figs = live_figures(w.snapshot(), catalog(), {}, 0)
    assert R.plain_line(figs, 3.0) == (
        "     3.000 s  task-clock 1.00 CPUs  IPC 1.50  mux 50.0%  gpu:0 util 95.0%  gpu:0 power 350 W"
        "  | unknown (busy GPU: compute vs memory cannot be told apart): GPU busy 95% of the time (NVML)")


def test_ascii_terminals_get_ascii():
    w = _pmu_gpu_window()
    figs = live_figures(w.snapshot(), catalog(), {}, R.spark_width(100))
    lines = screen(R.full(figs, R.Header("x", 1, None), 100, ascii_only=True), 100)
    assert lines[2].startswith("+- perf -")
    assert all(ln.isascii() for ln in lines[2:])
