"""Where a step's time goes, on recorded spans and signal values: time outside the main
thread's torch ops is host (and where it went), a region is judged by the ops inside it, the
main thread's wait for a CPU is shared out by who held the CPUs, the headline is the steps',
a scope too short for its sampling interval is judged from its trace or not at all."""
import pyarrow as pa
import pytest

from counterprof.analysis.classify import classify
from counterprof.analysis.headline import headline, too_short
from counterprof.analysis.signals import RunData, Signal, host_where, load_samples, load_spans, signals
from counterprof.ground.schema import samples_batch, spans_batch

MS = 1_000_000
MAIN = 7


def spans(rows):
    """rows: (start_ms, end_ms, name, category[, tid])"""
    return pa.Table.from_batches([spans_batch(
        start=[int(r[0] * MS) for r in rows], end=[int(r[1] * MS) for r in rows],
        name=[r[2] for r in rows], category=[r[3] for r in rows],
        tid=[r[4] if len(r) > 4 else MAIN for r in rows])])


def states(end_ms: int, run: float, wait: float, blocked: float, step_ms: int = 100, start_ms: int = 0):
    """The main thread's states every step_ms from start_ms: shares of each interval."""
    rows = []
    for t in range(start_ms + step_ms, end_ms + 1, step_ms):
        for metric, share in (("running", run), ("runnable", wait), ("blocked", blocked)):
            rows.append((t * MS, step_ms * MS, f"thread.main.{metric}", share * step_ms / 1000))
    return samples_batch([r[0] for r in rows], [r[1] for r in rows], "threads", [r[2] for r in rows],
                         ["thread:main"] * len(rows), [r[3] for r in rows])


CATALOG = {f"thread.main.{k}": {"kind": "delta", "unit": "s"} for k in ("running", "runnable", "blocked")}


def tokenizing_run(start_up_ms: int = 0) -> RunData:
    """10 steps of 200 ms, traced: each 140 ms of Python in a "tokenize" region (no op), then
    60 ms of ops in a "model" region; the main thread on a CPU the whole time, also for the
    start_up_ms before the first step (imports: no op traced)."""
    rows = [(0, 2000, "train.pt.trace.json", "window")]
    for k in range(10):
        t = 200 * k
        rows += [(t, t + 200, f"ProfilerStep#{k}", "step"),
                 (t, t + 140, "tokenize", "region"),
                 (t + 140, t + 200, "model", "region"),
                 (t + 140, t + 170, "aten::mm", "cpu_op"),
                 (t + 170, t + 200, "aten::add", "cpu_op")]
    data = RunData()
    load_samples(data, [states(2000, 1.0, 0.0, 0.0, start_ms=-start_up_ms)], CATALOG)
    load_spans(data, spans(rows), 10.0)
    return data


def test_time_outside_ops_is_host_and_said_where():
    data = tokenizing_run()
    s = signals(data, [(0, 2000 * MS)], steps=True)
    assert s["main_in_ops"].value == pytest.approx(0.3)
    where = host_where(data, [(0, 2000 * MS)], steps=True)
    assert where == [("tokenize", pytest.approx(1.0))]
    v = classify(s, "steps", {"host_where": where})
    assert v.verdict == "host"
    assert v.shares == {"host": pytest.approx(0.7), "compute|memory": pytest.approx(0.3)}
    assert v.host_parts == {"Python outside torch ops": pytest.approx(0.7)}
    ev = next(e for e in v.evidence if e.metric == "main_in_ops")
    assert "tokenize 100%" in ev.text


def test_a_region_is_judged_by_what_ran_inside_it():
    data = tokenizing_run()
    tok = classify(signals(data, data.regions["tokenize"]), "tokenize")
    model = classify(signals(data, data.regions["model"]), "model")
    assert tok.shares == {"host": pytest.approx(1.0)}
    assert model.shares == {"compute|memory": pytest.approx(1.0)}


def test_an_untraced_window_between_traced_steps_carries_their_share():
    data = tokenizing_run()
    data.windows = data.step_windows = [(0, 400 * MS)]       # only the first two steps traced
    s = signals(data, [(1000 * MS, 1400 * MS)])
    assert s["trace_coverage"].value == 0
    assert s["main_in_ops"].value == pytest.approx(0.3)


def test_the_headline_is_the_steps_with_start_up_apart():
    data = tokenizing_run(start_up_ms=3000)     # 3 s of imports before the first step
    start = -3000 * MS
    assert data.start_ns == start
    v, phases = headline(data, [(start, 2000 * MS)], lambda scope, steps=False, name=None: {})
    assert v.scope == "steps" and v.verdict == "host"
    assert v.shares["host"] == pytest.approx(0.7)
    assert [p.scope for p in phases] == ["start-up"]
    assert (phases[0].start_ns, phases[0].end_ns) == (start, 0)


def test_a_run_without_steps_keeps_the_whole_run():
    data = RunData()
    load_samples(data, [states(2000, 1.0, 0.0, 0.0)], CATALOG)
    v, phases = headline(data, [(0, 2000 * MS)], lambda scope, steps=False, name=None: {})
    assert v.scope == "run" and phases == []


def sig(**values):
    out = {"wall_s": Signal(10.0, "run")}
    for k, x in values.items():
        out[k] = Signal(x, "threads")
    return out


def test_the_wait_for_a_cpu_goes_to_whoever_held_the_cpus():
    # 2 ranks; each main thread runnable 40%: the CPUs meanwhile held by gloo's threads (0.6),
    # the other rank's main thread (0.5 x 1), other processes (0.1)
    s = sig(main_running=0.5, main_runnable=0.4, main_blocked=0.1, main_threads=2.0, ranks=2.0,
            comm_cpus=0.6, others_cpus=0.1, intraop_cpus=0.0)
    v = classify(s, "steps", {"cpus": 2})
    assert v.shares["collectives"] == pytest.approx(0.4 * 0.6 / 1.2, abs=1e-5)
    assert v.host_parts["oversubscribed by its own threads"] == pytest.approx(0.4 * 0.5 / 1.2, abs=1e-5)
    assert v.host_parts["CPU contention"] == pytest.approx(0.4 * 0.1 / 1.2, abs=1e-5)
    assert sum(v.shares.values()) == pytest.approx(1.0)
    text = next(e.text for e in v.evidence if e.metric == "main_runnable")
    assert "communication threads 0.60 CPUs" in text and "OMP_NUM_THREADS" in text


def test_a_rank_shares_its_wait_for_a_cpu_with_the_holders_it_cannot_see_itself():
    # one rank of two, runnable 30%: its gloo threads held 0.01 CPUs, the other rank 0.6 and an
    # unrelated process 0.8 (beside_the_rank: from the whole run). Without the last two, the
    # 30% went to the gloo threads: "collectives 20%" from 0.01 CPUs (seen in CI under load).
    s = sig(main_running=0.65, main_runnable=0.3, main_blocked=0.05, main_threads=1.0,
            comm_cpus=0.01, other_ranks_cpus=0.6, others_cpus=0.8)
    v = classify(s, "rank 0", {"cpus": 2})
    assert v.shares.get("collectives", 0.0) == pytest.approx(0.3 * 0.01 / 1.41, abs=1e-5)
    assert v.host_parts["oversubscribed by its own threads"] == pytest.approx(0.3 * 0.6 / 1.41, abs=1e-5)
    assert v.host_parts["CPU contention"] == pytest.approx(0.3 * 0.8 / 1.41, abs=1e-5)


def test_without_holders_the_wait_stays_contention():
    v = classify(sig(main_running=0.5, main_runnable=0.5, main_blocked=0.0))
    assert v.host_parts == {"CPU contention": pytest.approx(0.5)}


def test_a_short_untraced_region_is_not_judged():
    v = classify(sig(main_running=0.2, main_runnable=0.0, main_blocked=0.8), "tiny")
    out = too_short(v, sig(main_running=0.2), mean_ns=5 * MS, bucket=100 * MS)
    assert out.verdict == "unknown" and out.confidence == 0
    assert "too short at -I 100" in out.missing[0]


def test_a_short_traced_region_is_judged_from_its_trace():
    s = sig(main_running=0.2, main_runnable=0.0, main_blocked=0.8, main_in_ops=0.9)
    v = too_short(classify(s, "forward"), s, mean_ns=8 * MS, bucket=100 * MS)
    assert v.shares == {"compute|memory": pytest.approx(0.9), "host": pytest.approx(0.1)}
    assert v.verdict == "unknown" and v.undecided == ["compute", "memory"]
    assert v.confidence <= 0.5
    long = too_short(classify(s, "forward"), s, mean_ns=400 * MS, bucket=100 * MS)
    assert long.shares.get("host", 0) > 0.8           # long enough: the states stand


def test_rounded_shares_never_add_past_one():
    # 0.430670 + 0.224050 + 0.345281 = 1.000001 once each is rounded to 6 places
    run, coll = 0.43066964029126864, 0.22404961275435586
    v = classify(sig(main_running=run, main_runnable=0.0, main_blocked=1 - run, cpu_collective_exposed=coll))
    assert len(v.shares) == 3 and sum(v.shares.values()) <= 1.0 + 1e-12, v.shares
