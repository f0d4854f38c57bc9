"""A real S3-compatible server on loopback (moto), for the Makefile's local cluster, the tests and the benchmarks."""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def env(self) -> dict[str, str]:
        """Credentials the way users pass them: environment variables, never flags."""
        return {
            "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": self.endpoint,
            "SNAKEMAKE_STORAGE_S3_ACCESS_KEY": "testing-access-key",
            "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "testing-secret-key",
            "AWS_ACCESS_KEY_ID": "testing-access-key",
            "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self) -> object:
        """A boto3 S3 client with this server's credentials."""
        import boto3

        env = self.env()
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )

    def new_bucket(self) -> str:
        name = f"rlbuild-{uuid.uuid4().hex[:12]}"
        client = self.client()
        client.create_bucket(Bucket=name)  # type: ignore[attr-defined]
        # Snakemake's S3 plugin deletes a bucket when its last object goes; a sentinel keeps it.
        client.put_object(Bucket=name, Key=".keep", Body=b"")  # type: ignore[attr-defined]
        return name


@contextmanager
def s3_server(*, quiet: bool = False) -> Iterator[S3Server]:
    """A moto server on a free loopback port for the duration of the block; `quiet`: without its request log."""
    from moto.server import ThreadedMotoServer

    if quiet:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log would drown Snakemake's
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(endpoint=f"http://{host}:{port}")
    finally:
        server.stop()


@dataclass
class LatencyProxy:
    """A loopback TCP proxy in front of an HTTP server that holds every request `latency_s` before passing it
    on, and counts the requests (a real bucket's round trip, seen from the client)."""

    endpoint: str
    requests: int = 0

    def reset(self) -> int:
        """The requests counted since the last reset; the count starts again from zero."""
        counted, self.requests = self.requests, 0
        return counted


@contextmanager
def latency_proxy(upstream: str, latency_s: float) -> Iterator[LatencyProxy]:
    """A `LatencyProxy` to `upstream` (`http://host:port`) on a free loopback port for the duration of the block.

    HTTP/1.1 clients (boto3, s3fs) send one request at a time on a connection: the proxy reads a request's head
    and its `Content-Length` body, counts it, waits, and forwards it; answers flow back unchanged."""
    import socketserver
    import threading

    host, port = upstream.removeprefix("http://").rsplit(":", 1)
    lock = threading.Lock()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            client = self.request
            server = socket.create_connection((host, int(port)))
            threading.Thread(target=_pump, args=(server, client), daemon=True).start()
            buffered = b""
            try:
                while (request := _next_request(client, buffered)) is not None:
                    sent, buffered = request
                    with lock:
                        proxy.requests += 1
                    time.sleep(latency_s)
                    server.sendall(sent)
            except OSError:
                return
            finally:
                server.close()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    listener = Server(("127.0.0.1", 0), Handler)
    proxy = LatencyProxy(endpoint=f"http://127.0.0.1:{listener.server_address[1]}")
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        listener.shutdown()
        listener.server_close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        sink.close()


def _next_request(client: socket.socket, buffered: bytes) -> tuple[bytes, bytes] | None:
    """(the next whole request as the server gets it, what was read past it); None when the client is done. An
    `Expect: 100-continue` is answered here, so the client sends its body and the server sees a plain request."""
    while b"\r\n\r\n" not in buffered:
        if not (chunk := client.recv(65536)):
            return None
        buffered += chunk
    head, _, buffered = buffered.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if any(line.lower() == b"expect: 100-continue" for line in lines):
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        lines = [line for line in lines if line.lower() != b"expect: 100-continue"]
    length = next((int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length:")), 0)
    while len(buffered) < length:
        if not (chunk := client.recv(65536)):
            return None
        buffered += chunk
    return b"\r\n".join(lines) + b"\r\n\r\n" + buffered[:length], buffered[length:]
