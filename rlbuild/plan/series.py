"""A series: the arms of one experiment (`arms:` in its file), each a whole experiment built under the version key
`<version>@<arm>`, the stages they share staged once, a smoke arm that goes first.

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
    experiment: Experiment | None  # None: the merged experiment does not validate (its problems say why)
    problems: tuple[Violation, ...]


# Arms per experiment object (parsed once per run; identity, not equality, as preflight's cache).
_ARMS: dict[int, tuple[Experiment, dict[str, Arm]]] = {}


def arms_of(experiment: Experiment) -> dict[str, Arm]:
    """The experiment's arms, in the order the file declares them, each merged and validated."""
    known = _ARMS.get(id(experiment))
    if known is not None and known[0] is experiment:
        return known[1]
    base = _document(experiment)
    arms: dict[str, Arm] = {}
    for name, overlay in experiment.arms.items():
        smoke = overlay.get("smoke") is True
        merged = deep_merge(base, {k: v for k, v in overlay.items() if k != "smoke"})
        try:
            arm_experiment: Experiment | None = parse_experiment(merged, f"arm {name}")
            problems = [_named(name, v) for v in check_experiment(arm_experiment)[1]]  # type: ignore[arg-type]
        except PreflightError as error:
            arm_experiment, problems = None, [_named(name, v) for v in error.violations]
        if smoke:
            problems += _smoke_problems(name, base, merged)
        arms[name] = Arm(name, overlay, smoke, arm_experiment, tuple(problems))
    _ARMS[id(experiment)] = (experiment, arms)
    return arms


def series_problems(experiment: Experiment) -> list[Violation]:
    """Every problem of every arm at once, each named `arms.<arm>.<field>`; more than one smoke is one more."""
    arms = arms_of(experiment)
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


def experiment_of(experiment: Experiment, key: str) -> Experiment:
    """The experiment a version key builds: the arm's merged experiment, or the experiment itself."""
    arm = arm_of(key)
    if arm is None:
        return experiment
    problems = key_problems(experiment, key)
    found = arms_of(experiment).get(arm)
    if found is not None and found.experiment is None:
        problems += list(found.problems)
    if problems or found is None or found.experiment is None:
        raise PreflightError(f"version key {key}", problems)
    return found.experiment


def key_problems(experiment: Experiment, key: str) -> list[Violation]:
    """A version key is a version, and where it names an arm, one the experiment declares that is not another
    arm's build."""
    problems = check_version(version_of(key))
    arm = arm_of(key)
    if arm is None:
        return problems
    if arm in experiment.arms:
        alias = alias_of(experiment, arm)
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


def stage_keys(experiment: Experiment, key: str) -> dict[str, str]:
    """Under which version key each shared stage of `key` is built: the plain version where the stage is the
    experiment's own, else the first arm with the same stage. Empty for a plain version: its stages are its own."""
    arm = arm_of(key)
    arms = arms_of(experiment)
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


def plain_in_series(experiment: Experiment, key: str, kind: str) -> Violation | None:
    """In a series the plain version stages what the arms share; asking it for an arm's kind (launch, train,
    export, eval) names the arms' keys instead."""
    if not experiment.arms or arm_of(key) is not None or kind in SHARED_STAGES:
        return None
    keys = ", ".join(series_keys(experiment, key))
    return Violation(
        "version",
        f"{experiment.name} is a series (arms: in its file): {kind} of {key} belongs to an arm",
        f"name one of {keys} (e.g. {kind}/v{arm_key(key, base_arm(experiment))}), or run snakemake with no target",
    )


def alias_of(experiment: Experiment, arm: str) -> str | None:
    """The earlier arm whose whole experiment (smoke included) equals this arm's: its build is this arm's."""
    arms = arms_of(experiment)
    mine = arms[arm]
    if mine.experiment is None:
        return None
    for other in arms.values():
        if other.name == arm:
            return None
        if other.experiment is not None and other.smoke == mine.smoke and other.experiment == mine.experiment:
            return other.name
    return None


def smoke_arm(experiment: Experiment) -> str | None:
    return next((arm.name for arm in arms_of(experiment).values() if arm.smoke), None)


def series_keys(experiment: Experiment, version: str) -> list[str]:
    """The version keys a series builds for `version`: the smoke first, then every other arm that is not an alias,
    in the file's order. An experiment without arms builds the plain version."""
    if not experiment.arms:
        return [version]
    names = [a for a in experiment.arms if alias_of(experiment, a) is None]
    smoke = smoke_arm(experiment)
    ordered = ([smoke] if smoke in names else []) + [a for a in names if a != smoke]
    return [arm_key(version, a) for a in ordered]


def expand(experiment: Experiment, versions: list[str]) -> list[str]:
    """The version keys that versions a person named stand for: a plain version of a series is each of its arms;
    a version key that names an arm, and any version of an experiment without arms, is itself."""
    return [key for v in versions for key in (series_keys(experiment, v) if arm_of(v) is None else [v])]


def base_arm(experiment: Experiment) -> str:
    """The arm a comparison's deltas are against: the one named `base`, else the first non-smoke arm."""
    names = list(experiment.arms)
    if BASE_ARM in names:
        return BASE_ARM
    return next((a for a in names if not arms_of(experiment)[a].smoke), names[0])


def changes(experiment: Experiment, arm: str) -> dict[str, tuple[Any, Any]]:
    """What the arm changes against the experiment itself, by field: (the experiment's value, the arm's). A recipe
    key one side leaves out holds the schema's default (kl_loss_coef 0.04, not None); an arm that writes out the
    default changes nothing."""
    merged = arms_of(experiment)[arm].experiment
    if merged is None:
        return {}
    defaults = recipe_defaults()
    found: dict[str, tuple[Any, Any]] = {}
    for name, values in field_diff(_document(experiment), _document(merged)).items():
        old, new = (defaults.get(name) if value is None else value for value in values)
        if old != new:
            found[name] = (old, new)
    return found


def describe_changes(experiment: Experiment, arm: str) -> str:
    """One line of what an arm changes, for the plan."""
    found = changes(experiment, arm)
    shown = [f"{field} {old!r} -> {new!r}" for field, (old, new) in list(found.items())[:4]]
    more = f"; and {len(found) - 4} more" if len(found) > 4 else ""
    return "; ".join(shown) + more if shown else "nothing (the experiment as written)"


def report_path(version: str) -> str:
    """The series' comparison report of `version` (rule `compare`): every arm's curves, evals, changes and cost."""
    return f"series/v{version}/compare.html"


def plan_lines(experiment: Experiment, key: str) -> list[str]:
    """What the plan says of a version key in a series: the series (with the first arm planned), and what this
    arm changes, which stages it shares, and whether it waits for the smoke."""
    arm = arm_of(key)
    if not experiment.arms or arm is None or arm not in experiment.arms:
        return []
    version = version_of(key)
    keys = series_keys(experiment, version)
    lines = []
    if keys and key == keys[0]:
        aliases = [f"{a} = {alias_of(experiment, a)}" for a in experiment.arms if alias_of(experiment, a)]
        same = f"; the same build, no job of its own: {', '.join(aliases)}" if aliases else ""
        lines.append(f"  series         {len(keys)} arm(s) of {experiment.name} {version}: {', '.join(keys)}{same}")
    smoke = arms_of(experiment)[arm].smoke
    waits = " (trains first; the other arms' trainings wait for it)" if smoke else ""
    lines.append(f"  {'smoke' if smoke else 'arm':<14} {arm}: changes {describe_changes(experiment, arm)}{waits}")
    shared = {kind: stage for kind, stage in stage_keys(experiment, key).items() if stage != key}
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
