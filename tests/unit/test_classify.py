"""The classifier on recorded signal values: each class, the undecidable cases, the margin."""
import pytest

from counterprof.analysis.classify import classify, describe
from counterprof.analysis.signals import Signal


def sig(**values):
    out = {"wall_s": Signal(10.0, "run")}
    for k, v in values.items():
        out[k] = Signal(v, "perf" if not k.startswith(("gpu", "gpm")) else "spans")
    return out


def test_busy_cpu_without_pmu_is_unknown_naming_the_counters():
    v = classify(sig(cpu_busy=0.98))
    assert v.verdict == "unknown" and v.device == "cpu"
    assert v.undecided == ["compute", "memory"]
    assert any("instructions and cycles" in m for m in v.missing)
    assert v.shares["compute|memory"] == pytest.approx(0.98)
    assert describe(v) == "unknown (busy CPU: compute vs memory cannot be told apart)"


def test_high_ipc_is_compute_low_ipc_with_misses_is_memory():
    assert classify(sig(cpu_busy=1.0, ipc=2.5, llc_mpki=0.3)).verdict == "compute"
    v = classify(sig(cpu_busy=1.0, ipc=0.3, llc_mpki=25.0))
    assert v.verdict == "memory"
    assert {e.metric for e in v.evidence} >= {"ipc", "llc_mpki", "cpu_busy"}
    ipc = next(e for e in v.evidence if e.metric == "ipc")
    assert ipc.threshold == 1.0 and ipc.value == pytest.approx(0.3)


def test_middling_ipc_alone_is_undecided():
    v = classify(sig(cpu_busy=1.0, ipc=0.8))
    assert v.verdict == "unknown" and "LLC-load-misses" in v.missing[0]


def test_topdown_memory_bound():
    v = classify(sig(cpu_busy=1.0, td_retiring=0.2, td_backend=0.6, td_memory=0.45))
    assert v.verdict == "memory"
    assert classify(sig(cpu_busy=1.0, td_retiring=0.7, td_backend=0.1)).verdict == "compute"


def test_off_cpu_is_host():
    v = classify(sig(cpu_busy=0.08, voluntary_switches_per_s=300.0, io_bytes_per_s=5e6))
    assert v.verdict == "host"
    assert v.shares["host"] == pytest.approx(0.92)
    assert "300 voluntary context switches/s" in v.evidence[-1].text
    assert v.confidence > 0.9


def test_cpu_collectives():
    v = classify(sig(cpu_busy=0.9, cpu_collective=0.7, cpu_busy_outside_collectives=0.95))
    assert v.verdict == "collectives"
    assert v.shares["collectives"] == pytest.approx(0.7)


def test_close_call_is_unknown_with_both_candidates():
    v = classify(sig(cpu_busy=0.52, ipc=2.0))      # compute 52% vs host 48%
    assert v.verdict == "unknown" and v.undecided == ["compute", "host"]


def gpu(**values):
    return sig(gpu_active_share=0.9, **values)


def test_gpu_idle_is_host():
    v = classify(gpu(gpu_idle=0.7, gpu_compute=0.25, gpu_comm_exposed=0.0, gpu_memory=0.05,
                     short_kernel_share=0.9))
    assert v.device == "gpu" and v.verdict == "host"
    assert any("launch-bound" in e.text for e in v.evidence)


def test_gpu_exposed_communication_is_collectives():
    v = classify(gpu(gpu_idle=0.1, gpu_compute=0.3, gpu_comm_exposed=0.6, gpu_memory=0.0, comm_overlap=0.2))
    assert v.verdict == "collectives"


def test_gpu_busy_without_gpm_cannot_split_compute_from_memory():
    v = classify(gpu(gpu_idle=0.05, gpu_compute=0.9, gpu_comm_exposed=0.0, gpu_memory=0.05))
    assert v.verdict == "unknown" and v.undecided == ["compute", "memory"]
    assert "GPM" in v.missing[0]


def test_gpm_decides_compute_and_memory():
    assert classify(gpu(gpu_idle=0.05, gpu_compute=0.9, gpu_comm_exposed=0.0, gpu_memory=0.0,
                        gpm_tensor=0.7, gpm_dram=0.3)).verdict == "compute"
    assert classify(gpu(gpu_idle=0.05, gpu_compute=0.9, gpu_comm_exposed=0.0, gpu_memory=0.0,
                        gpm_tensor=0.0, gpm_dram=0.85)).verdict == "memory"


def test_nvml_only():
    v = classify(sig(gpu_util=0.2, cpu_busy=1.0))
    assert v.device == "gpu" and v.verdict == "host"
    v = classify(sig(gpu_util=0.97, gpm_tensor=0.6, gpm_dram=0.2))
    assert v.verdict == "compute"


def test_no_signal_at_all():
    v = classify({})
    assert v.verdict == "unknown" and v.device == "none"
