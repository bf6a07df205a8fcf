"""Terminal control for the live view: a fixed region at the bottom, and keys in cbreak mode.

The dashboard lives in the bottom rows of the terminal; the rows above it are a scroll
region (DECSTBM) that the workload keeps writing to directly. Why this shape:
- the workload's stdout/stderr stay the terminal itself: nothing of its output passes
  through the profiler, so its buffering, colours, isatty() and \\r progress bars are
  unchanged, and a slow or stopped profiler can never block it;
- the region starts at row 1, so lines the workload scrolls off the top go to the
  terminal's scrollback as usual (terminals keep history only for a region at the top);
- each frame is one write(): the tty layer serializes it against the workload's writes,
  and the frame saves and restores the cursor (DECSC/DECRC, which also keep the
  workload's colours), so output never tears.
What it cannot survive: a workload that addresses the whole screen itself (curses, a
pager) or uses DECSC/DECRC; run those without --live.
"""
from __future__ import annotations

import atexit
import errno
import os
import select
import termios
import threading
import time
from typing import Any
from collections.abc import Callable

CSI = "\x1b["
SAVE, RESTORE = "\x1b7", "\x1b8"
MIN_WORKLOAD_ROWS = 3      # the workload keeps at least this many rows


def write_all(fd: int, data: bytes, timeout_s: float = 2.0) -> None:
    """Write everything, waiting (bounded) if someone made the shared tty non-blocking."""
    deadline = time.monotonic() + timeout_s
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
            view = view[n:]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            select.select([], [fd], [], left)
        except InterruptedError:
            continue


def terminal_size(fd: int) -> tuple[int, int] | None:
    """(columns, rows), or None when fd is no terminal."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return size.columns, size.lines


class BottomRegion:
    """The bottom `n` rows of a terminal, redrawn in place; the rows above scroll."""

    def __init__(self, fd: int):
        self.fd = fd
        self.size: tuple[int, int] | None = None   # (cols, rows) the region was laid out for
        self.n = 0
        self.shown: list[str] = []
        self.closed = False
        self._lock = threading.Lock()

    def max_rows(self, size: tuple[int, int]) -> int:
        return max(0, size[1] - MIN_WORKLOAD_ROWS)

    def show(self, lines: list[str], size: tuple[int, int]) -> None:
        """Draw `lines` (already at most size's width, at most max_rows(size) of them).
        The region never shrinks for the same size, so the workload's rows do not jump."""
        with self._lock:
            if self.closed:
                return
            out = []
            if size != self.size:
                out.append(self._relayout(size, max(len(lines), 1 if self.size is None else 0)))
            elif len(lines) > self.n:
                out.append(self._grow(len(lines), size))
            lines = lines[:self.n] + [""] * (self.n - len(lines))   # never below the screen
            cols, rows = size
            top = rows - self.n + 1
            changed = [(i, ln) for i, ln in enumerate(lines)
                       if i >= len(self.shown) or self.shown[i] != ln]
            if changed or out:
                buf = [SAVE, *out]
                for i, ln in (enumerate(lines) if out else changed):
                    buf.append(f"{CSI}{top + i};1H{CSI}0m{ln}{CSI}0m{CSI}K")
                buf.append(RESTORE)
                write_all(self.fd, "".join(buf).encode("utf-8", "replace"))
            self.shown = lines

    def _relayout(self, size: tuple[int, int], n: int) -> str:
        """First layout, or the terminal was resized: margins for n rows at the bottom."""
        cols, rows = size
        n = max(1, min(n, self.max_rows(size)))
        first = self.size is None
        self.size, self.n, self.shown = size, n, []
        if first:
            # make room: n newlines scroll the screen up if the cursor is near the bottom,
            # then go back up, so the workload starts where the shell's cursor was
            write_all(self.fd, ("\n" * n + f"{CSI}{n}A").encode())
            return f"{CSI}1;{rows - n}r{RESTORE}{SAVE}"
        # a resize moved things we cannot see: put the workload's cursor on a fresh line at
        # the bottom of its region (the scroll keeps its last line) and clear the dashboard rows
        return (f"{CSI}1;{rows - n}r{CSI}{rows - n};1H\n{SAVE}"
                f"{CSI}{rows - n + 1};1H{CSI}J")

    def _grow(self, n: int, size: tuple[int, int]) -> str:
        """More rows for the dashboard (laid out for `size` already): scroll the workload's
        region up to make them."""
        cols, rows = size
        n = min(n, self.max_rows(size))
        d = n - self.n
        if d <= 0:
            return ""
        old_bottom = rows - self.n
        self.n, self.shown = n, []
        # (the caller saved the cursor) scroll the old region up d lines, narrow it, and put
        # the workload's cursor back d lines higher, on the same text
        return (f"{CSI}{old_bottom};1H" + "\n" * d + f"{CSI}1;{rows - n}r{RESTORE}{CSI}{d}A{SAVE}"
                f"{CSI}{rows - n + 1};1H{CSI}J")

    def close(self) -> None:
        """Erase the dashboard and give the whole terminal back. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.size is None:
                return
            size = terminal_size(self.fd) or self.size
            cols, rows = size
            top = max(1, rows - self.n + 1)
            write_all(self.fd, f"{SAVE}{CSI}{top};1H{CSI}0m{CSI}J{CSI}r{RESTORE}".encode())


class KeyReader:
    """Keys from the controlling terminal, in cbreak mode (no echo, no line buffering,
    Ctrl-C still a signal), on a thread. The terminal is restored by close(), and at exit
    if close() was never reached."""

    def __init__(self, on_key: Callable[[str], None], path: str = "/dev/tty"):
        self.on_key = on_key
        self.path = path
        self.fd = -1
        self._saved: list[Any] | None = None      # the terminal's mode before cbreak
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def usable(path: str = "/dev/tty") -> bool:
        """A controlling terminal whose foreground is us (reading from the background
        would stop the profiler with SIGTTIN)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError:
            return False
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            return False
        finally:
            os.close(fd)

    def start(self) -> None:
        # our own open file description: O_NONBLOCK here does not touch the workload's stdin
        self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        self._saved = termios.tcgetattr(self.fd)
        mode = termios.tcgetattr(self.fd)
        mode[3] &= ~(termios.ICANON | termios.ECHO)
        mode[6][termios.VMIN] = 1
        mode[6][termios.VTIME] = 0
        termios.tcsetattr(self.fd, termios.TCSANOW, mode)
        atexit.register(self.restore)
        self._thread = threading.Thread(target=self._loop, name="counterprof-keys", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if not ready:
                    continue
                data = os.read(self.fd, 64)
            except BlockingIOError:      # the workload read it first
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return                   # the terminal went away (hang-up)
            if not data:
                return
            for ch in data.decode("utf-8", "replace"):
                try:
                    self.on_key(ch)
                except Exception:
                    pass

    def restore(self) -> None:
        if self._saved is not None and self.fd >= 0:
            try:
                termios.tcsetattr(self.fd, termios.TCSANOW, self._saved)
            except (OSError, termios.error):
                pass
            self._saved = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        self.restore()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            atexit.unregister(self.restore)
        except Exception:
            pass
