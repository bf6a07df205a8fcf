"""Streaming Kineto trace scanner: a trace file -> batches of raw event columns.

A Kineto trace is one JSON object: {"schemaVersion": 1, "deviceProperties": [...],
"traceEvents": [ {...}, {...}, ... ], "baseTimeNanoseconds": ...}. The metadata keys may come
before or after "traceEvents" (older PyTorch writes baseTimeNanoseconds last). The scanner walks
the top-level object itself over a refillable buffer, so memory stays bounded whatever the file
size: top-level values are decoded one at a time, and the events are decoded one at a time too.

Two event decoders produce identical columns:
- native (default): native/kineto.c parses the events straight from the UTF-8 bytes into column
  arrays (no Python object per event);
- python (the reference, used by the property tests): json.JSONDecoder.raw_decode, one event
  object at a time, over a str buffer.

Kept: complete events (ph "X") with numeric ts and dur; times are exact ns (the number's text
times 1000, rounded half away from zero below 1 ns). Every other element of traceEvents (flow
arrows, instants, metadata) is counted in `skipped`.
"""
from __future__ import annotations

import codecs
import decimal
import json
import os
import re
import stat
import sys
import threading
from collections.abc import Callable, Generator, Iterator

TYPE_CHECKING = False     # (typing.TYPE_CHECKING without importing typing: ~2 ms before the scan starts)
if TYPE_CHECKING:
    from typing import Any

    import pyarrow as pa
# pyarrow loads where a batch is finished, not with this module: `counterprof import` starts
# scanning its first trace while it loads (start_early), ~60 ms of its start-up

if TYPE_CHECKING:     # isal_zlib has zlib's API (its stub types `error` as an instance)
    import zlib as _zlib
else:
    try:   # ISA-L inflates gzip twice as fast as zlib (x86-64, Arm); the same API
        from isal import isal_zlib as _zlib
    except ImportError:
        import zlib as _zlib

NONE = -(2 ** 63)            # CP_KINETO_NONE: an absent integer
INT_COLUMNS = ("ts_ns", "dur_ns", "pid", "tid", "stream", "device", "correlation",
               "external_id", "bytes")
ARG_INTS = {"stream": "stream", "device": "device", "correlation": "correlation",
            "External id": "external_id", "bytes": "bytes"}
CHUNK_BYTES = 1 << 20         # bigger chunks cost memory and gain no speed
BATCH_ROWS = 16 * 1024
MAX_META_CHARS = 1 << 20      # a top-level value (deviceProperties...) longer is left out, named
TOO_BIG = object()
MAX_VALUE_CHARS = 64 << 20   # a longer event or top-level value means damaged text (an open quote)
NAME_BYTES = 8 << 20          # name text per batch (kernel names run to kilobytes; a full buffer ends the batch)
CAT_BYTES = 1 << 20
SHAPES_BYTES = 4 << 20        # op shapes text per batch (a full buffer ends the batch)
SHAPES_NONE, SHAPES_TEXT, SHAPES_PYTHON = 0, 1, 2   # kineto.c's shapes_state
# batches parsed before the libraries are there, held unfinished (their text with them, for
# the args taken at finish): the memory an early start may hold, ~10 MB each
EARLY_BATCHES = 4
EARLY_CHUNK_BYTES = 8 << 20
EARLY_SWITCH_INTERVAL = 0.0005    # s: sys.setswitchinterval while the libraries load


class TraceFileError(Exception):
    """The file cannot be read as a trace at all (missing, not gzip, not JSON)."""


class RawEvents:
    """One batch of complete events. columns: cat, name (string) and INT_COLUMNS (int64, null
    when absent); args: the decoded args of the rows the scanner was asked to keep them for;
    shapes: per row, op_shapes() of the rows the scanner was asked shapes for (null elsewhere).
    (A plain class: a record would load dataclasses, ~6 ms, before start_early can start.)"""

    __slots__ = ("columns", "args", "shapes")

    def __init__(self, columns: dict[str, pa.Array], args: dict[int, dict[str, Any]] | None = None,
                 shapes: pa.Array | None = None):
        self.columns = columns
        self.args = {} if args is None else args
        self.shapes = shapes

    @property
    def num_rows(self) -> int:
        return len(self.columns["name"])


def wants_nothing(cat: pa.Array, name: pa.Array) -> pa.Array | None:
    return None


def op_shapes(args: dict[str, Any]) -> str | None:
    """attrs of a torch op: its recorded Input Dims and Input type exactly as the trace has
    them, and Concrete Inputs (stride, padding, groups, is_causal) when any is recorded.
    native/kineto.c makes the same text from the args' own bytes (make_shapes); this is the
    reference, and the fallback for the text it leaves to Python."""
    if "Input Dims" not in args:
        return None
    shapes = {"input_dims": args["Input Dims"], "input_types": args.get("Input type")}
    concrete = args.get("Concrete Inputs")
    if isinstance(concrete, list) and any(concrete):
        shapes["concrete_inputs"] = concrete
    return json.dumps(shapes, separators=(",", ":"), default=float)   # float: the reference decoder's Decimals


# ---- the file ---------------------------------------------------------------------------

class _Source:
    """Bytes of a .json or .json.gz file (gzip recognised by its magic, not its name).

    gzip goes through ISA-L's (or zlib's) inflate directly: the CRC is checked inside inflate,
    not in a second pass as gzip.GzipFile does; concatenated members are read one after another."""

    RAW_BYTES = 1 << 20

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        try:
            self.raw = open(self.path, "rb", buffering=0)
        except OSError as exc:
            raise TraceFileError(f"{self.path}: {exc.strerror}") from None
        magic = self.raw.read(2)
        self.raw.seek(0)
        self.compressed = magic == b"\x1f\x8b"
        self._z = _zlib.decompressobj(31) if self.compressed else None
        self._pending = b""          # compressed input not yet given to zlib
        self._member_started = False
        self.problem = ""

    def read(self, n: int) -> bytes:
        """Up to n bytes; b"" at the end. A cut-off or damaged gzip stream ends the data early
        (what came before it is kept) and leaves the reason in self.problem."""
        if self.problem:
            return b""
        if self._z is None:
            return self.raw.read(n)
        out: list[bytes] = []
        size = 0
        try:
            while size < n:
                data = self._z.unconsumed_tail or self._pending
                self._pending = b""
                if not data:
                    data = self.raw.read(self.RAW_BYTES)
                    if not data:
                        if self._member_started and not self._z.eof:
                            try:              # what inflate still holds of a cut-off stream
                                out.append(self._z.flush())
                            except _zlib.error:
                                pass
                            self.problem = ("the gzip stream is cut off (the file was not "
                                            "written to the end)")
                        break
                self._member_started = True
                chunk = self._z.decompress(data, n - size)
                out.append(chunk)
                size += len(chunk)
                if self._z.eof:            # the end of one gzip member; another may follow
                    rest = self._z.unused_data
                    self._z = _zlib.decompressobj(31)
                    self._member_started = False
                    if rest.strip(b"\0"):
                        self._pending = rest
        except _zlib.error as exc:
            self.problem = f"the gzip data is damaged ({exc})"
        return b"".join(out)

    def close(self) -> None:
        self.raw.close()


class _ReadAhead:
    """A _Source inflated by a thread a few chunks ahead of the scanner: inflate and the C
    scanner both run without the GIL, so on two cores the gzip costs the import next to
    nothing. `problem` is the source's as of the last chunk handed out, as if read in line."""

    AHEAD = 3

    def __init__(self, src: _Source, n: int):
        import queue
        import threading
        self.src = src
        self.compressed = src.compressed
        self.problem = ""
        self._n = n
        self._chunks: queue.Queue[tuple[bytes, str, BaseException | None]] = queue.Queue(self.AHEAD)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="counterprof-inflate", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import queue
        while not self._stop.is_set():
            item: tuple[bytes, str, BaseException | None]
            try:
                item = (self.src.read(self._n), self.src.problem, None)
            except BaseException as exc:      # handed to the reader, raised there
                item = (b"", self.src.problem, exc)
            while not self._stop.is_set():
                try:
                    self._chunks.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if not item[0]:
                return

    def read(self, n: int) -> bytes:
        if self._done:
            return b""
        data, self.problem, exc = self._chunks.get()
        if exc is not None:
            self._done = True
            raise exc
        self._done = not data
        return data

    def close(self) -> None:
        self._stop.set()
        _empty(self._chunks)
        self._thread.join()
        self.src.close()


def _empty(q: Any) -> None:
    """Take what is left in a queue, so that its producer, blocked on put, sees the stop."""
    import queue
    try:
        while True:
            q.get_nowait()
    except queue.Empty:
        pass


# ---- the top-level walk, shared by both decoders ------------------------------------------

class _Incomplete(Exception):
    pass


class _Corrupt(Exception):
    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


class KinetoScanner:
    """Iterate over RawEvents batches of one trace file; afterwards (or during, for keys that
    precede traceEvents) `meta` holds the other top-level keys.

    wants_args(cat, name) -> boolean mask (or None): rows whose args are decoded into
    RawEvents.args (collectives, the Trace span): a few rows, not every event.
    wants_shapes(cat, name) -> boolean mask (or None): rows whose op_shapes() text goes into
    RawEvents.shapes (the costed torch ops), made without decoding their args in Python.
    """

    def __init__(self, path: str | os.PathLike[str], *, native: bool = True,
                 chunk_bytes: int = CHUNK_BYTES, batch_rows: int = BATCH_ROWS,
                 wants_args: Callable[[pa.Array, pa.Array], Any] = wants_nothing,
                 wants_shapes: Callable[[pa.Array, pa.Array], Any] = wants_nothing,
                 on_meta: Callable[[str, Any], None] | None = None):
        self.path = os.fspath(path)
        self.native = native
        self.chunk_bytes = max(16, int(chunk_bytes))
        self.batch_rows = max(1, int(batch_rows))
        self.wants_args = wants_args
        self.wants_shapes = wants_shapes
        self.on_meta = on_meta
        self.meta: dict[str, Any] = {}
        self.problems: list[str] = []
        self.truncated = False            # the events stop early (cut off or damaged)
        self.found_events = False         # a traceEvents array was found
        self.events = 0                   # complete events kept
        self.skipped = 0                  # other elements of traceEvents
        self.bad_time = 0                 # of those: "X" events whose ts or dur is not a number
        self.too_long = 0                 # of those: events whose name outgrew the buffers
        self.bytes_read = 0
        self.compressed = False
        # start_early's scanner: set once pyarrow is loaded (adopt); until then the
        # native scan parses ahead and holds its batches unfinished (None: finish at once)
        self.libraries_ready: threading.Event | None = None
        self._held: list[_NativeBatch] = []
        self.early: _ScanAhead | None = None      # start_early's thread, once adopted

    # -- buffer ---------------------------------------------------------------------------

    def _open(self) -> None:
        self.src: _Source | _ReadAhead = _Source(self.path)
        # an early scan inflates in its own thread while the libraries load (two cores: the
        # imports keep one); the inflate thread starts once they are loaded (_fill)
        if self.src.compressed and not self._holding():
            self.src = _ReadAhead(self.src, self.chunk_bytes)
        self.compressed = self.src.compressed
        if self.native:
            self.buf: Any = b""
            self._decoder = None
        else:
            self.buf = ""
            self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pos = 0
        self.eof = False
        self.consumed = 0                 # characters/bytes dropped from the buffer's front

    def _fill(self) -> None:
        """Drop what was consumed, append the next chunk (raises _Incomplete at the end)."""
        if self.eof:
            raise _Incomplete()
        if self.src.compressed and isinstance(self.src, _Source) and not self._holding():
            self.src = _ReadAhead(self.src, self.chunk_bytes)
        data = self.src.read(self.chunk_bytes)
        self.bytes_read += len(data)
        if not data:
            self.eof = True
            tail: str | bytes
            if self._decoder is not None:
                tail = self._decoder.decode(b"", final=True)
            else:
                tail = b""
        else:
            tail = self._decoder.decode(data) if self._decoder is not None else data
        self.consumed += self.pos
        self.buf = self.buf[self.pos:] + tail
        self.pos = 0

    def _peek(self) -> str:
        """The next non-whitespace character ("" at the end), self.pos moved onto it."""
        while True:
            m = _WS_BYTES.match(self.buf, self.pos) if self.native else _WS_STR.match(self.buf, self.pos)
            assert m is not None          # (whitespace or none: it always matches)
            self.pos = m.end()
            if self.pos < len(self.buf):
                ch = self.buf[self.pos:self.pos + 1]
                c: str = ch.decode("latin-1") if self.native else ch
                return c
            if self.eof:
                return ""
            self._fill()

    def _value(self, decoder: json.JSONDecoder | None = None, max_chars: int | None = None) -> Any:
        """Decode one JSON value at self.pos (refilling as needed). The reference decoder reads
        events with exact numbers (Decimal); top-level values read as json.loads would.
        max_chars: a longer value is stepped over, not decoded (TOO_BIG, its length in .big)."""
        self._peek()
        while True:
            try:
                if self.native:
                    end = _native_skip(self.buf, self.pos, self.eof)
                    if max_chars is not None and end - self.pos > max_chars:
                        self.big, self.pos = end - self.pos, end
                        return TOO_BIG
                    text = self.buf[self.pos:end].decode("utf-8", "replace")
                    try:      # as the reference reads it: a raw tab or control character in a string is kept
                        value = _META_DECODER.decode(text)
                    except ValueError as exc:    # what the skipper let through: said where, not raised
                        raise _Corrupt(getattr(exc, "msg", str(exc)), self._here()) from None
                else:
                    value, end = _decode_one(self.buf, self.pos, self.eof, decoder or _META_DECODER)
            except _Incomplete:
                self._check_size()
                self._fill()
                continue
            self.pos = end
            return value

    def _check_size(self) -> None:
        """Refilling for one value must stop somewhere: a value this long is damaged text
        (typically a quote that never closes), and reading on would hold the whole file."""
        if len(self.buf) - self.pos > MAX_VALUE_CHARS:
            raise _Corrupt(f"a JSON value runs past {MAX_VALUE_CHARS >> 20} MB (an unclosed "
                           "string or bracket?)", self._here())

    def _here(self) -> int:
        return self.consumed + self.pos

    # -- walk -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[RawEvents]:
        self._open()
        try:
            yield from self._walk()
            self._check_after_end()
        except _Incomplete:
            self._problem_end()
        except _Corrupt as exc:
            self.truncated = self.truncated or self.found_events
            self.problems.append(f"the JSON is damaged at {self._where(exc.pos)}: {exc} "
                                 f"(kept what came before it)")
        finally:
            self.src.close()

    def _check_after_end(self) -> None:
        """Past the trace's closing bracket: whitespace, or text that is said, not silently
        dropped (a second trace appended to the file, as `cat a.json.gz b.json.gz` makes)."""
        if self._peek() != "":
            self.problems.append(f"text follows the trace's end at {self._where(self._here())} "
                                 "and was not read (a second trace appended to this file?)")

    def _where(self, pos: int) -> str:
        unit = "character" if not self.native else "byte"
        where = f"{unit} {pos:,}"
        return where + (" of the decompressed text" if self.compressed else "")

    def _problem_end(self) -> None:
        if self.src.problem:
            self.problems.append(self.src.problem)
        else:
            self.problems.append("the file ends before the trace does (cut off while it was "
                                 "being written?)")
        self.truncated = self.truncated or self.found_events

    def _walk(self) -> Iterator[RawEvents]:
        if self.native:
            self._fill_if_empty()
            if self.buf.startswith(b"\xef\xbb\xbf"):
                self.pos = 3
        else:
            self._fill_if_empty()
            if self.buf.startswith("\ufeff"):
                self.pos = 1
        first = self._peek()
        if first == "":
            if self.src.problem:
                raise TraceFileError(f"{self.path}: {self.src.problem}")
            raise TraceFileError(f"{self.path} is empty")
        if first == "[":                  # Chrome's JSON Array Format: the events alone
            self.pos += 1
            yield from self._events()
            return
        if first != "{":
            raise TraceFileError(f"{self.path} is not a JSON trace (it starts with {first!r}, "
                                 "not '{')")
        self.pos += 1
        expect_key = True
        while True:
            ch = self._peek()
            if ch == "":
                raise _Incomplete()
            if ch == "}" and expect_key and not self.meta and not self.found_events:
                self.pos += 1
                return
            if ch == "}" and not expect_key:
                self.pos += 1
                return
            if not expect_key:
                if ch != ",":
                    raise _Corrupt("expected ',' or '}' after a top-level value", self._here())
                self.pos += 1
                expect_key = True
                continue
            if ch != '"':
                raise _Corrupt("expected a top-level key", self._here())
            key = self._value()
            if self._peek() != ":":
                raise _Corrupt("expected ':' after a top-level key", self._here())
            self.pos += 1
            if key == "traceEvents" and self._peek() == "[":
                self.pos += 1
                self.found_events = True
                yield from self._events()
            else:
                value = self._value(max_chars=MAX_META_CHARS)
                if value is TOO_BIG:       # a 50 MB deviceProperties would cost 10x in objects
                    self.problems.append(f"the trace's {key!r} is {self.big / 2**20:.1f} MB: left "
                                         f"out (over {MAX_META_CHARS >> 20} MB is not metadata)")
                    expect_key = False
                    continue
                self.meta[key] = value
                if self.on_meta is not None:
                    self.on_meta(key, value)
            expect_key = False

    def _fill_if_empty(self) -> None:
        try:
            self._fill()
        except _Incomplete:
            pass

    # -- events -----------------------------------------------------------------------------

    def _events(self) -> Iterator[RawEvents]:
        self.found_events = True
        try:
            if self.native:
                yield from self._events_native()
            else:
                yield from self._events_python()
        finally:
            self._say_left_out()

    def _say_left_out(self) -> None:
        """Events left out for their values are counted and said, never dropped silently."""
        if self.bad_time:
            self.problems.append(
                f"{self.bad_time:,} complete event(s) (ph X) left out: their ts or dur is not a "
                "number of µs (a string, NaN, or too large for a time)")
        if self.too_long:
            self.problems.append(
                f"{self.too_long:,} event(s) left out: a name or category longer than "
                f"{NAME_BYTES:,} bytes")

    def _events_python(self) -> Iterator[RawEvents]:
        rows: list[tuple[Any, ...]] = []
        args: dict[int, dict[str, Any]] = {}
        want = self.wants_args is not wants_nothing or self.wants_shapes is not wants_nothing
        need_comma = False
        while True:
            ch = self._peek()
            if ch == "":
                yield from self._flush_python(rows, args)
                raise _Incomplete()
            if need_comma:
                if ch == "]":
                    self.pos += 1
                    break
                if ch != ",":
                    yield from self._flush_python(rows, args)
                    raise _Corrupt("expected ',' or ']' between events", self._here())
                self.pos += 1
                need_comma = False
                continue
            if ch == "]" and self.events + self.skipped == 0 and not rows:
                self.pos += 1
                break
            try:
                ev = self._value(_DECODER)
            except _Corrupt:
                yield from self._flush_python(rows, args)
                raise
            except _Incomplete:
                yield from self._flush_python(rows, args)
                raise
            need_comma = True
            row = _python_row(ev)
            if row is None:
                self.skipped += 1
                self.bad_time += (isinstance(ev, dict) and isinstance(ev.get("ph"), str)
                                  and ev["ph"][:1] == "X")
                continue
            if want and isinstance(ev.get("args"), dict):
                args[len(rows)] = ev["args"]
            rows.append(row)
            if len(rows) >= self.batch_rows:
                yield from self._flush_python(rows, args)
        yield from self._flush_python(rows, args)

    def _flush_python(self, rows: list[tuple[Any, ...]], args: dict[int, dict[str, Any]]) -> Iterator[RawEvents]:
        if not rows:
            return
        import pyarrow as pa
        cols = list(zip(*rows))
        columns = {"cat": pa.array(cols[0], pa.string()), "name": pa.array(cols[1], pa.string())}
        for i, name in enumerate(INT_COLUMNS):
            columns[name] = pa.array(cols[2 + i], pa.int64())
        kept_args: dict[int, dict[str, Any]] = {}
        if args:
            mask = self.wants_args(columns["cat"], columns["name"])
            if mask is not None:
                for i in _true_indices(mask):
                    if i in args:
                        kept_args[i] = args[i]
        shapes = None
        mask = self.wants_shapes(columns["cat"], columns["name"])
        if mask is not None:
            texts: list[str | None] = [None] * len(rows)
            for i in _true_indices(mask):
                if i in args:
                    texts[i] = op_shapes(args[i])
            shapes = pa.array(texts, pa.string())
        self.events += len(rows)
        rows.clear()
        args.clear()
        yield RawEvents(columns, kept_args, shapes)

    def _events_native(self) -> Iterator[RawEvents]:
        from counterprof._native import ffi, lib
        batch = _NativeBatch(ffi, self.batch_rows)
        scan = ffi.new("struct cp_kineto_scan *")
        scan.min_headroom = min(1 << 20, NAME_BYTES // 8)
        while True:
            buf = self.buf
            scan.pos = self.pos
            cbuf = ffi.from_buffer(buf)
            r0 = batch.cols.rows
            status = lib.cp_kineto_events(cbuf, len(buf), 1 if self.eof else 0, batch.cols, scan)
            if batch.cols.rows > r0:
                # the args are taken while their text is in the buffer (kept with the batch
                # while it is held)
                batch.segments.append((buf, r0, batch.cols.rows))
                if not self._holding():
                    batch.take_args(self.wants_args, self.wants_shapes)
            self.pos = scan.pos
            self.skipped = int(scan.skipped)
            self.bad_time, self.too_long = int(scan.bad_time), int(scan.too_long)
            if status == lib.CP_KINETO_END:
                break
            if status == lib.CP_KINETO_FULL:
                self.events += batch.cols.rows
                yield from self._finished(batch)
                batch = _NativeBatch(ffi, self.batch_rows)
                continue
            if status == lib.CP_KINETO_ERROR:
                message = ffi.string(scan.error).decode()
                pos = self.consumed + int(scan.error_pos)
                self.events += batch.cols.rows
                yield from self._finished(batch, last=True)
                if "ends inside" in message:
                    raise _Incomplete()
                raise _Corrupt(message, pos)
            # MORE: the buffer ends inside an event
            try:
                self._check_size()
                self._fill()
            except _Incomplete:
                self.events += batch.cols.rows
                yield from self._finished(batch, last=True)
                raise
        self.events += batch.cols.rows
        yield from self._finished(batch, last=True)

    def _holding(self) -> bool:
        return self.libraries_ready is not None and not self.libraries_ready.is_set()

    def _finished(self, batch: _NativeBatch, last: bool = False) -> Iterator[RawEvents]:
        """batch as RawEvents, after the batches held before it. Before the libraries are
        loaded, batches are held (up to EARLY_BATCHES, or the last), then waited for."""
        if batch.cols.rows:
            self._held.append(batch)
        if self._holding():
            if len(self._held) < EARLY_BATCHES and not last:
                return
            assert self.libraries_ready is not None
            self.libraries_ready.wait()
        while self._held:
            held = self._held.pop(0)
            held.take_args(self.wants_args, self.wants_shapes)
            yield held.finish()


class _ScanAhead:
    """A thread that scans `scanner` up to `depth` batches ahead of its reader (scan_ahead)."""

    def __init__(self, scanner: KinetoScanner, depth: int = 2):
        import queue
        self.scanner = scanner
        self.items: queue.Queue[Any] = queue.Queue(depth)
        self.stop = threading.Event()
        self.done = object()
        self.thread = threading.Thread(target=self._run, name="counterprof-scan", daemon=True)
        self.thread.start()

    def _put(self, item: Any) -> bool:
        import queue
        while not self.stop.is_set():
            try:
                self.items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        batches = iter(self.scanner)
        try:
            for raw in batches:
                if not self._put((raw, dict(self.scanner.meta))):
                    return
            self._put(self.done)
        except BaseException as exc:            # raised in the caller, in line with the batches
            self._put(exc)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        self.stop.set()
        if self.scanner.libraries_ready is not None:
            self.scanner.libraries_ready.set()      # a held scan stops waiting (and then stops)
        _empty(self.items)
        self.thread.join()


def scan_ahead(scanner: KinetoScanner, depth: int = 2) -> Generator[tuple[RawEvents, dict[str, Any]], None, None]:
    """scanner's batches, each with scanner.meta as it was when the batch came out, scanned by
    a thread up to `depth` batches ahead of the caller: the C scanner runs without the GIL, so
    on two cores the parse of the next batch overlaps the caller's conversion and Parquet
    writing of this one (~40% of a `counterprof import`). The meta snapshot keeps what the
    caller sees what it would see scanning in line (keys that follow traceEvents arrive once
    the events are scanned). When the generator ends (or is closed early), the thread has
    finished: scanner's counters and problems are final. A scanner start_early started
    (adopt) goes on in its own thread."""
    ahead, scanner.early = scanner.early, None
    if ahead is None:
        ahead = _ScanAhead(scanner, depth)
    try:
        while True:
            item = ahead.items.get()
            if item is ahead.done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        ahead.close()


# ---- the early start: `counterprof import` scans its first trace while pyarrow loads

_early: dict[tuple[int, int], _ScanAhead] = {}


def start_early(path: str | os.PathLike[str]) -> None:
    """Start scanning the regular file `path` on a thread now, before the libraries load: the
    inflate and the C parse run without the GIL, beside the imports (the Python of each batch
    waits for adopt). Anything unusual (not a regular file, not readable) is left to the
    conversion to find and say."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(st.st_mode):
        return
    # bigger chunks: each one's parse hands the GIL back and waits for it (up to the switch
    # interval while the imports run), so fewer, longer parses
    scanner = KinetoScanner(path, chunk_bytes=EARLY_CHUNK_BYTES)
    scanner.libraries_ready = threading.Event()
    _early[(st.st_dev, st.st_ino)] = _ScanAhead(scanner)
    # the scan thread's Python between its C calls (the walk to traceEvents, each refill)
    # waits for the GIL the imports hold: up to the switch interval each time (5 ms); a
    # shorter one while they load (-5% of an a100_rank3of8 import), the usual one from adopt
    global _switch_interval
    if _switch_interval is None:
        _switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(EARLY_SWITCH_INTERVAL)


def adopt(path: str | os.PathLike[str], *, native: bool, chunk_bytes: int, batch_rows: int,
          wants_args: Callable[[pa.Array, pa.Array], Any],
          wants_shapes: Callable[[pa.Array, pa.Array], Any]) -> KinetoScanner | None:
    """The scanner start_early started on this same file with these settings, now given what
    the conversion wants (read once the libraries are loaded); None: there is none."""
    if not _early:
        return None
    _restore_switch_interval()
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    ahead = _early.pop((st.st_dev, st.st_ino), None)
    if ahead is None:
        return None
    scanner = ahead.scanner
    if (native, chunk_bytes, max(1, int(batch_rows))) != (scanner.native, CHUNK_BYTES, scanner.batch_rows):
        ahead.close()
        return None
    scanner.wants_args, scanner.wants_shapes = wants_args, wants_shapes
    scanner.chunk_bytes = CHUNK_BYTES               # the rest of the file in the usual chunks
    src = getattr(scanner, "src", None)
    if isinstance(src, _ReadAhead):
        src._n = CHUNK_BYTES
    scanner.early = ahead
    assert scanner.libraries_ready is not None
    scanner.libraries_ready.set()
    return scanner


_switch_interval: float | None = None     # the interpreter's, while start_early's is set


def _restore_switch_interval() -> None:
    global _switch_interval
    if _switch_interval is not None:
        sys.setswitchinterval(_switch_interval)
        _switch_interval = None


class _NativeBatch:
    """Column arrays for cp_kineto_events, handed over to Arrow without copying. The memory is
    cffi's (Arrow's buffers over it are made once pyarrow is loaded: a batch can be parsed
    before). No numpy: `counterprof import` loads pyarrow without it."""

    _alloc = None      # cffi's allocator that leaves memory as it comes (as np.empty does)

    def __init__(self, ffi: Any, capacity: int):
        self.ffi = ffi
        self.capacity = capacity
        if _NativeBatch._alloc is None:
            _NativeBatch._alloc = ffi.new_allocator(should_clear_after_alloc=False)
        empty = _NativeBatch._alloc
        # name: (C type, length, zeroed)
        self._mem = {name: empty("int64_t[]", capacity) for name in (*INT_COLUMNS, "args_start", "args_end")}
        for name, ctype, n, zeroed in (
                ("ph", "uint8_t[]", capacity, False), ("cat_valid", "uint8_t[]", capacity, False),
                ("name_valid", "uint8_t[]", capacity, False),
                ("cat_off", "int32_t[]", capacity + 1, True), ("name_off", "int32_t[]", capacity + 1, True),
                ("cat_data", "char[]", CAT_BYTES, False), ("name_data", "char[]", NAME_BYTES, False),
                ("shapes_state", "uint8_t[]", capacity, True), ("shapes_off", "int32_t[]", capacity + 1, True),
                ("shapes_data", "char[]", SHAPES_BYTES, False)):
            self._mem[name] = ffi.new(ctype, n) if zeroed else empty(ctype, n)
        self.shapes_wanted: bytearray | None = None     # rows wants_shapes selected (1 each)
        self.shapes_python: dict[int, str | None] = {}   # rows whose text kineto.c left to Python
        # (buffer, first row, end row) of each cp_kineto_events call whose args are not taken yet
        self.segments: list[tuple[bytes, int, int]] = []
        c = self.cols = ffi.new("struct cp_kineto_cols *")
        c.capacity = capacity
        c.rows = 0
        for name in (*INT_COLUMNS, "args_start", "args_end", "ph", "cat_valid", "name_valid",
                     "cat_off", "name_off", "cat_data", "name_data", "shapes_state",
                     "shapes_off", "shapes_data"):
            setattr(c, name, self._mem[name])
        c.cat_cap = CAT_BYTES
        c.name_cap = NAME_BYTES
        c.shapes_cap = SHAPES_BYTES
        self.args: dict[int, dict[str, Any]] = {}
        self._buffers: dict[str, pa.Buffer] | None = None

    def _arrow(self) -> dict[str, pa.Buffer]:
        """Arrow buffers over the C arrays (made the first time the batch is read)."""
        if self._buffers is None:
            import pyarrow as pa
            self._buffers = {name: pa.py_buffer(self.ffi.buffer(mem)) for name, mem in self._mem.items()}
        return self._buffers

    def _strings(self, which: str, r0: int, r1: int) -> pa.Array:
        import pyarrow as pa
        from . import arrow_compute as pc
        bufs = self._arrow()
        off = self._mem["cat_off" if which == "cat" else "name_off"]
        n = r1 - r0
        valid = pa.Array.from_buffers(pa.uint8(), n, [None, bufs[f"{which}_valid"]], offset=r0)
        mask = pc.bitmap(pc.cast(valid, pa.bool_()))
        return pa.StringArray.from_buffers(n, bufs[f"{which}_off"].slice(4 * r0, 4 * (n + 1)),
                                           bufs[f"{which}_data"].slice(0, off[r1]), mask)

    def take_args(self, wants: Callable[[pa.Array, pa.Array], Any],
                  wants_shapes: Callable[[pa.Array, pa.Array], Any]) -> None:
        """For each segment not taken yet: decode the args of its rows that `wants` selects,
        and the shapes kineto.c left to Python of those `wants_shapes` selects, from the
        buffer they were parsed from."""
        segments, self.segments = self.segments, []
        if wants is wants_nothing and wants_shapes is wants_nothing:
            return
        for buf, r0, r1 in segments:
            cat, name = self._strings("cat", r0, r1), self._strings("name", r0, r1)
            mask = wants(cat, name)
            if mask is not None:
                for i in _true_indices(mask):
                    args = self._args(buf, r0 + i)
                    if args is not None:
                        self.args[r0 + i] = args
            mask = wants_shapes(cat, name)
            if mask is None:
                continue
            if self.shapes_wanted is None:
                self.shapes_wanted = bytearray(self.capacity)
            wanted, state = self.shapes_wanted, self._mem["shapes_state"]
            for i in _true_indices(mask):
                row = r0 + i
                wanted[row] = 1
                if state[row] == SHAPES_PYTHON:
                    args = self._args(buf, row)
                    self.shapes_python[row] = None if args is None else op_shapes(args)

    def _args(self, buf: bytes, row: int) -> dict[str, Any] | None:
        start = self._mem["args_start"][row]
        if start < 0:
            return None
        try:
            # not strict, as the reference decoder: a raw tab in an argument's string keeps the args
            text = buf[start:self._mem["args_end"][row]].decode("utf-8", "replace")
            args: dict[str, Any] = _META_DECODER.decode(text)
            return args
        except ValueError:
            return None

    def _shapes(self, n: int) -> pa.Array | None:
        if self.shapes_wanted is None:
            return None
        import pyarrow as pa
        from . import arrow_compute as pc
        bufs = self._arrow()
        wanted = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(self.shapes_wanted)])
        state = pa.Array.from_buffers(pa.uint8(), n, [None, bufs["shapes_state"]])
        valid = pc.and_(pc.cast(wanted, pa.bool_()), pc.equal(state, pa.scalar(SHAPES_TEXT, pa.uint8())))
        shapes = pa.StringArray.from_buffers(
            n, bufs["shapes_off"].slice(0, 4 * (n + 1)),
            bufs["shapes_data"].slice(0, self._mem["shapes_off"][n]), pc.bitmap(valid))
        if self.shapes_python:    # rare: escapes, floats, objects in the shapes
            texts = shapes.to_pylist()
            for row, text in self.shapes_python.items():
                texts[row] = text
            shapes = pa.array(texts, pa.string())
        return shapes

    def finish(self) -> RawEvents:
        import pyarrow as pa
        from . import arrow_compute as pc
        bufs = self._arrow()
        n = self.cols.rows
        columns = {"cat": self._strings("cat", 0, n), "name": self._strings("name", 0, n)}
        absent = pa.scalar(NONE, pa.int64())
        for name in INT_COLUMNS:
            values = pa.Array.from_buffers(pa.int64(), n, [None, bufs[name]])
            present = pc.not_equal(values, absent)
            validity = pc.bitmap(present) if present.false_count else None
            columns[name] = pa.Array.from_buffers(pa.int64(), n, [validity, bufs[name]])
        return RawEvents(columns, self.args, self._shapes(n))


def _true_indices(mask: Any) -> list[int]:
    import pyarrow as pa
    from . import arrow_compute as pc
    if isinstance(mask, (pa.Array, pa.ChunkedArray)):
        mask = pc.fill_null(mask, False)
        found = pc.indices_nonzero(mask)
        return pc.int_view(found).tolist() if isinstance(found, pa.Array) else found.to_pylist()
    return [i for i, m in enumerate(mask) if m]


# ---- helpers ------------------------------------------------------------------------------

_WS_BYTES = re.compile(rb"[ \t\r\n]*")
_WS_STR = re.compile(r"[ \t\r\n]*")
_DECODER = json.JSONDecoder(parse_float=decimal.Decimal, strict=False)
_META_DECODER = json.JSONDecoder(strict=False)
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*")
_NS_CONTEXT = decimal.Context(prec=400, rounding=decimal.ROUND_HALF_UP)


def _native_skip(buf: bytes, pos: int, eof: bool) -> int:
    from counterprof._native import ffi, lib
    end = ffi.new("int64_t *")
    err = ffi.new("const char **")
    r = lib.cp_json_skip(ffi.from_buffer(buf), len(buf), pos, 1 if eof else 0, end, err)
    if r == 1:
        raise _Incomplete()
    if r < 0:
        raise _Corrupt(ffi.string(err[0]).decode(), int(end[0]))
    return int(end[0])


def _decode_one(buf: str, pos: int, eof: bool, decoder: json.JSONDecoder) -> tuple[Any, int]:
    """raw_decode that tells "needs more text" from "damaged"."""
    try:
        value, end = decoder.raw_decode(buf, pos)
    except json.JSONDecodeError as exc:
        if not eof:
            raise _Incomplete() from None
        # at the end of the file: text that stops mid-value was cut off, not damaged
        if exc.msg.startswith("Unterminated string") or exc.pos >= len(buf.rstrip()):
            raise _Incomplete() from None
        raise _Corrupt(exc.msg, exc.pos) from None
    if not eof:
        if end >= len(buf):
            raise _Incomplete()      # a number or literal may go on in the next chunk
        if isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool) \
                and (m := _NUMBER_TAIL.match(buf, end)) is not None and m.end() == len(buf):
            raise _Incomplete()      # "0" of "0.5" cut after the "0."
    return value, end


def _int_or_none(v: Any) -> int | None:
    if type(v) is int and NONE < v < 2 ** 63:
        return v
    return None


def us_to_ns(v: Any) -> int | None:
    """Exact ns of a µs value from the JSON text (int, or Decimal from parse_float)."""
    if type(v) is int:
        ns = v * 1000
    elif isinstance(v, decimal.Decimal):
        if not v.is_finite():
            return None
        ns = int(_NS_CONTEXT.multiply(v, 1000).quantize(decimal.Decimal(1), context=_NS_CONTEXT))
    else:
        return None
    return ns if NONE < ns < 2 ** 63 else None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(v: Any) -> str | None:
    """A JSON string as the native decoder gives it: lone surrogates become U+FFFD."""
    if not isinstance(v, str):
        return None
    return v if v.isascii() else _SURROGATE.sub("\ufffd", v)


def _python_row(ev: Any) -> tuple[Any, ...] | None:
    """The reference decoder's reading of one element of traceEvents."""
    if not isinstance(ev, dict):
        return None
    ph = ev.get("ph")
    if not (isinstance(ph, str) and ph[:1] == "X"):
        return None
    ts, dur = us_to_ns(ev.get("ts")), us_to_ns(ev.get("dur"))
    if ts is None or dur is None:
        return None
    cat, name = ev.get("cat"), ev.get("name")
    args = ev.get("args")
    if not isinstance(args, dict):
        args = {}
    return (_text(cat), _text(name),
            ts, dur, _int_or_none(ev.get("pid")), _int_or_none(ev.get("tid")),
            *(_int_or_none(args.get(k)) for k in ARG_INTS))
