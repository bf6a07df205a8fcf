"""perf stat's machine-readable forms of a run's counters: `-x SEP` (CSV) and `-j` (JSON
lines), for the totals at the end and for each interval of `-I MS`; and the interval rows of
`-I MS` as perf stat prints them on a terminal. Computes nothing a Summary does not hold but
perf stat's derived figures where a summary has none (the means of `-r N`).

The fields are perf stat's (Linux 6.1):

    -x,          value,unit,event,run-time,pcnt-running,metric-value,metric-unit
    -x, -r N     value,unit,event,variance,run-time,pcnt-running,metric-value,metric-unit
    -x, -I MS    time,value,unit,event,run-time,pcnt-running,metric-value,metric-unit
    -j           {"counter-value", "unit", "event", ["variance",] "event-runtime",
                  "pcnt-running", "metric-value", "metric-unit"}  (+ "interval" first with -I)

`variance` is perf's: the standard deviation of the mean over the runs (sd/sqrt(n)) as a
percentage of the mean. run-time is the time the counter ran, in ns: for counters of a
process, its task-clock (a counter counts while the task runs) times the share it was
scheduled on the PMU.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterator

from ..analysis.summary import Summary, SummaryRow

# perf stat's "/sec" events: their rate is per second of task-clock, as perf divides
RATE_EVENTS = {"context-switches", "cs", "cpu-migrations", "migrations", "page-faults", "faults",
               "minor-faults", "major-faults", "branches", "alignment-faults", "emulation-faults"}
LABELS = {"not supported": "<not supported>", "not counted": "<not counted>"}


def mean_error_pct(mean: float | None, sd: float | None, runs: int) -> float | None:
    """perf stat -r's ± : the standard deviation of the mean (sd/sqrt(n)) in percent of the
    mean; None without a spread (one run) or for a zero mean."""
    if mean is None or sd is None or runs < 2 or not mean:
        return None
    return 100.0 * sd / math.sqrt(runs) / abs(mean)


def rate(per_s: float) -> tuple[float, str]:
    """A rate as perf stat prints it: (number, "/sec" | "K/sec" | "M/sec" | "G/sec")."""
    for div, unit in ((1e9, "G/sec"), (1e6, "M/sec"), (1e3, "K/sec")):
        if abs(per_s) >= div:
            return per_s / div, unit
    return per_s, "/sec"


def derived(row: SummaryRow, s: Summary) -> tuple[str, str]:
    """(metric-value, metric-unit): perf stat's derived figure of a perf row. The summary's
    note where it has one ("0.995 CPUs utilized"); else, for the means of `-r N` (whose rows
    carry none), CPUs utilized from task-clock and elapsed time, and the /sec rates per second
    of task-clock."""
    if row.note:
        value, _, unit = row.note.partition(" ")
        try:
            float(value)
            return value, unit
        except ValueError:
            return "", row.note
    if row.value is None:
        return "", ""
    task = s.row("task-clock")
    task_s = task.value / 1e9 if task is not None and task.value and task.unit == "ns" else None
    if row.metric == "task-clock" and row.unit == "ns" and s.elapsed_s:
        return f"{row.value / 1e9 / s.elapsed_s:.3f}", "CPUs utilized"
    if row.metric in RATE_EVENTS and task_s:
        v, unit = rate(row.value / task_s)
        return f"{v:.3f}", unit
    return "", ""


def with_derived(s: Summary) -> Summary:
    """The summary with perf stat's derived figure in every perf row that has none (the
    means of `-r N` carry none): what the table prints beside each counter."""
    from dataclasses import replace
    rows = []
    for r in s.rows:
        if r.source == "perf" and not r.note and r.value is not None:
            value, unit = derived(r, s)
            if value:
                r = replace(r, note=f"{value} {unit}")
        rows.append(r)
    return replace(s, rows=rows)


def _value(row: SummaryRow) -> tuple[str, str]:
    """(counter-value, unit) as perf writes them in -x and -j: msec for task-clock."""
    if row.value is None:
        return LABELS.get(row.status, f"<{row.status}>"), ""
    if row.unit == "ns":
        return f"{row.value / 1e6:.2f}", "msec"
    if float(row.value).is_integer():
        return f"{row.value:.0f}", ""
    return f"{row.value:.2f}", "" if row.unit == "count" else row.unit


def _runtime(row: SummaryRow, s: Summary) -> tuple[int, float]:
    """(run-time ns, pcnt-running) of a perf row."""
    if row.value is None:
        return 0, 100.0
    cov = row.coverage if row.coverage is not None else 1.0
    task = s.row("task-clock")
    base = task.value if task is not None and task.value is not None and task.unit == "ns" else \
        (s.elapsed_s or 0.0) * 1e9
    return int(round(base * cov)), round(100.0 * cov, 2)


def perf_rows(s: Summary) -> list[SummaryRow]:
    return [r for r in s.rows if r.source == "perf"]


def csv_lines(s: Summary, sep: str) -> Iterator[str]:
    """`perf stat -x SEP`'s lines of the totals (with -r, its variance column)."""
    for r in perf_rows(s):
        value, unit = _value(r)
        runtime, pcnt = _runtime(r, s)
        mval, munit = derived(r, s)
        fields = [value, unit, r.metric]
        if s.runs > 1:
            err = mean_error_pct(r.value, r.stddev, s.runs)
            fields.append(f"{err if err is not None else 0.0:.2f}%")
        fields += [str(runtime), f"{pcnt:.2f}", mval, munit]
        yield sep.join(fields)


def json_lines(s: Summary) -> Iterator[str]:
    """`perf stat -j`'s lines of the totals (with -r, its "variance")."""
    for r in perf_rows(s):
        value, unit = _value(r)
        runtime, pcnt = _runtime(r, s)
        mval, munit = derived(r, s)
        d: dict[str, object] = {"counter-value": value if r.value is None else f"{float(value):.6f}",
                                "unit": unit, "event": r.metric}
        if s.runs > 1:
            err = mean_error_pct(r.value, r.stddev, s.runs)
            d["variance"] = round(err if err is not None else 0.0, 2)
        d.update({"event-runtime": runtime, "pcnt-running": pcnt,
                  "metric-value": float(mval) if mval else 0.0, "metric-unit": munit})
        yield json.dumps(d, separators=(", ", " : "))


class IntervalRow:
    """One counter over one interval of -I: what perf stat -I prints a line of."""
    __slots__ = ("t_s", "event", "value", "unit", "duration_ns", "quality", "task_clock_ns")

    def __init__(self, t_s: float, event: str, value: float, unit: str, duration_ns: float,
                 quality: float, task_clock_ns: float | None):
        self.t_s, self.event, self.value, self.unit = t_s, event, value, unit
        self.duration_ns, self.quality, self.task_clock_ns = duration_ns, quality, task_clock_ns

    def shown(self) -> tuple[str, str]:
        if self.unit == "ns":
            return f"{self.value / 1e6:.2f}", "msec"
        return f"{self.value:.0f}" if float(self.value).is_integer() else f"{self.value:.2f}", ""

    def metric(self) -> tuple[str, str]:
        if self.event == "task-clock" and self.unit == "ns" and self.duration_ns:
            return f"{self.value / self.duration_ns:.3f}", "CPUs utilized"
        if self.event in RATE_EVENTS and self.task_clock_ns:
            v, unit = rate(self.value / (self.task_clock_ns / 1e9))
            return f"{v:.3f}", unit
        return "", ""

    def text(self) -> str:
        value, unit = self.shown()
        mval, munit = self.metric()
        line = f"{self.t_s:15.9f} {value:>18} {unit:<5} {self.event:<32}"
        if mval:
            line += f" #  {mval:>8} {munit}"
        if self.quality < 0.9999:
            line += f"  ({100 * self.quality:.2f}%)"
        return line.rstrip()

    def csv(self, sep: str) -> str:
        value, unit = self.shown()
        mval, munit = self.metric()
        runtime = int(round((self.task_clock_ns or self.duration_ns) * self.quality))
        return sep.join([f"{self.t_s:.9f}", value, unit, self.event, str(runtime),
                         f"{100 * self.quality:.2f}", mval, munit])

    def json(self) -> str:
        value, unit = self.shown()
        mval, munit = self.metric()
        runtime = int(round((self.task_clock_ns or self.duration_ns) * self.quality))
        return json.dumps({"interval": round(self.t_s, 9), "counter-value": f"{float(value):.6f}",
                           "unit": unit, "event": self.event, "event-runtime": runtime,
                           "pcnt-running": round(100 * self.quality, 2),
                           "metric-value": float(mval) if mval else 0.0, "metric-unit": munit},
                          separators=(", ", " : "))


INTERVAL_HEADER = "#           time             counts unit events"
