"""The HTTP server behind `--serve`: one thread, and every connection bounded in time and number.

prometheus_client's start_http_server gives each connection a thread of its own and reads it
with no timeout: a client that connects and sends nothing holds one of the profiler's threads
for as long as it likes, and a thousand such clients a thousand threads. This server is one
thread over a selector (the profiler's thread count does not move with its connections):

- at most MAX_CONNECTIONS are open at once. One more, and the connection that has waited longest
  without sending its request is closed to make room (a scraper sends its request as it
  connects, so an idle socket is what gives way); when every open one is being answered, the
  newcomer is closed;
- a request (its line and headers, at most MAX_REQUEST_BYTES) must arrive within
  REQUEST_TIMEOUT_S of the connection, and the answer be taken within RESPONSE_TIMEOUT_S, or the
  connection is closed;
- one request per connection (`Connection: close`; Prometheus opens one per scrape); after the
  answer, what the client still sends is read and dropped for up to LINGER_S, then it is closed.

`GET /metrics` (or `/`) answers with the registry in the format the Accept header asks for
(prometheus_client's choose_encoder: OpenMetrics for Prometheus, the text format otherwise),
gzipped when the client accepts it; `HEAD` the same without the body; another path is 404,
another method 405, a request that is not HTTP 400, one too large 431. A scrape that fails
inside the registry is a 500 and the server goes on.
"""
from __future__ import annotations

import gzip
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

MAX_CONNECTIONS = 32
REQUEST_TIMEOUT_S = 5.0
RESPONSE_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 16384
LINGER_S = 2.0         # after the answer, what the client still sends is read and dropped this long
_ACCEPTS_PER_WAKE = 64
_READING, _WRITING, _LINGERING = 0, 1, 2

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


class _Conn:
    __slots__ = ("sock", "inbox", "outbox", "deadline", "state", "since")

    def __init__(self, sock: socket.socket, now: float, deadline: float):
        self.sock = sock
        self.inbox = bytearray()
        self.outbox = memoryview(b"")
        self.since = now
        self.deadline = deadline
        self.state = _READING


class MetricsServer:
    """Serves a prometheus_client registry on (host, port) from one daemon thread until close().
    Binds in the constructor: an address in use raises OSError there."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, *,
                 max_connections: int = MAX_CONNECTIONS,
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 response_timeout_s: float = RESPONSE_TIMEOUT_S):
        self.registry = registry
        self.max_connections = max(1, int(max_connections))
        self.request_timeout_s = request_timeout_s
        self.response_timeout_s = response_timeout_s
        family, _, _, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)      # close-on-exec: the workload never has it
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.server_port: int = sock.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = False
        self._conns: dict[socket.socket, _Conn] = {}
        self._thread = threading.Thread(target=self._serve, name="counterprof-serve", daemon=True)
        self._thread.start()

    # -- the loop ----------------------------------------------------------------------------

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        self._sel = sel
        try:
            while not self._stopping:
                timeout = None
                if self._conns:
                    timeout = max(0.0, min(c.deadline for c in self._conns.values()) - time.monotonic())
                for key, events in sel.select(timeout):
                    if key.fileobj is self._wake_r:
                        continue
                    if key.fileobj is self._sock:
                        self._accept()
                        continue
                    # still open? (one closed earlier in this round is gone from _conns)
                    conn = self._conns.get(key.fileobj) if isinstance(key.fileobj, socket.socket) else None
                    if conn is None:
                        continue
                    try:
                        if conn.state == _WRITING:
                            if events & selectors.EVENT_WRITE:
                                self._write(conn)
                        elif events & selectors.EVENT_READ:
                            self._read(conn)
                    except Exception:          # one connection's trouble never ends the server
                        self._close(conn)
                now = time.monotonic()
                for conn in [c for c in self._conns.values() if c.deadline <= now]:
                    self._close(conn)
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            sel.close()

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:           # EMFILE and the like: the backlog keeps it, try again later
                return
            sock.setblocking(False)
            now = time.monotonic()
            if len(self._conns) >= self.max_connections:
                # what gives way: a connection already answered, else the longest idle one
                done = [c for c in self._conns.values() if c.state == _LINGERING]
                idle = [c for c in self._conns.values() if c.state == _READING]
                if not done and not idle:
                    sock.close()
                    continue
                self._close(min(done or idle, key=lambda c: c.since))
            conn = _Conn(sock, now, now + self.request_timeout_s)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._close(conn)
            return
        if conn.state == _LINGERING:          # answered: what else comes is dropped
            return
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbox.find(b"\n\n")
        if end < 0:
            if len(conn.inbox) > MAX_REQUEST_BYTES:
                self._answer(conn, 431, b"request too large\n", "text/plain; charset=utf-8")
            return
        self._respond(conn, bytes(conn.inbox[:end]))

    def _respond(self, conn: _Conn, head: bytes) -> None:
        lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._answer(conn, 400, b"not an HTTP request\n", "text/plain; charset=utf-8")
            return
        method, target, _version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            self._answer(conn, 405, b"only GET and HEAD\n", "text/plain; charset=utf-8",
                         extra=[("Allow", "GET, HEAD")])
            return
        if path not in ("/metrics", "/"):
            self._answer(conn, 404, b"not found: the metrics are at /metrics\n", "text/plain; charset=utf-8")
            return
        try:
            from prometheus_client.exposition import choose_encoder
            encoder, ctype = choose_encoder(headers.get("accept", ""))
            body = encoder(self.registry)
        except Exception as exc:             # a scrape must never take the profiler down
            self._answer(conn, 500, f"could not collect the metrics: {type(exc).__name__}\n".encode(),
                         "text/plain; charset=utf-8")
            return
        extra = []
        if "gzip" in headers.get("accept-encoding", "").lower():
            body = gzip.compress(body, compresslevel=6)
            extra.append(("Content-Encoding", "gzip"))
        self._answer(conn, 200, body, ctype, extra=extra, head_only=method == "HEAD")

    def _answer(self, conn: _Conn, status: int, body: bytes, ctype: str,
                extra: list[tuple[str, str]] | None = None, head_only: bool = False) -> None:
        fields = [("Content-Type", ctype), ("Content-Length", str(len(body))), ("Connection", "close"),
                  *(extra or [])]
        head = f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
        conn.outbox = memoryview(head.encode("latin-1") + (b"" if head_only else body))
        conn.inbox = bytearray()
        conn.state = _WRITING
        conn.deadline = time.monotonic() + self.response_timeout_s
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        conn.outbox = conn.outbox[n:]
        if not conn.outbox:
            # the answer is sent: say so (FIN) and read what the client still sends until it
            # closes, so that closing with unread bytes (a reset) cannot lose the answer
            conn.sock.shutdown(socket.SHUT_WR)
            conn.state = _LINGERING
            conn.deadline = time.monotonic() + LINGER_S
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    # -- the owner's side ----------------------------------------------------------------------

    def connections(self) -> int:
        """How many connections are open now (for tests and diagnostics)."""
        return len(self._conns)

    def close(self) -> None:
        """Stop serving: the thread ends, every connection and the listening socket close."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()
