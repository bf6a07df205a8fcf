"""`run --serve` / `top --serve`: the live window as OpenMetrics, scraped during a real run on
loopback and read back with prometheus_client's own parsers (and promtool where Debian's
prometheus package is installed)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from helpers import COUNTERPROF, PYTHON, free_port, run_cli

pytest.importorskip("prometheus_client", reason="prometheus-client is in the test extra")
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

# spins on the CPU until the test says stop (a file appears), so every scrape lands in the run
SPIN = """
import os, sys, time
stop, end = sys.argv[1], time.monotonic() + 120
while not os.path.exists(stop) and time.monotonic() < end:
    x = 0
    for _ in range(20000):
        x += 1
"""


def scrape(port: int, openmetrics: bool = False) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if openmetrics:
        req.add_header("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        ctype = r.headers["Content-Type"]
        body = r.read().decode()
    assert ctype.startswith("application/openmetrics-text" if openmetrics else "text/plain"), ctype
    return body


def families(text: str, parser=text_string_to_metric_families) -> dict:
    return {f.name: f for f in parser(text)}


def wait_for(port: int, names, proc: subprocess.Popen, timeout: float = 90.0) -> dict:
    """Scrape until each family in `names` has a sample with a value above 0."""
    names = [names] if isinstance(names, str) else names
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            fams = families(scrape(port))
        except OSError as exc:        # not listening yet (the interpreter is still starting)
            last = exc
            time.sleep(0.2)
            continue
        if all(fams.get(n) is not None and any(s.value > 0 for s in fams[n].samples) for n in names):
            return fams
        time.sleep(0.2)
    raise AssertionError(f"not all of {names} > 0 within {timeout} s (last error: {last})")


@pytest.fixture
def served_run(tmp_path):
    port = free_port()
    stop = tmp_path / "stop"
    script = tmp_path / "spin.py"
    script.write_text(SPIN)
    proc = subprocess.Popen([*COUNTERPROF, "run", "-I", "50", "-e", "task-clock,page-faults",
                             "--serve", str(port), "-o", str(tmp_path / "run"), "--",
                             PYTHON, str(script), str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield port, proc, stop
    finally:
        stop.touch()
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_a_real_run_is_scraped_with_the_clients_own_parser(served_run):
    port, proc, stop = served_run
    fams = wait_for(port, ["counterprof_task_clock_seconds", "counterprof_proc_rss_bytes",
                           "counterprof_system_cpu_util_ratio"], proc)
    tc = fams["counterprof_task_clock_seconds"]
    assert tc.type == "counter"
    (sample,) = [s for s in tc.samples if s.name == "counterprof_task_clock_seconds_total"]
    assert sample.labels == {"rank": "0", "entity": "process", "Hostname": socket.gethostname()}
    first = sample.value
    assert 0 < first < 1000                                    # seconds, not ns
    assert fams["counterprof_page_faults"].type == "counter"
    for gauge in ("counterprof_proc_rss_bytes", "counterprof_system_cpu_util_ratio"):
        f = fams[gauge]
        assert f.type == "gauge" and f.samples and set(f.samples[0].labels) == {"rank", "entity", "Hostname"}
    util = fams["counterprof_system_cpu_util_ratio"].samples[0].value
    assert 0 <= util <= 1.0                                    # a percent as a ratio
    run_info = fams["counterprof_run_info"].samples[0].labels      # classic text: info is a gauge
    assert "spin.py" in run_info["command"]
    # the verdict (info) and its classes' shares, from the live view's own function
    deadline = time.monotonic() + 60
    while "counterprof_verdict_info" not in fams or not fams.get("counterprof_time_share_ratio") \
            or not fams["counterprof_time_share_ratio"].samples:
        assert time.monotonic() < deadline, "no verdict with shares was served"
        time.sleep(0.3)
        fams = families(scrape(port))
    v = fams["counterprof_verdict_info"].samples[0].labels
    assert v["verdict"] and v["Hostname"] == socket.gethostname()
    assert set(v) == {"verdict", "Hostname"}                 # no figures: a bounded label
    shares = {s.labels["class"]: s.value for s in fams["counterprof_time_share_ratio"].samples}
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.02) and all(0 <= x <= 1 for x in shares.values())
    # a counter only grows
    later = families(scrape(port))["counterprof_task_clock_seconds"].samples[0].value
    assert later >= first
    # OpenMetrics for a scraper that asks for it, valid to the strict OpenMetrics parser
    om = scrape(port, openmetrics=True)
    assert om.rstrip().endswith("# EOF")
    omf = families(om, parse_openmetrics)
    assert omf["counterprof_task_clock_seconds"].type == "counter"
    assert omf["counterprof_verdict"].type == "info"
    stop.touch()
    out, errs = proc.communicate(timeout=120)
    assert proc.returncode == 0, errs
    assert f"serving OpenMetrics on http://127.0.0.1:{port}/metrics" in errs   # loopback by default
    with pytest.raises(OSError):
        scrape(port)                                            # stopped with the run


@pytest.mark.skipif(not shutil.which("promtool"),
                    reason="promtool is not installed (Debian: prometheus; .ci/run installs it)")
def test_promtool_accepts_the_exposition(served_run):
    port, proc, _ = served_run
    wait_for(port, "counterprof_task_clock_seconds", proc)
    check = subprocess.run(["promtool", "check", "metrics"], input=scrape(port), text=True,
                           capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_top_serves_the_machine_view(tmp_path):
    port = free_port()
    proc = subprocess.Popen([*COUNTERPROF, "top", "--duration", "60", "--serve", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        fams = wait_for(port, "counterprof_system_cpu_util_ratio", proc)
        assert fams["counterprof_run_info"].samples[0].labels["command"] == "(none)"
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_bad_or_taken_addresses_are_refused_before_the_workload_starts(tmp_path):
    marker = tmp_path / "ran"
    cmd = ["--", PYTHON, "-c", f"open({str(marker)!r}, 'w')"]
    bad = run_cli("run", "--serve", "localhost:http", "-o", str(tmp_path / "a"), *cmd)
    assert bad.returncode == 2 and "--serve" in bad.stderr and "port" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run_cli("run", "--serve", str(port), "-o", str(tmp_path / "b"), *cmd)
    assert busy.returncode == 2 and "cannot listen there" in busy.stderr, busy.stderr
    assert not marker.exists() and not (tmp_path / "b").exists()
