"""The live view's memory of trace windows (torch's and jax's): the MFU of each window as it
comes in, and which framework traced it (a window with XLA ops: jax).

LiveWindow.write hands every spans batch here. A trace's batches arrive one after another from
the torch or jax collector, its `window` span last (collectors/*_trace: convert.py), and the
steps' spans before them (the steps file is swept first). When a window span arrives, the
trace's spans and the steps of its rank go through the same roofline as `counterprof roofline`
(ceilings: this host's `counterprof calibrate` cache, the ones a run copies into meta.json;
for a GPU without them, the datasheet): its MFU per step, against the measured and the
datasheet peak. Memory: one trace per rank being gathered, the last STEPS_KEPT step spans per
rank and the last WINDOWS_KEPT windows' figures.
"""
from __future__ import annotations

import socket
import threading
from collections import deque
from typing import Any
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

STEPS_KEPT = 512
WINDOWS_KEPT = 64
COLUMNS = ("start", "end", "name", "category", "kernel_class", "device", "pid", "tid", "correlation", "attrs")


def _this_host_ceilings() -> dict[str, Any]:
    from ..calibrate import cached
    return {"ceilings": cached() or None, "host": {"hostname": socket.gethostname()}}


class TraceMFU:
    """write(batch, rank) -> True when a trace window's MFU was added; windows: the newest
    last, each {"rank", "end_ns", "mfu": the roofline's mfu dict} (mfu None: no op with a
    cost model, or no shapes)."""

    def __init__(self, meta: Callable[[], dict[str, Any]] = _this_host_ceilings,
                 on_error: Callable[[str], None] | None = None):
        self._meta_of = meta
        self._meta: dict[str, Any] | None = None
        self._pending: dict[int, list[pa.Table]] = {}
        self._steps: dict[int, deque[pa.Table]] = {}
        self._lock = threading.Lock()
        self.windows: deque[dict[str, Any]] = deque(maxlen=WINDOWS_KEPT)
        self.on_error = on_error
        self.errors = 0

    def write(self, batch: pa.RecordBatch, rank: int | None = 0) -> bool:
        rank = rank or 0
        if "category" not in batch.schema.names:
            return False
        t = pa.Table.from_batches([batch]).select([c for c in COLUMNS if c in batch.schema.names])
        cat = t.column("category").cast(pa.string())
        steps = t.filter(pc.equal(cat, "step"))
        with self._lock:
            if steps.num_rows:
                kept = self._steps.setdefault(rank, deque(maxlen=STEPS_KEPT))
                for i in range(steps.num_rows):
                    kept.append(steps.slice(i, 1))
            rest = t.filter(pc.not_equal(cat, "step"))
            if not rest.num_rows:
                return False
            self._pending.setdefault(rank, []).append(rest)
            if not pc.any(pc.equal(rest.column("category").cast(pa.string()), "window")).as_py():
                return False
            parts = self._pending.pop(rank) + list(self._steps.get(rank, ()))
        try:
            spans = pa.concat_tables([p.cast(parts[0].schema) for p in parts]).unify_dictionaries()
            mfu = self._mfu(spans)
            ops = self._main_ops(spans)
        except Exception as exc:       # a figure of the view: its failure costs nothing else
            self.errors += 1
            if self.on_error is not None and self.errors == 1:
                self.on_error(f"live MFU left out: {type(exc).__name__}: {exc}")
            return False
        end = int(pc.max(rest.column("end").cast(pa.int64())).as_py())
        xla = pc.any(pc.equal(spans.column("category").cast(pa.string()), "xla_op")).as_py()
        with self._lock:
            self.windows.append({"rank": rank, "end_ns": end, "mfu": mfu,
                                 "framework": "jax" if xla else "torch", **ops})
        return True

    def _mfu(self, spans: pa.Table) -> dict[str, Any] | None:
        from ..analysis.roofline_run import spans_roofline
        if self._meta is None:
            self._meta = self._meta_of()
        return spans_roofline(spans, self._meta).mfu

    @staticmethod
    def _main_ops(spans: pa.Table) -> dict[str, float]:
        """The window's main-thread shares, as the report measures them over a traced step
        (signals.main_op_signals): in its own ops, and in op time the collectives caused. The
        live line carries the newest window's to the seconds after it, as the report carries
        the traced steps' to the untraced ones."""
        from ..analysis import signals
        if "device" not in spans.column_names:
            spans = spans.append_column("device", pa.nulls(spans.num_rows, pa.int32()))
        data = signals.RunData()
        signals.load_spans(data, spans, 0.0)
        if not data.main_ops or not data.windows:
            return {}
        return {k: s.value for k, s in signals.main_op_signals(data, data.windows).items()}

    def latest(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.windows)
