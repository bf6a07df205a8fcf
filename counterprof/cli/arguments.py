"""Argument sets that several subcommands share (not a subcommand itself)."""
from __future__ import annotations

from .common import ArgumentParser


def run_output_parser(prog: str, doc: str, json_help: str, html_help: str) -> ArgumentParser:
    """The parser of a subcommand that reads one run and prints it (--json) or writes a page
    (--html): `report` and `roofline`."""
    p = ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("run", help="run directory")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--html", metavar="FILE", help=html_help)
    return p
