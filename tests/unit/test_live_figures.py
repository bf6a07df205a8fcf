"""What the live view shows, computed from windows of known batches."""
from __future__ import annotations

import pyarrow as pa
import pytest
from live_batches import MS, T0, catalog, gpu_batch, host_batch, perf_batch

from counterprof.live.buckets import Bucket, binned, current_value, rate, recent
from counterprof.live.frame import live_figures
from counterprof.live.processes import top_processes
from counterprof.live.window import LiveWindow

S = 1_000_000_000


def window(seconds: float, make) -> LiveWindow:
    """A window fed every 100 ms for `seconds`; make(i, t_ns) returns the batches of tick i."""
    w = LiveWindow()
    for i in range(int(seconds * 10)):
        t = T0 + (i + 1) * 100 * MS
        for b in make(i, t):
            w.write("samples", b, 0)
    return w


def figures(w: LiveWindow, statuses=None, points=10, **kw):
    return live_figures(w.snapshot(), catalog(), statuses or {}, points, **kw)


def fig(figs, key):
    return next(f for p in figs.panels for f in p.figures if f.key == key)


def panel(figs, title):
    return next(p for p in figs.panels if p.title == title)


def test_cpu_ipc_cache_misses_from_perf_counts():
    # 0.75 CPUs (75 ms of task-clock per 100 ms), IPC 2, 4% of cache refs miss, 3 GHz
    w = window(5, lambda i, t: [perf_batch(t, 100 * MS, {
        "task-clock": 75 * MS, "cycles": 2.25e8, "instructions": 4.5e8,
        "cache-references": 1e6, "cache-misses": 4e4, "page-faults": 10.0})])
    f = figures(w)
    assert fig(f, "perf.cpus").value == pytest.approx(0.75)
    assert fig(f, "perf.ipc").value == pytest.approx(2.0)
    assert fig(f, "perf.ipc").detail == "3.00 GHz"
    assert fig(f, "perf.cache-misses").value == pytest.approx(4.0)
    assert fig(f, "perf.cache-misses").detail == "of refs · 400K/s"
    assert fig(f, "perf.page-faults").value == pytest.approx(100.0)      # per second
    assert fig(f, "perf.page-faults").unit == "/s"
    keys = [x.key for x in panel(f, "perf").figures]
    assert "perf.cycles" not in keys and "perf.mux" not in keys    # denominators; nothing multiplexed


def test_unknown_intervals_are_not_zeros():
    # half the intervals never ran on the PMU (null): the rate is over the known ones only
    w = window(2, lambda i, t: [perf_batch(t, 100 * MS, {"cycles": None if i % 2 else 3e8,
                                                         "instructions": None if i % 2 else 3e8},
                                           quality=0.0 if i % 2 else 1.0)])
    f = figures(w)
    assert fig(f, "perf.ipc").value == pytest.approx(1.0)
    mux = fig(f, "perf.mux")
    assert mux.value == pytest.approx(50.0) and mux.alert
    assert mux.detail == "ran 50% of time"


def test_multiplexing_fraction_follows_quality():
    w = window(3, lambda i, t: [perf_batch(t, 100 * MS, {"cycles": 1e8, "instructions": 1e8},
                                           quality=0.25)])
    assert fig(figures(w), "perf.mux").value == pytest.approx(75.0)


def test_threads_add_up_without_doubling_time():
    # --per-thread: two threads at 0.5 CPUs each are 1 CPU (perf drains every thread's
    # intervals in one batch)
    w = window(2, lambda i, t: [pa.concat_batches([
        perf_batch(t, 100 * MS, {"task-clock": 50 * MS}, entity="tid:1"),
        perf_batch(t, 100 * MS, {"task-clock": 50 * MS}, entity="tid:2")])])
    assert fig(figures(w), "perf.cpus").value == pytest.approx(1.0)


def test_host_panel_rates_and_gauges():
    w = window(3, lambda i, t: [host_batch(t, 100 * MS, {
        "proc.cpu_user": 0.08, "proc.cpu_system": 0.02, "proc.rss": float(100 + i) * 2**20,
        "proc.read_bytes": 1e5, "proc.write_bytes": 0.0,
        "system.cpu_util": 60.0, "system.cpu_iowait": 5.0})])
    f = figures(w)
    assert fig(f, "host.cpu").value == pytest.approx(100.0)
    assert fig(f, "host.cpu").detail == "sys 20.0%"
    assert fig(f, "host.rss").value == 128 * 2**20      # the newest of the last completed tick
    assert fig(f, "host.read").value == pytest.approx(1e6)              # bytes per second
    assert fig(f, "host.system_cpu").value == pytest.approx(60.0)
    assert fig(f, "host.system_cpu").detail == "iowait 5.0%"


def test_gpu_panels_are_generic_and_ordered():
    def make(i, t):
        return [gpu_batch(t, 100 * MS, "gpu:1", {"gpu.util": 10.0, "gpu.power": 100.0}),
                gpu_batch(t, 100 * MS, "gpu:0", {
                    "gpu.temperature": 65.0, "gpu.power": 350.0, "gpu.power_limit": 700.0,
                    "gpu.throttle_time": 20 * MS if i >= 10 else 0.0, "gpu.util": 95.0,
                    "gpm.sm_util": 80.0, "gpu.clock_sm": 1980.0, "gpu.mem_used": 40.0 * 2**30,
                    "gpu.mem_total": 80.0 * 2**30, "gpm.tensor_util": 60.0, "gpu.fan": 30.0,
                    "gpu.throttle_reasons": 4.0 if i >= 10 else 0.0})]
    f = figures(window(3, make))
    assert [p.title for p in f.panels] == ["gpu:0", "gpu:1"]
    g0 = panel(f, "gpu:0")
    assert [x.label for x in g0.figures] == ["util", "sm_util", "tensor_util", "mem_used", "power",
                                             "temperature", "clock_sm", "throttle_reasons",
                                             "throttle_time", "fan"]
    mem = fig(f, "gpu:0.gpu.mem_used")
    assert (mem.value, mem.detail, mem.scale) == (40.0 * 2**30, "of 80.0 GiB", 80.0 * 2**30)
    reasons = fig(f, "gpu:0.gpu.throttle_reasons")
    assert (reasons.value, reasons.unit, reasons.alert) == (4.0, "bitmask", True)
    power = fig(f, "gpu:0.gpu.power")
    assert (power.value, power.unit, power.detail, power.scale) == (350.0, "W", "of 700 W", 700.0)
    throttle = fig(f, "gpu:0.gpu.throttle_time")
    assert throttle.unit == "percent" and throttle.value == pytest.approx(20.0) and throttle.alert
    assert [x.key for x in g0.figures if x.headline] == ["gpu:0.gpu.util", "gpu:0.gpm.sm_util"]
    # no CPU figures: the classifier judges the GPUs (mean utilization 52%) and GPM (tensor 60%)
    assert f.verdict.label == "unknown (mixed: compute 52% vs host 48%, within the 10-point margin)"
    assert f.verdict.evidence == "GPU busy 52% of the time (NVML); tensor cores busy 60% (GPM)"


@pytest.mark.parametrize("cpu, sys_share, sys_util, iowait, gpu, vol_inv, label, evidence", [
    (1.0, 0.0, 60.0, 0.0, None, (0, 1), "unknown (busy CPU: compute vs memory cannot be told apart)",
     "the workload used 1.00 CPUs over the wall time"),
    (1.5, 0.5, 80.0, 0.0, None, (0, 1), "unknown (busy CPU: compute vs memory cannot be told apart)",
     "the workload used 1.50 CPUs"),
    (0.1, 0.0, 10.0, 0.0, None, (5, 0), "host-bound (90% of the time)",
     "off-CPU 90% of the time: 50 voluntary context switches/s (blocking)"),
    (0.1, 0.0, 10.0, 0.0, 5.0, (5, 0), "host-bound (95% of the time)", "GPU busy 5% of the time (NVML)"),
    (0.4, 0.0, 97.0, 0.0, None, (1, 5), "host-bound (60% of the time)", "off-CPU 60% of the time"),
    (0.05, 0.0, 10.0, 35.0, None, (5, 0), "host-bound (95% of the time)", "35% of CPU time in iowait"),
    (0.3, 0.0, 50.0, 0.0, 97.0, (5, 0), "unknown (busy GPU: compute vs memory cannot be told apart)",
     "GPU busy 97% of the time (NVML)"),
])
def test_bottleneck_line_is_the_classifiers(cpu, sys_share, sys_util, iowait, gpu, vol_inv, label, evidence):
    def make(i, t):
        out = [host_batch(t, 100 * MS, {"proc.cpu_user": 0.1 * cpu * (1 - sys_share),
                                        "proc.cpu_system": 0.1 * cpu * sys_share,
                                        "proc.ctx_switches_voluntary": float(vol_inv[0]),
                                        "proc.ctx_switches_involuntary": float(vol_inv[1]),
                                        "system.cpu_util": sys_util, "system.cpu_iowait": iowait})]
        if gpu is not None:
            out.append(gpu_batch(t, 100 * MS, "gpu:0", {"gpu.util": gpu}))
        return out
    v = figures(window(4, make)).verdict
    assert v.label == label
    assert evidence in v.evidence


def test_verdict_prefers_task_clock_and_thresholds_are_documented():
    # perf says 1 CPU while host's (coarser) figure says less: task-clock wins
    w = window(4, lambda i, t: [perf_batch(t, 100 * MS, {"task-clock": 100 * MS}),
                                host_batch(t, 100 * MS, {"proc.cpu_user": 0.05})])
    v = figures(w).verdict
    assert v.label.startswith("unknown (busy CPU") and "1.00 CPUs" in v.evidence
    from counterprof.ground.thresholds import T    # every cut-off in one table, with its source
    assert set(T) >= {"machine_gpu_busy", "machine_busy", "machine_iowait", "machine_idle"}
    assert all(t.why for t in T.values())


def test_system_wide_perf_is_not_a_busy_figure():
    # -a / top: task-clock counts every CPU's whole time; the machine verdict uses system CPU
    w = window(4, lambda i, t: [perf_batch(t, 100 * MS, {"task-clock": 200 * MS, "context-switches": 50.0},
                                           entity="system"),
                                host_batch(t, 100 * MS, {"system.cpu_util": 5.0})])
    f = figures(w, scope="machine", cpus=2, perf_system_wide=True)
    assert [x.key for x in panel(f, "perf").figures] == ["perf.context-switches"]
    assert str(f.verdict) == "idle: 0.1 of 2 CPUs busy, no GPU"
    busy = window(4, lambda i, t: [host_batch(t, 100 * MS, {"system.cpu_util": 95.0})])
    assert str(figures(busy, scope="machine", cpus=4).verdict) == "CPU-bound: 3.8 of 4 CPUs busy (95%), no GPU"


def test_statuses_show_failed_and_missing_events():
    w = window(1, lambda i, t: [perf_batch(t, 100 * MS, {"task-clock": 1e7})])
    statuses = {"perf": {"status": "ok", "events": {"task-clock": {"status": "counted"},
                                                    "cycles": {"status": "not supported"},
                                                    "instructions": {"status": "not supported"}}},
                "host": {"status": "failed", "reason": "cannot read /proc"},
                "nvml": {"status": "unavailable", "reason": "no NVIDIA driver"}}
    f = figures(w, statuses)
    assert panel(f, "perf").notes == ["not counted here: cycles, instructions"]
    assert (panel(f, "host").status, panel(f, "host").reason) == ("failed", "cannot read /proc")
    # not on this machine: one entry of the "not here" line, no panel
    assert not [p for p in f.panels if p.title == "nvml"]
    assert [(a.name, a.why) for a in f.absent] == [("nvml", "no NVIDIA driver")]


def test_history_bins_cover_the_window_oldest_first():
    # 60 s at 1..8 CPUs-worth steps: 8 points, one per 7.5 s
    w = LiveWindow()
    for i in range(600):
        t = T0 + (i + 1) * 100 * MS
        w.write("samples", perf_batch(t, 100 * MS, {"task-clock": (i // 75) * 12.5 * MS}), 0)
    hist = fig(figures(w, points=8), "perf.cpus").history
    assert hist == pytest.approx([0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875], abs=0.02)


def test_now_is_where_every_collector_has_reported():
    # perf has handed over 3 s, host only 2 s (it emits once a second): "now" ends before 2 s
    # for both, so the two CPU figures describe the same second; a collector silent for longer
    # than STALE_S does not hold the others back
    def make(i, t):
        out = [perf_batch(t, 100 * MS, {"task-clock": (100 if i >= 20 else 50) * MS})]
        if i < 20:
            out.append(host_batch(t, 100 * MS, {"proc.cpu_user": 0.05}))
        return out
    f = figures(window(3, make))
    assert fig(f, "perf.cpus").value == pytest.approx(0.5)
    assert fig(f, "host.cpu").value == pytest.approx(50.0)
    stale = figures(window(6, make))                    # host silent for 4 s: left out
    assert fig(stale, "perf.cpus").value == pytest.approx(1.0)
    assert fig(stale, "host.cpu").value is None


def test_binned_and_recent_edges():
    b = Bucket(1.0, 0.0, 1e9, 1e9, 1e9, 1, 0, 1.0, 1.0, 0)
    series = {10: b, 11: b, 20: b}
    assert binned(series, 20, 4, 4) == [None, None, None, b]            # 10 and 11 are outside
    assert binned({}, 20, 4, 4) == [None] * 4
    assert recent(series, 250 * MS, 0.5).known == 1                      # ticks 19..20 of its own end
    assert rate(recent(series, 250 * MS, 60)) == pytest.approx(1.0)
    assert recent({}, 250 * MS, 1) is None


@pytest.mark.parametrize("kind, unit, expect_unit", [
    ("delta", "bytes", "bytes/s"), ("delta", "", "/s"), ("delta", "count", "/s"),
    ("delta", "J", "J/s"), ("delta", "ms", "percent"), ("gauge", "W", "W"), ("ratio", "percent", "percent")])
def test_current_value_units(kind, unit, expect_unit):
    b = Bucket(vsum=2.0, vdur=2.0 * S, kdur=1.0 * S, qdur=S, dur=S, known=2, unknown=0, last=1.5,
               vmax=1.5, t_last=0)
    value, u = current_value(kind, unit, b)
    assert u == expect_unit
    assert value == pytest.approx({"gauge": 1.5, "ratio": 2.0}.get(kind, 0.2 if unit == "ms" else 2.0))


def test_top_processes_by_cpu_between_polls():
    prev = {1: ("init", 10.0, 1e6), 2: ("busy", 5.0, 2e6), 3: ("gone", 1.0, 1e6)}
    cur = {1: ("init", 10.0, 1e6), 2: ("busy", 6.5, 2e6), 4: ("new", 0.2, 5e6)}
    rows = top_processes(prev, cur, 2.0, 2)
    # busiest first; ties (idle, or new since the last poll: unknown) by memory
    assert [(r.pid, r.name, r.cpu_pct) for r in rows] == [(2, "busy", 75.0), (4, "new", None)]
    assert top_processes({}, cur, 1.0, 5)[0].cpu_pct is None             # first poll: unknown
