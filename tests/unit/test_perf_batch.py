"""The perf collector's C-arrays -> Arrow batch step, on recorded (fake) sampler output:
validity bitmap, metric/entity dictionaries, sysfs scale, multiplexing bookkeeping."""
import math

import pyarrow as pa

from counterprof._native import ffi
from counterprof.ground.clock import Clock
from counterprof.collectors.perf import PerfCollector
from counterprof.ground.schema import SAMPLES_SCHEMA


class Ctx:
    clock = Clock(offset_ns=0)


def collector(slot_keys, scales=None):
    c = PerfCollector({})
    c.ctx = Ctx()
    c._set_slots(slot_keys, scales or [1.0] * len(slot_keys))
    return c


def arrays(rows):
    """rows: (mono_ns, duration_ns, slot, value or None, quality)"""
    n = len(rows)
    t = ffi.new("int64_t[]", [r[0] for r in rows])
    d = ffi.new("int64_t[]", [r[1] for r in rows])
    s = ffi.new("int32_t[]", [r[2] for r in rows])
    v = ffi.new("double[]", [math.nan if r[3] is None else r[3] for r in rows])
    q = ffi.new("float[]", [r[4] for r in rows])
    bits = bytearray((n + 7) // 8)
    for i, r in enumerate(rows):
        if r[3] is not None:
            bits[i // 8] |= 1 << (i % 8)
    valid = ffi.new("uint8_t[]", bytes(bits))
    return n, t, d, s, v, q, valid


def test_batch_columns_from_c_arrays():
    c = collector([("cycles", "tid:1"), ("cycles", "tid:2"), ("instructions", "tid:1")])
    rows = [(10, 5, 0, 100.0, 1.0), (10, 5, 1, None, 0.0), (10, 5, 2, 250.0, 0.5)] * 3
    batch = c._batch(ffi, *arrays(rows))
    assert batch.schema.equals(SAMPLES_SCHEMA)
    assert batch.column("time").cast(pa.int64()).to_pylist() == [10] * 9
    assert batch.column("metric").to_pylist()[:3] == ["cycles", "cycles", "instructions"]
    assert batch.column("entity").to_pylist()[:3] == ["tid:1", "tid:2", "tid:1"]
    assert batch.column("source").to_pylist() == ["perf"] * 9
    assert batch.column("value").to_pylist()[:3] == [100.0, None, 250.0]
    assert batch.column("duration_ns").to_pylist() == [5] * 9
    assert batch.column("quality").to_pylist()[:3] == [1.0, 0.0, 0.5]


def test_sysfs_scale_applies_per_series():
    c = collector([("power/energy-pkg/", "system"), ("cpu-clock", "system")], scales=[0.5, 1.0])
    batch = c._batch(ffi, *arrays([(1, 1, 0, 8.0, 1.0), (1, 1, 1, 8.0, 1.0)]))
    assert batch.column("value").to_pylist() == [4.0, 8.0]


def test_never_counted_event_is_reported_not_counted():
    c = collector([("cycles", "tid:1"), ("cycles", "tid:2"), ("task-clock", "tid:1"),
                   ("instructions", "tid:1")])
    c.details["events"] = {n: {"status": "counted"} for n in ("cycles", "task-clock", "instructions")}
    # slot -> (known ticks, unknown ticks, smallest share counted)
    c._finish_status({0: (0, 7, 0.0), 1: (0, 7, 0.0), 2: (7, 0, 1.0), 3: (5, 2, 0.25)})
    assert c.details["events"]["cycles"]["status"] == "not counted"
    assert "split the group" in c.details["events"]["cycles"]["reason"]
    assert c.details["events"]["task-clock"] == {"status": "counted"}
    assert c.details["events"]["instructions"] == {"status": "counted", "min_quality": 0.25}
