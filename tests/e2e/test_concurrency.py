"""Two runs of one version into one bucket at the same time: exactly one builds, the other refuses in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbuild.dev.s3 import S3Server
from tests.conftest import REPO, run_snakemake
from tests.e2e.test_pipeline import VERSION, small_experiment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _s3(server: S3Server):
    import boto3

    return boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    )


def test_two_concurrent_runs_of_one_version_build_it_once(tmp_path: Path, s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    experiment = small_experiment(tmp_path, max_steps=4)
    storage = ["--default-storage-provider", "s3", "--default-storage-prefix", f"s3://{bucket}/team"]
    args = ["--cores", "2", *storage, "--config", f"experiment={experiment}", f"versions=['{VERSION}']"]
    first_dir, second_dir = tmp_path / "alice", tmp_path / "bob"  # two checkouts: Snakemake's lock is per checkout
    first_dir.mkdir(), second_dir.mkdir()
    env = {**os.environ, **s3_server.env()}
    first = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *args],
        cwd=first_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client, leases = _s3(s3_server), "team/tiny-addition/.leases/"
    deadline = time.monotonic() + 300
    while not client.list_objects_v2(Bucket=bucket, Prefix=leases).get("KeyCount") and first.poll() is None:
        assert time.monotonic() < deadline, "the first run never took its leases"
        time.sleep(0.2)

    planned = run_snakemake(["-n", *args[2:]], cwd=second_dir, env=s3_server.env())
    assert planned.returncode == 0 and "lease held     train/v2026.09.21: run " in planned.stderr
    started = time.monotonic()
    second = run_snakemake(args, cwd=second_dir, env=s3_server.env())
    assert second.returncode != 0
    assert time.monotonic() - started < 120
    refusals = [line for line in second.stderr.splitlines() if "is being built by run" in line]
    assert len(refusals) == 1, second.stderr[-3000:]

    output, _ = first.communicate(timeout=600)
    assert first.returncode == 0, output[-3000:]
    logs = client.list_objects_v2(Bucket=bucket, Prefix="team/tiny-addition/tmp/ttl=14d/train/")["Contents"]
    attempts = {o["Key"].split("/attempts/logs/")[1].split("/")[0] for o in logs if "/attempts/logs/" in o["Key"]}
    assert len(attempts) == 1  # trained once
    assert not client.list_objects_v2(Bucket=bucket, Prefix=leases).get("KeyCount")  # released at the end
