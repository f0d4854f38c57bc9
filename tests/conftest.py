"""Shared fixtures: a real S3-compatible server on loopback (moto) and a Snakemake runner."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "config" / "experiments"


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

    def new_bucket(self) -> str:
        import boto3

        name = f"rlbuild-{uuid.uuid4().hex[:12]}"
        client = boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials(self))
        client.create_bucket(Bucket=name)
        # Snakemake's S3 plugin deletes a bucket when its last object goes; a sentinel keeps it.
        client.put_object(Bucket=name, Key=".keep", Body=b"")
        return name


def _boto_credentials(server: S3Server) -> dict[str, str]:
    env = server.env()
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(endpoint=f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3_root(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the loopback S3 server, reached by rlbuild code through SNAKEMAKE_STORAGE_S3_*."""
    for name, value in s3_server.env().items():
        if name.startswith("SNAKEMAKE_STORAGE_S3_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return f"s3://{s3_server.new_bucket()}"


@dataclass(frozen=True)
class S3:
    server: S3Server
    bucket: str

    @property
    def env(self) -> dict[str, str]:
        return self.server.env()

    def read(self, key: str) -> str:
        import boto3

        env = self.env
        client = boto3.client(
            "s3",
            endpoint_url=self.server.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )
        return client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()


@pytest.fixture
def s3(s3_server: S3Server) -> S3:
    return S3(s3_server, s3_server.new_bucket())


def run_snakemake(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    snakefile: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real `snakemake` CLI of this venv against the repository's Snakefile (or another copy's)."""
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile or REPO / "Snakefile"), *args]
    return subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def copy_of_the_code(target: Path) -> Path:
    """The repository's files as a fresh clone of this working tree would have them (no venv, no results)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        source, copy = REPO / name, target / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            copy.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, copy)
    return target
