"""The journal: the crash-safe sink every batch goes to first.

Each table gets an Arrow IPC stream segment under _ranks/rank=<r>/journal/. The file is
unbuffered (pyarrow.OSFile), so each batch is in the kernel's hands as soon as it is
written: a profiler killed with SIGKILL loses only what collectors had not yet
emitted (they emit at least once a second). Segments rotate at a size limit so
compaction, which streams them into Parquet, never holds a whole run in memory, and so a
rotated (closed) segment can be compacted while the run goes on (on_rotate: the session's
compact.BackgroundCompactor), leaving only the open one to the end of the run.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from collections.abc import Callable, Iterator

import pyarrow as pa

from ..ground.schema import TABLES
from . import safepath
from .rundir import JOURNAL, rank_dir
from counterprof.ground.record import record

SUFFIX = ".arrows"
# What the end of a run has left to compact is at most one segment per table: 16 MB is about
# 350k samples (a minute of -I 1), a fraction of a second to compact.
SEGMENT_BYTES = 16 * 1024 * 1024
# A smaller size, for tests and benchmarks that want rotations from a short run.
SEGMENT_BYTES_ENV = "COUNTERPROF_SEGMENT_BYTES"
# Gathers one batch's writes (a bigger batch goes through in more than one write).
BUFFER_BYTES = 256 * 1024


def rotation_bytes() -> int:
    raw = os.environ.get(SEGMENT_BYTES_ENV, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else SEGMENT_BYTES


@record(frozen=True)
class Segment:
    path: Path
    table: str
    writer: str
    seq: int

    @classmethod
    def parse(cls, path: Path) -> Segment | None:
        name = path.name
        if not name.endswith(SUFFIX):
            return None
        parts = name[: -len(SUFFIX)].split("~")
        if len(parts) != 3 or not parts[2].isdigit():
            return None
        return cls(path, parts[0], parts[1], int(parts[2]))


def segment_name(table: str, writer: str, seq: int) -> str:
    return f"{table}~{writer}~{seq:06d}{SUFFIX}"


class _Stream:
    def __init__(self, path: Path, schema: pa.Schema):
        # created 0600 and exclusively first (a planted link is never written through), then
        # reopened by pyarrow's unbuffered file: the kernel has each batch at once
        safepath.create_private(path)
        self.file = pa.OSFile(str(path), "wb")
        # the IPC writer puts out each batch in a dozen small writes (metadata, padding, each
        # buffer): gathered here and flushed as one, the batch is one syscall (a drain's writes
        # were ~0.5 ms each on a VM with cold caches), and still in the kernel once write returns
        self.buffered = pa.BufferedOutputStream(self.file, BUFFER_BYTES)
        self.writer = pa.ipc.new_stream(self.buffered, schema)
        self.buffered.flush()

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        self.buffered.flush()

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            try:
                self.buffered.close()          # flushes; closes the file too
            finally:
                if not self.file.closed:
                    self.file.close()


# Called with (rank folder, segment) once a segment is closed and will not be written again.
OnRotate = Callable[[Path, "Segment"], None]


class JournalWriter:
    """A sink: write(table, batch) appends to that table's current segment."""

    def __init__(self, rank_path: Path, writer_id: str, segment_bytes: int | None = None,
                 on_rotate: OnRotate | None = None):
        self.rank_path = Path(rank_path)
        self.dir = self.rank_path / JOURNAL
        safepath.make_dirs(Path(rank_path), self.dir)      # 0700; never a link
        self.writer_id = writer_id
        self.segment_bytes = segment_bytes or rotation_bytes()
        self.on_rotate = on_rotate
        self._streams: dict[str, _Stream] = {}
        self._seq: dict[str, int] = {}
        self._lock = threading.Lock()
        self.rows: dict[str, int] = {}
        self.closed = False

    def write(self, table: str, batch: pa.RecordBatch) -> None:
        with self._lock:
            if self.closed:
                return
            stream = self._streams.get(table)
            if stream is not None and stream.file.tell() >= self.segment_bytes:
                stream.close()
                stream = None
                if self.on_rotate is not None:      # only queues it: this is a collector's thread
                    seq = self._seq[table]
                    closed = self.dir / segment_name(table, self.writer_id, seq)
                    self.on_rotate(self.rank_path, Segment(closed, table, self.writer_id, seq))
            if stream is None:
                seq = self._seq.get(table, -1) + 1
                self._seq[table] = seq
                stream = _Stream(self.dir / segment_name(table, self.writer_id, seq), batch.schema)
                self._streams[table] = stream
            stream.write(batch)
            self.rows[table] = self.rows.get(table, 0) + batch.num_rows

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for stream in self._streams.values():
                stream.close()
            self._streams.clear()


class JournalSet:
    """The session's sink: one JournalWriter per rank partition, opened on first use."""

    def __init__(self, run_path: Path, writer_id: str, on_rotate: OnRotate | None = None):
        self.run_path = Path(run_path)
        self.writer_id = writer_id
        self.on_rotate = on_rotate
        self.writers: dict[int, JournalWriter] = {}
        self._lock = threading.Lock()

    def write(self, table: str, batch: pa.RecordBatch, rank: int) -> None:
        with self._lock:
            w = self.writers.get(rank)
            if w is None:
                w = self.writers[rank] = JournalWriter(rank_dir(self.run_path, rank), self.writer_id,
                                                       on_rotate=self.on_rotate)
        w.write(table, batch)

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


def segments(rank_path: Path) -> list[Segment]:
    """The journal's segments, found without following a link (a linked journal folder or
    segment is skipped and named: its files are not the run's to read, compact or delete)."""
    found = [s for s in (Segment.parse(p) for p in safepath.files(Path(rank_path) / JOURNAL))
             if s is not None]
    return sorted(found, key=lambda s: (s.table, s.writer, s.seq))


@record
class SegmentRead:
    """What reading one segment found: a clean end, where a killed writer stopped, or batches
    left out because their bytes are damaged (a flipped bit: Arrow would crash on them)."""

    batches: int = 0
    rows: int = 0
    truncated: bool = False
    error: str = ""
    damaged: int = 0          # batches left out
    damage: str = ""          # why the first of them was


def _schema_problem(schema: pa.Schema, table: str | None) -> str:
    """Why a segment's schema is not the one counterprof writes for its table ("" if it is)."""
    expected = TABLES.get(table) if table else None
    if expected is None:
        return ""
    got = [(f.name, f.type) for f in schema]
    want = [(f.name, f.type) for f in expected]
    if got != want:
        return f"its schema is not counterprof's {table} schema ({schema.names})"
    return ""


def batch_problem(batch: pa.RecordBatch, schema: pa.Schema | None = None) -> str:
    """Why a batch read from disk must not be used ("" if it may): Arrow's full validation
    (offsets, dictionary indices, UTF-8), nulls where the schema has none, null dictionary
    entries. Arrow's kernels and the Parquet writer trust these and crash on them."""
    try:
        batch.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        return str(exc).splitlines()[0]
    fields = schema if schema is not None else batch.schema
    for f, col in zip(fields, batch.columns):
        if not f.nullable and col.null_count:
            return f"column {f.name} holds nulls"
        if pa.types.is_dictionary(col.type) and col.dictionary.null_count:
            return f"column {f.name}'s dictionary holds nulls"
    return ""


def read_segment(path: Path, report: SegmentRead | None = None) -> Iterator[pa.RecordBatch]:
    """Batches of one segment, tolerating a tail cut off by a killed writer and leaving out
    (and counting in report) batches whose bytes are damaged; a segment whose schema is not its
    table's yields nothing."""
    report = report if report is not None else SegmentRead()
    seg = Segment.parse(Path(path))
    try:
        if os.path.getsize(path) == 0:
            report.truncated = True
            report.error = "empty segment (the writer died before its first batch)"
            return
        # read, not mmap: an mmapped segment's pages all count as resident once read
        reader = pa.ipc.open_stream(pa.OSFile(str(path), "rb"))
    except (pa.ArrowInvalid, OSError) as exc:
        report.truncated = True
        report.error = str(exc)
        return
    problem = _schema_problem(reader.schema, seg.table if seg else None)
    if problem:
        report.truncated = True
        report.error = f"damaged: {problem}"
        return
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as exc:
            report.truncated = True
            report.error = str(exc)
            return
        except MemoryError:
            # a batch is at most a second of one writer's rows: one that asks for more memory
            # than there is has a damaged length (a flipped byte), and framing is lost from it
            report.truncated = True
            report.error = "damaged: a batch's lengths ask for more memory than there is"
            return
        problem = batch_problem(batch, reader.schema)
        if problem:                 # framing holds (each message has its length): go on
            report.damaged += 1
            report.damage = report.damage or problem
            continue
        report.batches += 1
        report.rows += batch.num_rows
        yield batch
