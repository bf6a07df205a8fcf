"""analysis/collectives.py on spans whose arrivals and durations are known: matching
across ranks, skew, transfer, waits, nccl-tests' bytes and bus factors, the curve."""
import pyarrow as pa
import pytest

from counterprof.analysis.collectives import (COLUMNS, Curve, analyze_calls, curves_from_ceilings,
                                                   normalize_op, size_bucket)
from counterprof.ground.schema import SPANS_SCHEMA

MS = 1_000_000


def table(rows: list[dict]) -> pa.Table:
    cols = {c: [r.get(c) for r in rows] for c in COLUMNS}
    schema = pa.schema([SPANS_SCHEMA.field(c) for c in COLUMNS])
    for c in ("category", "kernel_class"):
        schema = schema.set(schema.get_field_index(c), pa.field(c, pa.string()))
    return pa.table(cols, schema=schema)


def coll(op: str, start_ms: float, dur_ms: float, nbytes: int, n: int = 2, tid: int = 9) -> dict:
    return {"start": int(start_ms * MS), "end": int((start_ms + dur_ms) * MS), "name": f"gloo:{op}",
            "category": "collective", "collective": op, "bytes": nbytes, "group_size": n, "tid": tid}


def step(i: int, start_ms: float, end_ms: float) -> dict:
    return {"start": int(start_ms * MS), "end": int(end_ms * MS), "name": f"ProfilerStep#{i}",
            "category": "step"}


def test_names_as_nccl_tests_spells_them():
    assert normalize_op("allreduce") == normalize_op("gloo:all_reduce") == "all_reduce"
    assert normalize_op("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)") == "all_gather"
    assert normalize_op("_reduce_scatter_base") == "reduce_scatter"
    assert normalize_op("c10d::alltoall_base_") == "all_to_all"
    assert normalize_op("wait") is None
    assert normalize_op("all-gather") == "all_gather" and normalize_op("all-reduce.3") == "all_reduce"
    assert size_bucket(3 << 20) == "2 MiB" and size_bucket(8) == "8 B"


def test_a_late_rank_is_named_with_its_skew_and_the_others_wait():
    # step 0: rank 1 arrives 40 ms late to a 4 MiB all_reduce that takes 5 ms once both are in
    r0 = [step(0, 0, 100), coll("all_reduce", 10, 45, 4 << 20),
          step(1, 100, 200), coll("all_reduce", 110, 5, 4 << 20)]
    r1 = [step(0, 0, 100), coll("all_reduce", 50, 5, 4 << 20),
          step(1, 100, 200), coll("all_reduce", 110.5, 4.5, 4 << 20)]
    res = analyze_calls({0: table(r0), 1: table(r1)})
    assert len(res.calls) == 2 and not res.unmatched
    late = res.calls[0]
    assert late.last == 1 and late.skew_ns == 40 * MS and late.transfer_ns == 5 * MS
    assert late.wait_ns(0) == 40 * MS and late.wait_ns(1) == 0
    # nccl-tests: all_reduce busbw = bytes / t x 2(n-1)/n
    assert late.busbw == pytest.approx((4 << 20) / 5e-3 * 1.0)
    by = {b.rank: b for b in res.by_rank()}
    assert by[1].last == 2 and by[1].others_waited_s == pytest.approx(0.040 + 0.0005)
    j = res.to_json()
    for k in ("op", "bytes", "group_size", "skew_us", "transfer_us", "busbw_gbps", "fraction_of_curve"):
        assert k in j["calls"][0]
    assert j["calls"][0]["skew_us"] == pytest.approx(40_000)


def test_all_gather_counts_the_gathered_buffer():
    rows = [step(0, 0, 50), coll("all_gather", 1, 2, 1 << 20, n=4)]
    res = analyze_calls({r: table(rows) for r in range(4)})
    c = res.calls[0]
    assert c.bytes == 4 << 20                        # 1 MiB in per rank, 4 MiB gathered
    assert c.busbw == pytest.approx((4 << 20) / 2e-3 * 3 / 4)


def test_a_rank_missing_a_call_leaves_it_unmatched_not_shifted():
    # rank 1's trace lost the first all_reduce of step 0: the second pairs with the second
    r0 = [step(0, 0, 100), coll("all_reduce", 10, 5, 1024), coll("all_reduce", 30, 5, 1024),
          step(1, 100, 200), coll("all_reduce", 110, 5, 1024)]
    r1 = [step(0, 0, 100), coll("all_reduce", 30, 5, 1024), step(1, 100, 200), coll("all_reduce", 110, 5, 1024)]
    res = analyze_calls({0: table(r0), 1: table(r1)})
    assert res.unmatched == {"all_reduce on rank 0": 1}
    assert [(c.step, c.arrival_ns[0]) for c in res.calls] == [("ProfilerStep#0", 30 * MS), ("ProfilerStep#1", 110 * MS)]


def test_without_steps_windows_that_start_apart_are_lined_up_by_time():
    # every 10 ms an all_reduce; rank 1's window starts 3 calls after rank 0's
    r0 = [coll("all_reduce", 10 * i, 2, 1024) for i in range(10)]
    r1 = [coll("all_reduce", 10 * i + 0.3, 1.7, 1024) for i in range(3, 12)]
    res = analyze_calls({0: table(r0), 1: table(r1)})
    assert len(res.calls) == 7
    assert all(c.skew_ns == pytest.approx(0.3 * MS) for c in res.calls)
    assert res.unmatched == {"all_reduce on rank 0": 3, "all_reduce on rank 1": 2}


def test_each_call_against_the_measured_curve():
    doc = {"collectives": {"gloo": {"backend": "gloo", "all_reduce": {
        "latency_s": 50e-6, "sizes": {"8": {"busbw_bytes_per_s": 1e5}, "1048576": {"busbw_bytes_per_s": 1e9},
                                      "16777216": {"busbw_bytes_per_s": 2e9}}}}}}
    curves = curves_from_ceilings(doc)
    cv = curves["all_reduce"]
    assert cv.at(1 << 20) == pytest.approx(1e9) and cv.at(4 << 20) == pytest.approx(1.5e9)
    assert cv.at(1 << 30) == pytest.approx(2e9)      # beyond the sweep: its last point
    rows = [step(0, 0, 100), coll("all_reduce", 10, 4 * (1 << 20) / 1.5e9 * 1e3 * 2, 4 << 20)]
    res = analyze_calls({0: table(rows), 1: table(rows)}, curves=curves)
    assert res.calls[0].fraction_of_curve == pytest.approx(0.5, rel=1e-3)   # twice the time: half the curve
    tiny = analyze_calls({0: table([coll("all_reduce", 1, 0.05, 8)]), 1: table([coll("all_reduce", 1, 0.05, 8)])},
                         curves=curves)
    assert tiny.calls[0].under_latency_floor


def test_curve_interpolates_in_log_size():
    cv = Curve("all_reduce", "gloo", [1 << 10, 1 << 20], [1e6, 1e9])
    assert cv.at(1 << 15) == pytest.approx(0.5 * (1e6 + 1e9))


def test_the_knee_is_where_the_curve_reaches_half_its_best():
    cv = Curve("all_gather", "gloo", [32 << 10, 1 << 20, 16 << 20], [0.0, 1e9, 2e9])
    assert cv.knee() == pytest.approx(1 << 20)          # 1e9 is half of 2e9: reached at 1 MiB
    cv = Curve("all_gather", "gloo", [1 << 10, 1 << 20], [0.0, 2e9])
    assert cv.knee() == pytest.approx(2 ** 15)          # halfway in log-size from 1 KiB to 1 MiB


def test_across_hosts_the_clock_offset_is_taken_out_before_skew():
    # rank 1 runs on another host whose clock reads 50 ms ahead; truly, it arrives 2 ms after
    # rank 0 at each all_reduce, and both leave together (nobody leaves before the last arrives)
    r0, r1 = [], []
    for k in range(5):
        t = 100 * k
        r0 += [step(k, t, t + 100), coll("all_reduce", t + 10, 7, 1 << 20)]
        r1 += [step(k, t + 50, t + 150), coll("all_reduce", t + 12 + 50, 5, 1 << 20)]
    res = analyze_calls({0: table(r0), 1: table(r1)}, hosts={0: "a", 1: "b"})
    assert res.hosts == 2 and res.to_json()["link"] == "inter-node"
    assert len(res.calls) == 5
    for c in res.calls:
        assert c.last == 1 and c.skew_ns == pytest.approx(2 * MS, abs=0.01 * MS)
