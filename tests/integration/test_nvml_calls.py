"""The nvml collector's NVML call budget (issue 35): the real sampling thread against the fake
NVML, counted per GPU per second, and the readings the driver's sample buffers give, at the
driver's own times.

The budget at the default 100 ms interval, per GPU per second (each call ~0.6 ms of CPU on a
GPU VM):
  nvmlDeviceGetFieldValues   10   the counters' resolution is how often they are read; the
                                  rare fields ride on one of these a second
  nvmlDeviceGetSamples        5   utilization, memory utilization, power, SM and memory
                                  clocks: every driver sample, one read a second each
  temperature, memory used,   4   slow-moving, once a second
  throttle reasons, processes
  = 19 (the path before: 74), plus GPM where the GPU has it: nvmlGpmSampleGet and
  nvmlGpmMetricsGet once per 100 ms window, 20.
"""
from __future__ import annotations

import time

import pyarrow.compute as pc
import pytest

import counterprof
from counterprof.session import Session
from fake_nvml import FakeNvml, ampere, hopper

INTERVAL_S = 0.1
BUDGET = 1 / INTERVAL_S + 5 + 4          # per GPU per second, GPM aside (see above)
GPM_BUDGET = 2 / INTERVAL_S
GPM_CALLS = ("nvmlGpmSampleGet", "nvmlGpmMetricsGet")


def measure(path, fake, seconds=2.5, *, during=None, **config):
    """Run the collector; calls per GPU (bus id) per second per function over `seconds`
    after a warm-up (start-up's probe calls are not the steady state)."""
    s = Session(path, collectors=["nvml"], on_warning=lambda m: None,
                config={"nvml": {"module": fake, "interval_ms": INTERVAL_S * 1000, **config}})
    s.prepare()
    s.start()
    try:
        time.sleep(0.4)
        before, t0 = fake.device_calls.copy(), time.monotonic()
        if during:
            during(s)
        time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        per, dt = fake.per_gpu(before), time.monotonic() - t0
    finally:
        s.stop()
    run = counterprof.load(path)
    return run, {bus: {fn: n / dt for fn, n in c.items()} for bus, c in per.items()}


def rows(run, metric, entity="gpu:0"):
    t = run.samples()
    t = t.filter(pc.and_(pc.equal(t["metric"].cast("string"), metric),
                         pc.equal(t["entity"].cast("string"), entity)))
    return sorted(zip(t["time"].cast("int64").to_pylist(), t["value"].to_pylist()))


def test_calls_per_gpu_per_second_within_the_budget_and_a_quarter_of_the_old_path(tmp_path):
    gpus = lambda: [hopper(bus_id="00000000:17:00.0"), ampere(bus_id="00000000:3A:00.0")]  # noqa: E731
    _, new = measure(tmp_path / "new", FakeNvml(gpus()))
    _, old = measure(tmp_path / "old", FakeNvml(gpus()), sample_buffers=False)
    hop, amp = "00000000:17:00.0", "00000000:3A:00.0"

    def total(rates, gpm=False):
        return sum(n for fn, n in rates.items() if (fn in GPM_CALLS) == gpm)

    # fast ticks are scheduled from the end of the work, so never above 1/interval; a 2.5 s
    # window can catch one extra once-a-second call of each kind: + 0.4/s each
    for bus in (hop, amp):
        assert BUDGET - 3 <= total(new[bus]) <= BUDGET + 2.5, new[bus]
        assert new[bus]["nvmlDeviceGetFieldValues"] <= 1 / INTERVAL_S + 0.5
        assert new[bus]["nvmlDeviceGetSamples"] <= 5 * 1.5
        # nothing polled every tick but the field batch
        for fn in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature",
                   "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCurrentClocksEventReasons"):
            assert new[bus].get(fn, 0) <= 1.5, (fn, new[bus])
        # the same GPUs on the path before: every reading every tick
        assert total(old[bus]) >= 6.5 / INTERVAL_S
        assert total(new[bus]) <= total(old[bus]) / 3.5
    # GPM: once per window on the Hopper, not at all on the A100
    assert GPM_BUDGET * 0.7 <= total(new[hop], gpm=True) <= GPM_BUDGET + 0.5
    assert total(new[amp], gpm=True) == 0


def test_buffered_readings_arrive_at_the_drivers_period_and_times(tmp_path):
    """A driver sampling every 100 ms, read once a second: every sample arrives once, spaced
    as the driver stamped it, and a change lands at the run time it happened."""
    gpu = hopper(sample_period_s=0.1)
    fake = FakeNvml([gpu])
    marks = {}

    def during(s):
        time.sleep(1.2)
        with fake.lock:
            gpu.advance()                   # samples until now keep the old values
            marks["t"] = s.clock.now_ns()
            gpu.util, gpu.sm_clock, gpu.power_w = 95, 1980, 650.0
        time.sleep(1.3)

    run, rates = measure(tmp_path / "r", fake, during=during)
    assert rates["00000000:17:00.0"]["nvmlDeviceGetSamples"] <= 5 * 1.5
    change = marks["t"]
    for metric, before, after in (("gpu.util", 60.0, 95.0), ("gpu.util_sampled", 60.0, 95.0),
                                  ("gpu.sm_clock", 1755.0, 1980.0), ("gpu.mem_clock", 2619.0, 2619.0),
                                  ("gpu.power_sampled", 300.0, 650.0)):
        got = rows(run, metric)
        times = [t for t, _ in got]
        assert len(got) >= 25, (metric, len(got))
        assert len(set(times)) == len(times), metric            # each driver sample once
        gaps = [b - a for a, b in zip(times, times[1:])]
        # the driver's 100 ms spacing, to within the clock mapping's jitter (not the reads' 1 s)
        assert all(abs(g - 100_000_000) < 2_000_000 for g in gaps[1:]), (metric, gaps)
        # values change at the sample the driver took after the change, on the run's axis
        assert {v for t, v in got if t < change - 2_000_000} == {before}, metric
        assert {v for t, v in got if t > change + 102_000_000} == {after}, metric
    assert rows(run, "gpu.power")            # the instant-power field is still read every tick


def test_a_buffer_the_gpu_does_not_support_falls_back_to_polling_every_tick(tmp_path):
    fake = FakeNvml([hopper(gpm=False, samples_unsupported=("NVML_PROCESSOR_CLK_SAMPLES",
                                                            "NVML_GPU_UTILIZATION_SAMPLES"))])
    run, rates = measure(tmp_path / "r", fake)
    r = rates["00000000:17:00.0"]
    nv = run.meta["collectors"]["nvml"]
    for name in ("nvmlDeviceGetSamples(NVML_PROCESSOR_CLK_SAMPLES)",
                 "nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)"):
        assert nv["unsupported"][name] == ["gpu:0"]
    # the SM clock and utilization polled each tick, the memory clock from its buffer
    assert r["nvmlDeviceGetClockInfo"] == pytest.approx(1 / INTERVAL_S, rel=0.2)
    assert r["nvmlDeviceGetUtilizationRates"] == pytest.approx(1 / INTERVAL_S, rel=0.2)
    assert r["nvmlDeviceGetSamples"] <= 3 * 1.5
    assert "gpu.util_sampled" not in run.catalog
    for metric in ("gpu.util", "gpu.sm_clock", "gpu.mem_clock", "gpu.mem_util", "gpu.mem_util_sampled"):
        assert rows(run, metric), metric
    assert len(rows(run, "gpu.mem_util")) > 2 * len(rows(run, "gpu.util"))   # 50/s vs 10/s
    assert set(nv["gpus_sampled"]["gpu:0"]["sample_buffers_ms"]) == {
        "NVML_MEMORY_UTILIZATION_SAMPLES", "NVML_TOTAL_POWER_SAMPLES", "NVML_MEMORY_CLK_SAMPLES"}
    for name in run.catalog:
        assert rows(run, name), f"{name} is in the catalog but never recorded"


def test_a_driver_that_keeps_no_samples_is_polled(tmp_path):
    run, rates = measure(tmp_path / "r", FakeNvml([hopper(gpm=False, sample_period_s=None)]), seconds=1.5)
    r = rates["00000000:17:00.0"]
    assert "nvmlDeviceGetSamples" not in r           # found empty once, at the start
    assert r["nvmlDeviceGetClockInfo"] == pytest.approx(2 / INTERVAL_S, rel=0.2)
    assert not any(name.endswith("_sampled") for name in run.catalog)
    for name in run.catalog:
        assert rows(run, name), name


def test_a_mig_gpu_has_clocks_from_its_buffers_and_no_utilization(tmp_path):
    run, rates = measure(tmp_path / "r", FakeNvml([hopper(mig=True)]), seconds=1.5)
    r = rates["00000000:17:00.0"]
    assert "gpu.util" not in run.catalog and "gpu.util_sampled" not in run.catalog
    assert "nvmlDeviceGetUtilizationRates" not in r      # unsupported at the probe: not retried
    assert len(rows(run, "gpu.sm_clock")) > 40           # the fake driver's 20 ms samples
    assert run.meta["collectors"]["nvml"]["status"] == "ok"


def test_a_buffer_that_wraps_between_reads_is_read_more_often(tmp_path):
    """A buffer holding 0.16 s of samples loses some when read once a second; the sampler
    sees the gap and halves the period (500, 250: read on 100 ms ticks every 200 ms, still
    losing) until it is read every tick (125 ms: each tick), and no sample is lost."""
    fake = FakeNvml([hopper(gpm=False, sample_buffer_len=8, sample_period_s=0.02)])
    run, _ = measure(tmp_path / "r", fake, seconds=3.6)
    periods = run.meta["collectors"]["nvml"]["gpus_sampled"]["gpu:0"]["sample_buffers_ms"]
    assert all(100 <= p <= 125 for p in periods.values()), periods
    times = [t for t, _ in rows(run, "gpu.util")]
    late = [t for t in times if t > times[-1] - 1_000_000_000]
    gaps = [b - a for a, b in zip(late, late[1:])]
    assert gaps and max(gaps) < 25_000_000, gaps           # no sample lost in the last second
