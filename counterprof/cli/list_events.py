"""counterprof list: which collectors work on this machine and why not, and what each
offers here (the perf collector tries every event for real: opened disabled on this
process, then closed, so "supported" means this kernel, PMU and setting accept it).
"""
from __future__ import annotations

import json

from .common import ArgumentParser, guarded


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    p = ArgumentParser(prog="counterprof list", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    args = p.parse_args(argv)

    from ..collector import registry
    collectors = []
    for name, cls in sorted(registry().items()):
        entry = {"name": name, "available": False, "reason": "", "tables": []}
        collectors.append(entry)
        if isinstance(cls, Exception):
            entry["reason"] = str(cls)
            continue
        try:
            avail = cls.availability({})
            entry.update(available=avail.ok, reason=avail.reason)
            if avail.ok:
                entry["tables"] = cls.inventory({})
        except Exception as exc:   # one broken collector must not hide the others
            entry["reason"] = f"check failed: {type(exc).__name__}: {exc}"

    if args.json:
        print(json.dumps({"collectors": collectors}, indent=2))
        return 0

    from rich.table import Table
    from rich.text import Text
    from ..render.console import console as text_console, inert
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
    return 0
