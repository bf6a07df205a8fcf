"""The end-of-run table, laid out like perf stat's. Computes nothing: it formats a Summary."""
from __future__ import annotations

import io
import json
import shlex
import sys
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from . import units
from .console import console, inert

if TYPE_CHECKING:     # types only: the Summary calls this module to print itself
    from ..analysis.summary import Summary, SummaryRow


def _cells(r: SummaryRow) -> tuple[Text, str, Text, Text]:
    if r.value is None:
        label = {"not supported": "<not supported>", "not counted": "<not counted>"}.get(
            r.status, f"<{r.status}>")
        return Text(label, style="yellow"), "", Text(inert(r.metric)), Text("")
    num, unit = units.stat_number(r.value, r.unit)
    name = inert(r.metric if r.aggregate == "total" else f"{r.metric} ({r.aggregate})")
    note = f"#  {r.note}" if r.note else ""
    if r.coverage is not None and r.coverage < 0.9999:
        note += f"  ({units.share(r.coverage, 2)})"
    if r.unknown_intervals:
        note += f"  [{r.unknown_intervals} intervals unknown]"
    if r.stddev is not None:
        note = f"{units.spread(r.value, r.stddev, r.unit)}  {note}".rstrip()
    return Text(num), unit, Text(name), Text(note, style="dim")


_SECTION_TITLES = {"host": "process tree and system (host collector)",
                   "threads": "the main thread and its helpers (threads collector)",
                   "nvml": "GPUs, all sampled GPUs together (nvml collector)"}


def summary_renderable(s: Summary):
    what = inert(shlex.join(s.command)) if s.command else "this run"
    runs = f" ({s.runs} runs)" if s.runs > 1 else ""
    title = Text(f"\n Performance counter stats for '{what}'{runs}:\n", style="bold")
    table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column()
    perf = [r for r in s.rows if r.source == "perf"]
    other = [r for r in s.rows if r.source != "perf"]
    for r in perf:
        table.add_row(*_cells(r))
    parts = [title, table]
    footer = []
    for value, key, words in ((s.elapsed_s, "elapsed_s", "seconds time elapsed"),
                              (s.user_s, "user_s", "seconds user"), (s.system_s, "system_s", "seconds sys")):
        if value is None:
            continue
        sd = s.spread.get(key)
        if sd is None:
            footer.append(f"{value:15.9f} {words}")
        else:     # perf stat -r's form
            footer.append(f"{value:15.9f} +- {sd:.9f} {words}  {units.spread(value, sd)}")
    if s.runs > 1:
        footer.append(f"(means of {s.runs} runs; +- is the sample standard deviation over the runs)")
    if footer:
        parts.append(Text("\n" + "\n".join(footer)))
    for source in dict.fromkeys(r.source for r in other):     # one section per collector
        title = _SECTION_TITLES.get(source, f"{source} collector")
        if source == "host" and s.ranks > 1:
            title = f"process trees of {s.ranks} ranks and the system (host collector)"
        section = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False,
                        title=Text(title, style="bold"), title_justify="left")
        section.add_column(justify="right", no_wrap=True)
        section.add_column(no_wrap=True)
        section.add_column(no_wrap=True)
        section.add_column()
        for r in other:
            if r.source == source:
                section.add_row(*_cells(r))
        parts.append(Text(""))
        parts.append(section)
    failed = [inert(f"{k}: {v['status']} ({v['reason']})") for k, v in s.collectors.items()
              if v.get("status") not in ("ok", "unavailable", None)]
    if failed:
        parts.append(Text("\n" + "\n".join(failed), style="yellow"))
    # a default collector this machine cannot run (no GPU, say): one short line, not a paragraph
    absent = [inert(f"{k} ({_first_clause(v.get('reason', ''))})") for k, v in s.collectors.items()
              if v.get("status") == "unavailable"]
    if absent:
        parts.append(Text("not available here: " + "; ".join(absent) + "  (`counterprof list` says why)",
                          style="dim"))
    return Group(*parts)


def _first_clause(reason: str, limit: int = 60) -> str:
    head = reason.split(":")[0].split(" (")[0].strip()
    return head if len(head) <= limit else head[: limit - 1] + "…"


def summary_text(s: Summary, width: int = 120) -> str:
    buf = io.StringIO()
    console(file=buf, width=width, color_system=None).print(summary_renderable(s))
    return buf.getvalue()


def print_summary(summary, as_json: bool) -> None:
    """The end-of-run summary on stderr: the perf-stat-like table, or one JSON object."""
    if as_json:
        json.dump(summary.to_dict(), sys.stderr, default=str)
        sys.stderr.write("\n")
        sys.stderr.flush()
        return
    console(stderr=True).print(summary)
