"""The perf sampler's spill (native/spill.c, collectors/perf/spill.py): records written by the C
spill read back as the rows the drains make; rotation; growth; a cut or damaged file; a file
size limit (a full disk) turns it off without a SIGBUS."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pyarrow.compute as pc
import pytest

from counterprof._native import ffi, lib
from counterprof.collectors.perf import spill

LABELS = {"version": 1, "perf": {"slots": [["task-clock", "process"], ["page-faults", "process"]],
                                 "scale": [1e-9, 1.0]},
          "host": {"metrics": ["proc.cpu_user", "proc.cpu_system", "proc.rss", "system.cpu_util"],
                   "system_from": 3},
          "threads": {"epochs": {"2": "tid:77"}}}


@pytest.fixture
def c_spill(tmp_path):
    fds = [os.open(tmp_path / f"s.{i}.spill", os.O_RDWR | os.O_CREAT, 0o600) for i in (0, 1)]
    err = ffi.new("int *")
    sp = lib.cp_spill_new(fds[0], fds[1], err)
    assert sp != ffi.NULL, err[0]
    yield sp, fds, tmp_path
    lib.cp_spill_free(sp)
    for fd in fds:
        os.close(fd)


def add(sp, kind, payload: bytes) -> int:
    buf = ffi.from_buffer(payload)
    parts = ffi.new("const void *[1]", [buf])
    lens = ffi.new("uint32_t[1]", [len(payload)])
    return lib.cp_spill_add(sp, kind, 1, parts, lens)


def perf_tick(t, d, values, quality, valid) -> bytes:
    n = len(values)
    return (struct.pack("<qqi4x", t, d, n) + np.asarray(values, np.float64).tobytes()
            + np.asarray(quality, np.float32).tobytes() + bytes(valid))


def sched(t, run, wait, epoch, prev) -> bytes:
    return struct.pack("<qqqiiqqqi4x", t, run, wait, epoch, 0, *prev)


def test_records_read_back_as_the_drains_rows(c_spill):
    sp, _fds, folder = c_spill
    add(sp, lib.CP_SPILL_PERF, perf_tick(1_000, 100, [2e8, 7.0], [1.0, 0.5], [1, 0]))
    host = (struct.pack("<ii", 2, 0) + np.array([1_000, 1_000], np.int64).tobytes()
            + np.array([100, -1], np.int64).tobytes() + np.array([0, 3], np.int32).tobytes()
            + np.array([0.25, 42.0]).tobytes())
    add(sp, lib.CP_SPILL_HOST, host)
    walk = (struct.pack("<qq", 1_000, 100) + np.arange(6, dtype=np.float64).tobytes()
            + np.zeros(6).tobytes() + struct.pack("<ii", 3, 1))
    add(sp, lib.CP_SPILL_WALK, walk)
    add(sp, lib.CP_SPILL_SCHED, sched(1_000, 500, 0, 2, (900, 400, 0, 2)))
    add(sp, lib.CP_SPILL_SCHED, sched(1_100, 600, 0, 3, (1_000, 500, 0, 2)))    # a new watch: baseline
    seq, records = spill.read_records(folder / "s.0.spill")
    assert seq == 0 and [k for k, _ in records] == [1, 2, 3, 4, 4]
    t = spill.spill_rows(records, LABELS)
    rows = {(s, m, e): (v, d) for s, m, e, v, d in zip(
        t["source"].cast("string").to_pylist(), t["metric"].cast("string").to_pylist(),
        t["entity"].cast("string").to_pylist(), t["value"].to_pylist(), t["duration_ns"].to_pylist())}
    assert rows[("perf", "task-clock", "process")] == (pytest.approx(0.2), 100)       # scaled
    assert rows[("perf", "page-faults", "process")][0] is None                        # not valid
    assert rows[("host", "proc.cpu_user", "process")] == (0.25, 100)
    assert rows[("host", "system.cpu_util", "system")] == (42.0, None)                # a gauge: no duration
    assert rows[("threads", "thread.intraop.running", "process")][0] == 1.0           # run_s[INTRAOP]
    assert rows[("threads", "thread.intraop.count", "process")][0] == 3
    assert rows[("threads", "thread.main.running", "tid:77")] == (pytest.approx(1e-7), 100)
    assert len([k for k in rows if k[2] == "tid:77"]) == 3        # epoch 3 (no label, a baseline): none
    assert pc.min(t["quality"]).as_py() == 0.5


def test_rotation_empties_the_file_it_enters_and_numbers_it(c_spill):
    sp, _fds, folder = c_spill
    assert spill.read_records(folder / "s.1.spill") == (-1, [])      # its turn has not come
    add(sp, lib.CP_SPILL_SCHED, sched(1, 1, 0, 2, (0, 0, 0, 2)))
    assert lib.cp_spill_rotate(sp) == 0
    add(sp, lib.CP_SPILL_SCHED, sched(2, 2, 0, 2, (1, 1, 0, 2)))
    add(sp, lib.CP_SPILL_SCHED, sched(3, 3, 0, 2, (2, 2, 0, 2)))
    assert [(s, len(r)) for s, r in (spill.read_records(folder / f"s.{i}.spill") for i in (0, 1))] == [(0, 1), (1, 2)]
    assert lib.cp_spill_rotate(sp) == 0           # back to file 0: emptied, sequence 2
    assert spill.read_records(folder / "s.0.spill") == (2, [])
    add(sp, lib.CP_SPILL_SCHED, sched(4, 4, 0, 2, (3, 3, 0, 2)))
    assert [struct.unpack_from("<q", p)[0] for _k, p in spill.read_records(folder / "s.0.spill")[1]] == [4]
    assert lib.cp_spill_rotate(sp) == 0           # file 1 again: its two records gone
    assert spill.read_records(folder / "s.1.spill") == (3, [])


def test_the_file_grows_past_its_first_size(c_spill):
    sp, _fds, folder = c_spill
    payload = bytes(range(256)) * 16               # 4 KB records: 100 of them, past 256 KB
    for _ in range(100):
        assert add(sp, lib.CP_SPILL_HOST, payload) == 0
    seq, records = spill.read_records(folder / "s.0.spill")
    assert len(records) == 100 and all(p == payload for _k, p in records)
    assert os.path.getsize(folder / "s.0.spill") >= 100 * (8 + 4096)


def test_a_cut_or_damaged_file_keeps_what_is_whole(c_spill):
    sp, _fds, folder = c_spill
    for i in range(3):
        add(sp, lib.CP_SPILL_SCHED, sched(i + 1, i, 0, 2, (i, i, 0, 2)))
    path = folder / "s.0.spill"
    whole = path.read_bytes()
    end = 32 + 3 * (8 + 64)
    path.write_bytes(whole[:end - 10])            # cut mid-record
    assert len(spill.read_records(path)[1]) == 2
    path.write_bytes(whole[:32 + 2 * 72] + bytes(4) + whole[32 + 2 * 72 + 4:])   # its kind not stored yet
    assert len(spill.read_records(path)[1]) == 2
    path.write_bytes(b"X" + whole[1:])            # not a spill
    assert spill.read_records(path) == (-1, [])
    path.write_bytes(whole[:8])
    assert spill.read_records(path) == (-1, [])
    # a record whose size does not fit its kind is left out, not read as another
    bad = whole[:32] + struct.pack("<II", lib.CP_SPILL_PERF, 4) + b"abcd"
    path.write_bytes(bad)
    assert spill.spill_rows(spill.read_records(path)[1], LABELS).num_rows == 0


_LIMITED = r"""
import os, resource, signal, sys
from counterprof._native import ffi, lib
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (300 * 1024, 300 * 1024))
folder = sys.argv[1]
fds = [os.open(os.path.join(folder, f"s.{i}.spill"), os.O_RDWR | os.O_CREAT, 0o600) for i in (0, 1)]
err = ffi.new("int *")
sp = lib.cp_spill_new(fds[0], fds[1], err)
payload = ffi.new("char[]", 4096)
parts = ffi.new("const void *[1]", [payload])
lens = ffi.new("uint32_t[1]", [4096])
rcs = [lib.cp_spill_add(sp, 2, 1, parts, lens) for _ in range(100)]
st = ffi.new("struct cp_spill_stats *")
lib.cp_spill_get_stats(sp, st)
print(rcs.count(0), st.error, st.records)
"""


def test_a_file_that_cannot_grow_turns_it_off_without_a_sigbus(tmp_path):
    # RLIMIT_FSIZE stands for a full disk: the growth to 512 KB is refused (EFBIG) before a page
    # of it is mapped, so the process lives and says why
    p = subprocess.run([sys.executable, "-c", _LIMITED, str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    ok, error, records = map(int, p.stdout.split())
    assert error == -27 and 0 < ok < 100 and records == ok        # EFBIG; what fitted is kept
    _seq, kept = spill.read_records(tmp_path / "s.0.spill")
    assert len(kept) == ok


def test_recover_names_a_damaged_spill_and_leaves_it(tmp_path, c_spill):
    sp, _fds, folder = c_spill
    add(sp, lib.CP_SPILL_SCHED, sched(5, 1, 0, 2, (4, 0, 0, 2)))
    run = tmp_path / "run"
    where = run / "_ranks" / "rank=0" / spill.SPILL_DIR
    where.mkdir(parents=True)
    for i in (0, 1):
        (where / f"perf1-1.{i}.spill").write_bytes((folder / f"s.{i}.spill").read_bytes())
    for damaged in (b"{not json", b'{"perf": 5}', b'["a list"]', bytes([0xff, 0xfe])):
        (where / "perf1-1.json").write_bytes(damaged)
        lines = spill.recover(run)
        assert len(lines) == 1 and "left as it is" in lines[0], lines
        assert sorted(p.name for p in where.iterdir()) == ["perf1-1.0.spill", "perf1-1.1.spill", "perf1-1.json"]
    labels = {**LABELS, "threads": {"epochs": {"2": "tid:9"}}}
    (where / "perf1-1.json").write_text(__import__("json").dumps(labels))
    lines = spill.recover(run)
    assert lines == ["3 rows of its last 0.0 s from the sampler's spill (rank 0)"], lines
    assert not where.exists()
    assert spill.recover(run) == []
