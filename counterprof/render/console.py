"""Text that survives terminals, pipes, files and CI logs: the one place that makes a
user- or system-supplied string safe to print, and the one Console every text renderer
prints through.

Why each rule:
- inert(): names come from workloads (regions, kernels, commands, process command lines,
  collector reasons). A name holding ESC or BEL could clear the screen, retitle the window
  or hide lines when printed; every control character is shown as a visible escape
  (`\\x1b`) instead, so the name still reads as what it is.
- markup off: rich's markup eats `[...]` (the nvml hint `pip install 'counterprof[nvml]'`,
  a region `foo[bar]`). counterprof's renderers style through Text objects, never markup
  strings, so the console turns markup off for everything it prints.
- width: rich wraps at 80 columns whenever the stream is not a terminal, which wrecks tables
  in `report RUN > r.txt` and CI logs. COLUMNS is honoured when set; otherwise a terminal's
  own width, and no wrapping at all (a very wide console) elsewhere.
- colour: NO_COLOR (set and not empty, https://no-color.org) turns colours off, as does a stream that
  is not a terminal; FORCE_COLOR is left to rich.
"""
from __future__ import annotations

import os
import re
import sys
from typing import IO, Any, cast
from collections.abc import Iterable, Mapping

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

from .inert import _CONTROL_KEEP_NL, inert as inert, inert_lines as inert_lines  # (re-exported)

# "no wrapping": wider than any line counterprof prints; tables are sized to their content
UNWRAPPED_WIDTH = 100_000


def width_for(stream: IO[str], environ: Mapping[str, str] = os.environ) -> int | None:
    """The width to lay text out at on `stream`: COLUMNS when set, the terminal's own when
    it is one (None: rich asks the terminal), else UNWRAPPED_WIDTH."""
    cols = environ.get("COLUMNS", "").strip()
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    return None if _isatty(stream) else UNWRAPPED_WIDTH


class SafeConsole(Console):
    """A Console whose printed text can hold no control character of its own: whatever a
    renderer forgot to pass through inert() is escaped here (rich's own styles and cursor
    moves are not text segments and are untouched). Plain strings (table cells) are escaped
    before they are measured, so columns stay aligned; a Text object is escaped only as it is
    drawn, after its width was taken, so renderers pass names through inert() themselves."""

    def render_str(self, text: str, **kw: Any) -> Text:
        return super().render_str(inert_lines(text), **kw)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None
               ) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if not seg.control and _CONTROL_KEEP_NL.search(seg.text):
                seg = Segment(inert_lines(seg.text), seg.style, seg.control)
            yield seg


class _TrimmedLines:
    """A text stream that drops the spaces rich pads table rows with at the end of each line
    (in a file or a CI log they only make diffs noisy); the rest passes through."""

    _TRAILING = re.compile(r" +(?=\n)")

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(self._TRAILING.sub("", text))

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8") or "utf-8"


def console(stderr: bool = False, file: IO[str] | None = None,
            environ: Mapping[str, str] = os.environ, **kw: Any) -> Console:
    """The Console every text renderer of counterprof prints through (stdout, or stderr)."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    options: dict[str, Any] = dict(highlight=False, markup=False, emoji=False,
                                   no_color=environ.get("NO_COLOR", "") != "")
    options.update(kw)
    if "width" not in options:
        options["width"] = width_for(stream, environ)
    if not _isatty(stream) and "FORCE_COLOR" not in environ:
        # rich writes to a file through write, flush, isatty, fileno and encoding only
        file = cast(IO[str], _TrimmedLines(stream))
    return SafeConsole(file=file, stderr=stderr and file is None, **options)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
