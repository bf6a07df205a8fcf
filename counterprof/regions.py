"""counterprof.region(): named intervals of the workload's own code, kept as spans.

    with counterprof.region("dataloader"):
        batch = next(it)

    @counterprof.region("forward")
    def forward(x): ...

Where the spans go:
- inside `counterprof.profile()` (an in-process session): to that session;
- inside a workload that `counterprof run` launched (it sets COUNTERPROF_RUN_DIR): to a
  journal of this process's own in the run directory's _ranks/rank=<RANK>/;
- anywhere else: nowhere (a region then costs two clock reads).

Spans are buffered and written at most once a second (and at exit), so a killed
workload loses at most the last second of regions.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .store.journal import JournalWriter

FLUSH_EVERY_NS = 1_000_000_000
ENV_RUN_DIR = "COUNTERPROF_RUN_DIR"
ENV_CLOCK_OFFSET = "COUNTERPROF_CLOCK_OFFSET_NS"


class _Recorder:
    """This process's buffered spans and where they are flushed to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: list[tuple[int, int, str, str, int, int]] = []
        self._sink: Callable[..., None] | None = None          # emit(table, batch) of a live session
        self._offset_ns = 0
        self._last_flush = 0
        self._env_checked = False
        self._journal: JournalWriter | None = None

    # -- where spans go -----------------------------------------------------------------

    def attach(self, emit: Callable[..., None], offset_ns: int) -> None:
        """An in-process session started: spans go to it, on its clock."""
        with self._lock:
            self._sink, self._offset_ns = emit, offset_ns

    def detach(self) -> None:
        self.flush()
        with self._lock:
            self._sink = None

    def _from_environment(self) -> None:
        """Inside a workload launched by `counterprof run`: a journal of our own."""
        self._env_checked = True
        run_dir = os.environ.get(ENV_RUN_DIR)
        if not run_dir or not os.path.isdir(run_dir):
            return
        from .ground.proctree import rank_from_env
        from .store.journal import JournalWriter
        from .store.rundir import rank_dir
        try:
            rank_path = rank_dir(Path(run_dir), rank_from_env())
            self._journal = JournalWriter(rank_path, f"regions{os.getpid()}-{os.urandom(2).hex()}")
        except OSError:
            return      # not writable: regions are dropped, the workload is not disturbed
        self._offset_ns = int(os.environ.get(ENV_CLOCK_OFFSET) or (time.time_ns() - time.monotonic_ns()))
        atexit.register(self.close)

    @property
    def active(self) -> bool:
        if self._sink is None and not self._env_checked:
            with self._lock:
                if not self._env_checked:
                    self._from_environment()
        return self._sink is not None or self._journal is not None

    # -- recording ----------------------------------------------------------------------

    def record(self, start_mono: int, end_mono: int, name: str, category: str) -> None:
        self._rows.append((start_mono, end_mono, name, category, os.getpid(), threading.get_native_id()))
        if end_mono - self._last_flush >= FLUSH_EVERY_NS:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
            self._last_flush = time.monotonic_ns()
            if not rows:
                return
            from .ground.schema import spans_batch
            off = self._offset_ns
            batch = spans_batch(
                start=[r[0] + off for r in rows], end=[r[1] + off for r in rows],
                name=[r[2] for r in rows], category=[r[3] for r in rows],
                pid=[r[4] for r in rows], tid=[r[5] for r in rows])
            if self._sink is not None:
                self._sink("spans", batch)
            elif self._journal is not None:
                self._journal.write("spans", batch)

    def close(self) -> None:
        self.flush()
        if self._journal is not None:
            self._journal.close()
            self._journal = None


recorder = _Recorder()


class region(contextlib.ContextDecorator):
    """A named interval of the workload; a context manager or a decorator. Nesting is fine."""

    def __init__(self, name: str, category: str = "region"):
        self.name = str(name)
        self.category = category
        self._starts = threading.local()

    def __enter__(self) -> region:
        stack = getattr(self._starts, "stack", None)
        if stack is None:
            stack = self._starts.stack = []
        stack.append(time.monotonic_ns())
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        end = time.monotonic_ns()
        start = self._starts.stack.pop()
        if recorder.active:
            recorder.record(start, end, self.name, self.category)
        return False
