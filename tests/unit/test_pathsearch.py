"""pathsearch.which against shutil.which on the same PATHs: the files a shell would and would
not run (not executable, a directory, a dangling link, a link to a program)."""
from __future__ import annotations

import os
import shutil

import pytest

from counterprof.ground.pathsearch import which


@pytest.fixture
def path_dirs(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        d.mkdir()
    (a / "tool").write_text("#!/bin/sh\n")            # not executable: skipped
    (b / "tool").write_text("#!/bin/sh\n")
    (b / "tool").chmod(0o755)
    (a / "dirtool").mkdir()                           # a directory of that name: skipped
    (b / "dirtool").write_text("")
    (b / "dirtool").chmod(0o755)
    (a / "dangling").symlink_to(tmp_path / "nowhere")
    (c / "linked").symlink_to(b / "tool")
    return a, b, c


@pytest.mark.parametrize("name", ["tool", "dirtool", "dangling", "linked", "absent"])
def test_agrees_with_shutil(path_dirs, name):
    path = os.pathsep.join(str(d) for d in path_dirs)
    assert which(name, path) == shutil.which(name, path=path)


def test_the_first_match_on_path_wins(path_dirs):
    a, b, c = path_dirs
    (c / "tool").write_text("")
    (c / "tool").chmod(0o755)
    assert which("tool", f"{c}{os.pathsep}{b}") == str(c / "tool")


def test_a_name_with_a_slash_is_taken_as_given(path_dirs):
    _, b, _ = path_dirs
    assert which(str(b / "tool"), "") == str(b / "tool")
    assert which(str(b / "missing"), str(b)) is None


def test_an_empty_entry_is_the_current_directory(path_dirs, monkeypatch):
    _, b, _ = path_dirs
    monkeypatch.chdir(b)
    assert which("tool", os.pathsep) == os.path.join(os.curdir, "tool")


def test_an_empty_path_finds_nothing(path_dirs, monkeypatch):
    _, b, _ = path_dirs
    monkeypatch.chdir(b)
    assert which("tool", "") is None and shutil.which("tool", path="") is None
    monkeypatch.setenv("PATH", "")
    assert which("tool") is None


def test_path_from_the_environment(path_dirs, monkeypatch):
    _, b, _ = path_dirs
    monkeypatch.setenv("PATH", str(b))
    assert which("tool") == str(b / "tool")
