"""An experiment checked once where it is loaded (`check`: the one call of preflight's check function for it and
for each of its arms), and a series: the arms of one experiment (`arms:` in its file), each a whole experiment
built under the version key `<version>@<arm>`, the stages they share staged once, a smoke arm that goes first.

An arm is the experiment with its overlay deep-merged in (mappings merge, anything else is replaced), checked as a
whole experiment (its problems named `arms.<arm>.<field>`). A shared stage (base model, staged model, staged data)
whose identity equals the experiment's as written is built under the plain version (`stage/data/v2026.09.21/`),
whatever arms there are, so adding or reordering arms never moves it; one an arm changes is built under the first
arm that has it. An arm whose whole experiment equals an earlier arm's is that arm's build (an alias: no job of
its own). In a series, the plain version names the shared stages only: its launch, train, export and eval are the
arms'."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlbuild.contracts.artifacts import arm_key, arm_of, version_of
from rlbuild.contracts.recipe import Recipe
from rlbuild.core.errors import PreflightError, Violation
from rlbuild.plan.identity import field_diff, recipe_defaults
from rlbuild.plan.preflight import check_experiment, parse_experiment
from rlbuild.plan.spec import Experiment, check_version

# What a smoke may change: how much is done, never what runs or how it is laid out (runtime, role plan,
# topology, the model and the data it hands from stage to stage). A data or eval size the tasks take is
# their source's revision, which is a handoff; the smoke's lever is the step budget.
SMOKE_MAY_CHANGE = frozenset(
    {
        "recipe.trainer.max_steps",
        "recipe.trainer.ckpt_interval",
        "recipe.trainer.eval_interval",
        "recipe.trainer.eval_before_train",
        "recipe.trainer.policy.optimizer_config.num_warmup_steps",
    }
)
SHARED_STAGES = ("base_model", "stage_model", "stage_data")
BASE_ARM = "base"  # the arm the comparison's deltas are against when one is named so (else the first arm)


@dataclass(frozen=True)
class Arm:
    name: str
    overlay: Mapping[str, Any]
    smoke: bool
    checked: CheckedExperiment | None  # None: the merged experiment does not validate (its problems say why)
    problems: tuple[Violation, ...]

    @property
    def experiment(self) -> Experiment | None:
        return None if self.checked is None else self.checked.experiment


@dataclass(frozen=True)
class CheckedExperiment:
    """An experiment checked once, where it is loaded (`check`): the recipe compose_recipe made (None if invalid),
    every violation of preflight's one check function, and each arm of a series merged and checked the same way.
    What plans its versions (resolve, versioning, the Snakefile's graph) is handed this and checks nothing again."""

    experiment: Experiment
    recipe: Recipe | None
    violations: tuple[Violation, ...]
    shares_venv: bool  # the checks judged this checkout's .venv (else the nodes' runtime; noderuntime.py)
    arms: Mapping[str, Arm]  # in the order the file declares them


def check(experiment: Experiment, *, shares_venv: bool = True) -> CheckedExperiment:
    """The experiment and every arm of it, each through check_experiment once (an arm judged as its experiment is:
    same `shares_venv`)."""
    recipe, found = check_experiment(experiment, shares_venv=shares_venv)
    return CheckedExperiment(experiment, recipe, tuple(found), shares_venv, _arms(experiment, shares_venv))


def _arms(experiment: Experiment, shares_venv: bool) -> dict[str, Arm]:
    base = _document(experiment)
    arms: dict[str, Arm] = {}
    for name, overlay in experiment.arms.items():
        smoke = _is_smoke(overlay)
        merged = deep_merge(base, {k: v for k, v in overlay.items() if k != "smoke"})
        checked: CheckedExperiment | None = None
        try:
            checked = check(parse_experiment(merged, f"arm {name}"), shares_venv=shares_venv)
            problems = [_named(name, v) for v in checked.violations]
        except PreflightError as error:
            problems = [_named(name, v) for v in error.violations]
        if smoke:
            problems += _smoke_problems(name, base, merged)
        arms[name] = Arm(name, overlay, smoke, checked, tuple(problems))
    return arms


def series_problems(checked: CheckedExperiment) -> list[Violation]:
    """Every problem of every arm at once, each named `arms.<arm>.<field>`; more than one smoke is one more."""
    arms = checked.arms
    found = [problem for arm in arms.values() for problem in arm.problems]
    smokes = [arm.name for arm in arms.values() if arm.smoke]
    if len(smokes) > 1:
        found.append(
            Violation(
                "arms",
                f"{', '.join(smokes)} are all smoke arms; a series has one smoke, which trains before the others",
                "keep smoke: true on one arm",
            )
        )
    return found


def checked_of(checked: CheckedExperiment, key: str) -> CheckedExperiment:
    """What a version key builds, as checked: the arm's merged experiment, or the experiment itself."""
    arm = arm_of(key)
    if arm is None:
        return checked
    problems = key_problems(checked, key)
    found = checked.arms.get(arm)
    if found is not None and found.checked is None:
        problems += list(found.problems)
    if problems or found is None or found.checked is None:
        raise PreflightError(f"version key {key}", problems)
    return found.checked


def key_problems(checked: CheckedExperiment, key: str) -> list[Violation]:
    """A version key is a version, and where it names an arm, one the experiment declares that is not another
    arm's build."""
    problems = check_version(version_of(key))
    arm = arm_of(key)
    if arm is None:
        return problems
    experiment = checked.experiment
    if arm in experiment.arms:
        alias = alias_of(checked, arm)
        if alias is None:
            return problems
        same = Violation(
            "version",
            f"arm {arm!r} is the same experiment as arm {alias!r}, so it is that arm's build",
            f"use {arm_key(version_of(key), alias)}",
        )
        return [*problems, same]
    declared = ", ".join(arm_key(version_of(key), a) for a in experiment.arms)
    unknown = Violation(
        "version",
        f"{key!r} names the arm {arm!r}, which {experiment.name} does not declare",
        f"use one of {declared}" if declared else "declare it under arms: in the experiment file, or drop @arm",
    )
    return [*problems, unknown]


def stage_keys(checked: CheckedExperiment, key: str) -> dict[str, str]:
    """Under which version key each shared stage of `key` is built: the plain version where the stage is the
    experiment's own, else the first arm with the same stage. Empty for a plain version: its stages are its own."""
    arm = arm_of(key)
    experiment, arms = checked.experiment, checked.arms
    if arm is None or arm not in arms or arms[arm].experiment is None:
        return {}
    own = arms[arm].experiment
    version = version_of(key)
    keys: dict[str, str] = {}
    for kind in SHARED_STAGES:
        mine = _stage_signature(own, kind)  # type: ignore[arg-type]
        if mine == _stage_signature(experiment, kind):
            keys[kind] = version
            continue
        first = next(
            a for a in arms.values() if a.experiment is not None and _stage_signature(a.experiment, kind) == mine
        )
        keys[kind] = arm_key(version, first.name)
    return keys


def plain_in_series(checked: CheckedExperiment, key: str, kind: str) -> Violation | None:
    """In a series the plain version stages what the arms share; asking it for an arm's kind (launch, train,
    export, eval) names the arms' keys instead."""
    experiment = checked.experiment
    if not experiment.arms or arm_of(key) is not None or kind in SHARED_STAGES:
        return None
    keys = ", ".join(series_keys(checked, key))
    return Violation(
        "version",
        f"{experiment.name} is a series (arms: in its file): {kind} of {key} belongs to an arm",
        f"name one of {keys} (e.g. {kind}/v{arm_key(key, base_arm(experiment))}), or run snakemake with no target",
    )


def alias_of(checked: CheckedExperiment, arm: str) -> str | None:
    """The earlier arm whose whole experiment (smoke included) equals this arm's: its build is this arm's."""
    arms = checked.arms
    mine = arms[arm]
    if mine.experiment is None:
        return None
    for other in arms.values():
        if other.name == arm:
            return None
        if other.experiment is not None and other.smoke == mine.smoke and other.experiment == mine.experiment:
            return other.name
    return None


def _is_smoke(overlay: Mapping[str, Any]) -> bool:
    return overlay.get("smoke") is True


def smoke_arm(experiment: Experiment) -> str | None:
    return next((name for name, overlay in experiment.arms.items() if _is_smoke(overlay)), None)


def series_keys(checked: CheckedExperiment, version: str) -> list[str]:
    """The version keys a series builds for `version`: the smoke first, then every other arm that is not an alias,
    in the file's order. An experiment without arms builds the plain version."""
    experiment = checked.experiment
    if not experiment.arms:
        return [version]
    names = [a for a in experiment.arms if alias_of(checked, a) is None]
    smoke = smoke_arm(experiment)
    ordered = ([smoke] if smoke in names else []) + [a for a in names if a != smoke]
    return [arm_key(version, a) for a in ordered]


def expand(checked: CheckedExperiment, versions: list[str]) -> list[str]:
    """The version keys that versions a person named stand for: a plain version of a series is each of its arms;
    a version key that names an arm, and any version of an experiment without arms, is itself."""
    return [key for v in versions for key in (series_keys(checked, v) if arm_of(v) is None else [v])]


def base_arm(experiment: Experiment) -> str:
    """The arm a comparison's deltas are against: the one named `base`, else the first non-smoke arm."""
    names = list(experiment.arms)
    if BASE_ARM in names:
        return BASE_ARM
    return next((a for a in names if not _is_smoke(experiment.arms[a])), names[0])


def changes(checked: CheckedExperiment, arm: str) -> dict[str, tuple[Any, Any]]:
    """What the arm changes against the experiment itself, by field: (the experiment's value, the arm's). A recipe
    key one side leaves out holds the schema's default (kl_loss_coef 0.04, not None); an arm that writes out the
    default changes nothing."""
    merged = checked.arms[arm].experiment
    if merged is None:
        return {}
    defaults = recipe_defaults()
    found: dict[str, tuple[Any, Any]] = {}
    for name, values in field_diff(_document(checked.experiment), _document(merged)).items():
        old, new = (defaults.get(name) if value is None else value for value in values)
        if old != new:
            found[name] = (old, new)
    return found


def describe_changes(checked: CheckedExperiment, arm: str) -> str:
    """One line of what an arm changes, for the plan."""
    found = changes(checked, arm)
    shown = [f"{field} {old!r} -> {new!r}" for field, (old, new) in list(found.items())[:4]]
    more = f"; and {len(found) - 4} more" if len(found) > 4 else ""
    return "; ".join(shown) + more if shown else "nothing (the experiment as written)"


def report_path(version: str) -> str:
    """The series' comparison report of `version` (rule `compare`): every arm's curves, evals, changes and cost."""
    return f"series/v{version}/compare.html"


def plan_lines(checked: CheckedExperiment, key: str) -> list[str]:
    """What the plan says of a version key in a series: the series (with the first arm planned), and what this
    arm changes, which stages it shares, and whether it waits for the smoke."""
    arm, experiment = arm_of(key), checked.experiment
    if not experiment.arms or arm is None or arm not in experiment.arms:
        return []
    version = version_of(key)
    keys = series_keys(checked, version)
    lines = []
    if keys and key == keys[0]:
        aliases = [f"{a} = {alias}" for a in experiment.arms if (alias := alias_of(checked, a))]
        same = f"; the same build, no job of its own: {', '.join(aliases)}" if aliases else ""
        lines.append(f"  series         {len(keys)} arm(s) of {experiment.name} {version}: {', '.join(keys)}{same}")
    smoke = checked.arms[arm].smoke
    waits = " (trains first; the other arms' trainings wait for it)" if smoke else ""
    lines.append(f"  {'smoke' if smoke else 'arm':<14} {arm}: changes {describe_changes(checked, arm)}{waits}")
    shared = {kind: stage for kind, stage in stage_keys(checked, key).items() if stage != key}
    if shared:
        lines.append("  shared stages  " + ", ".join(f"{kind} of v{stage}" for kind, stage in shared.items()))
    return lines


def _stage_signature(experiment: Experiment, kind: str) -> Any:
    """What a shared stage's identity is computed from (rlbuild/plan/resolve.py build_records)."""
    if kind == "stage_data":
        return experiment.data
    return experiment.model  # the base model is built from its revision alone; the staged model from the model


def _document(experiment: Experiment) -> dict[str, Any]:
    return experiment.model_dump(mode="python", exclude={"arms"})


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`overlay` over `base`, copied: mappings merge key by key, anything else replaces (an arm over its
    experiment; the tests' and benchmarks' recipe overrides)."""
    merged = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        below = merged.get(key)
        nested = isinstance(below, Mapping) and isinstance(value, Mapping)
        merged[key] = deep_merge(below, value) if nested else copy.deepcopy(value)
    return merged


def _named(arm: str, violation: Violation) -> Violation:
    return dataclasses.replace(violation, field=f"arms.{arm}.{violation.field}")  # a MissingCredential stays one


def _smoke_problems(arm: str, base: Mapping[str, Any], merged: Mapping[str, Any]) -> list[Violation]:
    return [
        Violation(
            f"arms.{arm}.{field}",
            f"a smoke arm changes only how much is done ({', '.join(sorted(SMOKE_MAY_CHANGE))}), so that it runs "
            f"what the full run runs; this one changes {field} ({old!r} -> {new!r})",
            "make it an arm of its own (without smoke: true), or leave the field as the experiment has it",
        )
        for field, (old, new) in field_diff(base, merged).items()
        if field not in SMOKE_MAY_CHANGE
    ]
