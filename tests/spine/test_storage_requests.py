"""A dry run on S3 asks storage a number of times that does not grow with the versions (issue 21): counted by a
loopback proxy in front of the moto server, never timed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from rlbuild.core import storage
from rlbuild.core.inventory import Inventory
from rlbuild.dev.built import write_built
from rlbuild.dev.s3 import S3Server, latency_proxy
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.series import check
from rlbuild.plan.versioning import checked_plan, plan_cost, read_ahead
from tests.conftest import EXPERIMENTS, run_snakemake

VERSIONS = [f"2026.01.{day:02d}" for day in range(1, 29)] + [f"2026.02.{day:02d}" for day in range(1, 23)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_50_version_dry_run_asks_storage_at_most_2_requests_a_version(
    tmp_path: Path, s3_server: S3Server, s3_root: str
) -> None:
    write_built(EXPERIMENTS / "tiny-addition.yaml", f"{s3_root}/built", VERSIONS)
    with latency_proxy(s3_server.endpoint, 0.0) as proxy:
        env = {"SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": proxy.endpoint, "RLBUILD_CACHE_DIR": str(tmp_path / "cache")}

        def dry_run(state: str, versions: list[str]) -> tuple[int, str]:
            config = tmp_path / f"{state}-{len(versions)}.yaml"
            config.write_text(yaml.safe_dump({"versions": versions}))
            storage = ["--default-storage-provider", "s3", "--default-storage-prefix", f"{s3_root}/{state}"]
            proxy.reset()
            done = run_snakemake(["-n", "--configfile", str(config), *storage], cwd=tmp_path, env=env)
            assert done.returncode == 0, done.stderr[-3000:]
            return proxy.reset(), done.stdout + done.stderr

        first, out = dry_run("built", VERSIONS)
        assert "Nothing to be done" in out  # the built state is complete: every record matched, no drift
        one, _ = dry_run("built", VERSIONS[:1])
        fifty, out = dry_run("built", VERSIONS)
        assert "Nothing to be done" in out
        empty, out = dry_run("empty", VERSIONS)
        assert "eval" in out and "Nothing to be done" not in out
    extra = len(VERSIONS) - 1
    assert (fifty - one) / extra <= 2, f"built: {one} requests for 1 version, {fifty} for {len(VERSIONS)}"
    assert (empty - one) / extra <= 2, f"empty: {empty} requests for {len(VERSIONS)} versions (built 1: {one})"
    # The first dry run after the build reads each of the 7 records of a version and the 6 control documents they
    # describe (a fixed version's are verified) once, concurrently, and keeps them by ETag; later runs read none.
    assert first - fifty <= 13 * len(VERSIONS), f"first run {first}, later {fifty}"


def test_the_checks_of_built_versions_find_every_record_read_at_once(
    tmp_path: Path, s3_server: S3Server, s3_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh machine's first dry run (or `rlbuild check`) of built versions reads every version's records in one
    concurrent batch, not version after version: after `read_ahead`, each version's checks and cost ask nothing."""
    monkeypatch.setenv("RLBUILD_CACHE_DIR", str(tmp_path / "cache"))
    file, versions = EXPERIMENTS / "tiny-addition.yaml", VERSIONS[:3]
    checked = check(load_experiment(file))
    experiment = checked.experiment
    write_built(file, f"{s3_root}/built", versions)
    with latency_proxy(s3_server.endpoint, 0.0) as proxy:
        monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL", proxy.endpoint)
        inventory = Inventory(storage.join(f"{s3_root}/built", experiment.name))
        read_ahead(inventory, versions)
        assert proxy.reset() >= 7 * len(versions)  # the listings, then every record
        for version in versions:
            plan = checked_plan(checked, version, f"{s3_root}/built", str(file), inventory=inventory)
            assert plan_cost(experiment, plan, inventory).gpus == 1
        assert proxy.reset() == 0


def test_the_inventory_answers_from_its_listings_and_sees_what_changed_after_them(tmp_path: Path) -> None:
    root = str(tmp_path / "exp")
    storage.write_text(f"{root}/launch/v1.identity.json", '{"fingerprint": "a"}')
    storage.write_text(f"{root}/tmp/ttl=7d/train/v1/checkpoints/latest", "3")
    inventory = Inventory(root)
    texts = inventory.read_texts([f"{root}/launch/v1.identity.json", f"{root}/launch/v2.identity.json"])
    assert texts == {f"{root}/launch/v1.identity.json": '{"fingerprint": "a"}', f"{root}/launch/v2.identity.json": None}
    assert inventory.may_exist(f"{root}/tmp/ttl=7d/train/v1/checkpoints")
    assert not inventory.may_exist(f"{root}/tmp/ttl=7d/train/v2/checkpoints")  # no per-version request
    assert inventory.may_exist(f"{root}/launch") and not inventory.may_exist(f"{root}/export/v1")
    storage.write_text(f"{root}/launch/v2.identity.json", "{}")  # written after the listing
    assert inventory.read_text(f"{root}/launch/v2.identity.json") is None  # the listing's answer, until asked
    assert inventory.changed(f"{root}/launch/v2.identity.json")
    assert not inventory.changed(f"{root}/launch/v1.identity.json")


def test_the_inventory_lists_every_folder_at_once_and_asks_nothing_of_folders_the_root_lacks(
    s3_server: S3Server, s3_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = f"{s3_root}/exp"
    storage.write_text(f"{root}/launch/v1.identity.json", "{}")
    storage.write_text(f"{root}/train/v1/terminal.json", "{}")
    with latency_proxy(s3_server.endpoint, 0.0) as proxy:
        monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL", proxy.endpoint)
        inventory = Inventory(root)
        inventory.list_ahead()  # the root's names, then each folder it holds
        assert inventory.get(f"{root}/train/v1/terminal.json") is not None
        assert inventory.get(f"{root}/launch/v1.identity.json") is not None
        assert inventory.get(f"{root}/export/v1/manifest.json") is None  # no export/ under the root: no request
        assert proxy.reset() == 3
        # s3fs is not needed to name what a folder holds (status lists the coordinators so): one request.
        assert storage.list_names(root) == ["launch", "train"]
        assert storage.list_names(f"{root}/train/v1") == ["terminal.json"]
        assert storage.list_names(f"{root}/nothing") == []
        assert proxy.reset() == 3


def test_a_failed_listing_ahead_fails_the_first_question(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(uri: str) -> set[str]:
        raise storage.StorageUnavailableError(f"storage did not answer list_children({uri})")

    monkeypatch.setattr(storage, "list_children", unreachable)
    inventory = Inventory(str(tmp_path))
    inventory.list_ahead()
    with pytest.raises(storage.StorageUnavailableError, match="did not answer"):
        inventory.get(f"{tmp_path}/launch/v1.identity.json")


def test_short_storage_waits_hold_for_their_block_only_and_never_over_a_users_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RLBUILD_S3_ATTEMPTS", raising=False)
    monkeypatch.setenv("RLBUILD_S3_READ_TIMEOUT_S", "45")  # the user's own
    with storage.waits({"RLBUILD_S3_ATTEMPTS": "1", "RLBUILD_S3_READ_TIMEOUT_S": "3"}):
        assert storage.deadline_s() == 1 * (storage.CONNECT_TIMEOUT_S + 45) + 1
    assert "RLBUILD_S3_ATTEMPTS" not in os.environ
    assert storage.deadline_s() == storage.S3_ATTEMPTS * (storage.CONNECT_TIMEOUT_S + 45) + 2 ** (
        storage.S3_ATTEMPTS - 1
    )
