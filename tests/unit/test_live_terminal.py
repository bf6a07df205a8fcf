"""The terminal layer: the bottom region's escape sequences, and keys read in cbreak mode
from a real pty. (What a terminal makes of it is tested through tmux in
tests/integration/test_live.py.)"""
from __future__ import annotations

import os
import pty
import termios
import threading

import pytest

from counterprof.live.view import choose_mode, color_system
from counterprof.live.terminal import BottomRegion, KeyReader

CSI = "\x1b["


def drain(fd: int) -> str:
    os.set_blocking(fd, False)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return out.decode()
        if not chunk:
            return out.decode()
        out += chunk


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def line(row: int, text: str) -> str:
    return f"{CSI}{row};1H{CSI}0m{text}{CSI}0m{CSI}K"


def test_first_frame_makes_room_and_sets_the_scroll_region(pipe):
    r, w = pipe
    region = BottomRegion(w)
    region.show(["one", "two"], (80, 24))
    assert drain(r) == ("\n\n" + f"{CSI}2A"                         # room below the cursor
                        + "\x1b7" + f"{CSI}1;22r" + "\x1b8\x1b7"     # rows 1-22 scroll, cursor kept
                        + line(23, "one") + line(24, "two") + "\x1b8")


def test_only_changed_lines_are_rewritten_in_one_write(pipe):
    r, w = pipe
    region = BottomRegion(w)
    region.show(["one", "two"], (80, 24))
    drain(r)
    region.show(["one", "2"], (80, 24))
    assert drain(r) == "\x1b7" + line(24, "2") + "\x1b8"
    region.show(["one", "2"], (80, 24))
    assert drain(r) == ""


def test_growing_scrolls_the_workload_up_instead_of_covering_it(pipe):
    r, w = pipe
    region = BottomRegion(w)
    region.show(["a"], (80, 24))
    drain(r)
    region.show(["a", "b", "c"], (80, 24))
    out = drain(r)
    # from the old bottom of the scroll region, two newlines scroll its text up two rows;
    # the region shrinks to rows 1-21; the workload's cursor goes back up the same two rows
    assert out.startswith("\x1b7" + f"{CSI}23;1H\n\n{CSI}1;21r\x1b8{CSI}2A\x1b7{CSI}22;1H{CSI}J")
    assert out.endswith(line(22, "a") + line(23, "b") + line(24, "c") + "\x1b8")
    region.show(["a"], (80, 24))                 # fewer lines: the region keeps its size
    assert region.n == 3 and drain(r) == "\x1b7" + line(23, "") + line(24, "") + "\x1b8"


def test_resize_lays_out_again_and_never_takes_the_workloads_last_rows(pipe):
    r, w = pipe
    region = BottomRegion(w)
    region.show(["a", "b"], (80, 24))
    drain(r)
    region.show(["x"] * 10, (40, 8))
    out = drain(r)
    assert region.n == 5                            # 8 rows - 3 kept for the workload
    assert f"{CSI}1;3r{CSI}3;1H\n" in out           # the workload's cursor on a fresh line
    assert out.count(f"{CSI}0mx{CSI}0m") == 5


def test_close_erases_and_resets_the_scroll_region(pipe):
    r, w = pipe
    region = BottomRegion(w)
    region.show(["a", "b"], (80, 24))
    drain(r)
    region.close()
    assert drain(r) == f"\x1b7{CSI}23;1H{CSI}0m{CSI}J{CSI}r\x1b8"
    region.close()
    region.show(["late"], (80, 24))
    assert drain(r) == ""


def test_keys_in_cbreak_mode_and_the_terminal_restored():
    master, slave = pty.openpty()
    try:
        before = termios.tcgetattr(slave)
        got, seen_q = [], threading.Event()

        def on_key(ch):
            got.append(ch)
            if ch == "q":
                seen_q.set()

        keys = KeyReader(on_key, path=os.ttyname(slave))
        keys.start()
        mode = termios.tcgetattr(slave)
        assert not mode[3] & termios.ICANON and not mode[3] & termios.ECHO
        assert mode[3] & termios.ISIG                      # Ctrl-C is still a signal
        os.write(master, b"xq")                            # no Enter needed
        assert seen_q.wait(5)
        assert got == ["x", "q"]
        keys.close()
        assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)


def test_mode_and_colours_from_the_environment(pipe):
    r, w = pipe
    assert choose_mode(w) == "lines"                         # a pipe
    master, slave = pty.openpty()
    try:
        assert choose_mode(slave, {"TERM": "dumb"}) == "lines"
    finally:
        os.close(master)
        os.close(slave)
    assert color_system({"NO_COLOR": "1", "TERM": "xterm-256color"}) is None
    assert color_system({"TERM": "tmux-256color"}) == "256"
    assert color_system({"COLORTERM": "truecolor"}) == "truecolor"
