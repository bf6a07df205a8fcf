"""The end-of-run table, laid out like perf stat's. Computes nothing: it formats a Summary.

Laid out here, as lines of (text, style) spans, not by rich: `counterprof run` prints this at
every exit, and importing rich for it cost the run ~40 ms (issue 14's start-up); rich is
imported only to print the styles on a terminal. Columns are separated by two spaces, the
numbers right-aligned, nothing wraps (as perf stat's table does not).
"""
from __future__ import annotations

import json
import math
from dataclasses import fields
import shlex
import sys
from typing import IO, Any

from ..ground import units
from .inert import inert, inert_lines

from ..analysis.summary import Summary, SummaryRow
from .perf_formats import with_derived

Span = tuple[str, str]           # (text, style: "" | "bold" | "dim" | "yellow")
Line = list[Span]


def _mean_spread(mean: float, sd: float, runs: int, unit: str | None = None) -> str:
    """perf stat -r's "( +- x% )": the standard deviation of the mean (sd/sqrt(n)), relative
    to the mean, as perf prints it (sd: the sample standard deviation over the n runs)."""
    return units.spread(mean, sd / math.sqrt(runs) if runs > 1 else sd, unit)


def _cells(r: SummaryRow, runs: int = 1) -> tuple[Span, Span, Span, Span]:
    if r.value is None:
        label = {"not supported": "<not supported>", "not counted": "<not counted>"}.get(
            r.status, f"<{r.status}>")
        return (label, "yellow"), ("", ""), (inert(r.metric), ""), ("", "")
    num, unit = units.stat_number(r.value, r.unit)
    name = inert(r.metric if r.aggregate == "total" else f"{r.metric} ({r.aggregate})")
    note = f"#  {r.note}" if r.note else ""
    if r.coverage is not None and r.coverage < 0.9999:
        note += f"  ({units.share(r.coverage, 2)})"
    if r.unknown_intervals:
        note += f"  [{r.unknown_intervals} intervals unknown]"
    if r.stddev is not None:
        note = f"{note}  {_mean_spread(r.value, r.stddev, runs, r.unit)}".strip()   # perf's order
    return (num, ""), (inert(unit), ""), (name, ""), (inert(note), "dim")


def _table(rows: list[tuple[Span, Span, Span, Span]]) -> list[Line]:
    """The rows as aligned lines: the number right-aligned, the unit and the name padded."""
    if not rows:
        return []
    w_num, w_unit, w_name = (max(len(row[i][0]) for row in rows) for i in range(3))
    return [[(num.rjust(w_num), ns), ("  ", ""), (unit.ljust(w_unit), us), ("  ", ""),
             (name.ljust(w_name), nms), ("  ", ""), note]
            for (num, ns), (unit, us), (name, nms), note in rows]


_SECTION_TITLES = {"host": "process tree and system (host collector)",
                   "threads": "the main thread and its helpers (threads collector)",
                   "nvml": "GPUs, all sampled GPUs together (nvml collector)"}


def summary_lines(s: Summary, verbose: bool = True) -> list[Line]:
    """verbose: also the default collectors this machine cannot run (no GPU, no Neuron device)."""
    if s.runs > 1:
        s = with_derived(s)      # the means carry no derived figure: perf stat -r prints them
    what = inert(shlex.join(s.command)) if s.command else "this run"
    runs = f" ({s.runs} runs)" if s.runs > 1 else ""
    lines: list[Line] = [[], [(f" Performance counter stats for '{what}'{runs}:", "bold")], []]
    perf = [r for r in s.rows if r.source == "perf"]
    other = [r for r in s.rows if r.source != "perf"]
    lines += _table([_cells(r, s.runs) for r in perf])
    footer = []
    for value, key, words in ((s.elapsed_s, "elapsed_s", "seconds time elapsed"),
                              (s.user_s, "user_s", "seconds user"), (s.system_s, "system_s", "seconds sys")):
        if value is None:
            continue
        sd = s.spread.get(key)
        if sd is None:
            footer.append(f"{value:15.9f} {words}")
        else:     # perf stat -r's form: the standard deviation of the mean
            sdm = sd / math.sqrt(s.runs) if s.runs > 1 else sd
            footer.append(f"{value:15.9f} +- {sdm:.9f} {words}  {units.spread(value, sdm)}")
    if s.runs > 1:
        footer.append(f"(means of {s.runs} runs; +- is the standard deviation of the mean, "
                      "sd/sqrt(runs), as perf stat -r prints it)")
    if footer:
        lines += [[]] + [[(f, "")] for f in footer]
    for source in dict.fromkeys(r.source for r in other):     # one section per collector
        title = _SECTION_TITLES.get(source, f"{inert(source)} collector")
        if source == "host" and s.ranks > 1:
            title = f"process trees of {s.ranks} ranks and the system (host collector)"
        lines += [[], [(title, "bold")]]
        lines += _table([_cells(r, s.runs) for r in other if r.source == source])
    failed = [inert(f"{k}: {v['status']} ({v['reason']})") for k, v in s.collectors.items()
              if v.get("status") not in ("ok", "unavailable", None)]
    if failed:
        lines += [[]] + [[(f, "yellow")] for f in failed]
    # a default collector this machine cannot run (no GPU, say): one short line, not a paragraph
    absent = [inert(f"{k} ({_first_clause(v.get('reason', ''))})") for k, v in s.collectors.items()
              if v.get("status") == "unavailable"]
    if absent and verbose:
        lines.append([("not available here: " + "; ".join(absent) + "  (`counterprof list` says why)", "dim")])
    return lines


def summary_renderable(s: Summary) -> Any:
    """The lines as one rich Text with their styles (for a terminal)."""
    from rich.text import Text
    text = Text()
    for i, line in enumerate(summary_lines(s)):
        if i:
            text.append("\n")
        for part, style in _trimmed(line):
            text.append(part, style=style or None)
    return text


def _trimmed(line: Line) -> Line:
    """The line without the padding at its end (the last cells may be empty)."""
    out = list(line)
    while out and not out[-1][0].strip():
        out.pop()
    if out:
        out[-1] = (out[-1][0].rstrip(), out[-1][1])
    return out


def _first_clause(reason: str, limit: int = 60) -> str:
    head = reason.split(":")[0].split(" (")[0].strip()
    return head if len(head) <= limit else head[: limit - 1] + "…"


def summary_text(s: Summary, width: int = 120) -> str:
    """The table as plain text (width: kept for callers; nothing wraps)."""
    return "".join(inert_lines("".join(part for part, _ in _trimmed(line))) + "\n" for line in summary_lines(s))


def print_summary(summary: Summary, as_json: bool, verbose: bool = True) -> None:
    """The end-of-run summary on stderr: the perf-stat-like table, or one JSON object (the
    API's form; `counterprof run --json` prints on stdout: print_machine). Styled through rich
    on a terminal (or with FORCE_COLOR), plain text elsewhere. verbose: with the line on the
    default collectors this machine cannot run."""
    if as_json:
        json.dump(summary.to_dict(), sys.stderr, default=str)
        sys.stderr.write("\n")
        sys.stderr.flush()
        return
    import os
    if _isatty(sys.stderr) or "FORCE_COLOR" in os.environ:
        from rich.text import Text
        from .console import console
        text = Text()
        for i, line in enumerate(summary_lines(summary, verbose)):
            if i:
                text.append("\n")
            for part, style in _trimmed(line):
                text.append(part, style=style or None)
        console(stderr=True).print(text)
        return
    sys.stderr.write("".join(inert_lines("".join(part for part, _ in _trimmed(line))) + "\n"
                             for line in summary_lines(summary, verbose)))
    sys.stderr.flush()


def print_machine(summary: Summary, form: str, out: IO[str], sep: str = ",") -> None:
    """`counterprof run`'s machine-readable summary on `out` (stdout): "json" one JSON object
    (every collector's figures; with -r, "variance" per row: perf's ± in percent), "jsonl"
    perf stat -j's lines, "csv" perf stat -x SEP's lines (the perf counters)."""
    from .perf_formats import csv_lines, json_lines, mean_error_pct
    if form == "json":
        d = summary.to_dict()
        if summary.runs > 1:
            for row in d["rows"]:
                row["variance"] = mean_error_pct(row["value"], row["stddev"], summary.runs)
        out.write(json.dumps(d, default=str) + "\n")
    else:
        lines = csv_lines(summary, sep) if form == "csv" else json_lines(summary)
        out.write("".join(line + "\n" for line in lines))
    out.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class ShownSummary(Summary):
    """A Summary that prints as perf stat's table: what counterprof.Run.summary() returns, so
    `print(run.summary())` and rich's console show the table (the analysis' Summary is data)."""

    def __rich__(self) -> Any:
        return summary_renderable(self)

    def __str__(self) -> str:
        return summary_text(self)


def shown(s: Summary) -> ShownSummary:
    return ShownSummary(**{f.name: getattr(s, f.name) for f in fields(s)})
