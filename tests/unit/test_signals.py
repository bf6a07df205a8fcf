"""Signals over scopes from recorded samples and spans: pro-rating, buckets, span classes."""
import pyarrow as pa
import pytest

from counterprof.analysis.signals import RunData, load_samples, load_spans, signals
from counterprof.ground.schema import samples_batch, spans_batch

MS = 1_000_000
CATALOG = {"task-clock": {"kind": "delta"}, "instructions": {"kind": "delta"},
           "cycles": {"kind": "delta"}, "gpu.util": {"kind": "gauge"}}


def samples(rows):
    """rows: (end_ns, duration_ns, metric, entity, value)"""
    return samples_batch([r[0] for r in rows], [r[1] for r in rows], "perf", [r[2] for r in rows],
                         [r[3] for r in rows], [r[4] for r in rows])


def test_deltas_are_pro_rated_over_a_scope():
    # task-clock: 100 ms intervals, fully busy (100 ms of CPU per 100 ms), two threads
    rows = []
    for k in range(1, 11):
        for tid in ("tid:1", "tid:2"):
            rows.append((k * 100 * MS, 100 * MS, "task-clock", tid, 100.0 * MS))
    data = RunData()
    load_samples(data, [samples(rows)], CATALOG)
    assert (data.start_ns, data.end_ns) == (0, 1000 * MS)
    s = signals(data, [(0, 1000 * MS)])
    assert s["cpu_busy"].value == pytest.approx(2.0)
    s = signals(data, [(150 * MS, 250 * MS)])        # straddles two intervals: pro-rated
    assert s["cpu_busy"].value == pytest.approx(2.0)
    s = signals(data, [(0, 100 * MS), (500 * MS, 600 * MS)])
    assert s["wall_s"].value == pytest.approx(0.2)


def test_unknown_interval_does_not_count_as_zero():
    rows = [(100 * MS, 100 * MS, "instructions", "process", 1e9),
            (100 * MS, 100 * MS, "cycles", "process", 5e8),
            (200 * MS, 100 * MS, "instructions", "process", None),
            (200 * MS, 100 * MS, "cycles", "process", 5e8)]
    data = RunData()
    load_samples(data, [samples(rows)], CATALOG)
    assert signals(data, [(0, 100 * MS)])["ipc"].value == pytest.approx(2.0)
    assert "ipc" not in signals(data, [(100 * MS, 200 * MS)])


def test_spans_give_gpu_shares():
    # stream: compute 0-40, comm 30-70 (overlaps compute 30-40), memcpy 80-90; active 0-90
    t = pa.Table.from_batches([spans_batch(
        start=[0, 30 * MS, 80 * MS], end=[40 * MS, 70 * MS, 90 * MS],
        name=["gemm", "ncclDevKernel_AllReduce", "Memcpy DtoD"], category=["kernel", "kernel", "memcpy"],
        kernel_class=["compute", "communication", "memory"], device=[0, 0, 0], stream=[7, 8, 7])])
    data = RunData()
    load_spans(data, t, short_kernel_us=10)
    s = signals(data, [(0, 100 * MS)])
    assert s["gpu_active_share"].value == pytest.approx(0.9)
    assert s["gpu_idle"].value == pytest.approx(1 - 80 / 90)      # busy 0-70 and 80-90
    assert s["gpu_compute"].value == pytest.approx(40 / 90)
    assert s["gpu_comm_exposed"].value == pytest.approx(30 / 90)
    assert s["gpu_memory"].value == pytest.approx(10 / 90)
    assert s["comm_overlap"].value == pytest.approx(10 / 40)


def test_regions_and_cpu_collectives_from_spans():
    t = pa.Table.from_batches([spans_batch(
        start=[0, 50 * MS, 10 * MS, 20 * MS], end=[10 * MS, 60 * MS, 15 * MS, 40 * MS],
        name=["dataloader", "dataloader", "ProfilerStep#3", "gloo:all_reduce"],
        category=["region", "region", "step", "collective"])])
    data = RunData()
    load_spans(data, t, short_kernel_us=10)
    assert data.regions["dataloader"] == [(0, 10 * MS), (50 * MS, 60 * MS)]
    assert data.region_count == {"dataloader": 2, "ProfilerStep": 1}
    s = signals(data, [(0, 100 * MS)])
    assert s["cpu_collective"].value == pytest.approx(0.2)


def test_gpu_percentages_under_one_percent_stay_percentages():
    """NVML and GPM record percent. A mean under 1 % is still a percent: the tensor cores of
    an embedding-table training job on an H200 averaged 0.9 % over its steps, once read as 90 %
    (a fraction) and called compute-bound."""
    catalog = {"gpu.util": {"kind": "gauge"}, "gpm.tensor_util": {"kind": "ratio"},
               "gpm.dram_bw_util": {"kind": "ratio"}}
    rows = []
    for k in range(1, 11):
        rows += [(k * 100 * MS, 100 * MS, "gpu.util", "gpu:0", 0.8),
                 (k * 100 * MS, 100 * MS, "gpm.tensor_util", "gpu:0", 0.86),
                 (k * 100 * MS, 100 * MS, "gpm.dram_bw_util", "gpu:0", 53.0)]
    data = RunData()
    load_samples(data, [samples(rows)], catalog)
    s = signals(data, [(0, 1000 * MS)])
    assert s["gpu_util"].value == pytest.approx(0.008)
    assert s["gpm_tensor"].value == pytest.approx(0.0086)
    assert s["gpm_dram"].value == pytest.approx(0.53)


def test_the_steps_span_signals_leave_out_a_time_window_that_caught_the_first_step():
    """A set-up over 20 s: a time window records the end of it and step 0, in which the GPU
    waits while the optimizer's state is allocated; then the step schedule's windows record
    steady steps, the GPU busy. The steps' GPU idle share comes from the step windows; the run's
    from every window."""
    step_ns = 100 * MS
    spans = [
        # the time window: 0-300 ms, step 0 at 100-300 ms: 20 ms of GPU work, then 180 ms idle
        (0, 300 * MS, "vm_7.1.time.pt.trace.json", "window"),
        (100 * MS, 300 * MS, "ProfilerStep#0", "step"),
        (100 * MS, 120 * MS, "adam_init", "kernel"),
    ]
    for k in range(1, 6):              # the step window: 1000-1500 ms, five busy steps
        lo = 1000 * MS + (k - 1) * step_ns
        spans += [(lo, lo + step_ns, f"ProfilerStep#{k}", "step"), (lo + 2 * MS, lo + step_ns, "gemm", "kernel")]
    spans.append((1000 * MS, 1500 * MS, "vm_7.2.pt.trace.json", "window"))
    t = pa.Table.from_batches([spans_batch(
        start=[s for s, *_ in spans], end=[e for _, e, *_ in spans], name=[n for _, _, n, _ in spans],
        category=[c for *_, c in spans], kernel_class=["compute" if c == "kernel" else None for *_, c in spans],
        device=[0 if c == "kernel" else None for *_, c in spans],
        stream=[7 if c == "kernel" else None for *_, c in spans])])
    data = RunData()
    load_spans(data, t, short_kernel_us=10)
    steps = data.regions["ProfilerStep"]
    assert signals(data, steps, steps=True)["gpu_idle"].value == pytest.approx(0.02, abs=0.01)
    assert signals(data, steps)["gpu_idle"].value > 0.2        # step 0's 180 ms idle counted


@pytest.mark.parametrize("seed", range(40))
def test_steps_and_host_collectives_taken_in_bulk_are_what_each_row_gave(seed):
    """A big run's steps and host collectives (most of its spans) are read as arrays per rank,
    not row by row: per rank and in all, they are the unions of the rows, in any row order,
    with a region a user named ProfilerStep joining the steps, and the regions in the order
    they first appear."""
    import random
    from counterprof.analysis import intervals as iv
    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(1, 120)):
        a = rng.randint(0, 10_000)
        cat, dev, name = rng.choice([("step", None, "ProfilerStep#1"), ("collective", None, "gloo:all_reduce"),
                                     ("collective", 0, "ncclKernel"), ("region", None, "fwd"),
                                     ("region", None, "ProfilerStep"), ("cpu_op", None, "aten::mm")])
        rank = rng.choice([0, 1, 2, None])
        rows.append((a, a + rng.randint(0, 300), name, cat, dev, rank, rng.choice([7, 8, None])))
    rng.shuffle(rows)
    s, e, n, c, d, r, t = (list(x) for x in zip(*rows))
    table = pa.Table.from_batches([spans_batch(start=s, end=e, name=n, category=c, device=d, tid=t)])
    table = table.append_column("rank", pa.array(r, pa.int64()))
    data = RunData()
    load_spans(data, table, short_kernel_us=10)
    steps = [(a, b, rk or 0) for a, b, _n, cat, _d, rk, _t in rows if cat == "step"]
    host = [(a, b, rk or 0) for a, b, _n, cat, dv, rk, _t in rows if cat == "collective" and dv is None]
    for got, want in ((data.rank_steps, steps), (data.rank_collectives, host)):
        assert {k: list(v) for k, v in got.items()} == {
            rk: iv.merge((a, b) for a, b, x in want if x == rk) for rk in {x for _a, _b, x in want}}
    assert data.cpu_collectives == iv.merge((a, b) for a, b, _r in host)
    named = [(a, b) for a, b, nm, cat, *_ in rows if cat == "region" and nm == "ProfilerStep"]
    if steps or named:
        assert data.regions["ProfilerStep"] == iv.merge([(a, b) for a, b, _r in steps] + named)
        assert data.region_count["ProfilerStep"] == len(steps) + len(named)
    first = {}
    for _a, _b, nm, cat, *_ in rows:
        if cat in ("region", "step"):
            first.setdefault("ProfilerStep" if cat == "step" else nm, len(first))
    assert list(data.regions) == list(first)


@pytest.mark.parametrize("seed", range(60))
def test_collective_exposure_over_all_ranks_at_once_is_the_per_rank_sum(seed):
    """The exposed collective share is summed over every rank at once (the ranks' sets stacked,
    iv.Stacked): the same figure, to the last bit, as intersecting each rank's collectives, own
    ops and steps with the scope one rank at a time; ranks with no steps or no ops among them,
    scopes inside, across and outside the trace windows."""
    import random
    from counterprof.analysis import intervals as iv

    def ragged(rng, n, span=20_000, width=400):
        return iv.merge((a, a + rng.randint(1, width)) for a in (rng.randint(0, span) for _ in range(n)))

    rng = random.Random(seed)
    data = RunData()
    nranks = rng.randint(1, 6)
    data.ranks = nranks
    data.rank_collectives = {r: ragged(rng, rng.randint(0, 30)) for r in range(nranks)}
    data.main_ops = {r: ragged(rng, rng.randint(1, 40)) for r in range(nranks) if rng.random() < 0.7}
    data.rank_steps = {r: ragged(rng, rng.randint(1, 10), width=3000) for r in range(nranks) if rng.random() < 0.7}
    data.cpu_collectives = iv.union(data.rank_collectives.values())
    data.windows = ragged(rng, rng.randint(0, 3), width=6000)
    scope = ragged(rng, rng.randint(1, 4), width=8000)

    traced = iv.intersect(scope, data.windows) if data.windows else scope
    wall, traced_ns = iv.total(scope), iv.total(traced)
    in_coll = exposed = 0
    share = 0.0
    for r, spans_r in data.rank_collectives.items():          # as it was: one rank at a time
        c = iv.intersect(spans_r, traced)
        own = data.main_ops.get(r)
        exposed_r = iv.total(iv.subtract(c, own) if own else c)
        in_coll += iv.total(c)
        exposed += exposed_r
        steps_r = data.rank_steps.get(r)
        traced_steps = iv.total(iv.intersect(steps_r, traced)) if steps_r else 0
        if steps_r and traced_steps > 0:
            share += min(1.0, exposed_r / traced_steps) * iv.total(iv.intersect(steps_r, scope)) / wall
        else:
            share += exposed_r / traced_ns if traced_ns else 0.0
    got = signals(data, scope)
    if data.windows and traced_ns == 0 and "main_in_ops" in got:
        # an untraced scope: the traced steps' share in ops carried to its steps, all ranks'
        in_steps = sum(iv.total(iv.intersect(s, scope)) for s in data.rank_steps.values())
        f = min(1.0, in_steps / (wall * len(data.rank_steps)))
        assert got["main_in_ops"].value == data.steps_in_ops * f + (1 - f)
    if traced_ns == 0 or not iv.intersect(data.cpu_collectives, traced):
        assert "cpu_collective_exposed" not in got
        return
    assert got["cpu_collective_exposed"].value == min(1.0, share / nranks)
    if in_coll:
        assert got["cpu_collective_overlap"].value == 1 - exposed / in_coll


@pytest.mark.parametrize("spread", [1, 1 << 40, 1 << 62])
def test_distinct_rank_thread_pairs_are_np_uniques_rows(spread):
    """The (rank, thread) pairs of a run's steps: as np.unique(axis=0) gives them, whether the
    pair fits one int64 key or not (thread ids are the kernel's, ranks may be negative)."""
    import numpy as np
    from counterprof.analysis.signals import _distinct_pairs
    rng = np.random.default_rng(spread % 1000)
    a = rng.integers(-2, 50, 5000)
    b = rng.integers(0, 4, 5000) * (spread // 4) + rng.integers(0, 3, 5000)
    assert _distinct_pairs(a, b) == [tuple(x) for x in np.unique(np.stack([a, b], axis=1), axis=0).tolist()]
    assert _distinct_pairs(a[:0], b[:0]) == []
