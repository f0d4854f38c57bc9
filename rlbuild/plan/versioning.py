"""Every check, reported in one place: the experiment's, as checked once where it was loaded (series.check), with
where its jobs run (`experiment_problems`), and one version's, resolved and checked against what storage already
holds for it (`checked_plan`).

The dry run (`snakemake -n`), every real run and `rlbuild check` all go through these two functions (`check_all`
runs both, for `rlbuild check`; the Snakefile runs the first while it is parsed and the second in the rules' input
functions), so they refuse exactly the same things: a bad version, every preflight violation, node sizes over the
profile's limits, what the scheduler itself refuses (a partition that cannot hold the gang, where it answers),
configuration drift of a completed artifact of a fixed version, training that would start or resume under other
code than its launch document or checkpoints name, engine geometry the staged model cannot shard, and a chain of
jobs that the step time measured by an earlier run of the version would not fit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from rlbuild.contracts import checkpoints
from rlbuild.contracts.artifacts import (
    ARTIFACTS,
    METRICS_NAME,
    CorruptDocumentError,
    arm_key,
    artifact,
    check_document,
    experiment_root,
    is_mutable,
    parse_record,
    version_of,
)
from rlbuild.contracts.metricstream import Rate, measured_rate, median_step_time, parse_lines, read_run_metrics
from rlbuild.core.errors import PreflightError, RlbuildError, Violation
from rlbuild.core.inventory import Inventory
from rlbuild.core.storage import join
from rlbuild.plan import scheduling, series
from rlbuild.plan.identity import DERIVED_KINDS, check_drift, check_training_runtime, record_drift
from rlbuild.plan.modelcheck import check_model
from rlbuild.plan.planview import Cost
from rlbuild.plan.resolve import Plan, resolve_checked
from rlbuild.plan.series import CheckedExperiment
from rlbuild.plan.spec import Experiment, NodeLimits, check_node_sizes


class StoredRecords:
    """The identity records storage holds for one version, read once, all at once: which exist from the
    inventory's listing (shared by every version of a run), those that do concurrently."""

    def __init__(self, plan: Plan, inventory: Inventory | None = None) -> None:
        self.plan = plan
        self.inventory = inventory or Inventory(plan.experiment_root)
        self.read = cache(self._read)

    def uri(self, kind: str) -> str:
        return self.plan.uri(artifact(kind).record(self.plan.key_of(kind)))

    def _read(self, kind: str) -> dict[str, Any] | None:
        """The stored record of `kind`, its seal verified (CorruptDocumentError otherwise)."""
        texts = self.inventory.read_texts([self.uri(k) for k in dict.fromkeys([*self.plan.records, kind])])
        text = texts[self.uri(kind)]
        return None if text is None else parse_record(text, self.uri(kind))

    def document_uri(self, kind: str, name: str) -> str:
        return self.plan.uri(artifact(kind).file(self.plan.key_of(kind), name))

    def verify_documents(self, kind: str) -> None:
        """The control documents the stored record of `kind` describes match its digests (CorruptDocumentError
        naming the first that does not); read through the inventory, so a later run reads none of them again."""
        record = self.read(kind)
        if record is None:
            return
        uris = {name: self.document_uri(kind, name) for name in artifact(kind).documents}
        texts = self.inventory.read_texts(list(uris.values()))
        for name, uri in uris.items():
            text = texts[uri]
            check_document(record, name, uri, None if text is None else text.encode("utf-8"))

    def corrupt(self) -> dict[str, CorruptDocumentError]:
        """{kind: the error} for every stored record, or control document it describes, that changed after it was
        written (`rlbuild status` shows them `corrupt`; the checks of a fixed version refuse them)."""
        found: dict[str, CorruptDocumentError] = {}
        for kind in self.plan.records:
            try:
                self.verify_documents(kind)
            except CorruptDocumentError as error:
                found[kind] = error
        return found

    def complete(self, kind: str) -> bool:
        """The record is written last: an artifact with a record is complete."""
        return self.read(kind) is not None


def read_ahead(inventory: Inventory, keys: list[str]) -> None:
    """Read at once, concurrently, what the checks of these version keys read from storage in the common case:
    every artifact's record and the control documents it describes (status and the checks of a fixed version
    verify them), the staged model's config.json and the training's metrics. Each version's checks then find
    them read; asked version by version they would be one round trip after another (350 for 50 versions on a
    fresh machine). What the listings show absent costs no request; anything else a check needs it reads as it
    asks."""
    names: list[str] = []
    for key in keys:
        for a in ARTIFACTS:
            names += [a.record(key), *(a.file(key, name) for name in a.documents)]
        names += [f"{artifact('stage_model').path(key)}/config.json", artifact("train").file(key, METRICS_NAME)]
    uris = [join(inventory.root, name) for name in dict.fromkeys(names)]
    inventory.read_texts([uri for uri in uris if inventory.listed(uri)])


def rebuild_reasons(plan: Plan, read_record: Callable[[str], Mapping[str, Any] | None]) -> list[str]:
    """Why the stored artifacts of a `dev` version are rebuilt, by field: Snakemake's own reason names only the
    fingerprint marker it misses. A kind built from the launch document whose fields changed with it says so."""
    if not is_mutable(plan.version):
        return []  # a fixed version refuses changed configuration (check_drift) and keeps working after code edits
    stale, drifts = record_drift(plan.records, read_record)
    lines: list[str] = []
    for kind in stale:
        diff = drifts.get(kind)
        if not diff:
            why = "the code that builds it changed (runtime source digest)"
        elif kind in DERIVED_KINDS and diff == drifts.get("launch"):
            why = "its launch document changed (above)"
        else:
            shown = [f"{field} {_value(old)} -> {_value(new)}" for field, (old, new) in list(diff.items())[:3]]
            why = "; ".join(shown) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
        lines.append(f"  rebuilds       {kind}: {why}")
    return lines


def _value(value: Any, limit: int = 40) -> str:
    text = "(none)" if value is None else json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def experiment_problems(checked: CheckedExperiment, node_limits: NodeLimits, *, ask_scheduler: bool) -> list[Violation]:
    """Every version-independent check: the experiment's and its arms' (made when it was checked, series.check)
    and where its jobs run; `ask_scheduler`: also what the scheduler itself says (where it answers)."""
    problems = list(checked.violations) + series.series_problems(checked)
    return problems + _placement_problems(checked.experiment, node_limits, ask_scheduler=ask_scheduler)


def _placement_problems(experiment: Experiment, node_limits: NodeLimits, *, ask_scheduler: bool) -> list[Violation]:
    """The checks of where jobs run that resolving a version does not make: node sizes, and what the scheduler
    itself says (a partition that cannot hold the gang)."""
    problems = check_node_sizes(experiment, node_limits)
    if experiment.execution.publish:
        from rlbuild.stages.publish import token_problem  # huggingface_hub only where publishing is on

        if missing := token_problem(os.environ):
            problems.append(missing)
    return problems + scheduling.cluster_problems(experiment) if ask_scheduler else problems


def check_all(
    checked: CheckedExperiment, versions: list[str], storage_root: str, source: str, node_limits: NodeLimits
) -> tuple[dict[str, Plan], list[Violation], dict[str, Cost]]:
    """What `rlbuild check` runs: every check the dry run makes, the partition included; (plans, violations, each
    plan's training cost). Each version's `checked_plan` reports the experiment's own violations (resolving
    refuses them); one inventory of the experiment root answers them all. A version of a series is each of
    its arms; a problem of any arm is reported for all arms at once (each named `arms.<arm>.<field>`)."""
    experiment = checked.experiment
    problems = _placement_problems(experiment, node_limits, ask_scheduler=True) + series.series_problems(checked)
    plans: dict[str, Plan] = {}
    costs: dict[str, Cost] = {}
    if any(p.field.startswith("arms") for p in problems):
        return plans, problems, costs
    inventory = Inventory(experiment_root(storage_root, experiment.name))
    keys = series.expand(checked, versions)
    read_ahead(inventory, keys)
    for key in keys:
        try:
            plans[key] = checked_plan(checked, key, storage_root, source, inventory=inventory)
            costs[key] = plan_cost(experiment, plans[key], inventory)
        except RlbuildError as exc:
            problems += exc.as_violations()
    return plans, problems, costs


def measured_step_time(experiment: Experiment, plan: Plan) -> float | None:
    """Seconds per step measured by an earlier run of this version (a previous link, a crashed attempt), when the
    experiment's scheduler sizes its jobs by the step time and the experiment states none."""
    if not scheduling.sized_by_step_time(experiment) or scheduling.declared_step_time(experiment) is not None:
        return None
    artifacts = plan.launch.artifacts
    return median_step_time(read_run_metrics(artifacts.metrics_uri, artifacts.metrics_segments_root)[0])


def checked_plan(
    checked: CheckedExperiment,
    version: str,
    storage_root: str,
    source: str,
    *,
    measure: bool = True,
    inventory: Inventory | None = None,
) -> Plan:
    """Resolve `version` of a checked experiment and check it against storage; raise the first class of problems
    found (all of them).

    `measure`: also check the chain against the step time an earlier run measured (inside a job it is off: a
    later link reads the earlier links' metrics, and the submitter has checked). `inventory`: what storage holds
    under the experiment root, shared by the versions of one run (else listed for this version)."""
    experiment = checked.experiment
    problems = series.key_problems(checked, version)
    if problems:
        raise PreflightError(source, problems)
    plan = resolve_checked(checked, version, storage_root, source)
    stored = StoredRecords(plan, inventory)
    check_drift(version, plan.records, stored.read)
    if not is_mutable(version):
        _refuse_corrupt(source, stored)
    if not stored.complete("train"):
        stored.verify_documents("launch")  # the training will read it: an edited one trains something else
        ckpts = plan.uri(plan.temporary.checkpoints)
        state = checkpoints.latest_state(ckpts) if stored.inventory.may_exist(ckpts) else None
        runtime = plan.launch.runtime
        check_training_runtime(version, runtime.source_digest, stored.read("launch"), state, runtime.image)
    staged_model = artifact("stage_model").path(plan.key_of("stage_model"))
    text = stored.inventory.read_text(plan.uri(f"{staged_model}/config.json"))
    model_config = None if text is None else json.loads(text)
    problems = check_model(model_config or {}, experiment, plan.recipe)
    if problems:
        raise PreflightError(f"{source} (staged model {staged_model})", problems)
    measured = measure and measured_step_time(experiment, plan)
    if measured:
        problems = scheduling.problems(experiment, plan.recipe, measured)
        if problems:
            raise PreflightError(f"{source} (step time measured in an earlier run)", problems)
    return plan


def _refuse_corrupt(source: str, stored: StoredRecords) -> None:
    """A fixed version is built once: a control document of a completed artifact that no longer matches its
    record (a hand-edited launch.yaml) would make Snakemake's mtime trigger rebuild, or quietly keep, something
    else than the records say. Every such file, at once, as `rlbuild status` names it `corrupt`."""
    corrupt = stored.corrupt()
    if corrupt:
        raise PreflightError(
            f"{source} (what storage holds for version {stored.plan.version})",
            [Violation(kind, f"{e.where} is corrupt: {e.problem}", e.fix) for kind, e in corrupt.items()],
        )


def plan_cost(experiment: Experiment, plan: Plan, inventory: Inventory) -> Cost:
    """The training's cost (`planview.Cost`), from the first source that knows the rate: this version key's
    own earlier run, the series' smoke for the same version, a declared step time. Metrics are read through the
    inventory: a run that wrote none costs no request."""
    t = plan.experiment.topology
    gpus, steps = t.num_nodes * t.gpus_per_node, plan.recipe.trainer.max_steps
    smoke = series.smoke_arm(experiment)
    keys = dict.fromkeys([plan.version, *([arm_key(version_of(plan.version), smoke)] if smoke else [])])
    uris = {key: plan.uri(artifact("train").file(key, METRICS_NAME)) for key in keys}
    texts = inventory.read_texts(list(uris.values()))
    for key, uri in uris.items():
        text = texts[uri]
        rate = measured_rate(parse_lines(text)[0]) if text is not None else None
        if rate is not None:
            return Cost(gpus, steps, rate, f"measured by train/v{key}")
    execution = plan.experiment.execution
    stated = [(execution.step_time_s, "execution.step_time_s"), scheduling.declared_step_time(plan.experiment)]
    declared = next((s for s in stated if s is not None and s[0] is not None), None)
    if declared is not None:
        return Cost(gpus, steps, Rate(0.0, declared[0]), f"declared in {declared[1]}, start-up not counted")
    return Cost(gpus, steps, None, "")
