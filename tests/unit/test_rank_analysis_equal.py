"""analyze_calls and analyze_ranks on varied many-rank spans: their answers do not depend on
how the spans arrive (row order, rank order, one table per rank or pairs one rank at a time,
names as strings or dictionaries), and hold on runs with every awkward part at once: calls some
ranks lack, ranks without steps, hosts with skewed clocks, several operations and groups, GPU
kernels, record_param_comms, XLA's ops and c10d's."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from counterprof.analysis.across_ranks import analyze_ranks
from counterprof.analysis.collectives import COLUMNS, analyze_calls, curves_from_ceilings
from counterprof.ground.schema import SPANS_SCHEMA

MS = 1_000_000
LEVELS = ("gloo", "kernel", "rpc", "xla", "c10d")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier")
KERNEL = {"all_reduce": "ncclDevKernel_AllReduce_RING_LL_Sum_float",
          "all_gather": "ncclDevKernel_AllGather_RING_LL",
          "reduce_scatter": "ncclDevKernel_ReduceScatter_RING_LL_Sum_float",
          "broadcast": "ncclKernel_Broadcast_RING_LL",
          "all_to_all": "ncclDevKernel_SendRecv",
          "barrier": "ncclDevKernel_AllReduce_RING_LL_Sum_float"}
CEILINGS = {"collectives": {"gloo": {"all_reduce": {"latency_s": 2e-5, "sizes": {
    "8": {"busbw_bytes_per_s": 1e6}, "65536": {"busbw_bytes_per_s": 4e8}, "16777216": {"busbw_bytes_per_s": 2e9}}},
    "all_gather": {"sizes": {"1024": {"busbw_bytes_per_s": 1e7}, "4194304": {"busbw_bytes_per_s": 1e9}}}}}}


def case(seed: int) -> dict[str, Any]:
    """A run of a few ranks, drawn from `seed`: {"rows": {rank: [row dicts]}, "hosts",
    "world_size", "ties"}. Rows hold COLUMNS (start and end in ns); with "ties", times are whole
    milliseconds (spans of a rank starting together: which comes first is the rows' order)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    ranks = sorted(rng.choice(np.arange(12), n, replace=False).tolist()) if rng.random() < 0.3 else list(range(n))
    n_hosts = int(rng.integers(1, 4)) if n > 1 else 1
    host_of = {r: f"h{i * n_hosts // n}" for i, r in enumerate(ranks)}
    clock = {h: int(rng.integers(-50, 50)) * MS + int(rng.integers(0, 1000)) for h in sorted(set(host_of.values()))}
    clock[host_of[ranks[0]]] = 0 if rng.random() < 0.5 else clock[host_of[ranks[0]]]
    level = {r: LEVELS[int(rng.integers(0, len(LEVELS)))] for r in ranks}
    if rng.random() < 0.6:                          # mostly one level on every rank
        level = dict.fromkeys(ranks, level[ranks[0]])
    steps = int(rng.integers(0, 7))
    no_steps = {r for r in ranks if rng.random() < 0.15}
    window = {r: (int(rng.integers(0, 2)), int(rng.integers(max(steps - 1, 1), max(steps, 1) + 1)))
              for r in ranks if rng.random() < 0.5}
    gridded = rng.random() < 0.3                     # whole-ms times: ties between calls
    pattern = [(OPS[int(rng.integers(0, len(OPS)))], ["0", "0", "tp1", "dp"][int(rng.integers(0, 4))])
               for _ in range(int(rng.integers(1, 5)))]
    size = {op: int(2 ** rng.integers(3, 25)) for op, _ in pattern}
    gsize = (None if rng.random() < 0.3 else n + int(rng.random() < 0.15))
    slow = ranks[int(rng.integers(0, n))]
    drop = 0.0 if rng.random() < 0.5 else float(rng.uniform(0, 0.2))
    rows: dict[int, list[dict[str, Any]]] = {r: [] for r in ranks}
    for r in ranks:
        off = clock[host_of[r]]
        lvl = level[r]

        def t(x: float, off: int = off) -> int:
            return (int(round(x)) * MS if gridded else int(x * MS)) + off
        for k in range(max(steps, 1)):
            t0 = k * 100.0
            if steps and r not in no_steps:
                rows[r].append({"start": t(t0), "end": t(t0 + 99 + (r % 3)), "name": f"ProfilerStep#{k}",
                                "category": "step"})
            for c, (op, pg) in enumerate(pattern * (2 if k % 3 == 2 else 1)):
                if lvl in ("gloo", "c10d", "rpc"):       # (thread 1 holds the most ops: the main thread)
                    rows[r].append({"start": t(t0 + 1 + c * 11), "end": t(t0 + 1.5 + c * 11), "name": "aten::add",
                                    "category": "cpu_op", "tid": 1})
                if rng.random() < drop:
                    continue
                base = t0 + 5 + c * 11
                late = float(rng.uniform(0, 3)) + (6.0 if r == slow and (k + c) % 2 == 0 else 0.0)
                a, e = base + late, base + 9.5 + float(rng.uniform(0, 0.3))
                own = size[op] * (1 + (r % 3 if op == "all_to_all" else 0))
                attrs = (json.dumps({"pg": pg, "in_bytes": own, "out_bytes": own * (n if op == "all_gather" else 1),
                                     "dtype": "float"}) if lvl == "rpc" and rng.random() < 0.9 else
                         ("not json" if rng.random() < 0.05 else None))
                row = {"start": t(a), "end": t(e), "collective": op, "tid": 7, "device": None,
                       "bytes": None if rng.random() < 0.1 else own, "group_size": gsize, "attrs": attrs}
                if lvl == "gloo":
                    row.update(name=f"gloo:{op}", category="collective")
                elif lvl == "kernel":
                    row.update(name=KERNEL[op], category="kernel", kernel_class="communication", device=0,
                               collective=KERNEL[op])
                    rows[r].append({"start": t(a - 3), "end": t(a + 2), "name": "gemm", "category": "kernel",
                                    "kernel_class": "compute", "device": 0})
                elif lvl == "rpc":
                    row.update(name="record_param_comms", category="collective",
                               collective=["allreduce", "allgather", "reduce_scatter", "broadcast",
                                           "alltoall", "barrier"][OPS.index(op)])
                    rows[r].append({"start": t(a + 0.004), "end": t(a + 0.01), "name": "record_param_comms",
                                    "category": "collective", "collective": "wait", "tid": 7})
                elif lvl == "xla":
                    row.update(name=f"{op.replace('_', '-')}.{c}", category="collective",
                               collective=op.replace("_", "-"))
                    rows[r].append({"start": t(a - 1), "end": t(a + 4), "name": "fusion.1", "category": "xla_op"})
                else:
                    row.update(name=f"c10d::{op}_", category="cpu_op", collective=f"c10d::{op}_")
                rows[r].append(row)
                if lvl in ("gloo", "c10d", "rpc"):
                    rows[r].append({"start": t(a - 2), "end": t(a + 1 + c % 2), "name": "aten::mm",
                                    "category": "cpu_op", "tid": 1 + (c % 4 == 3) * 5})
        if steps and r not in no_steps and rng.random() < 0.1:       # a step named twice: the later counts
            rows[r].append({"start": t(steps * 100.0), "end": t(steps * 100.0 + 50), "name": "ProfilerStep#0",
                            "category": "step"})
        if r in window and steps:
            w0, w1 = window[r]
            rows[r].append({"start": t(w0 * 100.0), "end": t(w1 * 100.0), "name": "window", "category": "window"})
    extra = {r: "h9" for r in range(20, 20 + int(rng.random() < 0.2))}
    world = [None, None, str(max(ranks) + 1), str(max(ranks) + 3), "bogus"][int(rng.integers(0, 5))]
    return {"rows": rows, "hosts": {**host_of, **extra}, "world_size": world, "ties": gridded}


def rank_table(rows: list[dict[str, Any]], dictionary_names: bool = False, order: Any = None) -> pa.Table:
    if order is not None:
        rows = [rows[i] for i in order]
    cols = {c: [row.get(c) for row in rows] for c in COLUMNS}
    schema = pa.schema([SPANS_SCHEMA.field(c) for c in COLUMNS])
    if dictionary_names:
        schema = schema.set(schema.get_field_index("name"), pa.field("name", pa.dictionary(pa.int32(), pa.string())))
    return pa.table(cols, schema=schema)


def whole_table(c: dict[str, Any], seed: int | None = None) -> pa.Table:
    """Every rank's spans in one table with a "rank" column (as RunQuery.spans reads them: by
    start), or with seed, the ranks' spans one rank after another (in an order drawn from it),
    each rank's in an order drawn from it."""
    rows = [dict(row, rank=r) for r, rs in c["rows"].items() for row in rs]
    if seed is None:
        rows.sort(key=lambda row: row["start"])
    else:
        rng = np.random.default_rng(seed)
        ranks = rng.permutation(list(c["rows"])).tolist()
        rows = [dict(c["rows"][r][i], rank=r) for r in ranks for i in rng.permutation(len(c["rows"][r]))]
    cols = {c: [row.get(c) for row in rows] for c in COLUMNS + ["rank"]}
    schema = pa.schema([SPANS_SCHEMA.field(c) for c in COLUMNS] + [pa.field("rank", pa.int64())])
    return pa.table(cols, schema=schema)


def same(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Equal, floats to within `rel` (a mean over the same numbers summed in another order)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= rel * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y, rel) for x, y in zip(a, b))
    return bool(a == b) and type(a) is type(b)


def calls_json(c: dict[str, Any], **how: Any) -> dict[str, Any]:
    tables = {r: rank_table(rows, **how) for r, rows in c["rows"].items()}
    res = analyze_calls(tables, c["hosts"], curves_from_ceilings(CEILINGS))
    return res.to_json(top=3)


def ranks_json(c: dict[str, Any], seed: int | None = None) -> dict[str, Any] | None:
    a = analyze_ranks(whole_table(c, seed), c["hosts"], c["world_size"])
    return None if a is None else a.to_json()


@pytest.mark.parametrize("seed", range(0, 60, 3))
def test_one_table_per_rank_or_pairs_one_rank_at_a_time_give_the_same_calls(seed):
    c = case(seed)
    res = analyze_calls(((r, rank_table(rows, dictionary_names=True)) for r, rows in c["rows"].items()),
                        c["hosts"], curves_from_ceilings(CEILINGS))
    assert res.to_json(top=3) == calls_json(c)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), shuffle=st.integers(0, 2**32 - 1))
def test_calls_do_not_depend_on_the_order_of_a_ranks_rows(seed, shuffle):
    c = case(seed)
    assume(not c["ties"])
    rng = np.random.default_rng(shuffle)
    tables = {r: rank_table(rows, dictionary_names=bool(shuffle % 2), order=rng.permutation(len(rows)))
              for r, rows in c["rows"].items()}
    got = analyze_calls(tables, c["hosts"], curves_from_ceilings(CEILINGS)).to_json(top=3)
    want = calls_json(c)
    if got != want:     # calls starting at the same moment may be listed in either order
        assert sorted(map(json.dumps, got.pop("calls"))) == sorted(map(json.dumps, want.pop("calls")))
        assert got == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), shuffle=st.integers(0, 2**32 - 1))
def test_rank_analysis_does_not_depend_on_the_order_of_a_ranks_rows(seed, shuffle):
    # (the ranks' order is kept: of two ranks equally late, the first seen is named)
    c = case(seed)
    assume(not c["ties"])
    rng = np.random.default_rng(shuffle)
    c2 = {**c, "rows": {r: [c["rows"][r][i] for i in rng.permutation(len(c["rows"][r]))] for r in c["rows"]}}
    assert same(ranks_json(c2, shuffle), ranks_json(c, shuffle))


def test_the_cases_hold_every_awkward_part():
    """The drawn runs reach what the equality above must hold over."""
    seen: dict[str, int] = {}
    for seed in range(60):
        c = case(seed)
        j = calls_json(c)
        a = ranks_json(c)
        for k, yes in (("unmatched", bool(j["unmatched"])), ("several hosts", j["hosts"] > 1),
                       ("device kernels", "device kernels" in j["calls_from"].values()),
                       ("record_param_comms", "record_param_comms" in j["calls_from"].values()),
                       ("xla", "XLA collective ops" in j["calls_from"].values()),
                       ("c10d", "c10d ops" in j["calls_from"].values()),
                       ("incomplete", any(not x["complete"] for x in j["calls"])),
                       ("by order", any("by their order" in x for x in j["notes"])),
                       ("imbalance", any("imbalance" in x for x in j["calls"])),
                       ("skew", bool(a and a["skew_max_ms"])),
                       ("no steps", bool(a and any("without steps" in x for x in a["notes"]))),
                       ("missing ranks", bool(a and any("missing" in x for x in a["notes"]))),
                       ("straggler", bool(a and a["straggler"] is not None))):
            seen[k] = seen.get(k, 0) + yes
    assert all(seen.values()), seen
