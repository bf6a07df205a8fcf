"""render/console.py: inert() on any string, the width rule, and the console's safety net."""
from __future__ import annotations

import io
import re

from hypothesis import given, strategies as st
from rich.table import Table
from rich.text import Text

from counterprof.render.console import UNWRAPPED_WIDTH, console, inert, inert_lines, width_for

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


@given(st.text())
def test_inert_leaves_no_control_character_and_keeps_printable_text(s):
    out = inert(s)
    assert not CONTROL.search(out)
    if not CONTROL.search(s):
        assert out == s
    assert "\n" not in out and not CONTROL.search(inert_lines(s).replace("\n", ""))


def test_inert_writes_visible_escapes():
    assert inert("a\x1b[2J\x1b]0;T\x07\tb\nc\x9b") == "a\\x1b[2J\\x1b]0;T\\x07\\tb\\nc\\x9b"
    assert inert("foo[bar]") == "foo[bar]"


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_width_columns_then_terminal_then_unwrapped():
    assert width_for(_Stream(False), {"COLUMNS": "57"}) == 57
    assert width_for(_Stream(True), {"COLUMNS": "57"}) == 57
    assert width_for(_Stream(True), {}) is None
    assert width_for(_Stream(False), {}) == UNWRAPPED_WIDTH
    assert width_for(_Stream(False), {"COLUMNS": "x"}) == UNWRAPPED_WIDTH


def test_console_keeps_brackets_and_escapes_what_a_renderer_forgot():
    buf = _Stream(False)
    c = console(file=buf, environ={})
    t = Table(box=None)
    t.add_column("name")
    t.add_column("x")
    t.add_row("k[nvml]\x1b[2J", "1")          # a plain string cell: escaped before measuring
    c.print(t)
    c.print(Text("raw \x1b]0;T\x1b\\ end [b]not markup[/b]"))
    out = buf.getvalue()
    assert "k[nvml]\\x1b[2J  1" in out
    assert "\x1b" not in out and "[b]not markup[/b]" in out
