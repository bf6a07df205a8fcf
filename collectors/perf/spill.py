"""The perf sampler's spill: every tick's counters, host rows, thread walks and critical-thread
readings, in a mapped file as the sampler's thread takes them (native/spill.c), so the Python drain can
wake every few seconds (a drain's wake-up is most of the profiler's CPU at -I 100) while a
killed profiler still loses nothing the sampler had read.

Writing (the perf collector): `Spill.open` at start, `rotate` before each drain takes the rings,
`note_epoch` when the threads collector watches a new critical thread (its readings' entity),
`close` at a clean stop (the files go: the journal has every row).

Reading (`counterprof recover`, after the journal is compacted): `recover` turns what a killed
profiler's spill holds into rows, leaves out those the rank's samples already hold (the drain
had taken them), writes the rest as a Parquet file of the rank's samples and removes the spill.
Safe to repeat: rows already written are left out the next time.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

SPILL_DIR = "spill"
MAGIC = b"CPSPILL1"
HEAD = 32                                   # magic, sequence, reserved
PERF, HOST, WALK, SCHED, SETTLED = 1, 2, 3, 4, 5   # native CP_SPILL_* kinds
ROLES = 6                                   # native CP_ROLES
_opened = 0                                 # spills opened by this process (a writer's name)


class Spill:
    """One sampler's two spill files and their labels (what a record's slots and epochs are)."""

    def __init__(self, folder: Path, name: str, handle: Any, fds: list[int], labels: dict[str, Any]):
        self.folder, self.name, self.handle, self.fds, self.labels = folder, name, handle, fds, labels

    @classmethod
    def open(cls, run_path: Path, rank: int, slot_keys: list[tuple[str, str]],
             scales: list[float] | None) -> Spill:
        """Create the files in the rank's folder (0600, never through a link) and the C spill."""
        from counterprof._native import ffi, lib
        from counterprof.store import rundir, safepath
        from ..host import METRICS, SYSTEM_FROM
        global _opened
        _opened += 1
        folder = rundir.make_dirs(rundir.rank_dir(run_path, rank) / SPILL_DIR, run_path)
        name = f"perf{os.getpid()}-{_opened}"
        fds: list[int] = []
        try:
            for i in (0, 1):
                path = folder / f"{name}.{i}.spill"
                safepath.unlink_in_run(path)
                fds.append(safepath.create_mapped(path))
            labels = {"version": 1, "pid": os.getpid(), "rank": rank,
                      "perf": {"slots": [list(k) for k in slot_keys], "scale": scales},
                      "host": {"metrics": [m.name for m in METRICS], "system_from": SYSTEM_FROM},
                      "threads": {"epochs": {}}}
            rundir.write_json(folder / f"{name}.json", labels)
            err = ffi.new("int *")
            handle = lib.cp_spill_new(fds[0], fds[1], err)
            if handle == ffi.NULL:
                raise OSError(-err[0], os.strerror(-err[0]), str(folder / name))
        except BaseException:
            for fd in fds:
                os.close(fd)
            for i in (0, 1):
                safepath.unlink_in_run(folder / f"{name}.{i}.spill")
            safepath.unlink_in_run(folder / f"{name}.json")
            raise
        return cls(folder, name, handle, fds, labels)

    def note_epoch(self, epoch: int, entity: str) -> None:
        """The critical thread's readings of this watch are this entity's (written before its
        first reading can be: the watch starts after this returns)."""
        from counterprof.store import rundir
        self.labels["threads"]["epochs"][str(epoch)] = entity
        rundir.write_json(self.folder / f"{self.name}.json", self.labels)

    def note_settled(self, epoch: int, last: tuple[int, int, int], carry: tuple[int, int]) -> None:
        """The threads collector took the critical thread's rows (a watch of it: epoch) up to its
        reading `last` (time, run, wait ns), carrying `carry` (run, wait ns) past it: how the
        recovery settles the readings after it as the next take would have (thread_rows.py)."""
        from counterprof._native import ffi, lib
        rec = struct.pack("<qqqiiqq", *last, epoch, 0, *carry)
        buf = ffi.from_buffer(rec)
        lib.cp_spill_add(self.handle, SETTLED, 1, ffi.new("void *[]", [buf]), ffi.new("uint32_t[]", [len(rec)]))

    def rotate(self) -> None:
        from counterprof._native import lib
        lib.cp_spill_rotate(self.handle)          # a failure turns it off: stats() says so

    def stats(self) -> dict[str, Any]:
        from counterprof._native import ffi, lib
        st = ffi.new("struct cp_spill_stats *")
        lib.cp_spill_get_stats(self.handle, st)
        out: dict[str, Any] = {"records": st.records, "bytes": st.bytes}
        if st.error:
            out["error"] = os.strerror(-st.error)
        return out

    def close(self) -> None:
        """After the last drain, once nobody adds to it: free it and remove its files."""
        from counterprof._native import lib
        from counterprof.store import safepath
        if self.handle is None:
            return
        lib.cp_spill_free(self.handle)
        self.handle = None
        for fd in self.fds:
            os.close(fd)
        for i in (0, 1):
            safepath.unlink_in_run(self.folder / f"{self.name}.{i}.spill")
        safepath.unlink_in_run(self.folder / f"{self.name}.json")
        try:
            os.rmdir(self.folder)            # the last spill of the rank
        except OSError:
            pass


# ---- reading ---------------------------------------------------------------------------------

def read_records(path: Path) -> tuple[int, list[tuple[int, bytes]]]:
    """(sequence, [(kind, payload)]) of one spill file, up to its first zero kind (a record is
    whole once its kind is there) or a record that does not fit; (-1, []) for a file that is not
    a spill (a file whose turn has not come yet is zeros)."""
    from counterprof.store import safepath
    try:
        fd = safepath.open_read(path)
    except OSError:
        return -1, []
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    if len(data) < HEAD or data[:8] != MAGIC:
        return -1, []
    seq = struct.unpack_from("<Q", data, 8)[0]
    out, at = [], HEAD
    while at + 8 <= len(data):
        kind, size = struct.unpack_from("<II", data, at)
        if kind == 0 or at + 8 + size > len(data):
            break
        out.append((kind, data[at + 8:at + 8 + size]))
        at += 8 + size
    return seq, out


def spill_records(folder: Path, name: str) -> list[tuple[int, bytes]]:
    """The records of one spill's two files, the older file's first."""
    files = sorted((read_records(folder / f"{name}.{i}.spill") for i in (0, 1)), key=lambda r: r[0])
    return [rec for seq, recs in files if seq >= 0 for rec in recs]


def spill_rows(records: list[tuple[int, bytes]], labels: dict[str, Any]) -> pa.Table:
    """The samples rows the records stand for, as the drains would have made them (a table)."""
    import numpy as np
    import pyarrow as pa
    from ..thread_rows import ThreadRows
    from counterprof.ground.schema import SAMPLES_SCHEMA, samples_from_columns

    batches: list[pa.RecordBatch] = []
    slots = labels["perf"]["slots"]
    scale = labels["perf"].get("scale")
    metrics = pa.array(sorted({m for m, _e in slots}), pa.string())
    entities = pa.array(sorted({e for _m, e in slots}), pa.string())
    m_at = {m: i for i, m in enumerate(metrics.to_pylist())}
    e_at = {e: i for i, e in enumerate(entities.to_pylist())}
    slot_metric = np.array([m_at[m] for m, _e in slots], np.int32)
    slot_entity = np.array([e_at[e] for _m, e in slots], np.int32)
    host_metrics = pa.array(labels["host"]["metrics"], pa.string())
    system_from = int(labels["host"]["system_from"])
    epochs = labels["threads"]["epochs"]
    rows = ThreadRows("threads")
    takes: set[str] = set()       # entities a take of the live collector is known for
    walk: list[bytes] = []
    for kind, p in records:
        if kind == PERF and len(p) >= 24:
            t, d, n = struct.unpack_from("<qqi", p, 0)
            if n != len(slots) or len(p) != 24 + 13 * n:
                continue
            value = np.frombuffer(p, np.float64, n, 24)
            if scale is not None:
                value = value * np.asarray(scale, np.float64)
            quality = np.frombuffer(p, np.float32, n, 24 + 8 * n)
            valid = np.frombuffer(p, np.uint8, n, 24 + 12 * n).astype(bool)
            batches.append(pa.RecordBatch.from_arrays([
                pa.array(np.full(n, t, np.int64)).cast(SAMPLES_SCHEMA.field("time").type),
                pa.array(np.full(n, d, np.int64)),
                pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["perf"])),
                pa.DictionaryArray.from_arrays(pa.array(slot_metric), metrics),
                pa.DictionaryArray.from_arrays(pa.array(slot_entity), entities),
                pa.array(value, mask=~valid),
                pa.array(quality),
            ], schema=SAMPLES_SCHEMA))
        elif kind == HOST and len(p) >= 8:
            n = struct.unpack_from("<i", p, 0)[0]
            if n <= 0 or len(p) != 8 + 28 * n:
                continue
            t = np.frombuffer(p, np.int64, n, 8)
            d = np.frombuffer(p, np.int64, n, 8 + 8 * n)
            m = np.frombuffer(p, np.int32, n, 8 + 16 * n)
            v = np.frombuffer(p, np.float64, n, 8 + 20 * n)
            if (m < 0).any() or (m >= len(host_metrics)).any():
                continue
            batches.append(samples_from_columns(
                n, t.copy(), np.where(d >= 0, d, 0), np.packbits(d >= 0, bitorder="little"),
                pa.array(["host"], pa.string()), m.copy(), host_metrics, (m >= system_from).astype(np.int32),
                pa.array(["process", "system"], pa.string()), v.copy()))
        elif kind == WALK and len(p) == 16 + 16 * ROLES + 8:
            walk.append(p)
        elif kind == SCHED and len(p) == 64:
            t, run, wait, epoch, _z, pt, prun, pwait, pepoch = struct.unpack("<qqqiiqqqi4x", p)
            entity = epochs.get(str(epoch))
            if entity is None or epoch != pepoch or run < 0 or prun < 0:
                continue          # the first reading of a watch is its baseline only
            rows.main_readings(np.array([t], np.int64), np.array([run], np.int64),
                               np.array([wait], np.int64), (pt, prun, pwait), entity)
        elif kind == SETTLED and len(p) == 48:
            t, run, wait, epoch, _z, carry_run, carry_wait = struct.unpack("<qqqiiqq", p)
            entity = epochs.get(str(epoch))
            if entity is None:
                continue
            # the live take ended at this reading: those before it are the rows it took, settled
            # as it did once a take before it is known here (before that, they are the journal's
            # and what came before them is not in the spill: left out)
            rows.settle_until(entity, t, (t, run, wait), (carry_run, carry_wait), drop=entity not in takes)
            takes.add(entity)
    if walk:
        w = np.frombuffer(b"".join(walk), np.dtype([("t", "<i8"), ("d", "<i8"), ("run", "<f8", ROLES),
                                                    ("wait", "<f8", ROLES), ("intraop", "<i4"),
                                                    ("loaders", "<i4")]))
        rows.walks(w["t"], w["d"], w["run"], w["wait"], w["intraop"], w["loaders"])
    threads = rows.take()
    if threads is not None:
        batches.append(threads)
    return pa.Table.from_batches(batches, schema=SAMPLES_SCHEMA)


def _present(table_folder: Path, since_ns: int) -> set[tuple[str, str, str, int]]:
    """(source, metric, entity, time) of the rank's samples rows from since_ns on."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from counterprof.store import rundir
    have: set[tuple[str, str, str, int]] = set()
    since = pa.scalar(since_ns, pa.timestamp("ns", tz="UTC"))
    for f in rundir.parquet_files(table_folder, "samples"):
        # row groups that end before the spill's first row are skipped on their statistics
        t = pq.read_table(f, columns=["time", "source", "metric", "entity"], filters=[("time", ">=", since)])
        if t.num_rows:
            have.update(zip(t["source"].cast("string").to_pylist(), t["metric"].cast("string").to_pylist(),
                            t["entity"].cast("string").to_pylist(),
                            pc.cast(t["time"], "int64").to_pylist()))
    return have


def recover(run_path: Path) -> list[str]:
    """What each killed sampler's spill holds beyond the rank's samples, into a Parquet file of
    them; the spill removed once its rows are in. One line per spill that gave rows."""
    import json

    import pyarrow as pa
    import pyarrow.compute as pc
    from counterprof.store import rundir, safepath
    lines = []
    for rank, rank_path in rundir.rank_dirs(Path(run_path)):
        folder = rank_path / SPILL_DIR
        if not safepath.plain_dir(folder):
            continue
        for label_file in sorted(folder.glob("perf*.json")):
            name = label_file.name[:-len(".json")]
            try:
                with os.fdopen(safepath.open_read(label_file), "rb") as f:
                    labels = json.loads(f.read())
            except (OSError, ValueError) as exc:
                lines.append(f"spill {name} (rank {rank}): unreadable labels ({exc}); left as it is")
                continue
            try:
                table = spill_rows(spill_records(folder, name), labels)
            except Exception as exc:        # labels or records damaged: said, and left for a look
                lines.append(f"spill {name} (rank {rank}): not read ({type(exc).__name__}: {exc}); left as it is")
                continue
            if table.num_rows:
                times = pc.cast(table["time"], "int64")
                since = pc.min(times).as_py()
                target_dir = rundir.table_dir(rank_path, "samples")
                have = _present(target_dir, since) if target_dir.is_dir() else set()
                keys = zip(table["source"].cast("string").to_pylist(), table["metric"].cast("string").to_pylist(),
                           table["entity"].cast("string").to_pylist(), times.to_pylist())
                missing = [k not in have for k in keys]
                out = table.filter(pa.array(missing))
                if out.num_rows:
                    folder_out = rundir.make_dirs(target_dir, Path(run_path))
                    target = folder_out / f"samples-spill-{name}.parquet"
                    n = 1
                    while target.exists():                 # an earlier recovery's, of other rows
                        n += 1
                        target = folder_out / f"samples-spill-{name}-{n}.parquet"
                    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
                    safepath.unlink_in_run(tmp)
                    safepath.create_private(tmp)
                    # the run's own writer: the file says its units as compaction's do
                    from counterprof.ground.schema import SAMPLES_SCHEMA
                    from counterprof.store.parquet_writer import open_parquet
                    writer = open_parquet(tmp, SAMPLES_SCHEMA, compression="zstd")
                    try:
                        writer.write_table(out.cast(SAMPLES_SCHEMA))
                    finally:
                        writer.close()
                    os.chmod(tmp, 0o600)
                    os.replace(tmp, target)
                    t = pc.cast(out["time"], "int64")
                    span = (pc.max(t).as_py() - pc.min(t).as_py()) / 1e9
                    lines.append(f"{out.num_rows:,} rows of its last {span:.1f} s from the sampler's spill "
                                 f"(rank {rank})")
            for i in (0, 1):
                safepath.unlink_in_run(folder / f"{name}.{i}.spill")
            safepath.unlink_in_run(label_file)
        try:
            os.rmdir(folder)
        except OSError:
            pass
    return lines
