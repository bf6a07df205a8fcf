"""`counterprof run` as a user runs it: real processes, real syscalls, real Parquet."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import counterprof
from counterprof.ground.schema import SAMPLES_SCHEMA
from helpers import COUNTERPROF, EXAMPLES, HAS_PMU, PYTHON, REPO, run_cli, table_files, journal_dir

WORKLOADS = str(REPO / "tests" / "workloads.py")


def perf_rows(run, metric):
    t = run.samples()
    t = t.filter(pc.and_(pc.equal(t["source"].cast("string"), "perf"),
                         pc.equal(t["metric"].cast("string"), metric)))
    return t


def test_run_writes_a_complete_run_directory(run_dir):
    proc = run_cli("run", "-e", "task-clock,page-faults,context-switches,cycles,instructions",
                   "-I", "10", "-o", str(run_dir), "--", PYTHON, str(EXAMPLES / "busy.py"), "0.3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("iterations "), "the workload's stdout must stay its own"
    # the run directory is private: command lines can hold secrets
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete"
    assert meta["command"] == [PYTHON, str(EXAMPLES / "busy.py"), "0.3"]
    assert meta["workload"]["exit_status"] == 0
    assert meta["collectors"]["perf"]["status"] == "ok"
    assert meta["collectors"]["host"]["status"] == "ok"
    events = meta["collectors"]["perf"]["events"]
    assert events["task-clock"]["status"] == "counted"
    catalog = {m["name"]: m for m in json.loads((run_dir / "catalog.json").read_text())}
    assert catalog["task-clock"] == {"name": "task-clock", "unit": "ns", "kind": "delta",
                                     "description": "CPU time of the task", "source": "perf"}
    assert catalog["proc.rss"]["kind"] == "gauge"
    files = table_files(run_dir, "samples", 0)
    assert len(files) == 1 and not journal_dir(run_dir, 0).exists()
    table = pq.read_table(files[0])
    assert table.schema.equals(SAMPLES_SCHEMA)
    run = counterprof.load(run_dir)
    tc = perf_rows(run, "task-clock")
    # 10 ms intervals over ~0.3 s of workload
    assert 20 <= tc.num_rows <= 60
    assert tc["value"].null_count == 0
    assert set(tc["entity"].cast("string").to_pylist()) == {"process"}
    durations = tc["duration_ns"].to_pylist()[1:-1]
    assert sorted(durations)[len(durations) // 2] == pytest.approx(10e6, rel=0.2)
    # the timeline is on the epoch axis and ordered
    times = tc["time"].cast("int64").to_pylist()
    assert times == sorted(times)
    assert abs(times[-1] / 1e9 - time.time()) < 120
    summary = run.summary()
    assert summary.value("task-clock") == pytest.approx(pc.sum(tc["value"]).as_py())
    assert summary.row("cycles").value is None  # unknown, never zero, where there is no PMU
    assert "task-clock" in proc.stderr and "seconds time elapsed" in proc.stderr
    assert f"run directory: {run_dir}" in proc.stderr


def test_unsupported_hardware_event_is_reported_not_zero(run_dir):
    if HAS_PMU:
        pytest.skip("this machine counts hardware events: nothing is unsupported")
    proc = run_cli("run", "-e", "task-clock,cycles", "-o", str(run_dir), "--", "true")
    assert proc.returncode == 0
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("counterprof: cycles")]
    assert len(warnings) == 1 and "no PMU" in warnings[0]
    assert "<not supported>" in proc.stderr
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["collectors"]["perf"]["events"]["cycles"]["status"] == "not supported"
    run = counterprof.load(run_dir)
    assert perf_rows(run, "cycles").num_rows == 0
    assert "cycles" not in run.catalog


def test_no_countable_event_fails_the_collector_not_the_run(run_dir):
    if HAS_PMU:
        pytest.skip("this machine counts hardware events")
    proc = run_cli("run", "-e", "cycles,instructions", "-o", str(run_dir), "--", "sh", "-c", "exit 3")
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert "none of the events can be counted here" in proc.stderr
    meta = json.loads((run_dir / "meta.json").read_text())
    perf = meta["collectors"]["perf"]
    assert perf["status"] == "failed"
    assert perf["events"]["cycles"]["status"] == "not supported"
    assert meta["collectors"]["host"]["status"] == "ok"
    rows = [ln.split() for ln in proc.stderr.splitlines() if ln.strip().startswith("<not supported>")]
    assert [r[-1] for r in rows] == ["cycles", "instructions"]


def test_default_events_are_perf_stats(run_dir):
    proc = run_cli("run", "-o", str(run_dir), "--", "true")
    assert proc.returncode == 0
    events = json.loads((run_dir / "meta.json").read_text())["collectors"]["perf"]["events"]
    assert list(events) == ["task-clock", "context-switches", "cpu-migrations", "page-faults",
                            "cycles", "instructions", "branches", "branch-misses"]


def test_default_run_directory_is_new_and_timestamped(tmp_path):
    for _ in range(2):
        assert run_cli("run", "-q", "--", "true", cwd=tmp_path).returncode == 0
    runs = sorted(p.name for p in tmp_path.iterdir())
    assert len(runs) == 2 and all(r.startswith("counterprof-20") for r in runs)


@pytest.mark.parametrize("script, expected", [
    ("exit 7", 7),
    ("exit 0", 0),
    ("kill -TERM $$", 128 + signal.SIGTERM),
    ("kill -KILL $$", 128 + signal.SIGKILL),
])
def test_exit_status_is_the_workloads(tmp_path, script, expected):
    proc = run_cli("run", "-q", "-o", str(tmp_path / "r"), "--", "sh", "-c", script)
    assert proc.returncode == expected
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["workload"]["exit_status"] == expected
    assert meta["status"] == "complete"


def test_command_not_found_is_127_and_not_executable_is_126(tmp_path):
    proc = run_cli("run", "-o", str(tmp_path / "a"), "--", "no-such-command-xyz")
    assert proc.returncode == 127
    assert "no-such-command-xyz: command not found" in proc.stderr
    assert not (tmp_path / "a").exists(), "nothing is created for a command that cannot start"
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    proc = run_cli("run", "-o", str(tmp_path / "b"), "--", str(script))
    assert proc.returncode == 126
    assert "permission denied" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_exec_failure_in_the_child_is_reported(tmp_path):
    # passes the checks before the start (exists, executable) but exec itself fails:
    # its interpreter does not exist (bash says "bad interpreter" and exits 127 too)
    bad = tmp_path / "bad"
    bad.write_text("#!/nonexistent/interpreter\n")
    bad.chmod(0o755)
    proc = run_cli("run", "-o", str(tmp_path / "r"), "--", str(bad))
    assert proc.returncode == 127
    assert "cannot execute: No such file or directory" in proc.stderr
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["workload"]["status"] == "exec failed"


def test_unknown_event_exits_2_before_the_workload_starts(tmp_path):
    marker = tmp_path / "started"
    proc = run_cli("run", "-e", "task-clock,instrutions", "-o", str(tmp_path / "r"), "--",
                   PYTHON, WORKLOADS, "marker", str(marker))
    assert proc.returncode == 2
    assert "unknown event 'instrutions'" in proc.stderr
    assert "did you mean instructions" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
    assert not (tmp_path / "r").exists()


def test_usage_errors_exit_2(tmp_path):
    assert run_cli("run").returncode == 2
    assert run_cli("run", "-I", "abc", "--", "true").returncode == 2
    proc = run_cli("run", "--collectors", "perf,nope", "-o", str(tmp_path / "r"), "--", "true")
    assert proc.returncode == 2 and "unknown collector(s): nope" in proc.stderr
    proc = run_cli("run", "-I", "0.01", "-o", str(tmp_path / "r"), "--", "true")
    assert proc.returncode == 2 and "out of range" in proc.stderr
    assert run_cli("frobnicate").returncode == 2


def test_existing_run_directory_is_not_overwritten_without_force(run_dir):
    assert run_cli("run", "-q", "-o", str(run_dir), "--", "true").returncode == 0
    proc = run_cli("run", "-q", "-o", str(run_dir), "--", "true")
    assert proc.returncode == 1 and "already holds a run" in proc.stderr
    assert run_cli("run", "-q", "--force", "-o", str(run_dir), "--", "true").returncode == 0


def test_collectors_flag_selects(run_dir):
    assert run_cli("run", "-q", "--collectors", "host", "-o", str(run_dir), "--", "true").returncode == 0
    meta = json.loads((run_dir / "meta.json").read_text())
    assert list(meta["collectors"]) == ["host"]


def _start(args, **kw):
    return subprocess.Popen([*COUNTERPROF, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_sent_to_the_profiler_reaches_the_workload(tmp_path, sig):
    marker = tmp_path / "got"
    proc = _start(["run", "-q", "-o", str(tmp_path / "r"), "--", PYTHON, WORKLOADS, "on_signal",
                   "3", str(marker)])
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert marker.read_text() == str(int(sig))
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["status"] == "complete"
    assert meta["workload"]["forwarded_signals"] == [int(sig)]


# the counters reach the journal every 0.5 s: what a SIGKILL can take, plus the last interval's
# bucket and the kill's own latency; from -I 100 the drain is every 10 s, but every tick is in the
# spill (collectors/perf/spill.py) as it is taken: a tick and the kill's latency
@pytest.mark.parametrize("interval, lost_s, seconds", [("10", 1.0, "4"), ("100", 0.45, "14")])
def test_profiler_killed_then_recover_keeps_all_but_the_last_second(tmp_path, interval, lost_s, seconds):
    run_dir = tmp_path / "r"
    # (no interval rows: printing them drains every second, and this is the spill's test)
    proc = _start(["run", "-I", interval, "--no-interval-rows", "-o", str(run_dir), "--", PYTHON,
                   str(EXAMPLES / "busy.py"), seconds])
    deadline = time.monotonic() + 20
    while not list(journal_dir(run_dir, 0).glob("*.arrows")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2.0)
    killed_at = time.time()
    proc.kill()     # SIGKILL: no chance to finish anything
    proc.wait()
    # the orphaned workload still runs to completion
    assert json.loads((run_dir / "meta.json").read_text())["status"] == "running"

    run = counterprof.load(run_dir)      # readable before recovery, straight from the journal
    before = perf_rows(run, "task-clock")
    assert before.num_rows > 1.0 / (float(interval) / 1000) / 2     # 2 s of rows at -I: a quarter at least

    rec = run_cli("recover", str(run_dir))
    assert rec.returncode == 0, rec.stderr
    assert "recovered" in rec.stderr and "task-clock" in rec.stderr
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "recovered"
    assert table_files(run_dir, "samples", 0)
    after = perf_rows(counterprof.load(run_dir), "task-clock")
    if interval == "10":
        assert after.num_rows == before.num_rows
    else:           # the spill's ticks after the last drain come in at recovery
        assert after.num_rows > before.num_rows
        assert "from the sampler's spill" in rec.stderr
    last = pc.max(after["time"].cast("int64")).as_py() / 1e9
    assert killed_at - last < lost_s, f"at most {lost_s} s may be lost"
    # recover is idempotent
    assert run_cli("recover", "-q", str(run_dir)).returncode == 0
    assert perf_rows(counterprof.load(run_dir), "task-clock").num_rows == after.num_rows


def test_recover_refuses_a_run_still_being_written(tmp_path):
    run_dir = tmp_path / "r"
    proc = _start(["run", "-q", "-o", str(run_dir), "--", "sleep", "3"])
    deadline = time.monotonic() + 20
    while not (run_dir / "meta.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rec = run_cli("recover", str(run_dir))
    proc.wait(timeout=30)
    assert rec.returncode == 1 and "still being written" in rec.stderr


def test_workload_killed_keeps_the_data(tmp_path):
    run_dir = tmp_path / "r"
    proc = _start(["run", "-q", "-I", "10", "-o", str(run_dir), "--", PYTHON, str(EXAMPLES / "busy.py"), "30"])
    from helpers import wait_for_samples
    wait_for_samples(run_dir, rows=60)
    import psutil
    child = psutil.Process(proc.pid).children()[0]
    child.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL
    run = counterprof.load(run_dir)
    assert run.meta["status"] == "complete"
    assert perf_rows(run, "task-clock").num_rows >= 50


def test_meta_records_only_allowlisted_environment(run_dir):
    env = dict(os.environ, RANK="3", WORLD_SIZE="8", AWS_SECRET_ACCESS_KEY="hunter2",
               OMP_NUM_THREADS="4")
    proc = run_cli("run", "-q", "-o", str(run_dir), "--", "true", env=env)
    assert proc.returncode == 0
    text = (run_dir / "meta.json").read_text()
    assert "hunter2" not in text and "AWS_SECRET" not in text
    meta = json.loads(text)
    assert meta["env"] == {"RANK": "3", "WORLD_SIZE": "8", "OMP_NUM_THREADS": "4"}
    assert stat.S_IMODE((run_dir / "meta.json").stat().st_mode) == 0o600


def test_python_dash_m_and_console_script_agree(tmp_path):
    exe = Path(sys.executable).parent / "counterprof"
    if not exe.exists():
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("counterprof ")


def test_ctrl_c_at_the_terminal_reaches_the_workload_once(tmp_path):
    """The terminal sends SIGINT to the whole foreground process group: the workload gets
    it from the terminal, and the profiler must not send it a second time."""
    import fcntl
    import pty
    import termios

    marker = tmp_path / "got"
    master, slave = pty.openpty()

    def become_session_leader_on_the_pty():
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([*COUNTERPROF, "run", "-q", "-o", str(tmp_path / "r"), "--", PYTHON,
                             WORKLOADS, "on_signal", "5", str(marker)],
                            stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=become_session_leader_on_the_pty)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 30
    while b"ready" not in out and time.monotonic() < deadline:
        out += os.read(master, 1024)
    os.write(master, b"\x03")          # Ctrl-C
    assert proc.wait(timeout=30) == 5
    os.close(master)
    assert marker.read_text() == str(int(signal.SIGINT))
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["workload"]["forwarded_signals"] == []
    assert meta["status"] == "complete"


def test_the_end_of_run_summary_equals_the_one_read_back(tmp_path):
    """The summary printed at the end is made from sums taken as the batches passed (no
    reading back): it is the one `Run.summary()` reads from the files."""
    run_dir = tmp_path / "r"
    proc = run_cli("run", "--json", "-I", "5", "-e", "task-clock,page-faults", "-o", str(run_dir),
                   "--", PYTHON, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.4: pass")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    read_back = counterprof.load(run_dir).summary().to_dict()
    assert [(r["source"], r["metric"]) for r in printed["rows"]] == \
        [(r["source"], r["metric"]) for r in read_back["rows"]]
    for p, b in zip(printed["rows"], read_back["rows"]):
        assert p["value"] == pytest.approx(b["value"], rel=1e-9), p["metric"]
        assert (p["aggregate"], p["status"], p["unknown_intervals"]) == \
            (b["aggregate"], b["status"], b["unknown_intervals"])
    assert len(printed["rows"]) > 10
