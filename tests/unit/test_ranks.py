"""Cross-rank analysis on recorded spans: stragglers, waits, clock skew; launcher detection."""
import pyarrow as pa
import pytest

from counterprof.analysis.across_ranks import analyze_ranks, clock_skew
from counterprof.ranks import launches_ranks
from counterprof.ground.schema import spans_batch

MS = 1_000_000


def spans(rows):
    """rows: (rank, category, name, start_ms, end_ms)"""
    b = spans_batch([r[3] * MS for r in rows], [r[4] * MS for r in rows], [r[2] for r in rows],
                    [r[1] for r in rows])
    return pa.Table.from_batches([b]).append_column("rank", pa.array([r[0] for r in rows], pa.int64()))


def synchronous(steps=5, slow_rank=2, slow_ms=30, ranks=3, skew_ms=None):
    """Each step is 100 ms; the all_reduce ends at 100 ms for everyone; the slow rank starts it
    slow_ms late (it computed longer), so the others wait slow_ms more inside it."""
    rows = []
    for k in range(steps):
        t0 = k * 100
        for r in range(ranks):
            off = (skew_ms or {}).get(r, 0)
            start_coll = t0 + 50 + (slow_ms if r == slow_rank else 0)
            rows.append((r, "step", f"ProfilerStep#{k}", t0 + off, t0 + 100 + off))
            rows.append((r, "collective", "gloo:all_reduce", start_coll + off, t0 + 100 + off))
    return spans(rows)


def test_the_rank_that_waits_least_in_collectives_is_the_straggler():
    a = analyze_ranks(synchronous())
    assert (a.steps, a.straggler) == (5, 2)
    assert a.straggler_lag_s == pytest.approx(0.030)
    f = {x.rank: x for x in a.ranks}
    assert f[2].slowest_in == 5 and f[0].slowest_in == 0
    assert f[0].waited_s_per_step == pytest.approx(0.030) and f[2].waited_s_per_step == 0
    assert f[0].collective_s_per_step == pytest.approx(0.050)
    assert f[1].step_mean_s == pytest.approx(0.1)
    assert a.skew_max_ms is None            # one host: one clock, nothing estimated


def test_the_straggler_is_who_cost_the_others_most_not_who_was_last_most_often():
    # rank 1 is 40 ms late in one step of three; rank 0 is 1 ms late in the other two
    rows = []
    for k, (late, ms) in enumerate(((1, 40), (0, 1), (0, 1))):
        t0 = k * 100
        for r in (0, 1):
            rows.append((r, "step", f"ProfilerStep#{k}", t0, t0 + 100))
            rows.append((r, "collective", "gloo:all_reduce", t0 + 50 + (ms if r == late else 0), t0 + 100))
    a = analyze_ranks(spans(rows))
    f = {x.rank: x for x in a.ranks}
    assert (f[0].slowest_in, f[1].slowest_in) == (2, 1)
    assert a.straggler == 1


def test_a_step_with_many_collectives_counts_them_all():
    """Tensor-parallel steps hold hundreds of collectives; each counts, not only the last few
    (the search once looked back over 64 only)."""
    rows = []
    for k in range(3):
        t0 = k * 1000
        for r in range(2):
            rows.append((r, "step", f"ProfilerStep#{k}", t0, t0 + 1000))
            # 100 all_reduces of 4 ms (rank 0) or 2 ms (rank 1, the straggler) in each step
            for c in range(100):
                rows.append((r, "collective", "nccl:all_reduce", t0 + 5 * c, t0 + 5 * c + (4 if r == 0 else 2)))
    a = analyze_ranks(spans(rows))
    f = {x.rank: x for x in a.ranks}
    assert f[0].collective_s_per_step == pytest.approx(0.400)
    assert f[0].waited_s_per_step == pytest.approx(0.200)
    assert a.straggler == 1


def test_skew_is_estimated_across_hosts_and_aligned():
    t = synchronous(skew_ms={1: 7})
    assert clock_skew({}) == {}
    a = analyze_ranks(t, hosts={0: "a", 1: "b", 2: "a"})
    f = {x.rank: x for x in a.ranks}
    assert f[1].skew_ms == pytest.approx(7.0) and f[0].skew_ms == 0
    assert any("clocks disagree by up to 7.0 ms" in n for n in a.notes)
    assert a.straggler == 2                 # still found after alignment


def test_independent_ranks_use_the_longest_step():
    rows = []
    for k in range(4):
        for r in range(2):
            rows.append((r, "step", f"ProfilerStep#{k}", k * 100, k * 100 + (90 if r == 1 else 60)))
    a = analyze_ranks(spans(rows))
    assert a.straggler == 1 and a.straggler_lag_s == pytest.approx(0.015)


def test_one_rank_is_no_analysis():
    assert analyze_ranks(spans([(0, "step", "ProfilerStep#0", 0, 10)])) is None


@pytest.mark.parametrize("cmd, yes", [
    (["torchrun", "--nproc_per_node", "2", "train.py"], True),
    (["/usr/bin/mpirun", "-n", "4", "./a.out"], True),
    (["python", "-m", "torch.distributed.run", "train.py"], True),
    (["srun", "python", "train.py"], True),
    (["python", "train.py"], False),
    ([], False),
])
def test_launchers(cmd, yes):
    assert launches_ranks(cmd) is yes


def test_a_ranks_gpu_samples_land_in_its_partition(tmp_path):
    """nvml samples the machine once; a rank that drives gpu:1 (LOCAL_RANK 1) owns its rows."""
    from counterprof.ground.schema import samples_batch
    from counterprof.session import Session

    class Sink:
        def __init__(self):
            self.got = []

        def write(self, table, batch, rank):
            self.got.append((rank, batch.column("entity").to_pylist()))

        def close(self):
            pass

    sink = Sink()
    s = Session(tmp_path / "r", collectors=[], sinks=[sink], rank=0)
    s.start()
    s.own_entity("gpu:1", 1)
    s.emit("samples", samples_batch([1, 1, 1], [None] * 3, "nvml", ["gpu.util"] * 3,
                                    ["gpu:0", "gpu:1", "gpu:2"], [1.0, 2.0, 3.0]))
    s.stop()
    assert sorted(sink.got) == [(0, ["gpu:0", "gpu:2"]), (1, ["gpu:1"])]


def test_ranks_lacking_metrics_are_grouped_and_named():
    import pyarrow as pa
    from counterprof.analysis.report import metric_set_notes
    rows = [(0, "task-clock"), (0, "gpu.util"), (1, "task-clock"), (1, "gpu.util"),
            (2, "task-clock"), (3, "task-clock"), (4, "page-faults")]
    t = pa.table({"rank": [r for r, _ in rows], "metric": pa.array([m for _, m in rows]).dictionary_encode()})
    notes = metric_set_notes(t)
    assert notes[0].startswith("ranks 0, 1 lack page-faults, which other ranks have: their verdicts")
    assert notes[1].startswith("ranks 2, 3 lack gpu.util, page-faults,")
    assert notes[2].startswith("rank 4 lacks gpu.util, task-clock, which other ranks have: its verdict")
    assert len(notes) == 3
    assert metric_set_notes(t.filter(pa.compute.less(t["rank"], 2))) == []    # same sets: nothing


def test_skew_survives_a_rank_lacking_a_trace_window():
    """Rank 1 (another host, clock 7 ms ahead) lost the trace window of steps 0-1: its
    collectives are matched with rank 0's of the same steps, not by position (which paired
    each with the one a step or two later: 200 ms of skew, and every span shifted by it)."""
    t = synchronous(steps=6, skew_ms={1: 7})
    starts = t["start"].cast(pa.int64()).to_pylist()
    t = t.filter(pa.array([not (r == 1 and s < 200 * MS + 7 * MS)      # rank 1, steps 0 and 1
                           for r, s in zip(t["rank"].to_pylist(), starts)]))
    a = analyze_ranks(t, hosts={0: "a", 1: "b", 2: "a"})
    f = {x.rank: x for x in a.ranks}
    assert f[1].skew_ms == pytest.approx(7.0)
    assert a.skew_max_ms == pytest.approx(7.0)
    assert not any("not estimated" in n for n in a.notes)
    assert (a.steps, a.straggler) == (4, 2)
    assert f[0].waited_s_per_step == pytest.approx(0.030)


def test_a_step_whose_collectives_differ_is_left_out_of_the_skew():
    """Rank 1 has every step but lacks the all_reduce of steps 1-3 and has an extra barrier in
    step 4: only steps 0 and 5 hold the same collectives on both ranks, and they are matched."""
    t = synchronous(steps=6, ranks=2, slow_rank=1, skew_ms={1: 7})
    extra = spans([(1, "collective", "gloo:barrier", 460 + 7, 470 + 7)])
    t = pa.concat_tables([t, extra.cast(t.schema)])
    starts = t["start"].cast(pa.int64()).to_pylist()
    lost = {(k * 100 + 50 + 30 + 7) * MS for k in (1, 2, 3)}
    t = t.filter(pa.array([not (r == 1 and c == "collective" and s in lost)
                           for r, c, s in zip(t["rank"].to_pylist(),
                                              t["category"].cast(pa.string()).to_pylist(), starts)]))
    a = analyze_ranks(t, hosts={0: "a", 1: "b"})
    assert {x.rank: x.skew_ms for x in a.ranks} == {0: 0.0, 1: pytest.approx(7.0)}


def test_skew_that_cannot_be_matched_is_said_and_nothing_is_shifted():
    """No steps to match within, and rank 1 lacks rank 0's first collective: the skew is not
    estimated (not guessed from collectives paired by position), and the note says why."""
    rows = []
    for k in range(5):
        for r in range(2):
            off = 7 if r == 1 else 0
            if not (r == 1 and k == 0):
                rows.append((r, "collective", "gloo:all_reduce", k * 100 + 50 + off, k * 100 + 100 + off))
    a = analyze_ranks(spans(rows), hosts={0: "a", 1: "b"})
    assert a.skew_max_ms is None and all(x.skew_ms in (None, 0) for x in a.ranks)
    assert any(n.startswith("clock skew not estimated: ranks 0 and 1 recorded different collectives")
               for n in a.notes), a.notes
    assert not any("clocks disagree" in n for n in a.notes)
    # the same sequences on both (no steps): matched whole
    rows = [r for r in rows if not (r[0] == 0 and r[3] == 50)]
    a = analyze_ranks(spans(rows), hosts={0: "a", 1: "b"})
    assert {x.rank: x.skew_ms for x in a.ranks} == {0: 0.0, 1: pytest.approx(7.0)}


def test_missing_ranks_up_to_the_world_size_are_named():
    """The gap check looks up to WORLD_SIZE, not only below the highest rank present: a run of
    rank 0 alone of a 2-rank job names rank 1."""
    one = spans([(0, "step", "ProfilerStep#0", 0, 10)])
    assert analyze_ranks(one, hosts={0: "a"}) is None                 # world size unknown
    assert analyze_ranks(one, hosts={0: "a"}, world_size="1") is None
    a = analyze_ranks(one, hosts={0: "a"}, world_size="2")
    assert a.notes[0].startswith("ranks missing from this run: 1 (their partitions are absent")
    assert [x.rank for x in a.ranks] == [0]
    # a rank partition without spans is present, not missing; a huge world size is cheap
    a = analyze_ranks(synchronous(ranks=2), hosts={0: "a", 1: "a", 2: "a", 4: "a"}, world_size=10**12)
    assert a.notes[0].startswith(f"ranks missing from this run: 3, 5-{10**12 - 1} (")
    assert any(n == "ranks without steps: 2, 4" for n in a.notes)
    for bad in ("x", "0", "-3", "1_0", None):
        a = analyze_ranks(synchronous(ranks=2), hosts={0: "a", 1: "a", 3: "a"}, world_size=bad)
        assert a.notes[0].startswith("ranks missing from this run: 2 ("), bad


def test_the_straggler_lag_is_the_mean_wait_as_in_the_ranks_table():
    """4 ranks, rank 3 the straggler: rank 0 waits 30 ms, rank 1 20 ms, rank 2 1 ms per step.
    The evidence's lag and the table's waited are the same statistic: the mean (17 ms), not
    the median (20 ms)."""
    rows = []
    for k in range(5):
        t0 = k * 100
        for r, late in ((0, 0), (1, 10), (2, 29), (3, 30)):
            rows.append((r, "step", f"ProfilerStep#{k}", t0, t0 + 100))
            rows.append((r, "collective", "gloo:all_reduce", t0 + 50 + late, t0 + 100))
    a = analyze_ranks(spans(rows))
    f = {x.rank: x for x in a.ranks}
    assert a.straggler == 3 and f[3].slowest_in == 5
    assert [f[r].waited_s_per_step for r in (0, 1, 2)] == pytest.approx([0.030, 0.020, 0.001])
    assert a.straggler_lag_s == pytest.approx(0.017)
    assert a.straggler_lag_s == pytest.approx(sum(f[r].waited_s_per_step for r in (0, 1, 2)) / 3)
