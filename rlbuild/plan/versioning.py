"""One version of an experiment, resolved and checked against what storage already holds for it.

The dry run (`snakemake -n`), every real run and `rlbuild check` all go through `checked_plan`, so they refuse
exactly the same things: a bad version, every preflight violation, configuration drift of a completed artifact of
a fixed version, training that would start or resume under other code than its launch document or checkpoints
name, and engine geometry the staged model cannot shard.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from rlbuild.contracts import checkpoints
from rlbuild.contracts.artifacts import artifact
from rlbuild.core.errors import PreflightError
from rlbuild.core.storage import read_json
from rlbuild.plan.identity import check_drift, check_training_runtime
from rlbuild.plan.modelcheck import check_model
from rlbuild.plan.resolve import Plan, resolve
from rlbuild.plan.spec import Experiment, check_version, load_experiment


class StoredRecords:
    """The identity records storage holds for one version, read once each."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.read = cache(self._read)

    def _read(self, kind: str) -> dict[str, Any] | None:
        return read_json(self.plan.uri(artifact(kind).record(self.plan.version)))

    def complete(self, kind: str) -> bool:
        """The record is written last: an artifact with a record is complete."""
        return self.read(kind) is not None


def checked_plan(experiment: Experiment, version: str, storage_root: str, source: str) -> Plan:
    """Resolve `version` and check it against storage; raise the first class of problems found (all of them)."""
    problems = check_version(version)
    if problems:
        raise PreflightError(source, problems)
    plan = resolve(experiment, version, storage_root, source=source)
    stored = StoredRecords(plan)
    check_drift(version, plan.records, stored.read)
    if not stored.complete("train"):
        state = checkpoints.latest_state(plan.uri(plan.temporary.checkpoints))
        check_training_runtime(version, plan.launch.runtime.source_digest, stored.read("launch"), state)
    staged_model = artifact("stage_model").path(version)
    model_config = read_json(plan.uri(f"{staged_model}/config.json"))
    problems = check_model(model_config or {}, experiment, plan.recipe)
    if problems:
        raise PreflightError(f"{source} (staged model {staged_model})", problems)
    return plan


def check_file(path: Path, version: str, storage_root: str) -> Plan:
    return checked_plan(load_experiment(path), version, storage_root, str(path))
