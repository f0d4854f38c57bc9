"""Identity: which differences between a stored record and the config's are drift, for which versions."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rlbuild.contracts.tinymodel import DEFAULT_VARIANT
from rlbuild.core.errors import IdentityDriftError, RuntimeDriftError
from rlbuild.plan.identity import check_drift, check_training_runtime
from rlbuild.plan.preflight import parse_experiment
from rlbuild.plan.resolve import build_records, resolve
from tests.spine.experiments import experiment

VERSION = "2026.09.21"
TIS = {"trainer": {"algorithm": {"use_tis": True, "tis_imp_ratio_cap": 2.0}}}


def _records(digest: str, **changes: Any) -> dict[str, dict[str, Any]]:
    base = {"source": "artifact:base_model", "revision": DEFAULT_VARIANT}  # the revision names the tiny variant
    doc = experiment(model={**base, "tokenizer": base}, **changes)
    plan = resolve(parse_experiment(doc, "test"), VERSION, "s3://b/p")
    return build_records(plan.experiment, VERSION, plan.recipe, digest)


def test_a_code_change_is_not_drift_of_a_completed_fixed_version() -> None:
    stored, now = _records("old-digest"), _records("new-digest")
    assert stored["base_model"]["fingerprint"] != now["base_model"]["fingerprint"]
    # The digest reaches stage_model only through base_model's identity, and launch through stage_model's.
    stale = check_drift(VERSION, now, stored.get)
    assert stale == sorted(set(now) - {"stage_data"})  # staged data does not depend on the code


def test_a_configuration_change_is_drift_even_with_a_code_change() -> None:
    stored, now = _records("old-digest"), _records("new-digest", seed=7)
    with pytest.raises(IdentityDriftError) as info:
        check_drift(VERSION, now, stored.get)
    assert info.value.drifts["launch"]["seed"] == (42, 7)
    assert all("source_digest" not in name for fields in info.value.drifts.values() for name in fields)


def test_a_recipe_key_added_since_with_its_default_is_not_drift() -> None:
    """A version completed before the schema gained a key (the loop, agent episodes' turns) stays usable: its
    record lacks the key, and the default names what its code did. Stated otherwise, the key is drift."""
    stored, now = _records("old-digest"), _records("new-digest")
    for kind in ("launch", "train", "export", "eval"):  # (they may share one fields mapping)
        stored[kind]["fields"]["recipe"]["trainer"].pop("entrypoint", None)
        stored[kind]["fields"]["recipe"]["environment"].pop("max_turns", None)
    assert "launch" in check_drift(VERSION, now, stored.get)  # rebuilt for a dev version, usable for a fixed one
    changed = _records("new-digest", runtime__entrypoint="fully_async", role_plan__train_batch_size=16, recipe=TIS)
    with pytest.raises(IdentityDriftError) as info:
        check_drift(VERSION, changed, stored.get)
    assert info.value.drifts["launch"]["recipe.trainer.entrypoint"] == (None, "fully_async")


def test_dev_rebuilds_on_any_difference() -> None:
    stored, now = _records("old-digest"), _records("new-digest", seed=7)
    assert "launch" in check_drift("dev", now, stored.get)


def _launch_record(digest: str) -> dict[str, Any]:
    return {"fields": {"runtime": {"source_digest": digest}}}


def test_training_must_run_the_code_its_launch_document_names() -> None:
    check_training_runtime(VERSION, "d" * 64, _launch_record("d" * 64), None)
    check_training_runtime(VERSION, "d" * 64, None, None)  # the launch will be resolved by this code
    with pytest.raises(
        RuntimeDriftError, match=r"resolved by runtime e{16}, but the code now is d{16}.*resolve_launch"
    ):
        check_training_runtime(VERSION, "d" * 64, _launch_record("e" * 64), None)
    with pytest.raises(RuntimeDriftError, match=r"checkpoints written by runtime e{16}.*allow_retrain=true"):
        check_training_runtime(VERSION, "d" * 64, _launch_record("d" * 64), {"runtime_source_digest": "e" * 64})
    check_training_runtime("dev", "d" * 64, _launch_record("e" * 64), None)  # dev follows its fingerprint


def test_dev_checkpoints_live_under_their_configuration() -> None:
    doc = experiment()
    other = copy.deepcopy(doc)
    other["recipe"]["trainer"] = {"policy": {"optimizer_config": {"lr": 1.0e-5}}}
    first = resolve(parse_experiment(doc, "a"), "dev", "s3://b/p")
    second = resolve(parse_experiment(other, "b"), "dev", "s3://b/p")
    assert first.launch.artifacts.checkpoint_root != second.launch.artifacts.checkpoint_root
    assert first.records["train"]["fingerprint"] in first.launch.artifacts.checkpoint_root
    fixed = resolve(parse_experiment(doc, "a"), VERSION, "s3://b/p")
    assert fixed.launch.artifacts.checkpoint_root.endswith(f"/train/v{VERSION}/checkpoints")
