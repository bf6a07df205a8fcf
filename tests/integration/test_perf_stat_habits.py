"""A perf stat user's habits through the real CLI (issue 34): --json alone on stdout, -q --json,
-x SEP and -j (perf's CSV and JSON lines, totals and intervals), -I's interval rows, -r's ± as
perf prints it (the standard deviation of the mean), each warning said once under -r, the
outputs a user names following the umask, and a CPU-only `run --torch` quiet about hardware
it does not have."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
import statistics
import subprocess

import pytest

import counterprof
from helpers import COUNTERPROF, PYTHON, run_cli

SPIN = ("import sys, time\n"
        "print('workload says hi', flush=True)\n"
        "t = time.perf_counter()\n"
        "while time.perf_counter() - t < float(sys.argv[1]): pass\n")
EVENTS = "task-clock,context-switches,page-faults"


def _spin(tmp_path, seconds="0.3"):
    script = tmp_path / "spin.py"
    script.write_text(SPIN)
    return [PYTHON, str(script), seconds]


def test_json_is_the_only_thing_on_stdout_and_quiet_keeps_it(tmp_path):
    proc = run_cli("run", "--json", "-e", EVENTS, "-o", str(tmp_path / "a"), "--", *_spin(tmp_path))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)                  # the whole of stdout is one document
    assert {r["metric"] for r in doc["rows"]} >= {"task-clock", "page-faults"}
    assert "workload says hi" in proc.stderr       # the workload's stdout went to stderr
    assert f"run directory: {tmp_path / 'a'}" in proc.stderr
    quiet = run_cli("run", "-q", "--json", "-e", EVENTS, "-o", str(tmp_path / "b"), "--", *_spin(tmp_path))
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["rows"] and "Performance counter stats" not in quiet.stderr


def test_csv_and_json_lines_of_the_totals_parse_as_perfs(tmp_path):
    proc = run_cli("run", "-x,", "-e", EVENTS, "-o", str(tmp_path / "a"), "--", *_spin(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.reader(io.StringIO(proc.stdout)))
    assert [r[2] for r in rows] == EVENTS.split(",")
    by_event = {r[2]: r for r in rows}
    assert all(len(r) == 7 for r in rows), rows
    value, unit, _, runtime, pcnt, mval, munit = by_event["task-clock"]
    assert unit == "msec" and float(value) > 100 and int(runtime) > 0 and float(pcnt) == 100.0
    assert munit == "CPUs utilized" and 0.3 < float(mval) <= 1.1
    summary = counterprof.load(tmp_path / "a").summary()
    assert float(value) == pytest.approx(summary.value("task-clock") / 1e6, abs=0.01)
    assert int(by_event["page-faults"][0]) == summary.value("page-faults")
    assert "workload says hi" in proc.stderr

    j = run_cli("run", "-j", "-e", EVENTS, "-o", str(tmp_path / "b"), "--", *_spin(tmp_path))
    assert j.returncode == 0, j.stderr
    objs = [json.loads(line) for line in j.stdout.splitlines()]
    assert [o["event"] for o in objs] == EVENTS.split(",")
    assert objs[0]["unit"] == "msec" and float(objs[0]["counter-value"]) > 100


def test_interval_rows_as_perf_prints_them(tmp_path):
    """-I 100 prints a row per counter and interval (time since start, value, unit, event), on
    stderr as text, on stdout with -x, and -j."""
    proc = run_cli("run", "-I", "100", "-e", EVENTS, "-o", str(tmp_path / "a"), "--", *_spin(tmp_path, "0.6"))
    assert proc.returncode == 0, proc.stderr
    ticks = [ln.split() for ln in proc.stderr.splitlines() if re.match(r"\s*\d+\.\d{9}\s", ln)
             and "task-clock" in ln]
    assert len(ticks) >= 4, proc.stderr
    times = [float(t[0]) for t in ticks]
    assert times == sorted(times) and times[-1] < 5
    assert all(t[2] == "msec" and float(t[1]) <= 110 for t in ticks)
    assert "Performance counter stats" in proc.stderr        # the totals still end it

    x = run_cli("run", "-x", ";", "-I", "100", "-e", EVENTS, "-o", str(tmp_path / "b"), "--",
                *_spin(tmp_path, "0.6"))
    assert x.returncode == 0, x.stderr
    rows = list(csv.reader(io.StringIO(x.stdout), delimiter=";"))
    tc = [r for r in rows if r[3] == "task-clock"]
    assert len(tc) >= 4 and all(len(r) == 8 for r in rows)
    total = counterprof.load(tmp_path / "b").summary().value("task-clock")
    assert sum(float(r[1]) for r in tc) == pytest.approx(total / 1e6, rel=0.01, abs=0.1)

    j = run_cli("run", "-j", "-I", "100", "-e", EVENTS, "-o", str(tmp_path / "c"), "--", *_spin(tmp_path, "0.6"))
    assert j.returncode == 0, j.stderr
    objs = [json.loads(line) for line in j.stdout.splitlines()]
    assert len([o for o in objs if o["event"] == "task-clock"]) >= 4 and all("interval" in o for o in objs)


def test_repeat_spread_is_of_the_mean_and_warnings_are_said_once(tmp_path):
    n = 3
    base = tmp_path / "set"
    proc = run_cli("run", "-r", str(n), "-e", EVENTS + ",cycles", "-o", str(base), "--", *_spin(tmp_path, "0.2"))
    assert proc.returncode == 0, proc.stderr
    values = [counterprof.load(base / f"run-{i}").summary().value("task-clock") for i in range(1, n + 1)]
    mean = statistics.mean(values)
    expected = 100 * statistics.stdev(values) / math.sqrt(n) / mean
    line = next(ln for ln in proc.stderr.splitlines() if "task-clock" in ln)
    shown = float(re.search(r"\( \+- ([0-9.]+)% \)", line).group(1))
    assert shown == pytest.approx(expected, abs=0.006), (line, values)
    assert "CPUs utilized" in line
    said = [ln for ln in proc.stderr.splitlines()
            if ln.startswith("counterprof: ") and "run directory" not in ln and "run set" not in ln]
    assert len(said) == len(set(said)), said          # e.g. cycles' <not supported>: once, not per run

    x = run_cli("run", "-r", str(n), "-x,", "-e", EVENTS, "-o", str(tmp_path / "set2"), "--",
                *_spin(tmp_path, "0.2"))
    assert x.returncode == 0, x.stderr
    row = next(r for r in csv.reader(io.StringIO(x.stdout)) if r[2] == "task-clock")
    values = [counterprof.load(tmp_path / "set2" / f"run-{i}").summary().value("task-clock")
              for i in range(1, n + 1)]
    expected = 100 * statistics.stdev(values) / math.sqrt(n) / statistics.mean(values)
    assert float(row[3].rstrip("%")) == pytest.approx(expected, abs=0.006)


def _umask_022():
    os.umask(0o022)


def test_named_outputs_follow_the_umask_and_the_run_stays_private(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([*COUNTERPROF, "run", "-q", "--collectors", "perf,host", "-o", str(run), "--",
                           *_spin(tmp_path, "0.2")], preexec_fn=_umask_022, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    for args, name in ((["report", str(run), "--html"], "r.html"),
                       (["export", str(run), "--perfetto"], "t.json.gz")):
        p = subprocess.run([*COUNTERPROF, *args, str(tmp_path / name)], preexec_fn=_umask_022,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    for f in run.rglob("*"):
        assert stat.S_IMODE(f.lstat().st_mode) == (0o700 if f.is_dir() else 0o600), f


def _has(module: str) -> bool:
    return subprocess.run([PYTHON, "-c", f"import {module}"], capture_output=True).returncode == 0


TORCH_WORK = ("import sys, threading, time, torch\n"
              "def chatter():\n"
              "    for i in range(40):\n"
              "        print(f'tick {i}', file=sys.stderr, flush=True)\n"
              "        time.sleep(0.05)\n"
              "th = threading.Thread(target=chatter); th.start()\n"
              "m = torch.nn.Linear(64, 64); x = torch.randn(8, 64)\n"
              "t = time.time()\n"
              "while time.time() - t < 3: m(x); time.sleep(0.005)\n"
              "th.join()\n")


@pytest.mark.skipif(not _has("torch"), reason="torch is not installed in this Python")
@pytest.mark.skipif(os.path.exists("/dev/nvidiactl") or os.path.isdir("/sys/devices/virtual/neuron_device"),
                    reason="this machine has a GPU or a Neuron device: the quiet CPU-only case is not here")
def test_a_cpu_only_torch_run_says_nothing_of_missing_hardware(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(TORCH_WORK)
    proc = run_cli("run", "--torch", "-o", str(tmp_path / "a"), "--", PYTHON, str(script), timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert not re.search(r"nvml|neuron|NVIDIA", proc.stderr), proc.stderr
    assert "USDT:" not in proc.stderr and "profiler_start" not in proc.stderr   # kineto's markers
    ticks = [int(m) for m in re.findall(r"^tick (\d+)$", proc.stderr, re.M)]
    assert ticks == list(range(40))           # the workload's own stderr, whole and in order
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["collectors"]["torch"]["status"] in ("ok", "complete") or \
        list((tmp_path / "a").glob("**/*.pt.trace.json*")), meta["collectors"]["torch"]
    loud = run_cli("run", "-v", "--torch", "-o", str(tmp_path / "b"), "--", PYTHON, "-c", "import torch",
                   timeout=240)
    assert loud.returncode == 0, loud.stderr
    assert "nvml collector unavailable" in loud.stderr and "not available here" in loud.stderr


def test_a_bad_field_separator_is_a_usage_line(tmp_path):
    proc = run_cli("run", "-x", "", "-o", str(tmp_path / "a"), "--", "true")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "-x takes a field separator" in proc.stderr


def test_interval_rows_on_a_pipe_nobody_reads_never_hold_up_the_run(tmp_path):
    """-I 10 on a stderr pipe that is not read while the job runs (a CI step capturing output):
    the rows pass 64 KB, a full pipe's size, in about 2 s. The profiler must keep writing the
    run meanwhile: after 4.5 s, counterprof.load() of the still-running run sees at least 3.3 s
    of its 10 ms task-clock rows (the journal is at most a second behind; printing in line, the
    run stalled at ~2 s), and the run ends whole once the pipe is read."""
    import time
    run_dir = tmp_path / "r"
    proc = subprocess.Popen([*COUNTERPROF, "run", "-I", "10", "-o", str(run_dir), "--", PYTHON, "-c",
                             "import time\nt=time.time()\nwhile time.time()-t<6: sum(range(1000))"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(4.5)          # nothing read: the pipe filled long ago
        seen = counterprof.load(run_dir).samples()
        perf = [m for s, m in zip(seen["source"].to_pylist(), seen["metric"].to_pylist())
                if s == "perf" and m == "task-clock"]
        assert len(perf) > 330, f"only {len(perf)} task-clock rows in the run after 4.5 s of -I 10"
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"task-clock" in err
