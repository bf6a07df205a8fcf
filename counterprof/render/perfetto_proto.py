"""A run as one Perfetto protobuf trace (a `Trace`: a stream of TracePackets), written as the
run is read: the same tracks, slices, flows and counter values as the JSON writer
(render/perfetto.py, whose track bookkeeping this reuses), at a fraction of the bytes.

What is written (field numbers from Perfetto's protos/perfetto/trace/, which the tests decode
the output with):

    a ClockSnapshot            BOOTTIME 0 = REALTIME `origin` (epoch ns): every packet's
                               timestamp is ns since origin (a few bytes less per varint than
                               epoch ns); Perfetto shows wall-clock time from it
    TrackDescriptors           a process track per (rank, device) as in the JSON ("rank R",
                               "rank R · GPU N"), a thread track per span track (its synthetic
                               tid, the name the JSON gives it), a counter track per series,
                               child of its process, typed where CounterDescriptor can say it
                               (UNIT_TIME_NS, UNIT_COUNT, UNIT_SIZE_BYTES) and unit_name
                               otherwise ("ns/s", "percent", ...)
    InternedData               event names, categories, debug-annotation names and string
                               values, each sent once per sequence (one sequence, id 1)
    TrackEvents                a span is TYPE_SLICE_BEGIN (name_iid, category_iids, its args as
                               debug annotations, flow_ids on a launch, terminating_flow_ids on
                               the GPU span it launched) and TYPE_SLICE_END; a sample is
                               TYPE_COUNTER with counter_value (integral values) or
                               double_counter_value

Packets are encoded a batch at a time with numpy (each field a block of byte columns and a
mask of the bytes each row uses; a batch's packets are the masked bytes in row order), joined
with Arrow where a field is a string. No protobuf library is needed to write.

Perfetto pairs a slice's BEGIN and END by a stack per track, after sorting every event by time
(ties kept in file order), so the events of one track must be in the right order wherever
times are equal: a rank's span events are held (encoded, ~20-40 bytes each) and written at the
end of the rank in time order, ends before begins at one instant, longer slices first.
Samples are written as they are read.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .perfetto import (AT_START, GAUGE, LANES, SPAN_COLUMNS, SpanPlan, TraceWriter, _CounterKey,
                       _dict_parts, _json_ok, _link_keys, _ns)

SEQ = 1                                  # the one packet sequence
_SEQ = b"\x50\x01"                      # trusted_packet_sequence_id = 1
_NEEDS_STATE = b"\x68\x02"              # sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE
UNITS = {"ns": 1, "count": 2, "bytes": 3}     # CounterDescriptor.Unit: TIME_NS, COUNT, SIZE_BYTES
INTERN_LIMIT = 500_000                   # interned entries before the state is cleared (at a rank's end)
_U64 = (1 << 64) - 1
_BIN = pa.binary()


# -- scalar encoding (descriptors, interned data) ------------------------------------------
def varint(v: int) -> bytes:
    v &= _U64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def f_int(num: int, v: int) -> bytes:
    return varint(num << 3) + varint(v)


def f_bytes(num: int, data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return varint(num << 3 | 2) + varint(len(raw)) + raw


def packet(*fields: bytes) -> bytes:
    """One TracePacket as a Trace's `packet` field."""
    return f_bytes(1, b"".join(fields))


# -- vector encoding ---------------------------------------------------------------------
def _varint_cols(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of int64/uint64 values (negatives as 10-byte two's complement) as a byte
    matrix (n, width) and a mask of the bytes used."""
    u = v.astype(np.int64, copy=False).view(np.uint64) if v.dtype != np.uint64 else v
    top = int(u.max()) if len(u) else 0
    width = max(1, (top.bit_length() + 6) // 7)
    length = np.ones(len(u), np.int64)
    for b in range(1, width):
        length += u >= np.uint64(1 << (7 * b))
    col = np.arange(width)
    shifts = (7 * col).astype(np.uint64)
    mat = ((u[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    mat |= np.where(col < (length - 1)[:, None], np.uint8(0x80), np.uint8(0))
    return mat, col < length[:, None]


class Msg:
    """Protobuf messages, one per row, built field by field. Fields are numpy byte blocks
    (with masks: a row uses only some of a block's bytes) or Arrow binary arrays (strings);
    `where` leaves a field out of the rows where it is False."""

    def __init__(self, n: int):
        self.n = n
        self.lens = np.zeros(n, np.int64)
        self.parts: list[tuple[np.ndarray, np.ndarray] | pa.Array] = []

    def _block(self, mat: np.ndarray, mask: np.ndarray, where: np.ndarray | None) -> None:
        if where is not None:
            mask = mask & where[:, None]
        self.parts.append((mat, mask))
        self.lens += mask.sum(axis=1)

    def const(self, data: bytes, where: np.ndarray | None = None) -> None:
        mat = np.broadcast_to(np.frombuffer(data, np.uint8), (self.n, len(data)))
        self._block(mat, np.ones((self.n, len(data)), bool), where)

    def varint(self, tag: bytes, v: np.ndarray, where: np.ndarray | None = None) -> None:
        self.const(tag, where)
        self._block(*_varint_cols(v), where)

    def fixed64(self, tag: bytes, v: np.ndarray, where: np.ndarray | None = None) -> None:
        """v: float64 or (u)int64, little-endian as the wire has it."""
        self.const(tag, where)
        mat = np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<"), copy=False).view(np.uint8)
        self._block(mat.reshape(self.n, 8), np.ones((self.n, 8), bool), where)

    def blob(self, arr: pa.Array, lens: np.ndarray) -> None:
        """Bytes per row, already encoded (e.g. a field with a string in it; b"" for none)."""
        self.parts.append(arr)
        self.lens += lens

    def message(self, tag: bytes, inner: Msg, where: np.ndarray | None = None) -> None:
        """inner as a length-delimited field."""
        if where is not None:
            assert all(isinstance(p, tuple) for p in inner.parts), "a string field cannot be left out by row"
            inner = _masked(inner, where)
        self.varint(tag, inner.lens, where)
        self.parts += inner.parts
        self.lens += inner.lens

    def build(self) -> pa.Array:
        """The rows' messages, one binary value each."""
        arrays: list[pa.Array] = []
        blocks: list[tuple[np.ndarray, np.ndarray]] = []
        for p in self.parts + [pa.nulls(0)]:
            if isinstance(p, tuple):
                blocks.append(p)
                continue
            if blocks:
                mat = np.concatenate([m for m, _ in blocks], axis=1)
                mask = np.concatenate([k for _, k in blocks], axis=1)
                offsets = np.zeros(self.n + 1, np.int64)
                np.cumsum(mask.sum(axis=1), out=offsets[1:])
                arrays.append(pa.LargeBinaryArray.from_buffers(
                    pa.large_binary(), self.n, [None, pa.py_buffer(offsets), pa.py_buffer(mat[mask])]))
                blocks = []
            if len(p):
                arrays.append(p.cast(pa.large_binary()))
        if len(arrays) == 1:
            return arrays[0]
        joined: pa.Array = pc.binary_join_element_wise(*arrays, pa.scalar(b"", pa.large_binary()))
        return joined


def _masked(m: Msg, where: np.ndarray) -> Msg:
    out = Msg(m.n)
    for part in m.parts:
        assert isinstance(part, tuple), "checked by the caller"
        out._block(part[0], part[1], where)
    return out


def _data(arr: pa.Array) -> pa.Buffer:
    """The bytes of a binary array's values, end to end."""
    if arr.null_count:
        raise ValueError("internal error: a packet encoded to null")
    offsets = np.frombuffer(arr.buffers()[1], np.int64, len(arr) + 1, arr.offset * 8)
    data = arr.buffers()[2]
    return data[int(offsets[0]):int(offsets[-1])] if data is not None else pa.py_buffer(b"")


class ProtoTraceWriter(TraceWriter):
    """Writes a Perfetto protobuf trace: `with ProtoTraceWriter(path, origin_ns) as w: ...`, the
    same calls as TraceWriter, plus finish_rank(plan) after each rank's spans."""

    def __init__(self, path: str | os.PathLike[str], base_ns: int, other_data: dict[str, Any] | None = None,
                 catalog: dict[str, dict[str, Any]] | None = None, gzip: bool | None = None):
        # interned: (kind, text) -> iid; kinds: 1 categories, 2 names, 3 annotation names,
        # 29 annotation string values (InternedData's field numbers)
        self._interned: dict[tuple[int, str], int] = {}
        self._iids: dict[int, int] = {}                          # kind -> last iid given
        self._new_interned: list[bytes] = []
        self._held: list[tuple[pa.Array, np.ndarray]] = []     # a rank's span events, with sort keys
        self._c_uuid: list[int] = []
        super().__init__(path, max(0, int(base_ns)), other_data, catalog, gzip)
        self.counts.format = "protobuf"

    def _open(self, other_data: dict[str, Any] | None) -> None:
        clock = f_bytes(6, f_bytes(1, f_int(1, 6) + f_int(2, 0))          # BOOTTIME 0
                        + f_bytes(1, f_int(1, 1) + f_int(2, self.base_ns))   # = REALTIME origin
                        + f_int(2, 6))                                        # primary: BOOTTIME
        self._put(packet(f_int(8, 0), clock, f_int(10, SEQ)))
        self._put(packet(f_int(8, 0), f_int(10, SEQ), f_int(13, 1)))     # incremental state cleared

    def close(self) -> None:
        self._sink.close()

    # -- tracks ----------------------------------------------------------------------------
    def _name_process(self, pid: int, name: str, sort: int) -> None:
        self._put(packet(f_int(10, SEQ), f_bytes(60, f_int(1, pid) + f_bytes(3, f_int(1, pid) + f_bytes(6, name))
                                                 + f_int(11, 3) + f_int(12, sort))))

    def _name_thread(self, pid: int, tid: int, name: str, sort: int) -> None:
        self._put(packet(f_int(10, SEQ), f_bytes(60, f_int(1, tid) + f_int(5, pid) + f_int(12, sort)
                                                 + f_bytes(4, f_int(1, pid) + f_int(2, tid) + f_bytes(5, name)))))

    def _new_counter(self, key: _CounterKey) -> int:
        _, source, metric, entity = key
        pid, kind, unit = self._counter_of(key)
        uuid = self._new_id()
        raw = (self.catalog.get(metric) or {}).get("unit") or ""
        if kind in (GAUGE, AT_START) and raw in UNITS:
            typed = f_int(3, UNITS[raw])
        elif unit:
            typed = f_bytes(6, unit)
        else:
            typed = b""
        order = 10_000 + len(self._c_uuid)
        self._put(packet(f_int(10, SEQ), f_bytes(60, f_int(1, uuid) + f_int(5, pid) + f_int(12, order)
                                                 + f_bytes(2, f"{source} {metric} {entity}") + f_bytes(8, typed))))
        self._c_uuid.append(uuid)
        return self._add_counter(key, kind)

    def _intern(self, kind: int, values: list[str | None]) -> np.ndarray:
        """iids of strings (None as ""), sending the new ones."""
        out = np.empty(len(values), np.int64)
        for i, v in enumerate(values):
            text = "" if v is None else v
            iid = self._interned.get((kind, text))
            if iid is None:
                iid = self._interned[(kind, text)] = self._iids[kind] = self._iids.get(kind, 0) + 1
                self._new_interned.append(f_bytes(kind, f_int(1, iid) + f_bytes(2, text)))
            out[i] = iid
        return out

    def _send_interned(self) -> None:
        if self._new_interned:
            self._put(packet(f_int(10, SEQ), f_int(13, 2), f_bytes(12, b"".join(self._new_interned))))
            self._new_interned = []

    # -- spans -----------------------------------------------------------------------------
    def spans(self, batch: pa.RecordBatch, rank: int, plan: SpanPlan, row0: int) -> None:
        """A batch's slice BEGIN and END events, held until finish_rank."""
        n = batch.num_rows
        if n == 0:
            return
        col = dict(zip(SPAN_COLUMNS, batch.columns))
        start, end = _ns(col["start"]), _ns(col["end"])
        neg = end < start
        if neg.any():
            self.counts.negative_spans += int(neg.sum())
            end = np.where(neg, start, end)
        base = self._track_ids(col, rank)
        lane = plan.lanes[row0:row0 + n] if plan.lanes is not None else np.zeros(n, np.int64)
        tracks, inverse = np.unique(base * LANES + np.minimum(lane, LANES - 1), return_inverse=True)
        uuid = np.array([self._thread(t // LANES, t % LANES)[1] for t in tracks.tolist()],
                        np.int64)[inverse.reshape(n)]
        name_idx, name_values = _dict_parts(col["name"])
        cat_idx, cat_values = _dict_parts(col["category"])
        names = self._intern(2, name_values)[name_idx]
        cats = self._intern(1, cat_values)[cat_idx]

        te = Msg(n)
        te.const(b"\x48\x01")                  # type: TYPE_SLICE_BEGIN
        te.varint(b"\x58", uuid)               # track_uuid
        te.varint(b"\x50", names)              # name_iid
        te.varint(b"\x18", cats)               # category_iids
        self._annotations(te, col)
        if len(plan.links):
            key, ok = _link_keys(col["device"], col["pid"], col["correlation"])
            found, fid = plan.flow_ids(key)
            gpu = col["device"].is_valid().to_numpy(zero_copy_only=False)
            te.fixed64(b"\xf9\x02", fid, found & ok & ~gpu)    # flow_ids
            te.fixed64(b"\x81\x03", fid, found & ok & gpu)     # terminating_flow_ids
            self.counts.flows += int((found & ok & ~gpu).sum())
        self._send_interned()                  # before any packet that uses them
        keep = start >= self.base_ns
        if not keep.all():
            self.counts.before_origin += int((~keep).sum())
        rows = np.nonzero(keep)[0]
        t0, t1 = start - self.base_ns, end - self.base_ns
        begin = Msg(n)
        begin.varint(b"\x40", t0)
        begin.message(b"\x5a", te)
        begin.const(_SEQ + _NEEDS_STATE)
        ending = Msg(n)
        ending.varint(b"\x40", t1)
        te_end = Msg(n)
        te_end.const(b"\x48\x02")              # TYPE_SLICE_END
        te_end.varint(b"\x58", uuid)
        ending.message(b"\x5a", te_end)
        ending.const(_SEQ)
        events = pa.concat_arrays([_framed(begin).take(rows), _framed(ending).take(rows)])
        # sort keys: time; at one instant the ends of slices that have a length first (their
        # order among themselves changes nothing), then begins, longer first, a zero-length
        # slice's end right after its begin
        zero = (t1 == t0)[rows]
        row = row0 + rows
        k = len(rows)
        keys = np.empty((5, 2 * k), np.int64)
        keys[0] = np.concatenate((t0[rows], t1[rows]))
        keys[1] = np.concatenate((np.ones(k, np.int64), zero.astype(np.int64)))
        keys[2] = np.concatenate((-t1[rows], np.where(zero, -t1[rows], -t0[rows])))
        keys[3] = np.concatenate((row, row))
        keys[4] = np.concatenate((np.zeros(k, np.int64), np.ones(k, np.int64)))
        self._held.append((events, keys))
        self.counts.spans += k

    def _annotations(self, te: Msg, col: dict[str, pa.Array]) -> None:
        """The JSON's args (but rank: the process says it) as debug annotations."""
        for key in ("kernel_class", "collective"):
            c = col[key]
            if c.null_count == len(c):
                continue
            idx, values = _dict_parts(c)
            (name,) = self._intern(3, [key]).tolist()
            iids = self._intern(29, values[:-1]).tolist()
            frags = [f_bytes(4, f_int(1, name) + f_int(17, i)) for i in iids] + [b""]
            arr = pa.array(frags, _BIN).take(pa.array(idx))
            te.blob(arr, np.array([len(f) for f in frags], np.int64)[idx])
        for key in ("correlation", "bytes", "group_size"):
            c = col[key]
            if c.null_count == len(c):
                continue
            (name,) = self._intern(3, [key]).tolist()
            ann = Msg(len(c))
            ann.varint(b"\x08", np.full(len(c), name, np.int64))
            ann.varint(b"\x20", _ns(c))      # int_value
            te.message(b"\x22", ann, c.is_valid().to_numpy(zero_copy_only=False))
        c = col["attrs"]
        if c.null_count < len(c):
            idx, values = _dict_parts(c)
            (name,) = self._intern(3, ["attrs"]).tolist()
            frags = []
            for v in values[:-1]:
                if _json_ok(v):                  # legacy_json_value: Perfetto shows it as args
                    frags.append(f_bytes(4, f_int(1, name) + f_bytes(9, v)))
                else:                             # a string, as the JSON writes it
                    self.counts.bad_attrs += int((idx == len(frags)).sum())
                    frags.append(f_bytes(4, f_int(1, name) + f_bytes(6, v)))
            frags.append(b"")
            te.blob(pa.array(frags, _BIN).take(pa.array(idx)), np.array([len(f) for f in frags], np.int64)[idx])

    def finish_rank(self, plan: SpanPlan) -> None:
        """Write the rank's span events in the order Perfetto must parse them."""
        if self._held:
            events = pa.concat_arrays([e for e, _ in self._held])
            keys = np.concatenate([k for _, k in self._held], axis=1)
            self._held = []
            order = np.lexsort(keys[::-1])
            del keys
            step = 1 << 18
            for i in range(0, len(order), step):
                self._put(_data(events.take(pa.array(order[i:i + step]))))
        if len(self._interned) > INTERN_LIMIT:       # every held event is written: safe to clear
            self._interned.clear()
            self._iids.clear()
            self._put(packet(f_int(8, 0), f_int(10, SEQ), f_int(13, 1)))

    # -- samples ---------------------------------------------------------------------------
    def samples(self, batch: pa.RecordBatch, rank: int) -> None:
        """TYPE_COUNTER events for a batch with SAMPLE_COLUMNS."""
        got = self._counter_points(batch, rank)
        if got is None:
            return
        track, out, at, _ = got
        rel = at - self.base_ns
        keep = rel >= 0
        if not keep.all():
            self.counts.before_origin += int((~keep).sum())
            track, out, rel = track[keep], out[keep], rel[keep]
        n = len(track)
        if n == 0:
            return
        whole = (out == np.round(out)) & (np.abs(out) < 2.0 ** 53)
        te = Msg(n)
        te.const(b"\x48\x04")                                      # TYPE_COUNTER
        te.varint(b"\x58", np.asarray(self._c_uuid, np.int64)[track])
        te.varint(b"\xf0\x01", np.where(whole, out, 0).astype(np.int64), whole)   # counter_value
        te.fixed64(b"\xe1\x02", out, ~whole)                       # double_counter_value
        pkt = Msg(n)
        pkt.varint(b"\x40", rel)
        pkt.message(b"\x5a", te)
        pkt.const(_SEQ)
        self._put(_data(_framed(pkt)))
        self.counts.samples += n


def _framed(pkt: Msg) -> pa.Array:
    """Each row's packet as a Trace's `packet` field."""
    outer = Msg(pkt.n)
    outer.message(b"\x0a", pkt)
    return outer.build()
