"""Every deterministic check of an experiment, collected at once, and the recipe composed from it.

Fast: no torch, no ray, no network but one short read of a Hub model's config.json that the HF cache lacks
(rlbuild/plan/modelcheck.py). It runs while Snakemake builds the DAG (so a dry run fails before
any job starts) and behind `rlbuild check`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlbuild.contracts.recipe import SANDBOX_PROVIDERS, Recipe, recipe_problems
from rlbuild.contracts.rows import no_rows_problem
from rlbuild.contracts.sources import Source, SourceError, parse_source
from rlbuild.core.errors import MissingCredential, PreflightError, Violation
from rlbuild.core.validation import violations
from rlbuild.core.wire import is_secret_name
from rlbuild.core.yamlfile import load_yaml
from rlbuild.plan import scheduling
from rlbuild.plan.environments import check_environments, check_sandbox
from rlbuild.plan.identity import flatten
from rlbuild.plan.modelcheck import check_base_model, check_model, source_model_config
from rlbuild.plan.noderuntime import NodeRuntime, image_problems, node_runtime, on_gpus
from rlbuild.plan.roleplan import check_role_plan, role_plan_recipe_keys
from rlbuild.plan.spec import Experiment, RolePlan, Runtime, Topology
from rlbuild.schedulers.registry import cluster_names

# Strategies this runtime can execute, and the package that would provide the others.
INSTALLED_STRATEGIES = {"fsdp2"}
INSTALL_VLLM = "scripts/setup.sh --extra gpu"
STRATEGY_PROVIDERS = {"megatron": "megatron-core"}


def parse_experiment(raw: Any, source: str) -> Experiment:
    """Validate a parsed experiment mapping; raise PreflightError listing every structural problem."""
    if not isinstance(raw, dict):
        raise PreflightError(source, [Violation("<root>", "must be a mapping of the experiment's fields")])
    try:
        return Experiment.model_validate(raw)
    except ValidationError as exc:
        found = violations(exc, raw, Experiment)
    raise PreflightError(source, found + _arithmetic_of_parts(raw))


def _arithmetic_of_parts(raw: dict[str, Any]) -> list[Violation]:
    """Role-plan arithmetic of the sections that did parse, and the recipe's own problems, so one run reports
    every problem of every section (a role-plan typo must not hide a recipe typo)."""
    found: list[Violation] = []
    recipe = raw.get("recipe")
    if isinstance(recipe, dict):
        try:
            Recipe.model_validate(recipe)
        except ValidationError as exc:
            # The keys the role plan renders are checked against it once it parses; here only what the recipe says.
            found += violations(exc, recipe, Recipe, "recipe.")
    try:
        topology = Topology.model_validate(raw.get("topology"))
        plan = RolePlan.model_validate(raw.get("role_plan"))
        runtime = Runtime.model_validate(raw.get("runtime"))
    except ValidationError:
        return found
    return found + check_role_plan(topology, plan, runtime)


def load_experiment(path: Path) -> Experiment:
    return parse_experiment(load_yaml(path, "experiment"), str(path))


def role_plan_values(experiment: Experiment) -> dict[str, Any]:
    """The recipe keys the role plan, runtime and seed own, with the values they render."""
    return {
        "trainer.entrypoint": experiment.runtime.entrypoint,
        "trainer.strategy": experiment.runtime.strategy,
        "trainer.seed": experiment.seed,
        **role_plan_recipe_keys(experiment.role_plan),
    }


def _owner(key: str) -> str:
    owners = {"trainer.entrypoint": "runtime.entrypoint", "trainer.strategy": "runtime.strategy"}
    return {**owners, "trainer.seed": "seed"}.get(key, "role_plan")


def compose_recipe(experiment: Experiment) -> tuple[Recipe | None, list[Violation]]:
    """The experiment's recipe over the typed defaults, with the role plan rendered in; None if it is invalid."""
    stated = flatten(experiment.recipe)
    out: list[Violation] = []
    merged: dict[str, Any] = _copy_tree(experiment.recipe)
    for key, value in role_plan_values(experiment).items():
        if key in stated and (type(stated[key]) is not type(value) or stated[key] != value):
            out.append(
                Violation(
                    f"recipe.{key}",
                    f"states {stated[key]!r} but {_owner(key)} renders {value!r}",
                    f"delete it from the recipe; {_owner(key)} is the single source of this value",
                )
            )
        _set(merged, key, value)
    try:
        recipe = Recipe.model_validate(merged)
    except ValidationError as exc:
        found = [v for v in violations(exc, merged, Recipe, "recipe.") if v.field not in {o.field for o in out}]
        return None, out + found
    return recipe, out + recipe_problems(recipe)


def _copy_tree(tree: Any) -> Any:
    return {k: _copy_tree(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = tree.setdefault(key, {})
        if not isinstance(child, dict):
            # A user's non-mapping here is reported by validation; the rendered value must not hide it.
            return
        tree = child
    tree[leaf] = value


def check_strategy(recipe: Recipe) -> list[Violation]:
    strategy = recipe.trainer.strategy
    if strategy in INSTALLED_STRATEGIES:
        return []
    return [
        Violation(
            "runtime.strategy",
            f"{strategy!r}: this runtime installs no {STRATEGY_PROVIDERS.get(strategy, strategy)} backend "
            "(not in uv.lock), so the job would fail after GPUs are allocated",
            f"use one of {sorted(INSTALLED_STRATEGIES)}, or pin a runtime that provides it",
        )
    ]


def check_collectives(experiment: Experiment, recipe: Recipe) -> list[Violation]:
    """NCCL moves GPU tensors between GPUs: on CPU ranks the weight-sync group would fail as the training starts."""
    if recipe.generator.weight_sync_backend != "nccl" or on_gpus(experiment):
        return []
    return [
        Violation(
            "recipe.generator.weight_sync_backend",
            f"'nccl' needs GPUs, and topology.gpu_variant {experiment.topology.gpu_variant} runs the policy and the "
            "engines on CPU ranks: the weight-sync group would fail as the training starts",
            "use weight_sync_backend: gloo (the default) on CPU ranks, or a GPU topology",
        )
    ]


def rollout_backend(experiment: Experiment, recipe: Recipe) -> str:
    """The engine the job's rollouts will use: `auto` is vLLM on GPUs, Hugging Face generate (torch) on CPU ranks."""
    backend = recipe.generator.backend
    return ("vllm" if on_gpus(experiment) else "torch") if backend == "auto" else backend


def check_backend(experiment: Experiment, recipe: Recipe, nodes: NodeRuntime) -> list[Violation]:
    """vLLM where the plan needs it must be in the runtime the nodes will run (rlbuild/plan/noderuntime.py): this
    .venv where jobs share it, the lock's resolution for the nodes' platform, or what an image declares it holds
    (an image that declares nothing is checked only by each node before Ray starts)."""
    if rollout_backend(experiment, recipe) != "vllm" or nodes.vllm is not None:
        return []
    if nodes.origin == "image" and nodes.provides is None:
        return []
    why = (
        "generator.backend 'auto' means vLLM on GPUs"
        if recipe.generator.backend == "auto"
        else "generator.backend is 'vllm'"
    )
    # Which runtime is judged depends on where the jobs run: each refusal names the other place's check.
    where, fix, elsewhere = {
        "venv": (
            "the nodes run this checkout and its .venv",
            f"install it with `{INSTALL_VLLM}` (Linux GPU nodes, x86_64 or aarch64)",
            "this judged the local executor's .venv: where the jobs run on a cluster, `rlbuild check --profile "
            f"{cluster_names()}` judges the nodes' runtime",
        ),
        "lock": (
            f"the nodes set up from uv.lock{' with extras ' + ', '.join(nodes.extras) if nodes.extras else ''}, "
            f"which installs none on linux/{nodes.platform}"
            + ("" if on_gpus(experiment) else " (a CPU topology installs no GPU extra)"),
            "use a GPU topology (its nodes get the gpu extra), or pin runtime.image to an image with vLLM",
            "this judged the profile's nodes: `rlbuild check` without --profile judges this machine's .venv",
        ),
        "image": (
            f"runtime.image_provides declares {', '.join(f'{k} {v}' for k, v in (nodes.provides or {}).items())} "
            f"for {nodes.image}, no vllm",
            "declare the image's vllm in runtime.image_provides if it has one (each node checks it), or pin an "
            "image with vLLM",
            "this judged the image the profile's jobs run",
        ),
    }[nodes.origin]
    return [
        Violation(
            "recipe.generator.backend",
            f"{why} (topology.gpu_variant {experiment.topology.gpu_variant}), and the runtime the job will use has "
            f"no vllm: {where}",
            f"{fix}, or set generator.backend: torch ({elsewhere})",
        )
    ]


def check_sources(experiment: Experiment) -> list[Violation]:
    entries = [
        ("model", experiment.model.source, experiment.model.revision),
        ("model.tokenizer", experiment.model.tokenizer.source, experiment.model.tokenizer.revision),
    ]
    entries += [(f"data.train.{i}", d.source, d.revision) for i, d in enumerate(experiment.data.train)]
    entries += [(f"data.validation.{i}", d.source, d.revision) for i, d in enumerate(experiment.data.validation)]
    out: list[Violation] = []
    for field, source, revision in entries:
        try:
            parsed = parse_source(source, revision)
            problems = parsed.check()
        except SourceError as exc:
            problems = [str(exc)]
        out += [Violation(f"{field}.source", problem) for problem in problems]
        if not problems and field.startswith("data."):
            out += _empty_data(f"{field}.source", parsed)
    return out


def _empty_data(field: str, source: Source) -> list[Violation]:
    """A local data source that would stage no rows, known now rather than at staging. Only `local:` data is read
    here (cheaply: rlbuild/contracts/rows.py); `hf:` data is not fetched to plan, `task:` rows are the trainer's to
    generate, and `harbor:` tasks are checked by the environment checks: staging refuses any of them that yields no
    rows."""
    problem = no_rows_problem(source.local_path()) if source.scheme == "local" else None
    if problem is None:
        return []
    fix = "point the source at data with rows, or remove the entry"
    return [Violation(field, f"source {source}: {problem}, which staging would refuse", fix)]


def check_credentials(recipe: Recipe) -> list[Violation]:
    """Credentials a stage will need, checked where they are forwarded from: the submitting environment. Only
    names are ever written: a value would land in a terminal, a log or CI output."""
    out: list[Violation] = []  # each a MissingCredential: a command that starts no job drops them
    wandb_off = os.environ.get("WANDB_MODE") in ("offline", "disabled")
    if recipe.trainer.logger == "wandb" and not os.environ.get("WANDB_API_KEY") and not wandb_off:
        out.append(
            MissingCredential(
                "recipe.trainer.logger",
                "'wandb' needs WANDB_API_KEY in the submitting environment (it is forwarded to the jobs), and none is "
                "set",
                "export WANDB_API_KEY, or set WANDB_MODE=offline, or use logger: console",
            )
        )
    sandbox = recipe.environment.sandbox
    if sandbox is None:
        return out
    backend = sandbox.backend
    missing = [name for name in SANDBOX_PROVIDERS[backend].credentials if not os.environ.get(name)]
    if missing:
        names = " and ".join(missing)
        out.append(
            MissingCredential(
                "recipe.environment.sandbox.backend",
                f"{backend!r} needs {names} in the submitting environment (forwarded to the jobs by name; every "
                f"episode's sandbox is started with it), and {'they are' if len(missing) > 1 else 'it is'} unset",
                f"export {names} in the shell that runs rlbuild or snakemake, or choose another backend "
                f"({', '.join(b for b in SANDBOX_PROVIDERS if b != backend)})",
            )
        )
    return out


def check_plain_values(experiment: Experiment) -> list[Violation]:
    """No value interpolates (`${...}`) and none carries a secret: an experiment's values are recorded in the launch
    document and in identity records, and fingerprinted, so a secret in one would be stored and compared."""
    secrets = {value: name for name, value in os.environ.items() if is_secret_name(name) and len(value) >= 8}
    out: list[Violation] = []
    for field, value in flatten(experiment.model_dump(mode="json")).items():
        if not isinstance(value, str):
            continue
        if "${" in value:
            out.append(
                Violation(
                    field,
                    "interpolation (${...}) is not supported",
                    "write the value itself; secrets stay in the environment",
                )
            )
        holder = next((name for secret, name in secrets.items() if secret in value), None)
        if holder is not None:
            out.append(
                Violation(
                    field,
                    f"holds the value of the secret environment variable {holder}",
                    "remove it: secrets reach jobs through the environment, never through an experiment, a record "
                    "or a fingerprint",
                )
            )
    return out


def check_experiment(experiment: Experiment, *, shares_venv: bool = True) -> tuple[Recipe | None, list[Violation]]:
    """The one check function: every version-independent check, and the recipe compose_recipe makes (None if
    invalid). Run once per experiment and arm, where the experiment is loaded (rlbuild/plan/series.py `check`).
    `shares_venv`: the jobs run this checkout's .venv (else what the experiment declares; noderuntime.py)."""
    violations_found = check_plain_values(experiment)
    violations_found += check_role_plan(experiment.topology, experiment.role_plan, experiment.runtime)
    recipe, recipe_violations = compose_recipe(experiment)
    violations_found += recipe_violations
    if recipe is not None:
        violations_found += check_strategy(recipe) + check_credentials(recipe) + check_collectives(experiment, recipe)
        nodes = node_runtime(experiment, shares_venv=shares_venv)
        violations_found += check_backend(experiment, recipe, nodes) + check_sandbox(experiment, recipe, nodes)
        violations_found += image_problems(experiment, shares_venv=shares_venv)
        violations_found += scheduling.problems(experiment, recipe)
    model_config = source_model_config(experiment).values
    if model_config is not None:
        violations_found += check_model(model_config, experiment, recipe)
    violations_found += check_sources(experiment) + check_base_model(experiment)
    violations_found += check_environments(experiment, recipe.environment.env_class if recipe else None)
    return recipe, violations_found
