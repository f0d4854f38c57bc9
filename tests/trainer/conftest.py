"""Fixtures for trainer tests: a moto S3 server reached through the SNAKEMAKE_STORAGE_S3_* variables."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def s3_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_ACCESS_KEY", "testing")
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_SECRET_KEY", "testing")
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="trainer-test")
    try:
        yield "s3://trainer-test"
    finally:
        server.stop()
