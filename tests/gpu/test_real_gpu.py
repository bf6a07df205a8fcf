"""On a real NVIDIA GPU with real torch workloads: do the nvml collector's numbers mean what
they say? One profiled run of four phases on cuda:0 (= gpu:0), then a check per phase:

  sleep     time.sleep: utilization near zero
  matmul    a large bf16 matmul loop: GPU utilization > 90 %, GPM tensor utilization high,
            DRAM bandwidth utilization moderate; energy = the integral of power within 10 %
  copy      a large device-to-device copy loop: DRAM bandwidth utilization high, tensor ~0

Skipped, with the reason, where there is no GPU, no driver, no nvidia-ml-py, or torch has no
CUDA. Run with `pytest -s tests/gpu` to see the figures.
"""
from __future__ import annotations

import time

import pyarrow.compute as pc
import pytest

from counterprof.collectors.nvml import NvmlCollector

torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")
_avail = NvmlCollector.availability()
pytestmark = [
    pytest.mark.skipif(not _avail.ok, reason=f"no GPU to sample here: {_avail.reason}"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device (CPU build or no driver)"),
    pytest.mark.slow,
]

PHASE_S = 4.0
MARGIN_NS = 600_000_000      # leave out the edges of each phase (ramp, the driver's 1/6 s period)


def _matmul(seconds: float) -> int:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()
        n += 8
    return n


def _copy(seconds: float) -> int:
    src = torch.empty(2**30, device="cuda", dtype=torch.uint8)     # 1 GiB
    dst = torch.empty_like(src)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            dst.copy_(src)
        torch.cuda.synchronize()
        n += 8
    return n


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    import counterprof
    torch.ones(1, device="cuda")           # create the context before sampling starts
    _matmul(0.5)                            # and warm up cuBLAS
    path = tmp_path_factory.mktemp("gpu") / "run"
    phases = {}
    prof = counterprof.profile(collectors=["nvml"], path=path,
                               config={"nvml": {"interval_ms": 50, "gpm_interval_ms": 100}})
    with prof as run:
        clock = prof.session.clock
        for name, work in (("sleep", time.sleep), ("matmul", _matmul), ("copy", _copy)):
            t0 = clock.now_ns()
            work(PHASE_S)
            phases[name] = (t0 + MARGIN_NS, clock.now_ns() - MARGIN_NS)
    return run, phases


def _rows(run, metric, window=None):
    t = run.samples()
    t = t.filter(pc.and_(pc.equal(t["metric"].cast("string"), metric),
                         pc.equal(t["entity"].cast("string"), "gpu:0")))
    out = sorted(zip(t["time"].cast("int64").to_pylist(), t["duration_ns"].to_pylist(),
                     t["value"].to_pylist()))
    if window:
        lo, hi = window
        out = [r for r in out if lo <= r[0] - (r[1] or 0) and r[0] <= hi]
    return out


def _mean(run, metric, window):
    rows = _rows(run, metric, window)
    if not rows:
        pytest.skip(f"{metric} not recorded on this GPU "
                    f"({run.meta['gpus'][0]['name']}; GPM needs Hopper or newer)")
    return sum(v for *_, v in rows) / len(rows)


def test_gpu0_is_torchs_cuda0(recorded):
    run, _ = recorded
    facts = run.meta["gpus"][0]
    props = torch.cuda.get_device_properties(0)
    print(f"\ngpu:0 = {facts['name']} driver {facts['driver_version']} {facts['pci_bus_id']}")
    assert facts["name"] == props.name
    if hasattr(props, "pci_bus_id"):
        assert int(facts["pci_bus_id"].split(":")[1], 16) == props.pci_bus_id


def test_sleep_is_idle(recorded):
    run, phases = recorded
    util = _mean(run, "gpu.util", phases["sleep"])
    print(f"\nsleep: gpu.util {util:.1f} %")
    assert util < 5


def test_matmul_is_busy_on_tensor_cores(recorded):
    run, phases = recorded
    util = _mean(run, "gpu.util", phases["matmul"])
    print(f"\nmatmul: gpu.util {util:.1f} %")
    assert util > 90
    tensor = _mean(run, "gpm.tensor_util", phases["matmul"])
    dram = _mean(run, "gpm.dram_bw_util", phases["matmul"])
    print(f"matmul: gpm.tensor_util {tensor:.1f} %, gpm.dram_bw_util {dram:.1f} %")
    assert tensor > 50
    assert 1 < dram < 70


def test_copy_is_memory_bound(recorded):
    run, phases = recorded
    dram = _mean(run, "gpm.dram_bw_util", phases["copy"])
    tensor = _mean(run, "gpm.tensor_util", phases["copy"])
    print(f"\ncopy: gpm.dram_bw_util {dram:.1f} %, gpm.tensor_util {tensor:.1f} %")
    assert dram > 60
    assert tensor < 5


def test_energy_is_the_integral_of_power(recorded):
    run, phases = recorded
    energy = _rows(run, "gpu.energy", phases["matmul"])
    if not energy:
        pytest.skip("this GPU has no energy counter")
    joules = sum(v for *_, v in energy)
    start, end = energy[0][0] - energy[0][1], energy[-1][0]
    power = _rows(run, "gpu.power_sampled") or _rows(run, "gpu.power")
    power = [(t, v) for t, _, v in power]
    # trapezoids over the power readings, clipped to [start, end]
    integral = 0.0
    for (t0, p0), (t1, p1) in zip(power, power[1:]):
        lo, hi = max(t0, start), min(t1, end)
        if hi > lo:
            integral += (p0 + p1) / 2 * (hi - lo) / 1e9
    print(f"\nmatmul: energy counter {joules:.1f} J, integral of power {integral:.1f} J "
          f"over {(end - start) / 1e9:.2f} s")
    assert joules == pytest.approx(integral, rel=0.10)
