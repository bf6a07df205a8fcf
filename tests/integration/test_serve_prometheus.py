"""`run --serve` scraped by a real Prometheus server (Debian's `prometheus`) for a while, then
asked through its HTTP API what it stored: the series stay the same from scrape to scrape (none
per scrape: the verdict is one series), ratios are gauges in 0..1 with OpenMetrics units, and
the GPU series join DCGM-exporter's on (Hostname, gpu, UUID).

The GPUs are tests/fake_nvml.py's (CI has none), two of them with CUDA_VISIBLE_DEVICES=1, so
the workload's gpu:0 is NVML's GPU 1: DCGM-exporter labels a GPU by NVML's index. The DCGM side
is a small exporter serving what DCGM-exporter serves for those two GPUs (its metric name, its
labels and its percent scale), made from the same fake GPUs."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import fake_nvml
from helpers import PYTHON, REPO, free_port

pytest.importorskip("prometheus_client", reason="prometheus-client is in the test extra")
pytestmark = [pytest.mark.required,
              pytest.mark.skipif(not shutil.which("prometheus") or not shutil.which("promtool"),
                                 reason="the prometheus server is not installed (Debian: "
                                        "apt-get install prometheus; .ci/run installs it)")]

TESTS = str(REPO / "tests")
SCRAPE_S = 1          # the scrape interval
WINDOW_S = 20         # how long the series are watched once everything is there
# two GPUs as the fake's constructor makes them, in the counterprof process and here alike
GPUS = ("[fake_nvml.hopper(uuid='GPU-1b2c3d4e-0000-4000-8000-00000000000a', "
        "bus_id='00000000:17:00.0', util=20), "
        "fake_nvml.hopper(uuid='GPU-5f6a7b8c-0000-4000-8000-00000000000b', "
        "bus_id='00000000:3A:00.0', util=60, nvlinks=2)]")

# `counterprof ARGS` in an interpreter whose pynvml is the fake, with the second GPU's tensor
# cores busier and idler every 1.5 s as a real job's are (the verdict's evidence quotes that
# figure: put in a label, each value would be a new series); its utilization stays put, so the
# DCGM side can serve the same figure
BOOT = """
import sys, threading, time
sys.path.insert(0, {tests!r})
import fake_nvml
nv = fake_nvml.FakeNvml({gpus})
sys.modules["pynvml"] = nv

def vary():
    for k in range(1000):
        with nv.lock:
            nv.gpus[1].gpm_values["NVML_GPM_METRIC_ANY_TENSOR_UTIL"] = (40.0, 55.0, 70.0, 85.0)[k % 4]
        time.sleep(1.5)

threading.Thread(target=vary, daemon=True).start()
from counterprof.cli import main
sys.exit(main(sys.argv[1:]))
"""
VERDICTS = {"compute-bound", "memory-bound", "collectives-bound", "host-bound", "unknown"}

SPIN = """
import os, sys, time
stop, end = sys.argv[1], time.monotonic() + 240
while not os.path.exists(stop) and time.monotonic() < end:
    x = 0
    for _ in range(20000):
        x += 1
"""


def dcgm_exposition(gpus, hostname: str) -> bytes:
    """What DCGM-exporter serves for these GPUs' utilization: DCGM_FI_DEV_GPU_UTIL in percent,
    labelled gpu (NVML's index), UUID, pci_bus_id, device, modelName, Hostname."""
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for i, g in enumerate(gpus):
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="{g.uuid}",pci_bus_id="{g.bus_id}",'
                     f'device="nvidia{i}",modelName="{g.name}",Hostname="{hostname}"}} {g.util}')
    return ("\n".join(lines) + "\n").encode()


def serve(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Prom:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path: str, **params) -> dict:
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(url, timeout=10) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        data = self.api("query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))
        assert data["resultType"] == "vector", data
        return data["result"]


def wait_until(what: str, check, timeout: float, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args[:3]} ended early: " + (p.stderr.read() if p.stderr else "")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what}")


def scrape(port: int, openmetrics: bool) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if openmetrics:
        req.add_header("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


@pytest.fixture
def scraped_run(tmp_path):
    """Prometheus scraping a counterprof run (fake GPUs) and a DCGM-like exporter every second."""
    hostname = socket.gethostname()
    gpus = eval(GPUS, {"fake_nvml": fake_nvml})        # the same two GPUs the run sees
    dcgm = serve(dcgm_exposition(gpus, hostname))
    cp_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(f"""
global:
  scrape_interval: {SCRAPE_S}s
  scrape_timeout: {SCRAPE_S}s
scrape_configs:
  - job_name: counterprof
    static_configs: [{{targets: ['127.0.0.1:{cp_port}']}}]
  - job_name: dcgm
    static_configs: [{{targets: ['127.0.0.1:{dcgm.server_port}']}}]
""")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stop = tmp_path / "stop"
    (tmp_path / "spin.py").write_text(SPIN)
    code = BOOT.format(tests=TESTS, gpus=GPUS)
    run = subprocess.Popen([PYTHON, "-c", code, "run", "-I", "200", "--serve", f"127.0.0.1:{cp_port}",
                            "-o", str(tmp_path / "run"), "--", PYTHON, str(tmp_path / "spin.py"), str(stop)],
                           env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield Prom(prom_port), cp_port, run, prom, gpus, hostname
    finally:
        stop.touch()
        for p in (run, prom):
            if p is prom:
                p.terminate()
            try:
                p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        dcgm.shutdown()
        dcgm.server_close()


def test_prometheus_stores_bounded_series_ratios_and_joins_dcgm(scraped_run):
    prom, cp_port, run, prom_proc, gpus, hostname = scraped_run
    procs = (run, prom_proc)
    wait_until("Prometheus ready", lambda: urllib.request.urlopen(f"{prom.base}/-/ready", timeout=5).status == 200,
               60, procs)
    # everything there: both targets up, the GPU's series and a verdict that is not "no data yet"
    wait_until("counterprof scraped with GPU series and a verdict", lambda: (
        len(prom.query('up{job=~"counterprof|dcgm"} == 1')) == 2
        and prom.query("counterprof_gpu_util_ratio")
        and prom.query('counterprof_verdict_info{verdict!="unknown"}')
        and prom.query("counterprof_time_share_ratio")), 90, procs)
    t0 = time.time()
    time.sleep(WINDOW_S + 0.5)
    t1 = time.time()
    window = f"{int(t1 - t0)}s"
    assert run.poll() is None, run.stderr.read() if run.stderr else ""

    # Prometheus scraped it all along (an OpenMetrics body that failed to parse would be up 0)
    scrapes = prom.query(f'count_over_time(up{{job="counterprof"}}[{window}])', t1)
    assert float(scrapes[0]["value"][1]) >= WINDOW_S / SCRAPE_S * 0.75, scrapes
    assert float(prom.query(f'min_over_time(up{{job="counterprof"}}[{window}])', t1)[0]["value"][1]) == 1

    # bounded: every series seen in the window is one served at its end (none per scrape)
    seen = prom.api("series", **{"match[]": '{__name__=~"counterprof_.+"}', "start": f"{t0:.3f}",
                                 "end": f"{t1:.3f}"})
    now = prom.query('{__name__=~"counterprof_.+"}', t1)
    per_name_seen: dict[str, int] = {}
    for s in seen:
        per_name_seen[s["__name__"]] = per_name_seen.get(s["__name__"], 0) + 1
    per_name_now: dict[str, int] = {}
    for s in now:
        per_name_now[s["metric"]["__name__"]] = per_name_now.get(s["metric"]["__name__"], 0) + 1
    assert len(per_name_now) >= 40, sorted(per_name_now)          # host, perf, threads, nvml, verdict
    assert per_name_seen == per_name_now
    # the query: the verdict is one series over the whole window
    verdicts = prom.query(f"count_over_time(counterprof_verdict_info[{window}])", t1)
    assert len(verdicts) == 1, verdicts
    assert float(verdicts[0]["value"][1]) >= WINDOW_S / SCRAPE_S * 0.75
    assert set(verdicts[0]["metric"]) == {"Hostname", "instance", "job", "verdict"}
    # every label value from a bounded set: no pid, tid or CPU number, no figure
    free_form = ("run", "command", "instance", "pci_bus_id")       # a path, a command line, addresses
    for s in seen:
        for key, value in s.items():
            assert key in free_form or not re.search(r"(pid|tid|cpu)[: ]\d|\d%|\d\.\d", value), s
    assert {s["verdict"] for s in seen if s["__name__"] == "counterprof_verdict_info"} <= VERDICTS

    # shares and every _ratio: gauges, in 0..1, and the shares add up to the whole
    meta = prom.api("metadata")
    assert meta["counterprof_time_share_ratio"][0]["type"] == "gauge"
    ratio_names = [n for n in per_name_now if n.endswith("_ratio")]
    assert len(ratio_names) >= 10, ratio_names
    for name in ratio_names:
        for fn in ("min_over_time", "max_over_time"):
            got = prom.query(f"{fn}({name}[{window}])", t1)
            assert got and all(0 <= float(r["value"][1]) <= 1 for r in got), (fn, name, got)
    total = prom.query("sum(counterprof_time_share_ratio)", t1)
    assert float(total[0]["value"][1]) == pytest.approx(1.0, abs=0.02)
    # the units came through OpenMetrics (# UNIT is in no other format), each the name's end
    units = {name: m[0].get("unit", "") for name, m in meta.items() if name.startswith("counterprof_")}
    for name, unit in units.items():
        assert not unit or name.endswith("_" + unit), (name, unit)
        assert meta[name][0]["type"] in ("counter", "gauge", "info"), (name, meta[name])
    assert {"seconds", "bytes", "ratio", "watts", "hertz", "joules", "celsius"} <= set(units.values())
    assert units["counterprof_task_clock_seconds"] == "seconds"
    assert meta["counterprof_task_clock_seconds"][0]["type"] == "counter"

    # the join with DCGM-exporter's series: one row, NVML's GPU 1 (the workload's gpu:0), and
    # the same utilization on one scale
    joined = prom.query("counterprof_gpu_util_ratio - on(Hostname, gpu, UUID) group_left(modelName) "
                        "(DCGM_FI_DEV_GPU_UTIL / 100)", t1)
    assert len(joined) == 1, joined
    row = joined[0]["metric"]
    assert (row["gpu"], row["UUID"], row["Hostname"]) == ("1", gpus[1].uuid, hostname)
    assert row["modelName"] == gpus[1].name
    assert float(joined[0]["value"][1]) == pytest.approx(0.0, abs=1e-9)
    # the model and the CUDA ordinal from counterprof's own GPU info
    info = prom.query('counterprof_gpu_util_ratio * on(Hostname, gpu, UUID) group_left(model_name, '
                      'cuda_device) counterprof_gpu_info', t1)
    assert [(r["metric"]["model_name"], r["metric"]["cuda_device"]) for r in info] == [(gpus[1].name, "0")]
    assert float(info[0]["value"][1]) == pytest.approx(gpus[1].util / 100)
    # one NVLink series per link of that GPU, as its own label
    links = prom.query("counterprof_gpu_nvlink_tx_bytes_total", t1)
    assert sorted(r["metric"]["nvlink"] for r in links) == ["0", "1"]

    # promtool finds no problem in the classic text format; the OpenMetrics body is the one
    # Prometheus parsed above (promtool reads only the classic format)
    text = scrape(cp_port, openmetrics=False)
    check = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                           capture_output=True, timeout=60)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr
    assert "counterprof_gpu_util_ratio{" in text
