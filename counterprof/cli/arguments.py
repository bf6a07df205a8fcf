"""Argument sets that several subcommands share (not a subcommand itself)."""
from __future__ import annotations

from .common import ArgumentParser

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def ceilings_option(p: ArgumentParser) -> None:
    """--ceilings FILE: hold the run to another calibration (`roofline`, `collectives`)."""
    p.add_argument("--ceilings", metavar="FILE", help="ceilings JSON (`counterprof calibrate --json` output)")


def ceilings_from(p: ArgumentParser, path: str | None) -> dict[str, Any] | None:
    """The documents of --ceilings FILE (None without it); a file that cannot be read is a
    usage error that says why, before any work is done."""
    if not path:
        return None
    from ..calibrate import load_file
    from .common import UsageFailure
    try:
        return load_file(path)
    except (OSError, ValueError) as exc:
        raise UsageFailure(f"--ceilings {path}: {exc}", p.format_usage()) from None


def run_output_parser(prog: str, doc: str, json_help: str, html_help: str) -> ArgumentParser:
    """The parser of a subcommand that reads one run and prints it (--json) or writes a page
    (--html): `report` and `roofline`."""
    p = ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("run", help="run directory")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--html", metavar="FILE", help=html_help)
    return p


def output_path(hint: str) -> Callable[[str], str]:
    """An argparse type for -o DIR: refuses "" (an unset shell variable: `-o "$OUT"`), which
    every path function reads as the current directory, so a run would be written into it.
    hint: what to give instead, said after the reason."""
    import argparse

    def check(text: str) -> str:
        if text == "":
            raise argparse.ArgumentTypeError(
                f"an empty path was given (an unset shell variable?); {hint} (. for the current "
                "directory)")
        return text
    check.__name__ = "path"        # argparse names the type in its own messages
    return check
