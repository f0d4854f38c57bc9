"""Storage faults, through a proxy on loopback that stalls or drops chosen S3 requests: a run fails within a
bounded time (or succeeds), no half-written artifact ever reads as complete, and a rerun completes."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError

from rlbuild.contracts import checkpoints
from rlbuild.contracts.launch import load_launch
from rlbuild.core import storage
from rlbuild.dev.launches import write_test_launch
from rlbuild.dev.s3 import S3Server
from rlbuild.workflow import bound_plugin_requests
from tests.conftest import REPO, run_snakemake
from tests.e2e.test_pipeline import VERSION, small_experiment
from tests.faults import Fault, s3_proxy, wait_until
from tests.spine.test_graph import job_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _keys(server: S3Server, bucket: str, prefix: str) -> set[str]:
    import boto3

    client = boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    )
    return {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}


def test_a_dropped_upload_or_a_kill_mid_upload_leaves_no_complete_looking_artifact_and_a_rerun_completes(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    experiment = small_experiment(tmp_path)
    target = f"stage/model/v{VERSION}"
    record = f"p/tiny-addition/{target}.identity.json"
    args = ["--default-storage-provider", "s3", "--default-storage-prefix", f"s3://{bucket}/p"]
    args += ["--storage-s3-retries", "2", "--config", f"experiment={experiment}", "--", target]
    with s3_proxy(s3_server.endpoint) as proxy:
        # The third file of the staged model never arrives: its connection is dropped, again and again.
        proxy.fault = Fault("PUT", f"/p/tiny-addition/{target}/", "drop", after=2)
        env = {**s3_server.env(), "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": proxy.url}
        started = time.monotonic()
        failed = run_snakemake(["--cores", "2", *args], cwd=tmp_path, env=env, timeout=600)
        assert failed.returncode != 0
        assert time.monotonic() - started < 300, "the failure must come within a bounded time"
        assert proxy.fault.hits >= 1
    assert record not in _keys(s3_server, bucket, "p/tiny-addition/stage/model/")  # not complete-looking
    fresh = tmp_path / "fresh-checkout"
    fresh.mkdir()
    planned = run_snakemake(["-n", *args], cwd=fresh, env=s3_server.env())
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert job_counts(planned.stdout + planned.stderr).get("stage_model") == 1, planned.stdout + planned.stderr

    # SIGKILL of Snakemake's group while the staged model uploads (its third file stalls), in the same checkout:
    # the README's recipe (`--unlock`, then `--rerun-incomplete`) must recover without removing anything by hand
    # (Snakemake leaves the local copy of the half-uploaded folder in .snakemake/storage).
    with s3_proxy(s3_server.endpoint) as proxy:
        proxy.fault = Fault("PUT", f"/p/tiny-addition/{target}/", "stall", after=2)
        env = {**os.environ, **s3_server.env(), "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": proxy.url}
        command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "2", *args]
        process = subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
        assert wait_until(lambda: proxy.fault.hits >= 1 or process.poll() is not None, 300)
        assert process.poll() is None, "the upload never started"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert record not in _keys(s3_server, bucket, "p/tiny-addition/stage/model/")
    assert any((tmp_path / ".snakemake" / "storage").rglob("config.json")), "the local copy the kill leaves"

    assert run_snakemake(["--unlock", *args], cwd=tmp_path, env=s3_server.env()).returncode == 0
    rerun = run_snakemake(["--cores", "2", "--rerun-incomplete", *args], cwd=tmp_path, env=s3_server.env())
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Traceback" not in rerun.stderr
    assert record in _keys(s3_server, bucket, "p/tiny-addition/stage/model/")
    assert not _keys(s3_server, bucket, "p/tiny-addition/.leases/"), "no lease outlives the run"


def _trainer(launch: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--launch", str(launch)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_stalled_checkpoint_upload_fails_in_bounded_time_and_training_resumes(
    tmp_path: Path, s3_server: S3Server, s3_root: str
) -> None:
    recipe = {"trainer": {"max_steps": 3, "ckpt_interval": 1}}
    launch_path = write_test_launch(tmp_path, recipe=recipe, storage_root=f"{s3_root}/p")
    launch = load_launch(str(launch_path))
    root = launch.artifacts.checkpoint_root
    with s3_proxy(s3_server.endpoint) as proxy:
        proxy.fault = Fault("PUT", "/checkpoints/global_step_2/", "stall")
        env = {**s3_server.env(), "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": proxy.url}
        env |= {"RLBUILD_S3_CONNECT_TIMEOUT_S": "3", "RLBUILD_S3_READ_TIMEOUT_S": "3", "RLBUILD_S3_ATTEMPTS": "2"}
        started = time.monotonic()
        stalled = _trainer(launch_path, env)
        elapsed = time.monotonic() - started
    assert stalled.returncode != 0
    assert elapsed < 240, f"a stall must end in a bounded failure, took {elapsed:.0f} s"
    errors = [line for line in stalled.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not answer" in errors[0], stalled.stderr[-3000:]
    assert checkpoints.latest_step(root) == 1
    assert checkpoints.read_state(checkpoints.step_uri(root, 2)) is None  # incomplete: never resumed

    resumed = _trainer(launch_path, s3_server.env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {checkpoints.step_uri(root, 1)} at step 1" in resumed.stdout + resumed.stderr
    assert storage.read_json(launch.artifacts.terminal_manifest_uri)["global_step"] == 3


@contextmanager
def moto_process() -> Iterator[tuple[S3Server, subprocess.Popen[bytes]]]:
    """A moto server in a process of its own, so that a test can stop it (SIGSTOP) like a hung endpoint."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = S3Server(endpoint=f"http://127.0.0.1:{port}")

    def answers() -> bool:
        with socket.socket() as client:
            return client.connect_ex(("127.0.0.1", port)) == 0

    try:
        assert wait_until(answers, 60, poll=0.2), "moto did not start"
        yield server, process
    finally:
        process.kill()
        process.wait(timeout=30)


def _snakemake_plugin(server: S3Server, retries: int, local: Path) -> Any:
    """The S3 storage plugin's provider as Snakemake makes it, with the timeouts rlbuild's workflow gives it."""
    from snakemake_storage_plugin_s3 import StorageProvider, StorageProviderSettings

    settings = StorageProviderSettings(endpoint_url=server.endpoint, access_key="k", secret_key="s", retries=retries)
    provider = StorageProvider(local_prefix=local, logger=logging.getLogger(), settings=settings)
    bound_plugin_requests(provider)
    return provider


def test_a_stopped_storage_server_ends_each_storage_path_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP of the S3 server (it accepts connections and never answers): every fsspec and boto3 path fails with
    one StorageUnavailableError within (connect + read) x attempts plus backoff, and `rlbuild status` says
    `storage unreachable` within seconds instead of blocking."""
    waits = {"RLBUILD_S3_CONNECT_TIMEOUT_S": "1", "RLBUILD_S3_READ_TIMEOUT_S": "2", "RLBUILD_S3_ATTEMPTS": "2"}
    bound = 2 * (1 + 2) + 2  # attempts x (connect + read) + botocore's backoff between the two attempts
    with moto_process() as (server, process):
        root = f"s3://{server.new_bucket()}/p"
        for name, value in {**server.env(), "SNAKEMAKE_STORAGE_S3_REGION": "us-east-1", **waits}.items():
            monkeypatch.setenv(name, value)
        storage.write_text(f"{root}/a.txt", "x")
        calls = {
            "read_text": lambda: storage.read_text(f"{root}/a.txt"),
            "exists": lambda: storage.exists(f"{root}/a.txt"),
            "list_names": lambda: storage.list_names(root),
            "write_text": lambda: storage.write_text(f"{root}/b.txt", "z"),
            "read_tagged (boto3)": lambda: storage.read_tagged(f"{root}/a.txt"),
            "put_dir": lambda: storage.put_dir(folder, f"{root}/folder"),
            "get_dir": lambda: storage.get_dir(f"{root}/folder", tmp_path / "copy"),
            "remove": lambda: storage.remove(f"{root}/folder"),
        }
        folder = tmp_path / "folder"
        folder.mkdir()
        (folder / "f.bin").write_bytes(b"x" * 1000)
        storage.put_dir(folder, f"{root}/folder")
        plugin = _snakemake_plugin(server, retries=1, local=tmp_path / "plugin")  # 2 attempts, like rlbuild's
        os.kill(process.pid, signal.SIGSTOP)
        try:
            for name, call in calls.items():
                started = time.monotonic()
                with pytest.raises(storage.StorageUnavailableError, match="did not answer"):
                    call()
                elapsed = time.monotonic() - started
                print(f"{name}: StorageUnavailableError after {elapsed:.1f} s (bound {bound} s)")
                assert elapsed < 3 * bound, f"{name} took {elapsed:.0f} s"
            # Snakemake's own S3 requests (its uploads, its existence probes), through its plugin's client.
            started = time.monotonic()
            with pytest.raises(BotoCoreError):
                plugin.s3c.meta.client.head_object(Bucket=root.split("/")[2], Key="p/a.txt")
            elapsed = time.monotonic() - started
            print(f"snakemake's S3 plugin: a botocore error after {elapsed:.1f} s (bound {bound} s)")
            assert elapsed < 3 * bound, f"the plugin's request took {elapsed:.0f} s"
            env = {k: v for k, v in os.environ.items() if k not in waits}  # status's own, shorter wait
            started = time.monotonic()
            status = subprocess.run(
                [sys.executable, "-m", "rlbuild", "status", "--storage-root", root],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            elapsed = time.monotonic() - started
            print(f"rlbuild status: storage unreachable after {elapsed:.1f} s")
        finally:
            os.kill(process.pid, signal.SIGCONT)
    assert status.returncode == 1 and "storage unreachable" in status.stderr, status.stderr[-2000:]
    assert "Traceback" not in status.stderr
    assert elapsed < 30, f"rlbuild status took {elapsed:.0f} s"
