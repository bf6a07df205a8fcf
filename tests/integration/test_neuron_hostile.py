"""The neuron collector against a misbehaving neuron-monitor (tests/fake_neuron/hostile, a real
child process): silent, ignoring SIGTERM, a helper holding its stdout, flooding, a 50 MB line,
stderr spam, exiting at once, a line cut at stop, fuzzed lines; and a SIGKILLed profiler.
Each must leave the profiler running, stop() quick, the rows taken kept, and a clear status."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from counterprof.ground.clock import Clock
from counterprof.collector import SessionContext, Target
from counterprof.collectors.neuron import NeuronCollector
from counterprof.collectors.neuron import collector as neuron_collector
from fake_neuron import DATA, HOSTILE_BIN, bump, make_sysfs, path_with_fakes
from helpers import COUNTERPROF

GUIDE_LINE = (DATA / "monitor-guide.json").read_bytes().strip()
ROWS_PER_LINE = 48          # the guide's line, tag my_app_1 taken as the workload's


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def wait_until(pred, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


class Collected:
    """A NeuronCollector started as the session starts it, with the hostile monitor on PATH."""

    def __init__(self, tmp_path, monkeypatch, mode, sysfs_root=None, **env):
        monkeypatch.setenv("PATH", path_with_fakes(bin_dir=HOSTILE_BIN)["PATH"])
        monkeypatch.setenv("COUNTERPROF_NEURON_SYSFS", str(sysfs_root or tmp_path / "no-tree"))
        monkeypatch.setenv("NEURON_PROCESS_TAG", "my_app_1")     # the guide's runtime is ours
        monkeypatch.setenv("FAKE_NEURON_HOSTILE", mode)
        self.record = tmp_path / "monitor.json"
        monkeypatch.setenv("FAKE_NEURON_RECORD", str(self.record))
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        self.batches, self.fails, self.warns = [], [], []
        self.ctx = SessionContext(
            clock=Clock(), target=Target("self", os.getpid()), config={}, rank=0,
            emit=lambda table, batch, rank=None: self.batches.append(batch),
            add_metrics=lambda metrics: None, fail=lambda name, why: self.fails.append(why),
            warn=self.warns.append)
        self.col = NeuronCollector({})
        self.col.start(self.ctx)

    @property
    def rows(self) -> int:
        return sum(b.num_rows for b in self.batches)

    def rec(self) -> dict:
        assert wait_until(self.record.exists, 10), "the fake monitor never started"
        for _ in range(50):
            try:
                return json.loads(self.record.read_text())
            except ValueError:
                time.sleep(0.05)
        raise AssertionError("unreadable record")

    def stop(self, within: float = 8.0) -> float:
        """stop() on a thread: its duration, failing (not hanging) the test past `within`."""
        t0 = time.monotonic()
        th = threading.Thread(target=self.col.stop, daemon=True)
        th.start()
        th.join(within)
        assert not th.is_alive(), f"stop() still running after {within} s"
        return time.monotonic() - t0


def test_a_silent_monitor_is_said_to_be_silent(tmp_path, monkeypatch):
    c = Collected(tmp_path, monkeypatch, "silent")
    pid = c.rec()["pid"]
    assert wait_until(lambda: c.col.status == "failed", neuron_collector.silent_after_s(1.0) + 5)
    assert "printed nothing for" in c.col.reason and "period is 1 s" in c.col.reason
    assert c.stop() < 4.0
    assert not alive(pid)


def test_a_monitor_that_ignores_sigterm_is_killed(tmp_path, monkeypatch):
    c = Collected(tmp_path, monkeypatch, "deaf")
    pid = c.rec()["pid"]
    assert wait_until(lambda: c.rows >= 2 * ROWS_PER_LINE, 10)
    assert c.stop() < 2 * neuron_collector.STOP_WAIT_S + 2
    assert wait_until(lambda: not alive(pid), 2)
    assert c.col.status == "ok", c.col.reason


def test_a_helper_holding_stdout_does_not_hang_stop(tmp_path, monkeypatch):
    c = Collected(tmp_path, monkeypatch, "holder")
    assert wait_until(lambda: "holder" in c.rec(), 10)
    rec = c.rec()
    assert wait_until(lambda: c.rows >= ROWS_PER_LINE, 10)
    taken = c.rows
    assert c.stop() < 6.0
    assert wait_until(lambda: not alive(rec["pid"]) and not alive(rec["holder"]), 3)
    assert c.rows >= taken


def test_a_flood_is_cut_to_a_few_lines_a_period(tmp_path, monkeypatch):
    c = Collected(tmp_path, monkeypatch, "flood")
    time.sleep(3.0)
    assert c.stop() < 4.0
    lines_kept = c.rows / ROWS_PER_LINE
    assert c.col.lines > 1000                        # it did flood
    assert lines_kept <= neuron_collector.BURST_LINES + 2 * neuron_collector.LINES_PER_PERIOD * 4
    assert c.col.status == "failed" and "far more than one report a period" in c.col.reason
    assert c.col.details["lines_dropped"] > 1000


def test_a_50_mb_line_is_dropped_and_reading_goes_on(tmp_path, monkeypatch):
    c = Collected(tmp_path, monkeypatch, "long_line", FAKE_NEURON_LONG_MB="50")
    assert wait_until(lambda: c.col.bad_lines == 1, 30)
    after = c.rows
    assert wait_until(lambda: c.rows >= after + 2 * ROWS_PER_LINE, 10), "lines after the long one are read"
    assert "50.0 MiB" in c.col.reason and "dropped" in c.col.reason
    assert c.stop() < 4.0


def test_stderr_spam_fills_neither_memory_nor_disk(tmp_path, monkeypatch):
    c = Collected(tmp_path, monkeypatch, "stderr_spam")
    tmp_dir = c.col._tmp
    time.sleep(3.0)
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_dir) for f in fs) \
        if os.path.isdir(tmp_dir) else 0
    assert on_disk < 64 << 10, f"{on_disk} bytes of the monitor's stderr kept on disk"
    assert c.rows >= 2 * ROWS_PER_LINE
    c.stop()
    assert c.col.status == "ok", c.col.reason
    assert not os.path.exists(tmp_dir)


def test_a_monitor_that_exits_at_once_says_why(tmp_path, monkeypatch):
    c = Collected(tmp_path, monkeypatch, "exit_now")
    assert wait_until(lambda: c.col.status == "failed", 10)
    assert "exited with status 7 after 0 line(s)" in c.col.reason
    assert "cannot open the Neuron driver" in c.col.reason
    assert c.stop() < 2.0


@pytest.mark.parametrize("mode", ["exit_now", "silent"])
def test_sysfs_goes_on_for_every_core_when_the_monitor_gives_none(tmp_path, monkeypatch, mode):
    root = make_sysfs(tmp_path / "nd", devices=1, cores=2)
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    c = Collected(tmp_path, monkeypatch, mode, sysfs_root=root)
    assert wait_until(lambda: c.col.status == "failed", neuron_collector.silent_after_s(1.0) + 5)
    assert "sysfs counters go on" in c.col.reason
    for _ in range(5):
        bump(root, 0, 1, flops=1000)
        time.sleep(0.3)
    c.stop()
    flops = [v for b in c.batches for m, e, v in zip(b["metric"].to_pylist(), b["entity"].to_pylist(),
                                                       b["value"].to_pylist())
             if m == "neuron.flop_count" and e == "neuron:0/core:1"]
    assert sum(flops) == 5000


def test_a_line_cut_off_by_stop_is_not_a_failure(tmp_path, monkeypatch):
    c = Collected(tmp_path, monkeypatch, "half")
    assert wait_until(lambda: c.rows >= ROWS_PER_LINE, 10)
    time.sleep(0.3)
    c.stop()
    assert c.col.status == "ok", c.col.reason
    assert c.col.bad_lines == 0


def test_fuzzed_lines_each_a_clear_reason_and_the_good_ones_after_are_read(tmp_path, monkeypatch):
    rng = random.Random(151)
    lines = [GUIDE_LINE[:rng.randrange(len(GUIDE_LINE))] for _ in range(3)]
    for _ in range(3):
        b = bytearray(GUIDE_LINE)
        b[rng.randrange(len(b))] = rng.randrange(256)
        lines.append(bytes(b).replace(b"\n", b" "))
    guide = json.loads(GUIDE_LINE)
    for wild in (10**400, 1e308, "abc", [1], {"x": None}, -1):
        g = json.loads(GUIDE_LINE)
        rep = g["neuron_runtime_data"][0]["report"]
        rep["neuroncore_counters"]["period"] = wild
        rep["neuroncore_counters"]["neuroncores_in_use"]["0"]["neuroncore_utilization"] = wild
        rep["execution_stats"]["execution_summary"]["completed"] = wild
        g["neuron_hardware_info"]["neuroncore_per_device_count"] = wild
        lines.append(json.dumps(g).encode())
    lines.append(b"[" * 100_000)
    lines.append(json.dumps(guide).encode())
    path = tmp_path / "lines"
    path.write_bytes(b"\n".join(lines) + b"\n")
    c = Collected(tmp_path, monkeypatch, "lines", FAKE_NEURON_LINES=str(path))
    assert wait_until(lambda: c.col.lines >= len(lines) + 2, 20)
    assert c.stop() < 4.0
    assert c.col.status == "failed" and "not its report" in c.col.reason
    assert c.col.bad_lines >= 3
    # the wild-valued lines were read (their good fields gave rows), and so were the good ones after
    assert c.rows >= (6 + 3) * (ROWS_PER_LINE // 2)


def test_a_monitor_that_cannot_be_started(tmp_path, monkeypatch):
    bad = tmp_path / "bin"
    bad.mkdir()
    exe = bad / "neuron-monitor"
    exe.write_text("#!/no/such/interpreter\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bad}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COUNTERPROF_NEURON_SYSFS", str(tmp_path / "no-tree"))
    col = NeuronCollector({})
    ctx = SessionContext(clock=Clock(), target=Target("self", os.getpid()), config={}, rank=0,
                         emit=lambda *a, **k: None, add_metrics=lambda m: None,
                         fail=lambda n, r: None, warn=lambda m: None)
    with pytest.raises(OSError):
        col.start(ctx)
    col.stop()
    assert not [d for d in os.listdir(tempfile.gettempdir())
                if d.startswith(f"{neuron_collector.TMP_PREFIX}{os.getpid()}-")]


# -- a SIGKILLed profiler --------------------------------------------------------------------

def _run_and_kill(tmp_path, mode, ready=lambda rec: True):
    env = path_with_fakes(bin_dir=HOSTILE_BIN)
    env.update(COUNTERPROF_NEURON_SYSFS=str(tmp_path / "no-tree"), FAKE_NEURON_HOSTILE=mode,
               FAKE_NEURON_RECORD=str(tmp_path / "monitor.json"))
    prof = subprocess.Popen([*COUNTERPROF, "run", "-o", str(tmp_path / "run"), "--", "sleep", "60"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until((tmp_path / "monitor.json").exists, 30), "the monitor never started"
        rec = json.loads((tmp_path / "monitor.json").read_text())
        assert rec["ppid"] == prof.pid           # the profiler's child, not the workload's
        assert wait_until(lambda: ready(rec), 15)
        assert alive(rec["pid"])
        prof.send_signal(signal.SIGKILL)
        prof.wait(10)
    finally:
        if prof.poll() is None:
            prof.kill()
            prof.wait()
    return rec


def test_a_sigkilled_profiler_takes_the_monitor_and_its_config_with_it(tmp_path):
    # prints reports, ignores SIGTERM; its config goes once the first report is read
    rec = _run_and_kill(tmp_path, "deaf", ready=lambda rec: not os.path.exists(os.path.dirname(rec["config_path"])))
    try:
        assert wait_until(lambda: not alive(rec["pid"]), 5), "the monitor outlived the profiler"
    finally:
        if alive(rec["pid"]):
            os.kill(rec["pid"], signal.SIGKILL)


def test_a_sigkilled_profiler_config_dir_is_swept_by_the_next_run(tmp_path):
    rec = _run_and_kill(tmp_path, "silent", ready=lambda rec: time.sleep(1.0) is None)   # never prints
    try:
        assert wait_until(lambda: not alive(rec["pid"]), 5), "the monitor outlived the profiler"
    finally:
        if alive(rec["pid"]):
            os.kill(rec["pid"], signal.SIGKILL)
    left = os.path.dirname(rec["config_path"])
    assert os.path.isdir(left)
    assert left in neuron_collector.sweep_stale_dirs()
    assert not os.path.exists(left)


# -- neuron-ls for `counterprof list` --------------------------------------------------------

@pytest.mark.parametrize("mode,devices", [("holder", 1), ("flood", None), ("hang", None)])
def test_a_misbehaving_neuron_ls_cannot_hang_or_fill_list(tmp_path, monkeypatch, mode, devices):
    from counterprof.collectors.neuron import topology
    monkeypatch.setenv("PATH", path_with_fakes(bin_dir=HOSTILE_BIN)["PATH"])
    monkeypatch.setenv("FAKE_NEURON_LS_HOSTILE", mode)
    monkeypatch.setenv("FAKE_NEURON_RECORD", str(tmp_path / "ls.json"))
    monkeypatch.setattr(topology, "NEURON_LS_TIMEOUT_S", 2.0)
    out = []
    th = threading.Thread(target=lambda: out.append(topology.neuron_ls()), daemon=True)
    t0 = time.monotonic()
    th.start()
    th.join(15)
    assert not th.is_alive(), "neuron_ls() still running after 15 s"
    assert time.monotonic() - t0 < (3 if mode == "holder" else 6)
    got = out[0]
    assert (len(got) if got is not None else None) == devices
    rec = json.loads((tmp_path / "ls.json").read_text())
    assert wait_until(lambda: not any(alive(p) for p in (rec["pid"], rec.get("holder")) if p), 3)
