"""An HTTP proxy that injects transient faults in front of a real test server.

``proxy.inject("503", 2)`` makes the next two requests answer HTTP 503; ``"reset"`` closes the
connection with a TCP reset instead of answering; ``"stall"`` holds the request without an
answer until the client's read timeout fires; ``"reset-after"`` forwards the request (so the
server applies it) and then resets the connection instead of returning the answer. Every other request goes to the upstream server
unchanged, so clients see real behaviour once the fault clears.

``proxy.outage(down_s)`` is the server going away and coming back: the proxy stops listening
(new connections are refused), drops every open keep-alive connection, and listens again on the
same port ``down_s`` seconds later.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

FAULT_KINDS = ("503", "500", "reset", "stall", "reset-after")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "upgrade", "te"}


class FaultProxy:
    def __init__(self, upstream_url: str, stall_s: float = 30.0):
        parsed = urlparse(upstream_url)
        self.upstream = (parsed.hostname, parsed.port)
        self.stall_s = stall_s
        self.requests_seen = 0
        self.faults_served: list[str] = []
        self._faults: deque[str] = deque()
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0  # kept across an outage so clients reconnect to the same address
        self._open: set[socket.socket] = set()
        self.outages = 0

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def inject(self, kind: str, count: int = 1) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; use one of {FAULT_KINDS}")
        with self._lock:
            self._faults.extend([kind] * count)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def reset_counters(self) -> None:
        with self._lock:
            self.requests_seen = 0
            self.faults_served = []

    def _next_fault(self) -> str | None:
        with self._lock:
            self.requests_seen += 1
            fault = self._faults.popleft() if self._faults else None
            if fault:
                self.faults_served.append(fault)
            return fault

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._released.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def outage(self, down_s: float) -> None:
        """Stop answering for ``down_s`` seconds: connection refused, open connections dropped."""
        self.stop()
        with self._lock:
            for conn in list(self._open):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by its handler
            self.outages += 1
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        self._released.set()  # let stalled handlers finish
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy
    _aborted = False

    def log_message(self, format, *args):  # keep test output quiet
        return

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without NODELAY, Nagle's algorithm and
        # delayed ACKs add ~40 ms to every request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.owner._lock:
            self.owner._open.add(self.connection)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    # Skip trailer headers up to the blank line that ends the body.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        continue
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _abort_connection(self) -> None:
        # SO_LINGER 0 turns close() into a TCP reset: the client sees "connection reset by peer".
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self._aborted = True
        self.close_connection = True

    def finish(self) -> None:
        with self.owner._lock:
            self.owner._open.discard(self.connection)
        if not self._aborted:  # the socket is already gone after an injected reset
            super().finish()

    def _handle(self) -> None:
        body = self._read_body()
        fault = self.owner._next_fault()
        if fault in ("503", "500"):
            payload = b'{"message": "injected fault: service unavailable"}'
            self.send_response(int(fault))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return
        if fault == "reset":
            self._abort_connection()
            return
        if fault == "stall":
            self.owner._released.wait(self.owner.stall_s)
            self._abort_connection()
            return
        self._forward(body, answer=fault != "reset-after")

    def _forward(self, body: bytes, answer: bool = True) -> None:
        upstream = http.client.HTTPConnection(*self.owner.upstream, timeout=120)
        try:
            upstream.connect()
            upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            if not answer:
                self._abort_connection()
                return
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() in _HOP_BY_HOP or (key.lower() == "content-length" and self.command != "HEAD"):
                    continue
                self.send_header(key, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle
