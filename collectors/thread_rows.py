"""The threads collector's rows, kept as columns until they are emitted (once a second).

A walk gives 9 rows (each role's running and runnable seconds, the intra-op and loader counts),
a reading of the critical thread 3 (running, runnable, blocked). Riding the sampler's tick, a
second brings ~10 of each: built as numpy columns, not as ~120 Python tuples, that drain took
~550 µs of CPU a second at -I 100, more than perf's own.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from counterprof.schema import samples_from_columns

MAIN, INTRAOP, LOADER, COMM, OTHER, EXCLUDED = range(6)

# a walk's rows, in order: (metric, taken from run or wait by role, or a count; has a duration)
WALK_COLUMNS = [
    ("thread.intraop.running", "run", INTRAOP), ("thread.intraop.runnable", "wait", INTRAOP),
    ("thread.loader.running", "run", LOADER), ("thread.loader.runnable", "wait", LOADER),
    ("thread.comm.running", "run", COMM),
    ("thread.other.running", "run", OTHER), ("thread.other.runnable", "wait", OTHER),
    ("thread.intraop.count", "intraop", None), ("thread.loader.workers", "loaders", None),
]
MAIN_COLUMNS = ["thread.main.running", "thread.main.runnable", "thread.main.blocked"]
_NAMES = [name for name, _src, _role in WALK_COLUMNS] + MAIN_COLUMNS
_WALK_IDX = np.arange(len(WALK_COLUMNS), dtype=np.int32)
_WALK_TIMED = np.array([src in ("run", "wait") for _n, src, _r in WALK_COLUMNS])
_MAIN_IDX = np.arange(len(WALK_COLUMNS), len(_NAMES), dtype=np.int32)


class ThreadRows:
    """Pending rows as chunks of columns: (time, duration, has duration, metric index, entity,
    value), one chunk per call, in the order they were taken."""

    def __init__(self, source: str):
        self._source = pa.array([source], pa.string())
        self._metrics = pa.array(_NAMES, pa.string())
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str, np.ndarray]] = []

    def walks(self, time_ns: np.ndarray, duration_ns: np.ndarray, run_by: np.ndarray, wait_by: np.ndarray,
              intraop: np.ndarray, loaders: np.ndarray) -> None:
        """n walks: time and duration (n), run and wait seconds by role (n x roles), counts (n)."""
        n = len(time_ns)
        if n == 0:
            return
        k = len(WALK_COLUMNS)
        roles = run_by.shape[1]
        # run by role, wait by role, the two counts side by side; the walk's columns picked from them
        pick = [role if src == "run" else roles + role if src == "wait" else 2 * roles + (src == "loaders")
                for _name, src, role in WALK_COLUMNS]
        values = np.column_stack([run_by, wait_by, intraop, loaders])[:, pick]
        self._chunks.append((np.repeat(np.asarray(time_ns, np.int64), k),
                             np.repeat(np.asarray(duration_ns, np.int64), k),
                             np.tile(_WALK_TIMED, n), np.tile(_WALK_IDX, n), "process", values.ravel()))

    def main_readings(self, time_ns: np.ndarray, run_ns: np.ndarray, wait_ns: np.ndarray,
                      prev: tuple[int, int, int], entity: str) -> None:
        """The critical thread's readings after `prev` (time, run, wait ns of the reading
        before), each the change since the one before it; blocked is what is neither."""
        if len(time_ns) == 0:
            return
        t = np.concatenate(([prev[0]], time_ns)).astype(np.int64)
        duration = np.diff(t)
        run = np.maximum(0, np.diff(np.concatenate(([prev[1]], run_ns)).astype(np.int64))) / 1e9
        wait = np.maximum(0, np.diff(np.concatenate(([prev[2]], wait_ns)).astype(np.int64))) / 1e9
        blocked = np.maximum(0.0, duration / 1e9 - run - wait)
        n = len(duration)
        self._chunks.append((np.repeat(t[1:], 3), np.repeat(duration, 3), np.ones(3 * n, bool),
                             np.tile(_MAIN_IDX, n), entity, np.column_stack([run, wait, blocked]).ravel()))

    def take(self) -> pa.RecordBatch | None:
        """Everything pending as one samples batch (None if nothing), and the chunks cleared."""
        chunks, self._chunks = self._chunks, []
        if not chunks:
            return None
        entities = list(dict.fromkeys(c[4] for c in chunks))
        at = {e: i for i, e in enumerate(entities)}
        time_ns = np.concatenate([c[0] for c in chunks])
        timed = np.concatenate([c[2] for c in chunks])
        duration = np.where(timed, np.concatenate([c[1] for c in chunks]), 0)
        entity_idx = np.concatenate([np.full(len(c[0]), at[c[4]], np.int32) for c in chunks])
        return samples_from_columns(
            len(time_ns), time_ns, duration, np.packbits(timed, bitorder="little"), self._source,
            np.concatenate([c[3] for c in chunks]), self._metrics, entity_idx, pa.array(entities, pa.string()),
            np.concatenate([c[5] for c in chunks]).astype(np.float64))
