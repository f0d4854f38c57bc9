"""A real S3-compatible server on loopback (moto), for `make iris-local`, the tests and the benchmarks."""

from __future__ import annotations

import logging
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
