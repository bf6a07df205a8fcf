"""The end-of-run table, laid out like perf stat's. Computes nothing: it formats a Summary."""
from __future__ import annotations

import io
import shlex

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..analysis.summary import Summary, SummaryRow
from .console import console, inert


def _number(value: float, unit: str) -> tuple[str, str]:
    if unit == "ns":
        return f"{value / 1e6:,.2f}", "msec"
    if unit == "s":
        return f"{value:,.3f}", "s"
    if unit == "bytes":
        for div, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if value >= div:
                return f"{value / div:,.2f}", name
        return f"{value:,.0f}", "B"
    if unit == "percent":
        return f"{value:,.1f}", "%"
    if float(value).is_integer() or abs(value) >= 100:
        return f"{value:,.0f}", ""
    return f"{value:,.2f}", unit if unit != "count" else ""


def _cells(r: SummaryRow) -> tuple[Text, str, Text, Text]:
    if r.value is None:
        label = {"not supported": "<not supported>", "not counted": "<not counted>"}.get(
            r.status, f"<{r.status}>")
        return Text(label, style="yellow"), "", Text(inert(r.metric)), Text("")
    num, unit = _number(r.value, r.unit)
    name = inert(r.metric if r.aggregate == "total" else f"{r.metric} ({r.aggregate})")
    note = f"#  {r.note}" if r.note else ""
    if r.coverage is not None and r.coverage < 0.9999:
        note += f"  ({100 * r.coverage:.2f}%)"
    if r.unknown_intervals:
        note += f"  [{r.unknown_intervals} intervals unknown]"
    return Text(num), unit, Text(name), Text(note, style="dim")


_SECTION_TITLES = {"host": "process tree and system (host collector)",
                   "nvml": "GPUs, all sampled GPUs together (nvml collector)"}


def summary_renderable(s: Summary):
    what = inert(shlex.join(s.command)) if s.command else "this run"
    title = Text(f"\n Performance counter stats for '{what}':\n", style="bold")
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
    if s.elapsed_s is not None:
        footer.append(f"{s.elapsed_s:15.9f} seconds time elapsed")
    if s.user_s is not None:
        footer.append(f"{s.user_s:15.9f} seconds user")
    if s.system_s is not None:
        footer.append(f"{s.system_s:15.9f} seconds sys")
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
