"""A loopback HTTP proxy in front of the test S3 server that can stall or drop chosen requests: a hostile network
for storage-fault tests. Requests are forwarded whole; a fault matches a method and a path fragment."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}
MAX_STALL_S = 600.0


@dataclass
class Fault:
    """Requests whose method is `method` and whose path holds `fragment`, from the `after`-th on, are stalled
    (held without an answer until `release()`) or dropped (the connection closed without an answer)."""

    method: str
    fragment: str
    action: str  # "stall" | "drop"
    after: int = 0
    seen: int = 0
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def applies(self, method: str, path: str) -> bool:
        if method != self.method or self.fragment not in path:
            return False
        self.seen += 1
        if self.seen <= self.after or self.released.is_set():
            return False
        self.hits += 1
        return True

    def release(self) -> None:
        self.released.set()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def log_message(self, *_: object) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().strip().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self) -> None:
        body = self._body()
        fault = self.server.fault
        if fault is not None and fault.applies(self.command, self.path):
            if fault.action == "stall":
                fault.released.wait(MAX_STALL_S)
            self.close_connection = True
            self.connection.close()
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(self.server.upstream_host, self.server.upstream_port, timeout=60)
        upstream.request(self.command, self.path, body=body, headers=headers)
        response = upstream.getresponse()
        data = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        # A HEAD answer has no body but announces the object's length.
        length = response.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", length)
        self.end_headers()
        self.wfile.write(data)
        upstream.close()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True
    fault: Fault | None = None
    upstream_host: str
    upstream_port: int


@contextmanager
def s3_proxy(upstream: str) -> Iterator[_Proxy]:
    """A proxy on a free loopback port forwarding to `upstream` (http://host:port); its URL is `proxy.url`."""
    parts = urlsplit(upstream)
    proxy = _Proxy(("127.0.0.1", 0), _Handler)
    proxy.upstream_host, proxy.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
    proxy.url = f"http://127.0.0.1:{proxy.server_address[1]}"  # type: ignore[attr-defined]
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        if proxy.fault is not None:
            proxy.fault.release()
        proxy.shutdown()
        proxy.server_close()


def wait_until(condition: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()
