"""`counterprof list` on a terminal: the collectors table, then each collector's own tables."""
from __future__ import annotations

from typing import Any


def print_inventory(collectors: list[dict[str, Any]]) -> None:
    """collectors as counterprof.inventory.collector_inventory gives them, on stdout."""
    from rich.table import Table
    from rich.text import Text

    from .console import console as text_console, inert
    console = text_console()
    t = Table(title="collectors", title_justify="left", box=None, pad_edge=False)
    for col in ("name", "here", "why not"):
        t.add_column(col)
    for c in collectors:
        here = Text("available", "green") if c["available"] else Text("unavailable", "yellow")
        t.add_row(inert(c["name"]), here, inert(c["reason"]))
    console.print(t)
    for c in collectors:
        for table in c["tables"]:
            console.print()
            t = Table(title=f"{c['name']}: {table['title']}", title_justify="left", box=None,
                      pad_edge=False)
            for col in table["columns"]:
                t.add_column(col, overflow="fold")
            for row in table["rows"]:
                t.add_row(*[Text(inert(x)) for x in row])
            console.print(t)
            if table.get("note"):
                console.print(table["note"])
