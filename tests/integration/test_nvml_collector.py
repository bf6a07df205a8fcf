"""The nvml collector end to end: a Session (and the CLI) with the fake NVML of
tests/fake_nvml.py where pynvml would be, plus the real nvidia-ml-py on this machine, which
has no NVIDIA driver."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import pyarrow.compute as pc
import pytest

import counterprof
from counterprof.collector import Target
from counterprof.collectors.nvml import NvmlCollector
from counterprof.ground.errors import UsageError
from counterprof.session import Session
from fake_nvml import FakeNvml, ampere, hopper
from helpers import PYTHON, REPO, run_cli

TESTS = str(REPO / "tests")


class BatchLog:
    """A sink that notes when each nvml batch arrived."""

    def __init__(self):
        self.arrivals: list[tuple[float, int]] = []

    def write(self, table, batch, rank):
        if batch.num_rows and batch.column("source")[0].as_py() == "nvml":
            self.arrivals.append((time.monotonic(), batch.num_rows))

    def close(self):
        pass


def record(path, fake, seconds=1.2, *, during=None, target=Target("self"), collectors=("nvml",),  # noqa: B008  Target is a frozen dataclass
           sinks=(), **config):
    warnings: list[str] = []
    cfg = {"nvml": {"module": fake, "interval_ms": 20, **config}}
    s = Session(path, collectors=list(collectors), config=cfg, target=target,
                on_warning=warnings.append, sinks=list(sinks))
    s.prepare()
    s.start()
    try:
        if during:
            during(s)
        else:
            time.sleep(seconds)
    finally:
        s.stop()
    run = counterprof.load(path)
    run.warnings = warnings
    run.session = s
    return run


def rows(run, metric, entity=None):
    t = run.samples()
    t = t.filter(pc.equal(t["metric"].cast("string"), metric))
    if entity is not None:
        t = t.filter(pc.equal(t["entity"].cast("string"), entity))
    out = list(zip(t["time"].cast("int64").to_pylist(), t["duration_ns"].to_pylist(),
                   t["value"].to_pylist(), t["entity"].cast("string").to_pylist()))
    return sorted(out)


def two_gpus():
    """gpu:0 a Hopper with GPM and two NVLink links; gpu:1 an A100 without power readings
    and without GPM, whose 32-bit PCIe byte counter wraps during the run."""
    return FakeNvml([
        hopper(bus_id="00000000:17:00.0", nvlinks=2, power_w=300.0, throttle_power_share=0.25),
        ampere(bus_id="00000000:3A:00.0", power_w=None, pcie_bits=32,
               pcie_start=2**32 - 300_000_000, pcie_tx_rate=1.0e9),
    ], driver="550.54.15")


def test_two_gpus_end_to_end(tmp_path):
    fake = two_gpus()
    log = BatchLog()
    seen_tids = {}

    def during(s):
        time.sleep(0.3)
        t = next(t for t in threading.enumerate() if t.name == "counterprof-nvml")
        seen_tids["nvml"] = t.native_id
        seen_tids["registered"] = set(s._ctx.profiler_tids)
        time.sleep(2.2)

    run = record(tmp_path / "r", fake, during=during, sinks=[log])
    meta = run.meta
    nv = meta["collectors"]["nvml"]
    assert nv["status"] == "ok", nv
    # the sampling thread is the profiler's own, registered before counting collectors start
    assert seen_tids["nvml"] in seen_tids["registered"]

    # meta.json "gpus": the devices seen, by CUDA ordinal
    assert [(g["index"], g["name"], g["pci_bus_id"], g["driver_version"]) for g in meta["gpus"]] == [
        (0, "NVIDIA H100 80GB HBM3", "00000000:17:00.0", "550.54.15"),
        (1, "NVIDIA A100-SXM4-40GB", "00000000:3A:00.0", "550.54.15")]
    assert meta["gpus"][0]["memory_total_bytes"] == 80 * 2**30 and meta["gpus"][1]["uuid"].startswith("GPU-")

    # catalog: units and kinds; gauges have no duration, deltas and GPM windows do
    cat = run.catalog
    assert (cat["gpu.util"]["unit"], cat["gpu.util"]["kind"]) == ("percent", "gauge")
    assert (cat["gpu.energy"]["unit"], cat["gpu.energy"]["kind"]) == ("J", "delta")
    assert (cat["gpu.power"]["unit"], cat["gpu.power"]["kind"]) == ("W", "gauge")
    assert (cat["gpm.tensor_util"]["unit"], cat["gpm.tensor_util"]["kind"]) == ("percent", "ratio")
    assert (cat["gpu.pcie_tx_bytes"]["unit"], cat["gpu.pcie_tx_bytes"]["kind"]) == ("bytes", "delta")
    for name, entry in cat.items():
        assert entry["source"] == "nvml"
        got = rows(run, name)
        assert got, f"{name} is in the catalog but never recorded"
        durations = {d is None for _, d, _, _ in got}
        assert durations == ({True} if entry["kind"] == "gauge" else {False}), name
    t = run.samples()
    assert set(t["source"].cast("string").unique().to_pylist()) == {"nvml"}
    # every row on the run's axis, inside the run
    times = t["time"].cast("int64")
    assert pc.min(times).as_py() >= meta["start_ns"] - 50_000_000
    assert pc.max(times).as_py() <= meta["end_ns"]

    # gpu:1 has no power readings: no power rows, named once in meta.json
    assert {e for *_, e in rows(run, "gpu.power")} == {"gpu:0"}
    assert {e for *_, e in rows(run, "gpu.energy")} == {"gpu:0"}
    for name in ("NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                 "nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)"):
        assert nv["unsupported"][name] == ["gpu:1"]
    # GPM: on the Hopper only; the A100 says why not
    assert {e for *_, e in rows(run, "gpm.sm_util")} == {"gpu:0"}
    assert nv["gpus_sampled"]["gpu:0"]["gpm"] == "on"
    assert "not supported" in nv["gpus_sampled"]["gpu:1"]["gpm"]
    assert nv["unsupported"]["nvmlGpmQueryDeviceSupport"] == ["gpu:1"]
    gpm = rows(run, "gpm.tensor_util", "gpu:0")
    assert all(v == 70.0 for *_, v, _ in gpm)
    assert min(d for _, d, _, _ in gpm) >= 100_000_000         # windows of >= 100 ms

    # energy is the counter's difference: 300 W over the intervals it covers
    energy = rows(run, "gpu.energy", "gpu:0")
    covered = sum(d for _, d, _, _ in energy) / 1e9
    assert covered > 2.0
    assert sum(v for *_, v, _ in energy) == pytest.approx(300.0 * covered, rel=0.02)
    # consecutive intervals tile the time: each starts where the previous ended
    for (t0, _, _, _), (t1, d1, _, _) in zip(energy, energy[1:]):
        assert abs((t1 - d1) - t0) < 1_000_000
    # the wrapping 32-bit PCIe counter: the deltas still add up to rate x time, never negative
    assert fake.gpus[1].pcie_tx > 2**32, "the fake's counter should have wrapped"
    tx = rows(run, "gpu.pcie_tx_bytes", "gpu:1")
    assert all(v >= 0 for *_, v, _ in tx)
    assert sum(v for *_, v, _ in tx) == pytest.approx(1.0e9 * sum(d for _, d, _, _ in tx) / 1e9, rel=0.02)
    assert max(v for *_, v, _ in tx) < 1.0e9            # no interval swallowed a 4 GiB jump
    # NVLink per link; throttle time as a share of the interval
    for link in (0, 1):
        nl = rows(run, "gpu.nvlink_tx_bytes", f"gpu:0/nvlink:{link}")
        assert sum(v for *_, v, _ in nl) == pytest.approx(5.0e9 * sum(d for _, d, _, _ in nl) / 1e9, rel=0.02)
    thr = rows(run, "gpu.throttle_time_power", "gpu:0")
    assert sum(v for *_, v, _ in thr) == pytest.approx(0.25 * sum(d for _, d, _, _ in thr) / 1e9, rel=0.02)
    assert {v for *_, v, _ in rows(run, "gpu.util", "gpu:1")} == {60.0}

    # the driver's sample buffer: every sample once, at the driver's own 20 ms spacing
    hist = rows(run, "gpu.power_sampled", "gpu:0")
    stamps = [t for t, *_ in hist]
    assert len(stamps) == len(set(stamps)) and len(hist) > 50
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    assert gaps[len(gaps) // 2] == pytest.approx(20_000_000, rel=0.01)

    # batched fields, never the blocking throughput call; NVML shut down at stop
    assert fake.calls["nvmlDeviceGetFieldValues"] < 2 * 3.0 / 0.02 + 20
    assert "nvmlDeviceGetPcieThroughput" not in nv["unsupported"]
    assert fake.inits == 0
    # one batch a second (and the last at stop)
    gaps = [b[0] - a[0] for a, b in zip(log.arrivals, log.arrivals[1:])]
    # (on a fixed grid: one late wake-up on a loaded machine shortens the next gap)
    assert len(log.arrivals) >= 2 and all(g >= 0.5 for g in gaps[:-1]), gaps
    if len(gaps) > 2:
        assert sum(gaps[:-1]) / len(gaps[:-1]) == pytest.approx(1.0, abs=0.15), gaps
    assert nv["thread_cpu_s"] > 0


def test_a_gpu_lost_mid_run_fails_the_collector_and_keeps_the_rest(tmp_path):
    fake = FakeNvml([hopper(bus_id="00000000:17:00.0"), hopper(bus_id="00000000:3A:00.0")])
    marks = {}

    def during(s):
        time.sleep(0.6)
        fake.gpus[1].lost = True
        marks["lost"] = s.clock.now_ns()      # after: no sample of gpu:1 can follow this mark
        time.sleep(0.8)

    run = record(tmp_path / "r", fake, during=during, collectors=("nvml", "host"))
    nv = run.meta["collectors"]["nvml"]
    assert nv["status"] == "failed"
    assert "gpu:1: the GPU is lost" in nv["reason"]
    assert "the other 1 GPU(s) are still sampled" in nv["reason"]
    assert any("nvml collector failed" in w for w in run.warnings)
    lost_at = marks["lost"]
    before = [t for t, *_ in rows(run, "gpu.util", "gpu:1")]
    assert before and max(before) < lost_at + 30_000_000      # its samples before are kept
    after = [t for t, *_ in rows(run, "gpu.util", "gpu:0") if t > lost_at + 300_000_000]
    assert len(after) >= 10                                   # the other GPU goes on
    assert run.meta["collectors"]["host"]["status"] == "ok"   # and so do the other collectors
    assert any(t > lost_at for t, *_ in rows(run, "system.mem_used"))
    assert fake.inits == 0


def test_cuda_visible_devices_names_gpus_by_cuda_ordinal(tmp_path, monkeypatch):
    # NVML index order 0,1,2 is not PCI order; CUDA counts in PCI order
    fake = FakeNvml([hopper(uuid="GPU-bbbb1111-0000", bus_id="00000000:3A:00.0", power_w=200.0),
                     hopper(uuid="GPU-aaaa2222-0000", bus_id="00000000:17:00.0", power_w=100.0),
                     hopper(uuid="GPU-cccc3333-0000", bus_id="00000001:05:00.0", power_w=300.0)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-aaaa")
    run = record(tmp_path / "r", fake, seconds=0.5)
    assert [(g["index"], g["uuid"], g["nvml_index"], g["visible_as"]) for g in run.meta["gpus"]] == [
        (0, "GPU-cccc3333-0000", 2, "2"), (1, "GPU-aaaa2222-0000", 1, "GPU-aaaa")]
    assert {v for *_, v, _ in rows(run, "gpu.power", "gpu:0")} == {300.0}
    assert {v for *_, v, _ in rows(run, "gpu.power", "gpu:1")} == {100.0}
    assert not rows(run, "gpu.power", "gpu:2")
    assert run.meta["env"]["CUDA_VISIBLE_DEVICES"] == "2,GPU-aaaa"


def test_gpus_selects_and_a_missing_gpu_fails_before_anything_starts(tmp_path):
    run = record(tmp_path / "r", FakeNvml([hopper(bus_id="00000000:17:00.0"),
                                           hopper(bus_id="00000000:3A:00.0")]), seconds=0.4, gpus="1")
    assert {e for *_, e in rows(run, "gpu.util")} == {"gpu:1"}
    assert [g["index"] for g in run.meta["gpus"]] == [1]
    # GPM answers per metric in its first window: these GPUs have no NVLink
    assert "gpm.sm_util" in run.catalog and "gpm.nvlink_tx_rate" not in run.catalog
    assert run.meta["collectors"]["nvml"]["unsupported"]["NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC"] == ["gpu:1"]
    on_disk = json.loads((tmp_path / "r" / "catalog.json").read_text())
    assert "gpm.sm_util" in {m["name"] for m in on_disk}
    fake = FakeNvml([hopper()])
    s = Session(tmp_path / "bad", collectors=["nvml"], config={"nvml": {"module": fake, "gpus": [7]}})
    with pytest.raises(UsageError, match=r"--gpus 7: no GPU 7 here; 1 GPU\(s\) visible \(gpu:0 NVIDIA H100"):
        s.prepare()
    assert not (tmp_path / "bad").exists()
    assert fake.inits == 0


@pytest.mark.parametrize("cfg,message", [({"gpm_interval_ms": 50}, "at least 100 ms"),
                                         ({"interval_ms": 0}, "out of range"),
                                         ({"gpus": "0,a"}, "not a GPU number"),
                                         ({"interval_ms": "fast"}, "numbers of ms")])
def test_bad_settings_are_usage_errors(cfg, message):
    with pytest.raises(UsageError, match=message):
        NvmlCollector.validate({"module": FakeNvml([hopper()]), **cfg})


def test_gpu_memory_of_the_workloads_process_tree(tmp_path):
    code = ("import subprocess,sys,time;"
            "c=subprocess.Popen([sys.executable,'-c','import time;time.sleep(30)']);"
            "print(c.pid,flush=True);time.sleep(30)")
    p = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        fake = FakeNvml([hopper(processes=[(p.pid, 1 * 2**30), (child, 3 * 2**30), (1, 5 * 2**30)])])
        run = record(tmp_path / "r", fake, seconds=1.3, target=Target("pid", p.pid))
    finally:
        p.kill()
        p.wait()
    used = rows(run, "gpu.proc_mem_used", "gpu:0")
    assert used and {v for *_, v, _ in used} == {4.0 * 2**30}      # not pid 1's 5 GiB
    assert run.catalog["gpu.proc_mem_used"]["unit"] == "bytes"


def test_a_short_run_still_gets_a_sample(tmp_path):
    with counterprof.profile(collectors=["nvml"], path=tmp_path / "r",
                             config={"nvml": {"module": FakeNvml([hopper()]), "interval_ms": 1000}}) as run:
        pass
    assert len(rows(run, "gpu.util", "gpu:0")) >= 1
    assert rows(run, "gpu.energy", "gpu:0"), "the final sample closes an energy interval"


def test_without_nvidia_ml_py_the_collector_says_how_to_install_it(tmp_path):
    avail = NvmlCollector.availability({"module": "no_such_nvml_module"})
    assert not avail.ok and "pip install" in avail.reason and "nvidia-ml-py" in avail.reason


# -- the real nvidia-ml-py on this machine (no NVIDIA driver) ------------------------------

needs_no_driver = pytest.mark.skipif(NvmlCollector.availability().ok,
                                     reason="an NVIDIA driver is present: the no-driver path cannot be seen")


@needs_no_driver
def test_no_driver_means_unavailable_with_the_reason_and_the_run_goes_on(tmp_path):
    s = Session(tmp_path / "r", collectors=None, config={}, on_warning=lambda m: None)
    s.prepare()
    s.start()
    time.sleep(0.3)
    s.stop()
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    nv = meta["collectors"]["nvml"]
    assert nv["status"] == "unavailable"
    assert "libnvidia-ml.so.1" in nv["reason"]
    assert meta["collectors"]["host"]["status"] == "ok"
    assert meta["gpus"] == []


@needs_no_driver
def test_cli_without_a_driver(tmp_path):
    listing = run_cli("list", "--json", check=True)
    nv = next(c for c in json.loads(listing.stdout)["collectors"] if c["name"] == "nvml")
    assert nv["available"] is False and "no NVIDIA driver" in nv["reason"]
    marker = tmp_path / "started"
    proc = run_cli("run", "-q", "--gpus", "7", "-o", str(tmp_path / "r"), "--",
                   PYTHON, "-c", f"open({str(marker)!r}, 'w')")
    assert proc.returncode == 2
    assert "--gpus 7: no GPU can be sampled here: no NVIDIA driver" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists() and not (tmp_path / "r").exists()
    proc = run_cli("run", "-q", "--collectors", "perf", "--gpus", "0", "--", "true")
    assert proc.returncode == 2 and "--collectors leaves out" in proc.stderr
    # a default run: nvml unavailable, said in meta.json, no warning line, the run succeeds
    proc = run_cli("run", "-q", "-o", str(tmp_path / "ok"), "--", "true")
    assert proc.returncode == 0 and "nvml" not in proc.stderr
    meta = json.loads((tmp_path / "ok" / "meta.json").read_text())
    assert meta["collectors"]["nvml"]["status"] == "unavailable"


# -- the CLI with the fake in place of pynvml -----------------------------------------------

def cli_with_fake(*args: str, gpus: str = "[fake_nvml.hopper()]", timeout: float = 120):
    """`counterprof ARGS` in a fresh interpreter whose `import pynvml` gives the fake."""
    code = (f"import sys; sys.path.insert(0, {TESTS!r}); import fake_nvml; "
            f"sys.modules['pynvml'] = fake_nvml.FakeNvml({gpus}); "
            "from counterprof.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([PYTHON, "-c", code, *args], capture_output=True, text=True, timeout=timeout)


def test_cli_gpus_7_on_a_one_gpu_machine_exits_2_before_the_workload(tmp_path):
    marker = tmp_path / "started"
    proc = cli_with_fake("run", "-q", "--gpus", "7", "-o", str(tmp_path / "r"), "--",
                         PYTHON, "-c", f"open({str(marker)!r}, 'w')")
    assert proc.returncode == 2, proc.stderr
    assert "--gpus 7: no GPU 7 here; 1 GPU(s) visible (gpu:0 NVIDIA H100 80GB HBM3)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_cli_run_and_list_with_a_gpu(tmp_path):
    proc = cli_with_fake("run", "-q", "--collectors", "nvml,host", "--nvml-interval-ms", "50",
                         "-o", str(tmp_path / "r"), "--", PYTHON, "-c", "import time; time.sleep(1.2)",
                         gpus="[fake_nvml.hopper(), fake_nvml.hopper(bus_id='00000000:3A:00.0')]")
    assert proc.returncode == 0, proc.stderr
    run = counterprof.load(tmp_path / "r")
    assert run.meta["collectors"]["nvml"]["status"] == "ok"
    assert run.meta["collectors"]["nvml"]["config"]["interval_ms"] == 50
    assert [g["index"] for g in run.meta["gpus"]] == [0, 1]
    util = rows(run, "gpu.util")
    assert {e for *_, e in util} == {"gpu:0", "gpu:1"} and len(util) >= 2 * 15
    text = str(run.summary())
    assert "(nvml collector)" in text and "gpu.energy" in text
    listing = cli_with_fake("list", "--json")
    nv = next(c for c in json.loads(listing.stdout)["collectors"] if c["name"] == "nvml")
    assert nv["available"] is True
    table = nv["tables"][0]
    assert table["title"] == "GPUs" and table["rows"][0][:2] == ["gpu:0", "NVIDIA H100 80GB HBM3"]
    assert table["rows"][0][-1] == "yes"                     # GPM


def test_a_batch_leaves_every_second_whatever_the_interval(tmp_path):
    log = BatchLog()
    run = record(tmp_path / "r", FakeNvml([hopper()]), seconds=2.6, sinks=[log], interval_ms=5000)
    arrivals = [t for t, _ in log.arrivals]
    assert len(arrivals) >= 3                       # at ~1 s, ~2 s and at stop
    assert all(b - a < 2.0 for a, b in zip(arrivals, arrivals[1:]))   # not every 5 s
    assert rows(run, "gpm.sm_util", "gpu:0")        # GPM kept its own 100 ms windows
