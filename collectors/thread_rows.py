"""The threads collector's rows, kept as columns until they are emitted (once a second).

A walk gives 9 rows (each role's running and runnable seconds, the intra-op and loader counts),
a reading of the critical thread 3 (running, runnable, blocked). Riding the sampler's tick, a
second brings ~10 of each: built as numpy columns, not as ~120 Python tuples, that drain took
~550 µs of CPU a second at -I 100, more than perf's own.

The critical thread's three states add up to each row's interval: schedstat's run and wait are
exact over the run but accounted late (a run-queue wait when it ends, a running thread's time at
the scheduler's tick), so one interval's changes can exceed its length and the one before fall
short. The rows are settled when taken (settle): the excess goes back into the pending intervals
before it, what finds no room there forward into the next ones (main_states), so running and
runnable keep schedstat's totals and blocked is only what neither holds.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from counterprof.ground.schema import samples_from_columns

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

# a chunk: (time, duration, has duration, metric index, entity, value)
_Chunk = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str, np.ndarray]
_Reading = tuple[int, int, int]          # (time, run, wait ns)
# a critical thread's pending readings: (chunk index, entity, the reading before, the last
# reading, duration, run, wait ns per interval)
_Main = tuple[int, str, _Reading, _Reading, np.ndarray, np.ndarray, np.ndarray]


class ThreadRows:
    """Pending rows as chunks of columns: (time, duration, has duration, metric index, entity,
    value), one chunk per call, in the order they were taken."""

    def __init__(self, source: str):
        self._source = pa.array([source], pa.string())
        self._metrics = pa.array(_NAMES, pa.string())
        self._chunks: list[_Chunk | None] = []     # None: dropped (settle_until)
        # the critical threads' pending readings: (chunk index, entity, the reading before, the
        # last reading, duration, run, wait ns per interval); their values are set by take()
        self._main: list[_Main] = []
        # per entity: its last reading taken (time, run, wait ns) and the (run, wait) ns carried past it
        self._carry: dict[str, tuple[_Reading, tuple[int, int]]] = {}
        self.settled: dict[str, tuple[_Reading, tuple[int, int]]] = {}   # by the last take

    def walks(self, time_ns: np.ndarray, duration_ns: np.ndarray, run_by: np.ndarray, wait_by: np.ndarray,
              intraop: np.ndarray, loaders: np.ndarray) -> None:
        """n walks: time and duration (n), run and wait seconds by role (n x roles), counts (n)."""
        n = len(time_ns)
        if n == 0:
            return
        k = len(WALK_COLUMNS)
        roles = run_by.shape[1]
        # run by role, wait by role, the two counts side by side; the walk's columns picked from them
        # (the counts have no role)
        pick = [2 * roles + (src == "loaders") if role is None else role if src == "run" else roles + role
                for _name, src, role in WALK_COLUMNS]
        values = np.column_stack([run_by, wait_by, intraop, loaders])[:, pick]
        self._chunks.append((np.repeat(np.asarray(time_ns, np.int64), k),
                             np.repeat(np.asarray(duration_ns, np.int64), k),
                             np.tile(_WALK_TIMED, n), np.tile(_WALK_IDX, n), "process", values.ravel()))

    def main_readings(self, time_ns: np.ndarray, run_ns: np.ndarray, wait_ns: np.ndarray,
                      prev: tuple[int, int, int], entity: str) -> None:
        """The critical thread's readings after `prev` (time, run, wait ns of the reading
        before), each the change since the one before it; blocked is what is neither.

        Running + runnable + blocked is each row's interval, exactly (settle): the values are
        worked out when the rows are taken, so that what schedstat accounts in an interval beyond
        its length goes back into the pending intervals before it, where it happened, and what
        finds no room there forward into the next ones. Readings that follow on from the
        entity's last ones (prev is that reading) continue its carry; others start afresh."""
        if len(time_ns) == 0:
            return
        t = np.concatenate(([prev[0]], time_ns)).astype(np.int64)
        duration = np.diff(t)
        run = np.maximum(0, np.diff(np.concatenate(([prev[1]], run_ns)).astype(np.int64)))
        wait = np.maximum(0, np.diff(np.concatenate(([prev[2]], wait_ns)).astype(np.int64)))
        n = len(duration)
        last = (int(t[-1]), int(run_ns[-1]), int(wait_ns[-1]))
        self._main.append((len(self._chunks), entity, (int(prev[0]), int(prev[1]), int(prev[2])), last, duration,
                           run, wait))
        self._chunks.append((np.repeat(t[1:], 3), np.repeat(duration, 3), np.ones(3 * n, bool),
                             np.tile(_MAIN_IDX, n), entity, np.zeros(3 * n)))

    def carried_s(self, entity: str) -> tuple[float, float]:
        """The running and runnable seconds schedstat accounted that no taken row holds yet."""
        last = self._carry.get(entity)
        return (0.0, 0.0) if last is None else (last[1][0] / 1e9, last[1][1] / 1e9)

    def _settle(self, items: list[_Main]) -> None:
        """Pending readings (of one or several entities, in the order taken) settled: their
        running, runnable and blocked seconds into their chunks; per entity, each run of
        readings that follow on from each other at once (settle)."""
        by_entity: dict[str, list[_Main]] = {}
        for item in items:
            by_entity.setdefault(item[1], []).append(item)
        for entity, mine in by_entity.items():
            start = 0
            for k in range(1, len(mine) + 1):
                if k < len(mine) and mine[k][2] == mine[k - 1][3]:
                    continue
                seg = mine[start:k]
                last = self._carry.get(entity)
                carry = last[1] if last is not None and last[0] == seg[0][2] else (0, 0)
                run, wait, blocked, carry = settle(np.concatenate([x[4] for x in seg]),
                                                   np.concatenate([x[5] for x in seg]),
                                                   np.concatenate([x[6] for x in seg]), carry)
                self._carry[entity] = (seg[-1][3], carry)
                self.settled[entity] = self._carry[entity]
                values = np.column_stack([run, wait, blocked]) / 1e9
                at = 0
                for idx, *_rest, duration, _r, _w in seg:
                    c = self._chunks[idx]
                    assert c is not None          # only dropped readings' chunks are None
                    self._chunks[idx] = c[:5] + (values[at:at + len(duration)].ravel(),)
                    at += len(duration)
                start = k

    def settle_until(self, entity: str, time_ns: int, last: tuple[int, int, int], carry: tuple[int, int],
                     drop: bool = False) -> None:
        """A take of the live collector, as the spill records it (counterprof recover): the
        entity's pending readings up to time_ns settled then (or, drop, left out: what came
        before them is not known), and its state after that take, the last reading and carry."""
        mine = [x for x in self._main if x[1] == entity and x[3][0] <= time_ns]
        self._main = [x for x in self._main if not (x[1] == entity and x[3][0] <= time_ns)]
        if drop:
            for x in mine:
                self._chunks[x[0]] = None
        else:
            self._settle(mine)
        self._carry[entity] = ((int(last[0]), int(last[1]), int(last[2])), (int(carry[0]), int(carry[1])))

    def take(self) -> pa.RecordBatch | None:
        """Everything pending as one samples batch (None if nothing), and the chunks cleared.
        `settled` then says, per entity whose readings were in it, its last reading and carry."""
        self.settled = {}
        pending, self._main = self._main, []
        self._settle(pending)
        chunks, self._chunks = [c for c in self._chunks if c is not None], []
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


def settle(duration: np.ndarray, run: np.ndarray, wait: np.ndarray,
           carry: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """A critical thread's running, runnable and blocked ns over consecutive intervals taken at
    once, and the carry after them (main_states): what an interval's changes hold beyond its
    length goes back first, into the intervals before it in this call (the kernel accounts time
    late, never early: a wait when it ends, a running thread's time at a tick), and what finds
    no room before, with `carry` (from intervals already given rows), forward (main_states)."""
    duration, run, wait = (np.asarray(a, np.int64) for a in (duration, run, wait))
    rest = duration - run - wait
    if not carry[0] and not carry[1] and (rest >= 0).all():      # nothing to move: the usual case
        return run, wait, rest, (0, 0)
    back_run, back_wait, _blocked, before = main_states(duration[::-1], run[::-1], wait[::-1])
    return main_states(duration, back_run[::-1], back_wait[::-1],
                       (carry[0] + before[0], carry[1] + before[1]))


def main_states(duration: np.ndarray, run: np.ndarray, wait: np.ndarray,
                carry: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """A critical thread's running, runnable and blocked ns per interval, from each interval's
    length and schedstat's changes in run and wait (int64 ns), with `carry` (run, wait ns)
    accounted before the first interval but not yet given a row; returns them and the carry after
    the last interval.

    schedstat is exact over the run, not per interval: the kernel adds a run-queue wait when the
    thread gets a CPU (the whole wait at once, however long) and a running thread's time at the
    scheduler's tick, so an interval's changes can hold time from before its start, and
    run + wait exceeds its length (a spin loop sharing a CPU: +10-20% per 10 ms row here). Taking
    blocked as max(0, length - run - wait) kept those excesses and dropped the shortfalls that
    balance them: blocked time for a thread never off its CPU, states summing to over 100%.

    Instead an interval holds at most its length: what does not fit is carried into the next
    intervals (waits first: they are what the kernel accounts late, whole), and blocked is the
    rest, never negative. So each row's three states are its length exactly; the carry is
    bounded by the kernel's lag at a reading (a tick, or a wait in progress), not by the run's
    length; and over the run the running and runnable totals are schedstat's, less the carry
    at the end (time accounted after the first reading that happened before it, when the thread
    was never blocked for that long since). In numpy, no loop: the carry is a Lindley
    recursion, C_i = max(0, C_(i-1) + run_i + wait_i - length_i)."""
    duration, run, wait = (np.asarray(a, np.int64) for a in (duration, run, wait))
    c0_run, c0_wait = int(carry[0]), int(carry[1])
    # the carry in all: S_i - min(0, min_(k<=i) S_k), S = C_0 + the running sum of the excesses
    s = c0_run + c0_wait + np.cumsum(run + wait - duration)
    total = s - np.minimum(np.minimum.accumulate(s), 0)
    # its wait part: as much as the waits pending allow, cw_i = min(C_i, cw_(i-1) + wait_i)
    cum_wait = np.cumsum(wait)
    carry_wait = cum_wait + np.minimum(np.minimum.accumulate(total - cum_wait), c0_wait)
    carry_run = total - carry_wait
    before_run = np.concatenate(([c0_run], carry_run[:-1]))
    before_wait = np.concatenate(([c0_wait], carry_wait[:-1]))
    running = before_run + run - carry_run
    runnable = before_wait + wait - carry_wait
    blocked = duration - running - runnable
    return running, runnable, blocked, (int(carry_run[-1]), int(carry_wait[-1]))
