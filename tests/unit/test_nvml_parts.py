"""The nvml collector's parts against the fake NVML (tests/fake_nvml.py): the chokepoint,
device naming through CUDA_VISIBLE_DEVICES, counter arithmetic, error translation."""
from __future__ import annotations

import pynvml
import pytest

from counterprof.collectors.nvml import devices
from counterprof.collectors.nvml.library import Nvml, open_nvml, union_value
from counterprof.collectors.nvml.sampler import counter_delta
from counterprof.ground.errors import GpuLost, NvmlUnavailable, UsageError, nvml_error
from fake_nvml import FakeNvml, ampere, hopper


def three_gpus() -> FakeNvml:
    # NVML's own index order is deliberately not PCI order here
    return FakeNvml([hopper(uuid="GPU-bbbb1111-0000", bus_id="00000000:3A:00.0"),
                     hopper(uuid="GPU-aaaa2222-0000", bus_id="00000000:17:00.0"),
                     hopper(uuid="GPU-cccc3333-0000", bus_id="00000001:05:00.0")])


# -- the chokepoint ------------------------------------------------------------------------

def test_init_is_lazy_and_shutdown_balances_it():
    fake = FakeNvml([hopper()])
    nvml = Nvml(fake)
    assert fake.inits == 0
    assert nvml.call("nvmlDeviceGetCount") == 1
    assert fake.inits == 1
    nvml.call("nvmlDeviceGetCount")
    assert fake.calls["nvmlInit"] == 1
    nvml.close()
    nvml.close()
    assert fake.inits == 0 and fake.calls["nvmlShutdown"] == 1


def test_no_driver_is_a_counterprof_error_that_says_why():
    with pytest.raises(NvmlUnavailable, match="libnvidia-ml.so.1"):
        open_nvml(FakeNvml([], library=False))


def test_the_real_library_without_a_driver_says_why():
    """This machine has nvidia-ml-py but no libnvidia-ml: the real library's own error path."""
    try:
        nvml = open_nvml("pynvml")
    except NvmlUnavailable as exc:
        assert exc.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
        assert "no NVIDIA driver" in str(exc)
    else:
        nvml.close()
        pytest.skip("an NVIDIA driver is present here")


def test_not_supported_becomes_none_and_is_named_once_per_device():
    fake = FakeNvml([ampere(power_w=None), hopper(mem_temp=None)])
    nvml = open_nvml(fake)
    h0 = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    h1 = nvml.call("nvmlDeviceGetHandleByIndex", 1)
    ids = [(pynvml.NVML_FI_DEV_POWER_INSTANT, 0), (pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)]
    names = ["NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_MEMORY_TEMP"]
    for _ in range(3):
        a = nvml.field_values(h0, ids, names, "gpu:0")
        b = nvml.field_values(h1, ids, names, "gpu:1")
    assert a[0] is None and a[1][0] == 40.0          # per-field status, not all-or-nothing
    assert b[0][0] == 300_000.0 and b[1] is None
    assert nvml.unsupported == {"NVML_FI_DEV_POWER_INSTANT": ["gpu:0"],
                                "NVML_FI_DEV_MEMORY_TEMP": ["gpu:1"]}
    assert nvml.is_unsupported("NVML_FI_DEV_POWER_INSTANT", "gpu:0")
    assert not nvml.is_unsupported("NVML_FI_DEV_POWER_INSTANT", "gpu:1")
    # a function missing from this nvidia-ml-py counts as unsupported too
    assert nvml.call("nvmlDeviceGetPcieThroughput", h0, 0, where="gpu:0") is None
    assert nvml.is_unsupported("nvmlDeviceGetPcieThroughput", "gpu:0")
    nvml.close()


def test_other_errors_are_null_and_recorded_with_their_message():
    fake = FakeNvml([hopper()])
    nvml = open_nvml(fake)
    h = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    assert nvml.call("nvmlDeviceGetClockInfo", h, 99, where="gpu:0") is None    # INVALID_ARGUMENT
    assert "gpu:0: nvmlDeviceGetClockInfo failed with NVML error 2" in nvml.errors["nvmlDeviceGetClockInfo"]
    assert nvml.unsupported == {}
    nvml.close()


def test_a_lost_gpu_raises_a_counterprof_error():
    gpu = hopper()
    nvml = open_nvml(FakeNvml([gpu]))
    h = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    gpu.lost = True
    with pytest.raises(GpuLost, match="gpu:3: the GPU is lost"):
        nvml.call("nvmlDeviceGetUtilizationRates", h, where="gpu:3")
    with pytest.raises(GpuLost):
        nvml.field_values(h, [(pynvml.NVML_FI_DEV_POWER_INSTANT, 0)], ["p"], "gpu:3")
    nvml.close()


def test_absent_codes_mean_nothing_new():
    gpu = hopper()
    nvml = open_nvml(FakeNvml([gpu]))
    h = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    future = 2**62
    got = nvml.call("nvmlDeviceGetSamples", h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, future,
                    absent_codes=(pynvml.NVML_ERROR_NOT_FOUND,), absent=(None, []))
    assert got == (None, [])
    assert not nvml.errors and not nvml.unsupported
    nvml.close()


@pytest.mark.parametrize("code,cls,text", [
    (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLost, "reset"),
    (pynvml.NVML_ERROR_RESET_REQUIRED, GpuLost, "reset"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, NvmlUnavailable, "modprobe nvidia"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, NvmlUnavailable, "reboot"),
    (pynvml.NVML_ERROR_NO_PERMISSION, None, "root"),
])
def test_error_codes_map_to_classes_and_say_what_to_do(code, cls, text):
    err = nvml_error(code, "nvmlDeviceGetPowerUsage", "gpu:0")
    if cls is not None:
        assert isinstance(err, cls)
    else:
        assert not isinstance(err, (GpuLost, NvmlUnavailable))
    assert text in str(err) and err.code == code


def test_union_values_by_type():
    v = pynvml.c_nvmlValue_t()
    v.ullVal = 2**40 + 5
    assert union_value(pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, v) == (float(2**40 + 5), 64)
    v.uiVal = 7
    assert union_value(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, v) == (7.0, 32)
    v.dVal = 1.5
    assert union_value(pynvml.NVML_VALUE_TYPE_DOUBLE, v) == (1.5, None)
    assert union_value(99, v) == (None, None)


# -- counters ------------------------------------------------------------------------------

def test_counter_delta_across_a_32_bit_wrap():
    assert counter_delta(100.0, 350.0, 32) == 250.0
    assert counter_delta(2**32 - 100.0, 50.0, 32) == 150.0
    assert counter_delta(2**16 - 1.0, 1.0, 16) == 2.0


def test_a_64_bit_counter_going_back_is_a_reset_not_a_wrap():
    assert counter_delta(5_000.0, 10.0, 64) is None
    assert counter_delta(5_000.0, 10.0, None) is None


# -- devices -------------------------------------------------------------------------------

def _visible(fake, cvd):
    nvml = open_nvml(fake)
    try:
        return [g.uuid for g in devices.visible_gpus(nvml, devices.physical_gpus(nvml), cvd)]
    finally:
        nvml.close()


def test_physical_order_is_pci_order_not_nvml_index():
    assert _visible(three_gpus(), None) == ["GPU-aaaa2222-0000", "GPU-bbbb1111-0000", "GPU-cccc3333-0000"]


@pytest.mark.parametrize("cvd,expected", [
    ("2,0", ["GPU-cccc3333-0000", "GPU-aaaa2222-0000"]),
    (" 1 ", ["GPU-bbbb1111-0000"]),
    ("GPU-cccc,GPU-aaaa2222-0000", ["GPU-cccc3333-0000", "GPU-aaaa2222-0000"]),
    ("1,7,0", ["GPU-bbbb1111-0000"]),            # an entry naming no device ends the list
    ("0,-1,1", ["GPU-aaaa2222-0000"]),
    ("GPU-", []),                                # ambiguous prefix: names no one device
    ("", []),
    ("0,0,1", ["GPU-aaaa2222-0000", "GPU-bbbb1111-0000"]),
])
def test_cuda_visible_devices(cvd, expected):
    assert _visible(three_gpus(), cvd) == expected


def test_ordinals_follow_cuda_visible_devices():
    nvml = open_nvml(three_gpus())
    gpus = devices.visible_gpus(nvml, devices.physical_gpus(nvml), "2,0")
    assert [(g.entity, g.pci_bus_id, g.via) for g in gpus] == [
        ("gpu:0", "00000001:05:00.0", "2"), ("gpu:1", "00000000:17:00.0", "0")]
    nvml.close()


def test_a_mig_instance_maps_to_its_parent():
    fake = FakeNvml([hopper(uuid="GPU-aaaa-0000", bus_id="00000000:17:00.0"),
                     hopper(uuid="GPU-bbbb-0000", bus_id="00000000:3A:00.0", mig=True,
                            mig_uuids=["MIG-1234-5678"])])
    assert _visible(fake, "MIG-1234-5678") == ["GPU-bbbb-0000"]
    assert _visible(fake, "MIG-GPU-aaaa-0000/1/0") == ["GPU-aaaa-0000"]
    assert _visible(fake, "MIG-nope,0") == []


def test_parse_and_select_gpus():
    assert devices.parse_gpus(None) is None and devices.parse_gpus("all") is None
    assert devices.parse_gpus("1, 0,1") == [1, 0]
    assert devices.parse_gpus([2]) == [2]
    with pytest.raises(UsageError, match="not a GPU number"):
        devices.parse_gpus("0,x")
    nvml = open_nvml(three_gpus())
    visible, _ = devices.discover(nvml, {"CUDA_VISIBLE_DEVICES": "2"})
    assert [g.uuid for g in devices.select(visible, [0], {})] == ["GPU-cccc3333-0000"]
    with pytest.raises(UsageError, match=r"--gpus 7: no GPU 7 here; 1 GPU\(s\) visible with "
                                         r"CUDA_VISIBLE_DEVICES='2'"):
        devices.select(visible, [7], {"CUDA_VISIBLE_DEVICES": "2"})
    nvml.close()


def test_mixed_models_warn_about_cuda_order():
    nvml = open_nvml(FakeNvml([hopper(bus_id="00000000:17:00.0"), ampere(bus_id="00000000:3A:00.0")]))
    _, warnings = devices.discover(nvml, {})
    assert warnings and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in warnings[0]
    assert devices.discover(nvml, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})[1] == []
    nvml.close()


def test_pci_key_sorts_short_and_long_forms_alike():
    assert devices.pci_key("00000000:17:00.0") == devices.pci_key("0000:17:00.0")
    assert devices.pci_key("00000000:3A:00.0") > devices.pci_key("00000000:17:00.0")


# -- time ----------------------------------------------------------------------------------

def test_nvml_wall_clock_stamps_land_on_the_runs_axis_after_a_wall_clock_step():
    """The run clock is monotonic + an offset fixed at start; if the wall clock has since
    stepped by an hour, NVML's wall-clock stamps must still map to the run clock's now."""
    import time
    from counterprof.ground.clock import Clock
    from counterprof.collectors.nvml.sampler import WallClock
    stepped = Clock(offset_ns=Clock().offset_ns - 3600 * 10**9)
    wall = WallClock(stepped)
    stamp_us = time.time_ns() // 1000          # what NVML stamps a reading taken now with
    assert abs(wall.run_ns(stamp_us) - stepped.now_ns()) < 50_000_000
    assert abs(wall.now_us() - stamp_us) < 50_000


def test_field_values_decode_the_array_at_once_as_member_by_member():
    """The chokepoint unpacks nvidia-ml-py's c_nvmlFieldValue_t array in one go; it must read
    what the members say, for every value type and per-field return code."""
    T = pynvml
    cases = [(T.NVML_VALUE_TYPE_DOUBLE, "dVal", -2.5, T.NVML_SUCCESS),
             (T.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 2**32 - 1, T.NVML_SUCCESS),
             (T.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 2**40, T.NVML_SUCCESS),
             (T.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**63 + 9, T.NVML_SUCCESS),
             (T.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -(2**40), T.NVML_SUCCESS),
             (T.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -7, T.NVML_SUCCESS),
             (T.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65535, T.NVML_SUCCESS),
             (T.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 5, T.NVML_ERROR_NOT_SUPPORTED)]
    array = (T.c_nvmlFieldValue_t * len(cases))()
    for i, (vtype, member, value, ret) in enumerate(cases):
        array[i].fieldId, array[i].timestamp = 100 + i, 1_700_000_000_000_000 + i
        array[i].valueType, array[i].nvmlReturn = vtype, ret
        setattr(array[i].value, member, value)

    class Stub(FakeNvml):
        def nvmlDeviceGetFieldValues(self, handle, ids):
            return self.result

    names = [f"f{i}" for i in range(len(cases))]
    got = {}
    for label, result in (("array", array), ("list", list(array))):   # fast path, member path
        stub = Stub([hopper()])
        stub.result = result
        nvml = open_nvml(stub)
        got[label] = nvml.field_values(None, [(0, 0)] * len(cases), names, "gpu:0")
        assert nvml.unsupported == {"f7": ["gpu:0"]}
        nvml.close()
    assert got["array"] == got["list"]
    expect = [(float(v), w, 1_700_000_000_000_000 + i) for i, (v, w) in enumerate(
        [(-2.5, None), (2**32 - 1, 32), (2**40, 64), (2**63 + 9, 64), (-(2**40), None), (-7, None), (65535, 16)])]
    assert got["array"] == expect + [None]


def test_the_default_module_says_no_driver_as_the_real_library_does():
    """Without a driver, open_nvml() finds so before importing pynvml, with the error the real
    nvmlInit gives (same code, same words)."""
    import subprocess
    import sys
    from counterprof.collectors.nvml.library import no_driver_here
    if not no_driver_here():
        pytest.skip("an NVIDIA driver is present here")
    code = ("import sys\nfrom counterprof.collectors.nvml.library import open_nvml\n"
            "from counterprof.ground.errors import NvmlUnavailable\n"
            "try:\n    open_nvml()\nexcept NvmlUnavailable as exc:\n"
            "    print(exc.code, 'pynvml' in sys.modules, exc)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    with pytest.raises(NvmlUnavailable) as real:
        open_nvml("pynvml")
    assert p.stdout.strip() == f"{real.value.code} False {real.value}", p.stderr
