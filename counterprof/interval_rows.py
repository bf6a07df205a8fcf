"""`counterprof run -I MS`'s interval rows, printed as the run goes, as perf stat -I prints them:
a sink (sinks.py) that takes the perf collector's rows as the session emits them (within a
second of each interval's end: it asks for fresh rows) and writes one line per counter and
interval, the time in seconds since the run started.

    text   on stderr, perf stat -I's layout:  time  value  unit  event  # derived figure
    csv    `-x SEP -I MS`, on the machine-readable stream (stdout)
    json   `-j -I MS`, one JSON object a line, on the machine-readable stream
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from .render.perf_formats import INTERVAL_HEADER, IntervalRow

if TYPE_CHECKING:
    import pyarrow as pa

NS_EVENTS = {"task-clock", "cpu-clock"}      # counted in ns: printed in msec, as perf does


class IntervalPrinter:
    fresh_rows = True      # rows within a second, not held back for the spill (sinks.py)

    def __init__(self, stream: IO[str], form: str, start_ns: Callable[[], int], sep: str = ",") -> None:
        self.stream, self.form, self.sep = stream, form, sep
        self.start_ns = start_ns
        self._lock = threading.Lock()
        self._header = form == "text"
        self.rows = 0
        self.dropped = 0          # rows not printed: the stream was not being read
        # the lines go out on a thread of their own: a stream nobody reads (a full pipe) must
        # never hold up the session's writes of the rows themselves
        import queue
        self._out: queue.Queue[str | None] = queue.Queue(maxsize=256)
        self._writer: threading.Thread | None = None

    def write(self, table: str, batch: pa.RecordBatch, rank: int) -> None:
        if table != "samples" or batch.num_rows == 0:
            return
        import pyarrow as pa
        import pyarrow.compute as pc
        perf = batch.filter(pc.equal(batch.column("source"), "perf"))
        if perf.num_rows == 0:
            return
        times = perf.column("time").cast(pa.int64()).to_pylist()
        metrics = perf.column("metric").to_pylist()
        entities = perf.column("entity").to_pylist()
        values = perf.column("value").to_pylist()
        durations = perf.column("duration_ns").to_pylist()
        qualities = perf.column("quality").to_pylist()
        start = self.start_ns()
        # perf's rates are per second of task-clock: each interval's, per entity
        task: dict[tuple[int, str], float] = {}
        for t, m, e, v in zip(times, metrics, entities, values):
            if m == "task-clock" and v is not None:
                task[(t, e)] = v
        lines = []
        for t, m, e, v, d, q in sorted(zip(times, metrics, entities, values, durations, qualities),
                                       key=lambda r: r[0]):
            if v is None or t is None:
                continue
            event = m if e in ("process", "system", "", None) else f"{m} ({e})"
            row = IntervalRow((t - start) / 1e9, event, float(v), "ns" if m in NS_EVENTS else "",
                              float(d or 0.0), 1.0 if q is None else float(q), task.get((t, e)))
            lines.append(row.text() if self.form == "text" else
                         row.csv(self.sep) if self.form == "csv" else row.json())
        if not lines:
            return
        with self._lock:
            if self._header:
                lines.insert(0, INTERVAL_HEADER)
                self._header = False
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_out, name="counterprof-interval-rows",
                                                daemon=True)
                self._writer.start()
            try:
                self._out.put_nowait("\n".join(lines) + "\n")
                self.rows += len(lines)
            except Exception:                  # queue.Full: the reader is that far behind
                self.dropped += len(lines)

    def _write_out(self) -> None:
        while (text := self._out.get()) is not None:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):      # a closed pipe: the run goes on
                pass

    def close(self) -> None:
        """The lines queued go out (for up to 2 s: a stream nobody reads is not waited for)."""
        if self._writer is None:
            return
        try:
            self._out.put(None, timeout=2.0)
        except Exception:
            return
        self._writer.join(timeout=2.0)
        if self.dropped:
            try:
                self.stream.write(f"counterprof: {self.dropped:,} interval rows not printed: the stream was "
                                  "not read fast enough (the run's data is whole)\n")
            except (OSError, ValueError):
                pass
