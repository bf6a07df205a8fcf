"""The live view's renderables: the dashboard, its compact forms, and the plain line.

Lays out what live/frame.py computed (numbers, units, sparklines), in the words of
ground/units.py; computes no metric.
Three sizes, chosen by the rows and columns the terminal gives:
  full     header, verdict, one panel per collector/device (two side by side when wide), and
           one "not here" line naming the collectors this machine has nothing for
  compact  three lines: header, the headline figures, the verdict
  line     one line: elapsed and the verdict
and `plain_line`, one line of text per interval when stderr is not a terminal.
"""
from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from rich import box
from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from ..render.console import SafeConsole, inert
from .figures import LiveFigures, PanelFigures
from ..ground import units
from ..ground.units import elapsed as fmt_elapsed, live_value as fmt_value
from .processes import ProcessRow

LABEL_W = 16
VALUE_W = 11
DETAIL_W = 16           # the words after the sparkline ("sys 0.2%", "of 700 W")
MIN_PANEL_W = 60        # two panels side by side from 2 x this many columns
MIN_SPARK_W = 8
MAX_SPARK_W = 60
FULL_MIN_WIDTH = 60     # narrower than this: the compact view

# rich's colour systems (Console(color_system=...))
ColorSystem = Literal["auto", "standard", "256", "truecolor", "windows"]


@dataclass
class Header:
    title: str                      # the command, or "top" / "pid 1234"
    elapsed_s: float
    run_path: str | None
    keys: str = "q stops profiling"
    warnings: list[str] = field(default_factory=list)


def sparkline(history: list[float | None], scale: float | None = None, ascii_only: bool = False) -> str:
    """One glyph per point, from empty to full; ' ' where a point is unknown. The top of the
    scale is the larger of `scale` and the history's maximum (units.sparkline, from zero)."""
    return units.sparkline(history, hi=scale, ascii_only=ascii_only)


# -- the full dashboard ----------------------------------------------------------------

# by the verdict's first word: the classifier's classes, and the machine view's labels
VERDICT_STYLE = {"compute": "bold green", "memory": "bold magenta", "collectives": "bold cyan",
                 "host": "bold yellow", "CPU": "bold green", "GPU": "bold green", "busy": "bold",
                 "waiting": "bold yellow", "idle": "dim", "unknown": "dim"}


def spark_width(width: int) -> int:
    """Sparkline width for a terminal this wide (the same in every panel)."""
    cols = 2 if width >= 2 * MIN_PANEL_W else 1
    inner = width // cols - 4
    return max(MIN_SPARK_W, min(MAX_SPARK_W, inner - LABEL_W - VALUE_W - DETAIL_W - 3))


def _header_lines(h: Header, verdict_text: Text, width: int) -> list[Text]:
    right = Text.assemble((fmt_elapsed(h.elapsed_s), "bold"), (f"  {h.keys}" if h.keys else "", "dim"))
    left_w = max(0, width - right.cell_len - 1)
    left = Text.assemble(("counterprof", "bold cyan"), " ▸ ", (inert(h.title), "bold"))
    left.truncate(left_w, overflow="ellipsis", pad=True)
    lines = [Text.assemble(left, " ", right)]
    sub = Text.assemble(("bottleneck ", "dim"), verdict_text)
    lines.append(sub)
    if h.run_path:
        lines.append(Text.assemble(("run ", "dim"), inert(h.run_path)))
    if h.warnings:
        lines.append(Text(f"! {inert(h.warnings[-1])}", style="yellow"))
    for t in lines:
        t.no_wrap, t.overflow = True, "ellipsis"
    return lines


def verdict_text(figs: LiveFigures) -> Text:
    v = figs.verdict
    word = v.label.replace("-", " ").split(" ")[0]
    t = Text(v.label, style=VERDICT_STYLE.get(word, "bold"))
    if v.evidence:
        t.append(": " + v.evidence)
    return t


class _Styles:
    label = Style(dim=True)
    value = Style(bold=True)
    spark = Style(color="cyan")
    detail = Style(dim=True)
    alert = Style(color="red", bold=True)
    alert_label = Style(color="red")
    title = Style(bold=True)
    border = Style()
    failed = Style(color="red")
    unavailable = Style(color="yellow")


def _fit(text: str, width: int, right: bool = False) -> str:
    """text in exactly `width` cells: cut with an ellipsis, padded left or right."""
    if width <= 0:
        return ""
    if cell_len(text) > width:
        text = set_cell_size(text, width - 1) + "…" if width > 1 else "…"
    pad = width - cell_len(text)
    return " " * pad + text if right else text + " " * pad


def _panel_lines(p: PanelFigures, width: int, spark_w: int, ascii_only: bool) -> list[list[Segment]]:
    """A panel as rows of segments, exactly `width` cells each: borders, one row per figure."""
    bx = box.ASCII if ascii_only else box.ROUNDED
    inner = width - 4                           # border and one space each side
    S = _Styles
    title = f" {p.title} " if cell_len(p.title) + 2 <= width - 4 else _fit(f" {p.title}", max(0, width - 4))
    top = [Segment(bx.top_left + bx.top, S.border), Segment(title, S.title),
           Segment(bx.top * max(0, width - 3 - cell_len(title)) + bx.top_right, S.border)]
    lines = [top]
    left, right = Segment(bx.mid_left + " ", S.border), Segment(" " + bx.mid_right, S.border)

    def row(*parts: tuple[str, Style]) -> None:
        used = sum(cell_len(t) for t, _ in parts)
        segs = [left, *(Segment(t, st) for t, st in parts)]
        if used < inner:
            segs.append(Segment(" " * (inner - used)))
        segs.append(right)
        lines.append(segs)

    if p.status in ("failed", "unavailable"):
        row((_fit(p.status, inner), S.failed if p.status == "failed" else S.unavailable))
        for piece in _wrap(p.reason, inner)[:3]:
            row((_fit(piece, inner), S.detail))
    else:
        detail_w = inner - LABEL_W - VALUE_W - spark_w - 3
        for f in p.figures:
            row((_fit(f.label, LABEL_W), S.alert_label if f.alert else S.label), (" ", S.border),
                (_fit(fmt_value(f.value, f.unit), VALUE_W, right=True), S.alert if f.alert else S.value),
                (" ", S.border), (_fit(sparkline(f.history, f.scale, ascii_only), spark_w),
                                  S.alert if f.alert else S.spark),
                (" ", S.border), (_fit(f.detail, detail_w), S.detail))
        if p.status == "waiting":
            row((_fit("waiting for data", inner), S.detail))
        for note in p.notes:
            row((_fit(note, inner), S.detail))
    lines.append([Segment(bx.bottom_left + bx.bottom * (width - 2) + bx.bottom_right, S.border)])
    return lines


def _wrap(text: str, width: int) -> list[str]:
    words, out, cur = text.split(), [], ""
    for w in words:
        if cur and cell_len(cur) + 1 + cell_len(w) > width:
            out.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        out.append(cur)
    return out or [""]


def _process_lines(rows: list[ProcessRow], width: int, ascii_only: bool) -> list[list[Segment]]:
    p = PanelFigures("processes by CPU")
    lines = _panel_lines(p, width, 0, ascii_only)[:1]        # the top border
    bx = box.ASCII if ascii_only else box.ROUNDED
    inner = width - 4
    name_w = max(1, inner - 8 - 8 - 11 - 3)
    head = f"{_fit('PID', 8, True)} {_fit('CPU', 8, True)} {_fit('RSS', 11, True)} {_fit('COMMAND', name_w)}"
    body = [(head, _Styles.label)]
    for r in rows:
        body.append((f"{_fit(str(r.pid), 8, True)} {_fit(fmt_value(r.cpu_pct, 'percent'), 8, True)} "
                     f"{_fit(fmt_value(r.rss, 'bytes'), 11, True)} {_fit(inert(r.name), name_w)}", Style()))
    for text, style in body:
        text = _fit(text, inner)
        lines.append([Segment(bx.mid_left + " "), Segment(text, style), Segment(" " + bx.mid_right)])
    lines.append([Segment(bx.bottom_left + bx.bottom * (width - 2) + bx.bottom_right)])
    return lines


class Dashboard:
    """The full view as a rich renderable: header lines, then panels in rows of `cols`."""

    def __init__(self, figs: LiveFigures, h: Header, width: int,
                 processes: list[ProcessRow] | None = None, ascii_only: bool = False):
        self.figs, self.h, self.width = figs, h, width
        self.processes, self.ascii_only = processes, ascii_only

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = min(self.width, options.max_width)
        yield from _header_lines(self.h, verdict_text(self.figs), width)
        spark_w = spark_width(width)
        cols = 2 if width >= 2 * MIN_PANEL_W else 1
        widths = [width // cols + (1 if i < width % cols else 0) for i in range(cols)]
        blocks = [_panel_lines(p, widths[i % cols], spark_w, self.ascii_only)
                  for i, p in enumerate(self.figs.panels)]
        for i in range(0, len(blocks), cols):
            row = blocks[i:i + cols]
            height = max(len(b) for b in row)
            for j in range(height):
                for k, b in enumerate(row):
                    if j < len(b):
                        yield from b[j]
                    else:
                        yield Segment(" " * widths[k])
                yield Segment.line()
        if self.processes is not None:        # the process table: a row of its own, full width
            for line in _process_lines(self.processes, width, self.ascii_only):
                yield from line
                yield Segment.line()
        if self.figs.absent:                  # what this machine has not: one line for them all
            yield absent_text(self.figs, width)


def absent_text(figs: LiveFigures, width: int) -> Text:
    """'not here: nvml (no NVIDIA driver), neuron (no Neuron device)', cut to width."""
    t = Text.assemble(("not here: ", "dim"),
                      (", ".join(f"{a.name} ({a.why})" for a in figs.absent), "dim"))
    t.truncate(width, overflow="ellipsis")
    t.no_wrap, t.overflow = True, "ellipsis"
    return t


def full(figs: LiveFigures, h: Header, width: int, *, processes: list[ProcessRow] | None = None,
         ascii_only: bool = False) -> Dashboard:
    """The dashboard. figs must have been computed with points == spark_width(width)."""
    return Dashboard(figs, h, width, processes, ascii_only)


# -- small terminals --------------------------------------------------------------------

def headline_text(figs: LiveFigures) -> str:
    """'CPUs 1.00 · CPU 99.8% · RSS 10.4 MiB · gpu:0 util 95.0%': each panel's headline figures."""
    parts = []
    for p in figs.panels:
        prefix = "" if p.title in ("perf", "host") else f"{p.title} "
        for f in p.figures:
            if f.headline:
                parts.append(f"{prefix}{f.short} {fmt_value(f.value, f.unit)}")
    return " · ".join(parts)


def compact(figs: LiveFigures, h: Header, width: int) -> list[Text]:
    """Three lines for a terminal too small for the panels."""
    first = Text.assemble(("counterprof ", "bold cyan"), (fmt_elapsed(h.elapsed_s), "bold"),
                          (f"  {h.keys}" if h.keys else "", "dim"),
                          (f"  {h.run_path}" if h.run_path else "", "dim"))
    lines = [first, Text(headline_text(figs)), verdict_text(figs)]
    for t in lines:
        t.no_wrap, t.overflow = True, "ellipsis"
    return lines


def one_line(figs: LiveFigures, h: Header, width: int) -> list[Text]:
    t = Text.assemble((fmt_elapsed(h.elapsed_s) + " ", "bold"), verdict_text(figs))
    t.no_wrap, t.overflow = True, "ellipsis"
    return [t]


def plain_line(figs: LiveFigures, elapsed_s: float) -> str:
    """One line of text per interval (stderr is not a terminal): like `perf stat -I`."""
    return inert(f"{elapsed_s:10.3f} s  {headline_text(figs).replace(' · ', '  ')}  | {figs.verdict}")


# -- to terminal lines ------------------------------------------------------------------

def to_lines(renderable: RenderableType, width: int, color_system: ColorSystem | None,
             ascii_only: bool = False) -> list[str]:
    """Render to lines of text with ANSI styles, each at most `width` cells."""
    console = SafeConsole(file=io.StringIO(), width=width, force_terminal=color_system is not None,
                      color_system=color_system, legacy_windows=False, highlight=False,
                      emoji=False, markup=False, _environ={}, safe_box=ascii_only)
    with console.capture() as cap:
        console.print(renderable, crop=True, overflow="ellipsis", no_wrap=True)
    text = cap.get()
    if text.endswith("\n"):
        text = text[:-1]
    return text.split("\n")


def layout(figs_for: Callable[[int], LiveFigures], h: Header, width: int, max_rows: int,
           color_system: ColorSystem | None,
           processes: list[ProcessRow] | None = None, ascii_only: bool = False) -> tuple[str, list[str]]:
    """The largest form that fits: ("full" | "compact" | "line", lines). figs_for(points)
    computes the figures for a sparkline width (so they are computed once per frame)."""
    if width >= FULL_MIN_WIDTH:
        figs = figs_for(spark_width(width))
        lines = to_lines(full(figs, h, width, processes=processes, ascii_only=ascii_only),
                         width, color_system, ascii_only)
        over = len(lines) - max_rows
        if over > 0 and processes and len(processes) > over:
            # the process table takes the rows the panels leave (top): the busiest that fit
            lines = to_lines(full(figs, h, width, processes=processes[:len(processes) - over],
                                  ascii_only=ascii_only), width, color_system, ascii_only)
        if len(lines) <= max_rows:
            return "full", lines
    else:
        figs = figs_for(MIN_SPARK_W)
    if max_rows >= 3:
        return "compact", to_lines(Group(*compact(figs, h, width)), width, color_system, ascii_only)
    return "line", to_lines(Group(*one_line(figs, h, width)), width, color_system, ascii_only)
