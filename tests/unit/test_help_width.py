"""The CLI's help width is argparse's own (shutil.get_terminal_size, less 2), found without
importing shutil: the same help text, whatever COLUMNS says."""
from __future__ import annotations

import argparse
import shutil

import pytest

from counterprof.cli.common import help_width
from counterprof.cli.run import build_parser


@pytest.mark.parametrize("columns", [None, "120", "37", "0", "-4", "wide", ""])
def test_the_width_is_argparses(monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert help_width() == shutil.get_terminal_size().columns - 2


@pytest.mark.parametrize("columns", ["60", "200"])
def test_run_help_is_what_argparse_would_print(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    ours = build_parser()
    plain = build_parser()
    plain._get_formatter = lambda: plain.formatter_class(prog=plain.prog)   # argparse's width
    assert isinstance(ours.formatter_class(prog="x"), argparse.HelpFormatter)
    assert ours.format_help() == plain.format_help()
