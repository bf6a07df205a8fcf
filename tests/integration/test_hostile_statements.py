"""The smaller wrong statements of issue 12 (items 17-20): each is what a user is told, checked
the way the user meets it (the CLI in a subprocess)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from helpers import COUNTERPROF, PYTHON, run_cli
from kineto_traces import X, write_trace


def test_run_refuses_a_duration_that_is_not_positive(tmp_path):
    p = run_cli("run", "-a", "--duration", "-1", "-o", str(tmp_path / "r"))
    assert p.returncode == 2 and "--duration must be a positive number" in p.stderr
    assert not (tmp_path / "r").exists()


def test_with_stderr_closed_nothing_meant_for_it_reaches_stdout(tmp_path):
    p = subprocess.run([*COUNTERPROF, "run", "-q", "-o", str(tmp_path / "r"), "--", "true"],
                       stdout=subprocess.PIPE, stderr=None, text=True, timeout=120,
                       preexec_fn=lambda: os.close(2))
    assert p.returncode == 0
    assert "run directory" not in p.stdout and "counterprof:" not in p.stdout, p.stdout


def test_import_says_each_files_reason_once(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schemaVersion": 1}')
    p = run_cli("import", str(bad), "-o", str(tmp_path / "r"))
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.splitlines() if "no traceEvents" in ln]
    assert len(lines) == 1, p.stderr


def test_a_run_of_cpu_ops_only_is_not_blamed_on_the_collectors(tmp_path):
    trace = write_trace(tmp_path / "t.json", [X("cpu_op", "aten::mm", 1000 + 10 * i, 5) for i in range(50)])
    run_cli("import", str(trace), "-o", str(tmp_path / "r"), check=True)
    p = run_cli("report", str(tmp_path / "r"))
    assert "every collector was unavailable or failed" not in p.stderr
    if p.returncode:
        assert "spans but none that the verdict reads" in p.stderr, p.stderr


def test_steps_whose_samples_are_unreadable_are_not_called_unjudgeable_spans(tmp_path):
    """A run's only samples file cut in half: its regions are spans the verdict reads, and what is
    missing is the samples (the report once said the spans were of kinds it does not read)."""
    run = tmp_path / "r"
    code = ("import time, counterprof\n"
            "for _ in range(5):\n"
            "    with counterprof.region('train step'):\n"
            "        time.sleep(0.05)\n")
    run_cli("run", "-q", "-o", str(run), "--", PYTHON, "-c", code, check=True)
    samples = sorted((run / "samples").rglob("*.parquet"))
    assert samples
    for f in samples:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    p = run_cli("report", str(run))
    assert "Traceback" not in p.stderr
    if p.returncode:
        assert "none that the verdict reads" not in p.stderr, p.stderr
        assert "no readable samples" in p.stderr and "unreadable" in p.stderr, p.stderr


def test_history_refuses_a_run_still_being_written(tmp_path):
    run = tmp_path / "live"
    proc = subprocess.Popen([*COUNTERPROF, "run", "-o", str(run), "--", PYTHON, "-c",
                             "import time; time.sleep(20)"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (run / "meta.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
        p = run_cli("history", "add", "--db", str(tmp_path / "h.duckdb"), str(run))
        assert p.returncode == 2 and "is still being written" in p.stderr, p.stderr
        assert not (tmp_path / "h.duckdb").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                    reason="needs root and setpriv to be another user")
def test_counting_another_users_process_names_its_owner(tmp_path):
    code = ("import errno, sys; from counterprof.ground.errors import perf_error; "
            "print(perf_error(errno.EACCES, 'task-clock', pid=int(sys.argv[1])))")
    p = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", PYTHON,
                        "-c", code, "1"], capture_output=True, text=True, timeout=60, cwd="/")
    assert "process 1 belongs to user root (uid 0), not to you" in p.stdout, p.stdout + p.stderr
    assert "seccomp" not in p.stdout


def test_a_tiny_workloads_peak_rss_is_not_the_profilers_copy(tmp_path):
    run_cli("run", "-q", "-o", str(tmp_path / "small"), "--", "sh", "-c", "exit 0", check=True)
    w = json.loads((tmp_path / "small" / "meta.json").read_text())["workload"]
    assert w["max_rss_bytes"] is None and "before exec" in w["max_rss_note"]
    run_cli("run", "-q", "-o", str(tmp_path / "big"), "--", PYTHON, "-c", "x = bytearray(300 * 2**20)",
            check=True)
    w = json.loads((tmp_path / "big" / "meta.json").read_text())["workload"]
    assert w["max_rss_bytes"] >= 300 * 2**20 and w["max_rss_note"] == ""
