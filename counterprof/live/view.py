"""The live view: a thread in the profiler process that draws the LiveWindow 4 times a second.

Two modes, chosen from where stderr goes:
  dashboard  stderr is a terminal we are in the foreground of: the bottom of the terminal
             (see terminal.BottomRegion), keys read in cbreak mode (q: stop profiling);
  lines      anything else (a pipe, a file, CI): one plain line per second on stderr,
             like `perf stat -I`.
The workload never runs any of this: it is only fed by the session's sink calls.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping

from . import render as R
from .figures import LiveFigures
from .frame import live_figures
from .processes import ProcessRow
from .terminal import BottomRegion, KeyReader, terminal_size, write_all
from .window import LiveWindow

if TYPE_CHECKING:
    from ..session import Session

REFRESH_S = 0.25          # at least 4 frames a second
LINE_S = 1.0              # one plain line a second when not on a terminal
FIRST_DRAW_S = 2.0        # longest wait for every collector's first batch before drawing


def choose_mode(fd: int = 2, environ: Mapping[str, str] = os.environ) -> str:
    if environ.get("TERM", "") == "dumb" or not os.isatty(fd) or terminal_size(fd) is None:
        return "lines"
    if not KeyReader.usable():
        return "lines"      # in the background of a shell: do not take over its terminal
    return "dashboard"


def color_system(environ: Mapping[str, str] = os.environ) -> R.ColorSystem | None:
    if "NO_COLOR" in environ:
        return None
    if environ.get("COLORTERM") in ("truecolor", "24bit"):
        return "truecolor"
    term = environ.get("TERM", "")
    if "256" in term or term.startswith(("tmux", "screen")):
        return "256"
    return "standard"


class LiveView:
    """Draws `window`; `statuses()`/`catalog()` are read each frame (the session's live
    dicts). on_quit is called (from the key thread) when q is pressed."""

    def __init__(self, window: LiveWindow, *, title: str, run_path: str | None,
                 catalog: Callable[[], Mapping[str, Any]], statuses: Callable[[], Mapping[str, Any]],
                 on_quit: Callable[[], None] | None = None, keys_hint: str = "q stops profiling, t traces 3 steps",
                 scope: str = "process", cpus: int | None = None, perf_system_wide: bool = False,
                 processes: Callable[[], list[ProcessRow] | None] | None = None,
                 mode: str | None = None, fd: int = 2, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self.title, self.run_path = title, run_path
        self.catalog, self.statuses = catalog, statuses
        self.on_quit = on_quit
        self.keys_hint = keys_hint
        self.scope, self.cpus, self.perf_system_wide = scope, cpus, perf_system_wide
        self.processes = processes
        self.fd = fd
        self.mode = mode or choose_mode(fd)
        self.clock = clock
        self.started_at = clock()
        self.warnings: list[str] = []
        self.quit_requested = threading.Event()
        self.frames = 0
        self.form = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._region: BottomRegion | None = None
        self._keys: KeyReader | None = None
        self._ascii = not (sys.stderr.encoding or "").lower().replace("-", "").startswith("utf")
        self._colors = color_system()
        self._last_key = None
        self._closed = False
        self.frame_cpu_s = 0.0
        self.waiting = True       # some collector has not sent anything yet

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.started_at = self.clock()
        if self.mode == "dashboard":
            self._region = BottomRegion(self.fd)
            try:
                self._keys = KeyReader(self._key)
                self._keys.start()
            except OSError:
                self._keys = None
                self.keys_hint = ""
        target = self._dashboard_loop if self.mode == "dashboard" else self._lines_loop
        self._thread = threading.Thread(target=target, name="counterprof-live", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop drawing, give the terminal back (keys, region), print what was held back.
        Idempotent; safe on every exit path."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        if self._keys is not None:
            self._keys.close()
        if self._region is not None:
            self._region.close()
        if self.mode == "dashboard":
            for w in self.warnings:      # shown one at a time while live; all of them now
                write_all(self.fd, f"counterprof: {w}\n".encode("utf-8", "replace"))

    def facts(self) -> dict[str, Any]:
        """What meta.json records about the view (after close): its mode and its own cost."""
        return {"mode": self.mode, "frames": self.frames, "cpu_s": round(self.frame_cpu_s, 6),
                "rows_seen": self.window.rows_seen}

    def warn(self, message: str) -> None:
        """A warning while the view is up (printing it would tear the dashboard)."""
        self.warnings.append(message)
        if self.mode == "lines":
            write_all(self.fd, f"counterprof: {message}\n".encode("utf-8", "replace"))

    def _key(self, ch: str) -> None:
        if ch in ("q", "Q") and not self.quit_requested.is_set():
            self.quit_requested.set()
            if self.on_quit is not None:
                self.on_quit()
        elif ch in ("t", "T") and self.run_path:
            self.warn(self._ask_trace())

    def _ask_trace(self) -> str:
        """t: every process of the job traces its next ASK_STEPS steps (`counterprof trace`);
        the answers are in the run (the report lists them)."""
        from pathlib import Path

        from ..store import control
        run = Path(str(self.run_path))
        if not control.drivers(run):
            return "t: no process of the job has the torch driver to ask (run it with --torch)"
        try:
            doc = control.new_ask([run], ASK_STEPS, None, "live view")
            control.write_ask(run, doc)
        except OSError as exc:
            return f"t: could not ask for a trace: {exc}"
        start = f" from step {doc['start_step']}" if doc["start_step"] is not None else ""
        return f"t: asked every process for {ASK_STEPS} steps{start} (ask {doc['id']}; `counterprof report` lists it)"

    # -- frames --------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def figures(self, points: int) -> LiveFigures:
        return live_figures(self.window.snapshot(), self.catalog(), self.statuses(), points,
                            scope=self.scope, cpus=self.cpus, perf_system_wide=self.perf_system_wide)

    def header(self) -> R.Header:
        keys = self.keys_hint if self.mode == "dashboard" else ""
        return R.Header(self.title, self.elapsed(), self.run_path, keys, list(self.warnings))

    def frame(self, size: tuple[int, int], max_rows: int) -> tuple[str, list[str]]:
        """(form, lines) for a terminal of `size` (cols, rows) with max_rows for us."""
        procs = self.processes() if self.processes is not None else None
        computed: list[LiveFigures] = []

        def figures_for(points: int) -> LiveFigures:
            computed.append(self.figures(points))
            return computed[-1]

        form, lines = R.layout(figures_for, self.header(), size[0], max_rows, self._colors,
                               processes=procs, ascii_only=self._ascii)
        self.waiting = any(p.status == "waiting" for p in computed[-1].panels)
        return form, lines

    def _dashboard_loop(self) -> None:
        region = self._region
        if region is None:        # start() makes it in dashboard mode
            return
        last_key = None
        t0 = time.thread_time()
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                size = terminal_size(self.fd)
                if size is not None and region.max_rows(size) >= 1:
                    # rebuild only when something shown could have changed: new data, the
                    # second of the clock, the size, a warning, the process table
                    procs = self.processes() if self.processes is not None else None
                    key = (self.window.version, int(self.elapsed()), size, len(self.warnings), procs)
                    if key != last_key:
                        last_key = key
                        self.form, lines = self.frame(size, region.max_rows(size))
                        # the first draw reserves the rows: wait (briefly) until every
                        # collector has said something, so the region does not grow later
                        # and push the workload's first lines up
                        if region.size is not None or not self.waiting or self.elapsed() >= FIRST_DRAW_S:
                            region.show(lines, size)
                            self.frames += 1
                        else:
                            last_key = None
                next_at += REFRESH_S
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except Exception as exc:   # never take the profiler down: fall back to nothing
            self.warnings.append(f"live view stopped: {type(exc).__name__}: {exc}")
        finally:
            self.frame_cpu_s = time.thread_time() - t0

    def _lines_loop(self) -> None:
        t0 = time.thread_time()
        next_at = time.monotonic() + LINE_S
        try:
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                next_at += LINE_S
                at = self.elapsed()     # the time of the wake-up, not after the figures' work
                line = R.plain_line(self.figures(0), at)
                write_all(self.fd, f"counterprof: {line}\n".encode("utf-8", "replace"))
                self.frames += 1
        except Exception as exc:
            self.warnings.append(f"live view stopped: {type(exc).__name__}: {exc}")
        finally:
            self.frame_cpu_s = time.thread_time() - t0


ASK_STEPS = 3       # what t asks for (`counterprof trace RUN --steps N` asks for any number)


def for_session(session: Session, window: LiveWindow, title: str, **kw: Any) -> LiveView:
    """A view of a Session's window: its catalog and collector statuses read live."""
    return LiveView(window, title=title, run_path=str(session.path),
                    catalog=lambda: dict(session.metrics),
                    statuses=lambda: dict(session.statuses),
                    perf_system_wide=session.target.system_wide, **kw)
