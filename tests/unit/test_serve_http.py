"""counterprof/serve_http.py, the HTTP server behind --serve, on loopback with real sockets: one
thread whatever the connections, a cap on open ones (the idle give way), a read deadline that
a slow sender cannot stretch, the format negotiation of prometheus_client, 4xx for the rest."""
from __future__ import annotations

import gzip
import os
import socket
import threading
import time
import urllib.request

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the test extra")
from prometheus_client import CollectorRegistry, Counter

from counterprof.serve_http import MetricsServer


@pytest.fixture
def server():
    reg = CollectorRegistry()
    Counter("demo_events", "events", registry=reg).inc(3)
    srv = MetricsServer("127.0.0.1", 0, reg, max_connections=8, request_timeout_s=0.8, response_timeout_s=2)
    yield srv
    srv.close()


def _get(port: int, headers: dict | None = None, path: str = "/metrics"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    return urllib.request.urlopen(req, timeout=5)


def _closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_formats_as_prometheus_client_negotiates_them(server):
    with _get(server.server_port) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        assert "demo_events_total 3.0" in r.read().decode()
    with _get(server.server_port, {"Accept": "application/openmetrics-text; version=1.0.0"}) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert r.read().decode().endswith("# EOF\n")
    with _get(server.server_port, {"Accept-Encoding": "gzip"}) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert b"demo_events_total" in gzip.decompress(r.read())
    head = _raw(server.server_port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("request_bytes,status", [
    (b"POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", b"405"),
    (b"GET /other HTTP/1.0\r\n\r\n", b"404"),
    (b"\x16\x03\x01\x02\x00garbage\r\n\r\n", b"400"),
    (b"GET /metrics HTTP/1.1\r\nX-Long: " + b"a" * 100_000, b"431"),
])
def test_what_is_not_a_scrape_is_answered_4xx_and_the_server_goes_on(server, request_bytes, status):
    assert _raw(server.server_port, request_bytes).split(b" ")[1] == status
    with _get(server.server_port) as r:
        assert r.status == 200


def test_idle_connections_cost_no_thread_and_close_at_the_read_deadline(server):
    task = f"/proc/{os.getpid()}/task"
    before = len(os.listdir(task))
    idle = [socket.create_connection(("127.0.0.1", server.server_port), timeout=5) for _ in range(50)]
    time.sleep(0.2)
    assert len(os.listdir(task)) == before                  # one server thread, whatever the count
    assert server.connections() <= 8                         # the cap: the oldest idle gave way
    with _get(server.server_port) as r:                      # a scrape still gets in
        assert r.status == 200
    t0 = time.monotonic()
    assert all(_closed_within(s, 3) for s in idle)
    assert time.monotonic() - t0 < 2.5
    for s in idle:
        s.close()
    assert server.connections() == 0


def test_a_slow_sender_cannot_stretch_the_read_deadline(server):
    s = socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
    t0 = time.monotonic()
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    closed = None
    while time.monotonic() - t0 < 3:
        try:
            s.sendall(b"X")
        except OSError:
            closed = time.monotonic() - t0
            break
        if _closed_within(s, 0.1):
            closed = time.monotonic() - t0
            break
    s.close()
    assert closed is not None and 0.6 < closed < 2.0, closed


def test_a_failing_collector_is_a_500_not_a_dead_server():
    class Broken:
        def collect(self):
            raise RuntimeError("boom")

        def describe(self):
            return []
    reg = CollectorRegistry()
    reg.register(Broken())
    srv = MetricsServer("127.0.0.1", 0, reg)
    try:
        assert _raw(srv.server_port, b"GET /metrics HTTP/1.0\r\n\r\n").split(b" ")[1] == b"500"
        assert srv._thread.is_alive()
    finally:
        srv.close()


def test_close_stops_the_thread_and_frees_the_port(server):
    port = server.server_port
    held = socket.create_connection(("127.0.0.1", port), timeout=5)
    server.close()
    assert not server._thread.is_alive()
    assert _closed_within(held, 2)
    held.close()
    with socket.socket() as again:                           # the port can be bound again at once
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def test_a_taken_port_raises_at_construction():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            MetricsServer("127.0.0.1", taken.getsockname()[1], CollectorRegistry())
    assert not any(t.name == "counterprof-serve" and not t.daemon for t in threading.enumerate())
