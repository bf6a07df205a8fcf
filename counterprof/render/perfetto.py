"""A run as one Chrome-trace / Perfetto JSON file, written as the run is read.

Track layout (every id is synthetic, so ranks from different hosts never collide; the names
carry the real pids, tids, devices and streams):

    process "rank R"            host threads of every process of rank R (one track per
                                (pid, tid): cpu ops, runtime calls, annotations, regions,
                                steps, CPU collectives), a "torch trace windows" track, and
                                one counter track per (source, metric, entity) not on a GPU
    process "rank R · GPU N"    one track per CUDA/HIP stream (kernels, memcpys, memsets,
                                syncs, GPU annotations) and the counter tracks of gpu:N
                                entities (gpu:N, gpu:N/nvlink:L)

Spans are "X" events; samples are "C" events (deltas as rates per second placed at the start of
the interval they cover, gauges at their instant, ratios at the start of their interval, the
unit in the track name); a runtime call and the GPU work it launched are linked by a flow
("s" on the call, "f" with "bp":"e" on the GPU span) where their correlation ids match.
"ts" and "dur" are µs since `base_ns` (the run's start, on the run's epoch clock) with exactly
three decimals: ns precision survives a reader that parses numbers as doubles, which epoch µs
would not (a double holds epoch µs only to 0.25 µs).

Events are formatted a batch at a time with Arrow string kernels (one precomputed prefix per
track, joined element-wise with the batch's numbers) and written straight from the result's
data buffer; a thread compresses and writes while the next batch is formatted. Nothing here
reads a run or computes a metric: the caller passes batches in the run's schemas (rates are the
one unit conversion done here).
"""
from __future__ import annotations

import json
import math
import os
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SAMPLE_COLUMNS = ["time", "duration_ns", "source", "metric", "entity", "value"]
SPAN_COLUMNS = ["start", "end", "name", "category", "kernel_class", "device", "stream", "pid",
                "tid", "correlation", "collective", "bytes", "group_size", "attrs"]
PLAN_COLUMNS = ["start", "end", "category", "device", "stream", "pid", "tid", "correlation"]
# span categories on a track of their own per process, not on their thread
SEPARATE = {"step": "steps", "region": "regions", "window": "torch trace windows",
            "pysample": "main thread Python (sampled)"}
LANES = 1 << 16

GZIP_LEVEL = 1            # ISA-L level 1: ~2 GB/s here, 19x on these events; zlib's 1 as fallback
_GPU_ENTITY = re.compile(r"^gpu:(\d+)(?:/|$)")
_NULL = np.int64(-(2 ** 62))       # stands for a null id in track keys
_FRACS: dict[str, pa.Array] = {}      # the 3 decimals of a µs value, and what follows them

# the constant pieces of events as Arrow scalars, made once: a Python str passed to a compute
# function is converted on every call (and that conversion probes for pandas each time)
_S: dict[str, pa.Scalar] = {}


def _scalar(text: str) -> pa.Scalar:
    got = _S.get(text)
    if got is None:
        got = _S[text] = pa.scalar(text)
    return got


def _join(*parts: pa.Array | str) -> pa.Array:
    """Element-wise concatenation of string arrays and constant pieces."""
    return pc.binary_join_element_wise(
        *(_scalar(x) if isinstance(x, str) else x for x in parts), _scalar(""))

# a span track before lanes: (kind "g" | "t" | "c", rank, a: the device or pid, b: the stream,
# tid or category code); a counter track: (rank, source, metric, entity)
_BaseKey = tuple[str, int, int, int]
_CounterKey = tuple[int, str, str, str]

# counter kinds: how a sample becomes a counter value
RATE, GAUGE, AT_START, RAW = 0, 1, 2, 3


def _ns(col: pa.Array) -> np.ndarray:
    """A timestamp/int column as int64 numpy (nulls as 0; callers mask them)."""
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    if col.null_count:
        col = col.fill_null(0)
    out: np.ndarray = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return out


def _us(ns: np.ndarray, then: str = "") -> list[pa.Array]:
    """int64 ns -> the pieces of "µs.nnn" + then, exactly: the whole µs, and the decimals
    with `then` (one lookup, so the number is not joined on its own first)."""
    frac = _FRACS.get(then)
    if frac is None:
        frac = _FRACS[then] = pa.array([f".{i:03d}{then}" for i in range(1000)])
    neg = ns < 0
    q, r = np.divmod(np.abs(ns) if neg.any() else ns, 1000)
    whole = pa.array(q).cast(pa.string())
    if neg.any():
        whole = pc.if_else(pa.array(neg), _join("-", whole), whole)
    return [whole, frac.take(pa.array(r))]


def _json_ok(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _dict_parts(col: pa.Array) -> tuple[np.ndarray, list[Any]]:
    """(indices, values) of a string or dictionary column; the values end with None, which
    null rows point to."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    values = col.dictionary.to_pylist()
    idx = col.indices
    idx = (idx.fill_null(len(values)) if idx.null_count else idx).to_numpy(zero_copy_only=False)
    return idx.astype(np.int64, copy=False), values + [None]


@dataclass
class Counts:
    """What was written, and what could not be, for the summary line."""

    spans: int = 0
    flows: int = 0
    samples: int = 0
    span_tracks: int = 0
    counter_tracks: int = 0
    null_values: int = 0          # unknown (null) sample values: a counter cannot show "unknown"
    not_finite: int = 0           # NaN/inf values, and deltas over a zero-length interval
    no_duration: int = 0          # deltas without duration_ns: no rate can be made
    out_of_order: int = 0         # samples not after their track's previous one (several writers)
    negative_spans: int = 0       # end before start: written with dur 0
    bad_attrs: int = 0            # attrs that were not JSON: written as a string
    relaned: int = 0              # slices moved to an overlap track so that Perfetto keeps them
    uncataloged: set[str] = field(default_factory=set)   # metrics missing from the catalog: raw values
    before_origin: int = 0        # protobuf only: events before the trace's clock origin (uint64 times)
    bytes: int = 0                # bytes of the format (JSON or protobuf) before compression
    format: str = "JSON"          # what bytes counts


class _Compressor(Protocol):
    """zlib's (or ISA-L's) compression object."""

    def compress(self, data: bytes, /) -> bytes: ...
    def flush(self) -> bytes: ...


class _Sink:
    """The output file: plain or gzip (ISA-L when installed), written on its own thread so
    compression overlaps the formatting of the next batch."""

    def __init__(self, path: Path, gzip: bool):
        # the user named it: created with the user's umask, as cp's (an existing file keeps its mode)
        from ..ground.outputs import user_opener
        self.file = open(path, "wb", opener=user_opener)
        self.compressor: _Compressor | None = None
        if gzip:
            try:
                from isal import isal_zlib
                self.compressor = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, 31)
            except ImportError:
                self.compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        # bytes or an Arrow buffer (pa.Buffer); None ends the thread
        self.queue: queue.Queue[bytes | pa.Buffer | None] = queue.Queue(maxsize=4)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="counterprof-export-writer",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is not None:
                continue
            try:
                data = self.compressor.compress(item) if self.compressor else item
                self.file.write(data)
            except BaseException as exc:     # reported to the writer on its next put
                self.error = exc

    def put(self, data: bytes | pa.Buffer) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(data)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        try:
            if self.error is None and self.compressor is not None:
                self.file.write(self.compressor.flush())
        finally:
            self.file.close()
        if self.error is not None:
            raise self.error


def _link_keys(device: pa.Array, pid: pa.Array, corr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per row: a launch<->GPU link key (pid << 32 | correlation; CUPTI and roctracer
    correlation ids are 32-bit, others are not linked) and whether it can be one."""
    ok = pc.and_(pc.is_valid(corr), pc.is_valid(pid)).to_numpy(zero_copy_only=False)
    p, c = _ns(pid), _ns(corr)
    ok &= (p >= 0) & (p < 2 ** 31) & (c >= 0) & (c < 2 ** 32)
    return (p << 32) | c, ok


def nesting_lanes(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """Lanes that make every track's slices nest, as Perfetto requires: it drops a slice that
    starts inside another of its track and ends after it. None when every track nests already
    (checked for all tracks at once as balanced parentheses); otherwise the tracks that do
    not are laid out greedily, a slice going to the first lane where it nests."""
    pos = np.nonzero(end > start)[0]          # zero-length slices nest anywhere
    n = len(pos)
    if n < 2:
        return None
    t, s, e = track[pos], start[pos], end[pos]
    i = np.arange(n)
    # endpoints in time order; at one instant ends first (intervals are half-open), longer
    # slices open first, and of slices closing together the one opened last closes first
    time = np.concatenate((s, e))
    kind = np.concatenate((np.ones(n, np.int8), np.zeros(n, np.int8)))
    idx = np.concatenate((i, i))
    order = np.lexsort((np.concatenate((i, -i)), np.concatenate((s - e, -s)), kind, time,
                        np.concatenate((t, t))))
    k, who = kind[order], idx[order]
    depth = np.cumsum(np.where(k == 1, 1, -1))
    level = np.where(k == 1, depth, depth + 1)
    # slices nest iff, level by level, each opening is closed by the same slice
    pairs = np.lexsort((np.arange(2 * n), level, t[who]))
    opened, closed = who[pairs[0::2]], who[pairs[1::2]]
    bad = opened != closed
    if not bad.any():
        return None
    lanes = np.zeros(len(track), np.int64)
    for tr in np.unique(t[opened[bad]]).tolist():
        rows = np.nonzero(t == tr)[0]
        rows = rows[np.lexsort((rows, s[rows] - e[rows], s[rows]))]
        stacks: list[list[int]] = []
        for r, a, b in zip(rows.tolist(), s[rows].tolist(), e[rows].tolist()):
            for lane, stack in enumerate(stacks):     # noqa: B007  the lane it breaks at is used below
                while stack and stack[-1] <= a:
                    stack.pop()
                if not stack or b <= stack[-1]:
                    stack.append(b)
                    break
            else:
                lane = len(stacks)
                stacks.append([b])
            lanes[pos[r]] = lane
    return lanes


class SpanPlan:
    """What must be known of a rank's spans before any is written: which launches and GPU
    spans link up (flows), and which slices need a lane of their own to nest. Built from a
    first pass over the rank's spans (add() each batch, in the order they will be written),
    it holds a few numbers per span, never the spans."""

    def __init__(self, writer: TraceWriter, rank: int):
        self.writer, self.rank = writer, rank
        # per batch: (track, start, end, launch link keys, GPU link keys)
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.links = np.empty(0, np.int64)      # sorted link keys seen on both sides
        self.first_flow = 0
        self.lanes: np.ndarray | None = None    # per span row, in add() order; None: all 0
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        col = dict(zip(batch.schema.names, batch.columns))
        key, ok = _link_keys(col["device"], col["pid"], col["correlation"])
        gpu = col["device"].is_valid().to_numpy(zero_copy_only=False)
        tracks = self.writer._track_ids(col, self.rank)
        self._parts.append((tracks, _ns(col["start"]), _ns(col["end"]), key[ok & ~gpu], key[ok & gpu]))
        self.rows += batch.num_rows

    def finish(self) -> SpanPlan:
        if self._parts:
            track, start, end, launch, gpu = (np.concatenate(x) for x in zip(*self._parts))
            self._parts = []
            self.links = np.intersect1d(launch, gpu)
            del launch, gpu
            self.first_flow = self.writer._next_flow
            self.writer._next_flow += len(self.links)
            self.lanes = nesting_lanes(track, start, end)
            if self.lanes is not None:
                self.writer.counts.relaned += int((self.lanes > 0).sum())
        return self

    def flow_ids(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, flow ids) for link keys."""
        if len(self.links) == 0:
            return np.zeros(len(key), bool), np.zeros(len(key), np.int64)
        at = np.minimum(np.searchsorted(self.links, key), len(self.links) - 1)
        return self.links[at] == key, self.first_flow + at


class TraceWriter:
    """Writes Chrome-trace JSON: `with TraceWriter(path, base_ns) as w: w.spans(batch, rank)...`"""

    def __init__(self, path: str | os.PathLike[str], base_ns: int, other_data: dict[str, Any] | None = None,
                 catalog: dict[str, dict[str, Any]] | None = None, gzip: bool | None = None):
        self.path = Path(path)
        self.base_ns = int(base_ns)
        self.catalog = catalog or {}
        self.counts = Counts()
        self._sink = _Sink(self.path, self.path.name.endswith(".gz") if gzip is None else gzip)
        self._first = True
        self._next_id = 1                    # pids and tids share one space: none collide
        self._next_flow = 1
        self._processes: dict[tuple[int, int | None], int] = {}     # (rank, device) -> pid
        self._bases: dict[_BaseKey, int] = {}       # (kind, rank, a, b) -> span track before lanes
        self._base_keys: list[_BaseKey] = []
        self._threads: dict[tuple[int, int], tuple[int, int]] = {}     # (base, lane) -> (pid, tid)
        self._thread_order: dict[int, int] = {}                 # pid -> threads so far
        self._counters: dict[_CounterKey, int] = {}             # (rank, src, metric, entity) -> i
        self._c_prefix: list[pa.Scalar] = []
        self._c_kind: list[int] = []
        self._c_last = np.empty(0, np.int64)
        self._json_cache: dict[str | None, str] = {}
        self._categories: dict[str, int] = {}
        self._open(other_data)

    def _open(self, other_data: dict[str, Any] | None) -> None:
        """What comes before the events."""
        head = {"otherData": {"generator": "counterprof export", "base_time_ns": self.base_ns,
                              "ts_unit": "µs since base_time_ns (epoch ns), 3 decimals = ns",
                              **(other_data or {})}}
        self._put(json.dumps(head)[:-1].encode() + b',"traceEvents":[')

    # -- output ----------------------------------------------------------------------------
    def _put(self, data: bytes | pa.Buffer) -> None:
        self.counts.bytes += len(data) if isinstance(data, bytes) else data.size
        self._sink.put(data)

    def _event(self, event: dict[str, Any]) -> None:
        text = ("\n" if self._first else ",\n") + json.dumps(event, separators=(",", ":"))
        self._first = False
        self._put(text.encode())

    def _chunk(self, text: pa.Array) -> None:
        """Element-wise joined events (each starting with ",\\n"), written from the buffer."""
        if len(text) == 0:
            return
        if text.null_count:                     # a bug in the formatting: never write "null"
            raise ValueError("internal error: an event formatted to null")
        if not isinstance(text, pa.Array):
            text = text.combine_chunks()
        offsets = np.frombuffer(text.buffers()[1], np.int32, len(text) + 1, text.offset * 4)
        lo, hi = int(offsets[0]), int(offsets[-1])
        assert not self._first, "metadata events always come first"
        self._put(text.buffers()[2][lo:hi])

    def close(self) -> None:
        self._put(b"\n]}\n")
        self._sink.close()

    def abort(self) -> None:
        try:
            self._sink.close()
        except Exception:
            pass

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- tracks ----------------------------------------------------------------------------
    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _process(self, rank: int, device: int | None) -> int:
        key = (rank, device)
        pid = self._processes.get(key)
        if pid is None:
            pid = self._processes[key] = self._new_id()
            name = f"rank {rank}" if device is None else f"rank {rank} · GPU {device}"
            self._name_process(pid, name, rank * 1000 + (0 if device is None else 1 + device))
        return pid

    def _name_process(self, pid: int, name: str, sort: int) -> None:
        self._event({"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}})
        self._event({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid,
                     "args": {"sort_index": sort}})

    def _name_thread(self, pid: int, tid: int, name: str, sort: int) -> None:
        self._event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        self._event({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                     "args": {"sort_index": sort}})

    def _track_ids(self, col: dict[str, pa.Array], rank: int) -> np.ndarray:
        """Each span row's track (before lanes), registering new ones: a GPU span goes to its
        device's stream, a host span to its (pid, tid), and steps, regions, trace windows and
        spans without a thread to a track per (pid, category) (a step boundary falls inside
        optimizer.step, which would not nest on the thread)."""
        n = len(col["start"])
        device, stream, pid, tid = col["device"], col["stream"], col["pid"], col["tid"]
        gpu = device.is_valid().to_numpy(zero_copy_only=False)

        def ids(c: pa.Array) -> np.ndarray:
            a = _ns(c)
            return np.where(c.is_valid().to_numpy(zero_copy_only=False), a, _NULL) if c.null_count else a

        cat_idx, cat_values = _dict_parts(col["category"])
        codes = np.array([self._categories.setdefault(c, len(self._categories)) for c in cat_values],
                         np.int64)[cat_idx]
        apart = np.isin(cat_idx, [i for i, c in enumerate(cat_values) if c in SEPARATE])
        by_thread = tid.is_valid().to_numpy(zero_copy_only=False) & ~apart
        kind = np.where(gpu, 0, np.where(by_thread, 1, 2))
        a = np.where(gpu, ids(device), ids(pid))
        b = np.where(gpu, ids(stream), np.where(by_thread, ids(tid), codes))
        keys, inverse = np.unique(np.stack([kind, a, b], axis=1), axis=0, return_inverse=True)
        base = np.empty(len(keys), np.int64)
        for i, (k, x, y) in enumerate(keys.tolist()):
            key = ("gtc"[k], rank, x, y)
            got = self._bases.get(key)
            if got is None:
                got = self._bases[key] = len(self._base_keys)
                self._base_keys.append(key)
            base[i] = got
        return base[inverse.reshape(n)]

    def _thread(self, base: int, lane: int) -> tuple[int, int]:
        """The (pid, tid) of a track, named on first use."""
        got = self._threads.get((base, lane))
        if got is not None:
            return got
        kind, rank, a_key, b = self._base_keys[base]
        a = None if a_key == _NULL else int(a_key)
        if kind == "g":
            pid = self._process(rank, a)
            name = "stream ?" if b == _NULL else f"stream {b}"
            sort = -1 if b == _NULL else min(int(b), 2 ** 31 - 1)
        else:
            pid = self._process(rank, None)
            order = self._thread_order.get(pid, 0)
            self._thread_order[pid] = order + 1
            owner = "" if a is None else f" (pid {a})"
            if kind == "t":
                name = f"main thread{owner}" if a == b else f"thread {b}{owner}"
                sort = (10 if a == b else 100) + order
            else:
                category = next(c for c, i in self._categories.items() if i == b)
                name = SEPARATE.get(category, category or "spans") + owner
                sort = order
        if lane:
            name += f" (overlap {lane})"
        tid = self._new_id()
        self._threads[(base, lane)] = (pid, tid)
        self.counts.span_tracks += 1
        self._name_thread(pid, tid, name, sort)
        return pid, tid

    def _json_str(self, values: list[str | None]) -> list[str]:
        cache = self._json_cache
        if len(cache) > 200_000:               # kernel names are many but repeat: keep it bounded
            cache.clear()
        out = []
        for v in values:
            j = cache.get(v)
            if j is None:
                j = cache[v] = json.dumps("" if v is None else v)
            out.append(j)
        return out

    # -- spans -----------------------------------------------------------------------------
    def plan(self, rank: int) -> SpanPlan:
        """Start the first pass over a rank's spans."""
        return SpanPlan(self, rank)

    def finish_rank(self, plan: SpanPlan) -> None:
        """After a rank's spans: nothing is held back here (every X event is complete)."""

    def spans(self, batch: pa.RecordBatch, rank: int, plan: SpanPlan, row0: int) -> None:
        """X events (and flow ends) for a batch with SPAN_COLUMNS; row0: where the batch
        starts among the rows given to plan.add()."""
        n = batch.num_rows
        if n == 0:
            return
        col = dict(zip(SPAN_COLUMNS, batch.columns))
        start, end = _ns(col["start"]), _ns(col["end"])
        dur = end - start
        neg = dur < 0
        if neg.any():
            self.counts.negative_spans += int(neg.sum())
            dur = np.where(neg, 0, dur)
        base = self._track_ids(col, rank)
        lane = plan.lanes[row0:row0 + n] if plan.lanes is not None else np.zeros(n, np.int64)
        tracks, inverse = np.unique(base * LANES + np.minimum(lane, LANES - 1), return_inverse=True)
        threads = [self._thread(t // LANES, t % LANES) for t in tracks.tolist()]
        row_track = inverse.reshape(n)
        prefixes = pa.array([f',\n{{"ph":"X","pid":{p},"tid":{t},"ts":' for p, t in threads])

        name_idx, name_values = _dict_parts(col["name"])
        names = pa.array(self._json_str(name_values)).take(pa.array(name_idx))
        cat_idx, cat_values = _dict_parts(col["category"])
        cats = pa.array(self._json_str(cat_values)).take(pa.array(cat_idx))
        parts = [prefixes.take(pa.array(row_track)), *_us(start - self.base_ns, ',"dur":'),
                 *_us(dur, ',"name":'), names, ',"cat":', cats, f',"args":{{"rank":{rank}']
        parts += list(self._span_args(col))
        parts.append("}}")
        self._chunk(_join(*parts))
        self.counts.spans += n
        if len(plan.links):
            self._flows(col, start, dur, row_track, threads, plan)

    def _span_args(self, col: dict[str, pa.Array]) -> Iterator[pa.Array]:
        """Per optional column, a ',"key":value' fragment per row ("" where null)."""
        for key in ("kernel_class", "collective"):
            c = col[key]
            if c.null_count == len(c):
                continue
            idx, values = _dict_parts(c)
            frags = [f',"{key}":{j}' for j in self._json_str(values[:-1])] + [""]
            yield pa.array(frags).take(pa.array(idx))
        for key in ("correlation", "bytes", "group_size"):
            c = col[key]
            if c.null_count == len(c):
                continue
            yield _join(f',"{key}":', c.cast(pa.string())).fill_null(_scalar(""))
        c = col["attrs"]
        if c.null_count < len(c):
            idx, values = _dict_parts(c)
            frags = []
            for v in values[:-1]:
                if _json_ok(v):
                    frags.append(f',"attrs":{v}')
                else:
                    self.counts.bad_attrs += int((idx == len(frags)).sum())
                    frags.append(f',"attrs":{json.dumps(v)}')
            frags.append("")
            yield pa.array(frags).take(pa.array(idx))

    def _flows(self, col: dict[str, pa.Array], start: np.ndarray, dur: np.ndarray, row_track: np.ndarray,
               threads: list[tuple[int, int]], plan: SpanPlan) -> None:
        key, ok = _link_keys(col["device"], col["pid"], col["correlation"])
        found, fid = plan.flow_ids(key)
        rows = np.nonzero(found & ok)[0]
        if len(rows) == 0:
            return
        gpu = col["device"].is_valid().to_numpy(zero_copy_only=False)[rows]
        # the arrow's ends sit mid-span, so each binds to its own slice, never a neighbour
        mid = start[rows] + dur[rows] // 2 - self.base_ns
        pid = np.array([p for p, _ in threads])[row_track[rows]]
        tid = np.array([t for _, t in threads])[row_track[rows]]
        head = pa.array(np.where(gpu, ',\n{"ph":"f","bp":"e","id":', ',\n{"ph":"s","id":'))
        self._chunk(_join(
            head, pa.array(fid[rows]).cast(pa.string()), ',"pid":', pa.array(pid).cast(pa.string()),
            ',"tid":', pa.array(tid).cast(pa.string()), ',"ts":',
            *_us(mid, ',"cat":"launch","name":"launch"}')))
        self.counts.flows += int((~gpu).sum())

    # -- samples ---------------------------------------------------------------------------
    def samples(self, batch: pa.RecordBatch, rank: int) -> None:
        """C events for a batch with SAMPLE_COLUMNS."""
        got = self._counter_points(batch, rank)
        if got is None:
            return
        track, out, at, firsts = got
        values = pa.array(out).cast(pa.string())
        whole, frac = _us(at - self.base_ns, "}")
        for a, b in zip(firsts.tolist(), firsts[1:].tolist() + [len(track)]):
            self._chunk(_join(self._c_prefix[track[a]], values.slice(a, b - a), '},"ts":',
                              whole.slice(a, b - a), frac.slice(a, b - a)))
        self.counts.samples += len(track)

    def _counter_points(self, batch: pa.RecordBatch, rank: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """A batch's samples as counter points: (track, value, time in epoch ns, where each
        track's run starts), grouped by track (each track's file order kept); None if none."""
        n = batch.num_rows
        if n == 0:
            return None
        time = _ns(batch.column(0))
        dcol = batch.column(1)
        has_d = dcol.is_valid().to_numpy(zero_copy_only=False)
        d = _ns(dcol)
        vcol = batch.column(5)
        value = vcol.to_numpy(zero_copy_only=False) if not vcol.null_count else \
            vcol.fill_null(math.nan).to_numpy(zero_copy_only=False)
        track = self._sample_tracks(batch, rank)
        kind = np.asarray(self._c_kind, np.int8)[track]

        rate = kind == RATE
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(rate, value * 1e9 / np.where(d > 0, d, 0), value)
        at = time - np.where(((kind == RATE) | (kind == AT_START)) & has_d, d, 0)
        ok = np.isfinite(out)
        if not ok.all():
            nulls = vcol.null_count
            no_dur = int((rate & ~has_d & ~np.isnan(value)).sum()) if (rate & ~has_d).any() else 0
            self.counts.null_values += nulls
            self.counts.no_duration += no_dur
            self.counts.not_finite += int((~ok).sum()) - nulls - no_dur
            out, at, track = out[ok], at[ok], track[ok]
        if len(track) == 0:
            return None
        # grouped by track (stable: each track's own order is kept), so that each group is
        # one join with its track's prefix as a scalar instead of a prefix copied per row
        order = np.argsort(track, kind="stable")
        track, out, at = track[order], out[order], at[order]
        firsts = np.concatenate(([0], np.flatnonzero(track[1:] != track[:-1]) + 1))
        self._check_order(track, at, firsts)
        return track, out, at, firsts

    def _sample_tracks(self, batch: pa.RecordBatch, rank: int) -> np.ndarray:
        """Each row's counter track (global index), creating tracks on first sight."""
        (si, sv), (mi, mv), (ei, ev) = (_dict_parts(batch.column(i)) for i in (2, 3, 4))
        local = (si * len(mv) + mi) * len(ev) + ei
        size = len(sv) * len(mv) * len(ev)
        lut = np.full(size, -1, np.int64)
        present = np.nonzero(np.bincount(local, minlength=size))[0]
        for code in present.tolist():
            s, rest = divmod(code, len(mv) * len(ev))
            m, e = divmod(rest, len(ev))
            key = (rank, sv[s], mv[m], ev[e])
            i = self._counters.get(key)
            if i is None:
                i = self._new_counter(key)
            lut[code] = i
        tracks: np.ndarray = lut[local]
        return tracks

    def _counter_of(self, key: _CounterKey) -> tuple[int, int, str]:
        """A new counter track's (pid, kind, unit as written: rates per second)."""
        rank, source, metric, entity = key
        gpu = _GPU_ENTITY.match(entity or "")
        pid = self._process(rank, int(gpu.group(1)) if gpu else None)
        entry = self.catalog.get(metric)
        unit = (entry or {}).get("unit") or ""
        kind_name = (entry or {}).get("kind")
        if kind_name == "delta":
            kind, unit = RATE, f"{unit}/s" if unit and unit != "count" else "/s"
        elif kind_name == "gauge":
            kind = GAUGE
        elif kind_name == "ratio":
            kind = AT_START
        else:
            kind, unit = RAW, "value, not in the catalog"
            self.counts.uncataloged.add(metric)
        return pid, kind, unit

    def _new_counter(self, key: _CounterKey) -> int:
        _, source, metric, entity = key
        pid, kind, unit = self._counter_of(key)
        name = json.dumps(f"{source} {metric} {entity}")
        series = json.dumps(f"[{unit or 'value'}]")
        self._c_prefix.append(pa.scalar(
            f',\n{{"ph":"C","pid":{pid},"tid":{pid},"name":{name},"args":{{{series}:'))
        return self._add_counter(key, kind)

    def _add_counter(self, key: _CounterKey, kind: int) -> int:
        self._c_kind.append(kind)
        self._c_last = np.append(self._c_last, np.iinfo(np.int64).min)
        self._counters[key] = len(self._c_kind) - 1
        self.counts.counter_tracks += 1
        return len(self._c_kind) - 1

    def _check_order(self, t: np.ndarray, a: np.ndarray, firsts: np.ndarray) -> None:
        """Count samples not strictly after every earlier one of their track (rows grouped by
        track, file order within). Several writers of one series in a partition could
        interleave; Perfetto sorts on load, so they are written all the same."""
        last = self._c_last[t[firsts]]
        ends = np.append(firsts[1:], len(t))
        in_order = (a[firsts] > last).all() and not ((t[1:] == t[:-1]) & (a[1:] <= a[:-1])).any()
        if in_order:
            self._c_last[t[firsts]] = a[ends - 1]
            return
        for g, (i, j) in enumerate(zip(firsts.tolist(), ends.tolist())):     # rare: exact count
            running = np.maximum.accumulate(np.concatenate(([last[g]], a[i:j])))
            self.counts.out_of_order += int((a[i:j] <= running[:-1]).sum())
            self._c_last[t[i]] = running[-1]
