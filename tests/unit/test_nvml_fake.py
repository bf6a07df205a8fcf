"""The fake NVML (tests/fake_nvml.py) answers as nvidia-ml-py does: return types, per-field
return codes, the errors nvmlDeviceGetSamples raises, and its call counting, which the
collector's call budget is tested with."""
from __future__ import annotations

import time

import pynvml
import pytest

from fake_nvml import FakeNvml, ampere, hopper


@pytest.fixture
def lib():
    fake = FakeNvml([hopper(bus_id="00000000:17:00.0", sample_period_s=0.01),
                     ampere(bus_id="00000000:3A:00.0", power_w=None, mig=True,
                            samples_unsupported=("NVML_MEMORY_CLK_SAMPLES",))])
    fake.nvmlInit()
    yield fake
    fake.nvmlShutdown()


def test_samples_come_back_as_nvidia_ml_py_returns_them(lib):
    h = lib.nvmlDeviceGetHandleByIndex(0)
    time.sleep(0.05)
    vtype, samples = lib.nvmlDeviceGetSamples(h, pynvml.NVML_PROCESSOR_CLK_SAMPLES, 0)
    assert vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert isinstance(samples, list) and len(samples) >= 4
    assert all(isinstance(s, pynvml.c_nvmlSample_t) for s in samples)
    assert {s.sampleValue.uiVal for s in samples} == {1755}
    stamps = [s.timeStamp for s in samples]
    assert stamps == sorted(stamps) and abs(stamps[-1] - time.time_ns() // 1000) < 100_000   # epoch µs
    # only those newer than lastSeenTimeStamp
    _, newer = lib.nvmlDeviceGetSamples(h, pynvml.NVML_PROCESSOR_CLK_SAMPLES, stamps[-3])
    assert [s.timeStamp for s in newer][:2] == stamps[-2:]
    # none newer: NOT_FOUND, the real library's own error class
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlDeviceGetSamples(h, pynvml.NVML_PROCESSOR_CLK_SAMPLES, 2**62)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetSamples(h, 99, 0)


def test_samples_unsupported_per_gpu_and_type(lib):
    h = lib.nvmlDeviceGetHandleByIndex(1)
    time.sleep(0.03)
    for stype in (pynvml.NVML_MEMORY_CLK_SAMPLES,             # named unsupported
                  pynvml.NVML_TOTAL_POWER_SAMPLES,             # no power readings
                  pynvml.NVML_GPU_UTILIZATION_SAMPLES):        # MIG mode: no utilization
        with pytest.raises(pynvml.NVMLError_NotSupported):
            lib.nvmlDeviceGetSamples(h, stype, 0)
    assert lib.nvmlDeviceGetSamples(h, pynvml.NVML_PROCESSOR_CLK_SAMPLES, 0)[1]


def test_a_lost_gpu_raises_from_samples_and_fields(lib):
    h = lib.nvmlDeviceGetHandleByIndex(0)
    lib.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        lib.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        lib.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT])


def test_field_values_carry_their_own_return_code(lib):
    h = lib.nvmlDeviceGetHandleByIndex(1)       # no power readings
    values = lib.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT,
                                              (pynvml.NVML_FI_DEV_MEMORY_TEMP, 0), 9999])
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_SUCCESS,
                                              pynvml.NVML_ERROR_INVALID_ARGUMENT]
    assert values[1].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT and values[1].value.uiVal == 40
    assert values[1].fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP and values[1].timestamp > 0


def test_calls_are_counted_per_function_gpu_and_second(lib):
    h0, h1 = lib.nvmlDeviceGetHandleByIndex(0), lib.nvmlDeviceGetHandleByIndex(1)
    time.sleep(0.03)
    before = lib.device_calls.copy()
    lib.nvmlDeviceGetSamples(h0, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlDeviceGetSamples(h0, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 2**62)
    lib.nvmlDeviceGetTemperature(h1, pynvml.NVML_TEMPERATURE_GPU)
    per = lib.per_gpu(before)
    assert per == {"00000000:17:00.0": {"nvmlDeviceGetSamples": 2},
                   "00000000:3A:00.0": {"nvmlDeviceGetTemperature": 1}}
    # as nvidia-ml-py's wrapper: two C calls (count, then samples), one where the count failed
    assert lib.c_calls["nvmlDeviceGetSamples"] == 3
    assert sum(n for (fn, _), n in lib.calls_by_second.items() if fn == "nvmlDeviceGetSamples") == 2
