"""analysis/repeat.combine: means and sample standard deviations over runs, like perf stat -r."""
from __future__ import annotations

import statistics

import pytest

from counterprof.analysis.repeat import combine
from counterprof.analysis.summary import Summary, SummaryRow
from counterprof.render.summary import summary_text


def _summary(tc, cycles, elapsed, status=0):
    rows = [SummaryRow("perf", "task-clock", "ns", "delta", tc, note="1.0 CPUs utilized"),
            SummaryRow("perf", "cycles", "count", "delta", cycles,
                       status="counted" if cycles is not None else "not supported")]
    return Summary(command=["python", "x.py"], elapsed_s=elapsed, user_s=elapsed / 2, system_s=0.1,
                   exit_status=status, rows=rows)


def test_means_and_sample_sd_and_rows_not_counted_everywhere():
    runs = [_summary(1e9, 10.0, 1.0), _summary(2e9, None, 2.0, status=3), _summary(3e9, 30.0, 3.0)]
    s = combine(runs)
    assert s.runs == 3 and s.exit_status == 3
    tc = s.row("task-clock")
    assert tc.value == pytest.approx(2e9) and tc.stddev == pytest.approx(statistics.stdev([1e9, 2e9, 3e9]))
    assert tc.note == ""                               # per-run ratios are not averaged
    cyc = s.row("cycles")
    assert cyc.value is None and cyc.status == "not supported"
    assert s.elapsed_s == pytest.approx(2.0) and s.spread["elapsed_s"] == pytest.approx(1.0)
    text = summary_text(s)
    # perf stat -r's ±: the standard deviation of the mean, sd/sqrt(n), of the mean
    assert "(3 runs):" in text and "( +- 28.87% )" in text
    assert "2.000000000 +- 0.577350269 seconds time elapsed  ( +- 28.87% )" in text


def test_one_run_has_no_spread():
    s = combine([_summary(1e9, 5.0, 1.0)])
    assert s.row("task-clock").stddev is None and s.spread["elapsed_s"] is None
    assert "+-" not in summary_text(s)
