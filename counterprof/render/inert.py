"""inert(): a user- or system-supplied string made safe to print (see console.py for why).
Apart from the console so that a one-line message (`counterprof: ...` on stderr) costs no
import of rich.
"""
from __future__ import annotations

import re
from typing import Any

# every C0 control but none kept, DEL, and the C1 controls (U+0080-U+009F: CSI is U+009B)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_CONTROL_KEEP_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _escape_char(m: re.Match[str]) -> str:
    ch = m.group(0)
    return _NAMED.get(ch) or f"\\x{ord(ch):02x}"


def inert(value: Any) -> str:
    """`value` as text with every control character (ESC, BEL, CR, newline, tab, DEL, C1)
    written as a visible escape: safe to print anywhere, one line, width as printed."""
    text = value if isinstance(value, str) else str(value)
    return _CONTROL.sub(_escape_char, text)


def inert_lines(value: Any) -> str:
    """As inert(), but newlines are kept (a multi-line message)."""
    text = value if isinstance(value, str) else str(value)
    return _CONTROL_KEEP_NL.sub(_escape_char, text)
