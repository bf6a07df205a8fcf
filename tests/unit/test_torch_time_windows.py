"""The torch driver's adaptive time windows, without torch running them: when the first one
starts, how each next one is paced and sized from what the last one cost, when a window that
grows the process is ended, which traces count as empty, and the traces held back until no step
mark came (a training job's set-up) or written at exit. Real torch processes are in
tests/integration/test_short_jobs_traced.py."""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

DRIVER = (Path(__file__).resolve().parents[2] / "collectors" / "torch_trace" / "bootstrap"
          / "_counterprof_torch_driver.py")


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("_time_windows_under_test", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_first_window_is_a_short_probe_a_second_after_the_import(mod, tmp_path):
    before = time.monotonic()
    d = mod.Driver(str(tmp_path), time_paced=True)
    assert d.window_len == mod.PROBE_WINDOW_S
    assert before + mod.FIRST_WINDOW_AFTER_S <= d.next_window <= time.monotonic() + mod.FIRST_WINDOW_AFTER_S
    given = mod.Driver(str(tmp_path), window_s=0.5, window_every_s=30.0)      # followed exactly
    assert not given.time_paced and given.window_len == 0.5
    assert given.next_window >= before + 30.0


def test_an_empty_window_is_tried_again_soon_and_longer(mod, tmp_path):
    d = mod.Driver(str(tmp_path), time_paced=True)
    lengths = []
    for _ in range(8):
        d.window_empty = True
        d._pace_time_windows(stopped=100.0, now=100.01)
        assert d.next_window == pytest.approx(100.01 + mod.EMPTY_RETRY_S)
        lengths.append(d.window_len)
    assert lengths[:3] == pytest.approx([0.1, 0.2, 0.4]) and lengths[-1] == d.window_s


@pytest.mark.parametrize("recorded, cost, length, gap", [
    (0.05, 0.005, 2.0, 0.1),      # ms ops: cheap, so the next window is 2 s, soon
    (2.0, 0.02, 2.0, 2.0),        # never more than half the time in windows
    (0.05, 0.5, 0.05, 10.0),      # µs ops: 10 s of stop and export per second recorded
    (0.5, 0.5, 0.25, 10.0),       # 1 s per second recorded: a quarter-second window next
])
def test_a_window_that_caught_ops_paces_and_sizes_the_next(mod, tmp_path, recorded, cost, length, gap):
    d = mod.Driver(str(tmp_path), time_paced=True)
    d.window_empty = False
    d.window_started, d.window_start_cost_s = 10.0, cost / 5
    stopped = 10.0 + recorded
    now = stopped + cost * 4 / 5
    d._pace_time_windows(stopped, now)
    assert d.window_len == pytest.approx(length)
    assert d.next_window - now == pytest.approx(max(gap, cost / mod.WINDOW_COST_SHARE, recorded))
    assert cost / (d.next_window - now) <= mod.WINDOW_COST_SHARE + 1e-9


def test_a_window_ends_once_the_process_grew_in_two_readings_in_a_row(mod, tmp_path):
    d = mod.Driver(str(tmp_path), time_paced=True)
    mb = 1 << 20
    readings = iter([100 * mb,                     # the first reading: the baseline, if larger
                     130 * mb,                     # a tensor allocated ...
                     101 * mb,                     # ... and freed: not growth
                     120 * mb, 121 * mb])          # torch's events: growth, twice
    d._rss = lambda: next(readings)
    d.window_rss, d.window_rss_first, d.window_full = 90 * mb, True, False
    assert [d._window_grew() for _ in range(5)] == [False, False, False, False, True]
    assert d.window_rss == 100 * mb
    given = mod.Driver(str(tmp_path), window_s=1.0, window_every_s=5.0)
    given.window_rss = 1
    given._rss = lambda: 1 << 40
    assert not given._window_grew() and not given._window_grew()        # a schedule given: exact


def test_a_trace_without_an_op_is_empty(mod, tmp_path):
    empty, ops, big = tmp_path / "empty.json", tmp_path / "ops.json", tmp_path / "big.json"
    empty.write_text('{"traceEvents": [{"ph": "X", "cat": "python_function", "name": "x"}]}')
    ops.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm"}]}')
    big.write_bytes(b" " * mod.EMPTY_TRACE_CHECK_BYTES)
    assert not mod._caught_an_op(str(empty))
    assert mod._caught_an_op(str(ops)) and mod._caught_an_op(str(big))


class FakeProfiler:
    def __init__(self, body: str):
        self.body = body

    def export_chrome_trace(self, path):
        Path(path).write_text(self.body)


OPS = '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm"}]}'


def visible(run: Path) -> list[str]:
    return sorted(p.name for p in run.rglob("*.pt.trace.json"))


def hidden(run: Path) -> list[str]:
    return sorted(p.name for p in run.rglob("*.tmp"))


def test_adaptive_windows_are_held_back_then_written(mod, tmp_path):
    d = mod.Driver(str(tmp_path), time_paced=True)
    d._export_time_window(FakeProfiler('{"traceEvents": []}'))
    assert d.window_empty and d.empty_windows == 1 and not hidden(tmp_path)
    d.window_empty = False
    d._export_time_window(FakeProfiler(OPS))
    assert not d.window_empty and visible(tmp_path) == [] and len(hidden(tmp_path)) == 1
    d._release_held()                                  # held for HOLD_S with no step mark
    assert visible(tmp_path) == []
    d.held_windows = [(h[0] - mod.HOLD_S, *h[1:]) for h in d.held_windows]
    d._release_held()
    pid = os.getpid()
    assert visible(tmp_path) == [f"{d.host}_{pid}.1.time.pt.trace.json"] and not hidden(tmp_path)
    assert d.written == [str(tmp_path / "_ranks" / "rank=0" / "traces" / visible(tmp_path)[0])]
    assert d.windows_kept == 1 and ("marks", 0, 0, 0, "window") in d._records
    d._export_time_window(FakeProfiler(OPS))
    d._release_held(every=True)                        # at exit
    assert len(visible(tmp_path)) == 2 and not hidden(tmp_path)


def test_held_windows_are_dropped_once_steps_are_marked(mod, tmp_path):
    d = mod.Driver(str(tmp_path), time_paced=True)
    d._export_time_window(FakeProfiler(OPS))
    d._export_time_window(FakeProfiler(OPS))
    assert len(hidden(tmp_path)) == 2
    d._set_marks("optimizer")                          # the set-up ended: steps from here on
    d._release_held(every=True)
    assert visible(tmp_path) == [] and hidden(tmp_path) == [] and d.windows_kept == 0


def test_a_schedule_given_writes_each_window_as_it_ends(mod, tmp_path):
    d = mod.Driver(str(tmp_path), window_s=1.0, window_every_s=5.0)
    d._export_time_window(FakeProfiler(OPS))
    assert len(visible(tmp_path)) == 1 and not d.held_windows and d.windows_kept == 1
