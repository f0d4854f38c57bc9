"""A typed view of the launch document (docs/design.md, "The launch document") and checks of its recipe.

The recipe (`trainer:` section) is validated against config/trainer/base.yaml, which is its schema: unknown
keys are errors. Batch arithmetic is re-checked here because the trainer is also run on hand-written documents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

BASE_RECIPE = Path(__file__).resolve().parent.parent / "config" / "trainer" / "base.yaml"


class LaunchError(ValueError):
    """A launch document the trainer cannot run; the message names the field, the value and the fix."""


SCHEDULES = ("constant_with_warmup", "cosine_with_warmup")


@cache
def base_recipe() -> dict[str, Any]:
    return yaml.safe_load(BASE_RECIPE.read_text())


def _unknown(user: dict[str, Any], base: dict[str, Any], prefix: str) -> list[str]:
    out = []
    for key, value in user.items():
        if key not in base:
            out.append(f"{prefix}{key}")
        elif isinstance(value, dict) and isinstance(base[key], dict) and base[key]:
            out += _unknown(value, base[key], f"{prefix}{key}.")
    return out


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        nested = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = deep_merge(merged[key], value) if nested else value
    return merged


def check_recipe(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe with base defaults filled in; raises LaunchError on unknown keys or bad batch arithmetic."""
    unknown = _unknown(recipe, base_recipe(), "trainer.")
    if unknown:
        raise LaunchError(
            f"launch document recipe has unknown keys {unknown}; config/trainer/base.yaml is the schema "
            "(fix the spelling, or add the key there)"
        )
    full = deep_merge(base_recipe(), recipe)
    t, g = full["trainer"], full["generator"]
    p = t["placement"]
    world = int(p["policy_num_nodes"]) * int(p["policy_num_gpus_per_node"])
    train, mini, micro = (
        int(t["train_batch_size"]),
        int(t["policy_mini_batch_size"]),
        int(t["micro_train_batch_size_per_gpu"]),
    )
    n = int(g["n_samples_per_prompt"])
    problems = []
    if n < 2:
        problems.append(f"generator.n_samples_per_prompt={n}: GRPO needs groups of at least 2 samples")
    if not 0 < mini <= train or train % mini:
        problems.append(
            f"trainer.train_batch_size={train} must be a positive multiple of policy_mini_batch_size={mini}"
        )
    elif (mini * n) % world or (mini * n // world) % micro:
        problems.append(
            f"trainer.policy_mini_batch_size={mini} x n_samples_per_prompt={n} must split evenly over {world} policy "
            f"ranks into micro-batches of micro_train_batch_size_per_gpu={micro}"
        )
    opt = t["policy"]["optimizer_config"]
    if opt["scheduler"] not in SCHEDULES:
        problems.append(
            f"trainer.policy.optimizer_config.scheduler={opt['scheduler']!r} is not a schedule; use one of "
            f"{', '.join(SCHEDULES)}"
        )
    if not 0.0 <= float(opt["min_lr_ratio"]) <= 1.0:
        problems.append(f"trainer.policy.optimizer_config.min_lr_ratio={opt['min_lr_ratio']} must be in [0, 1]")
    if int(t["max_steps"]) < 1:
        problems.append(f"trainer.max_steps={t['max_steps']} must be >= 1")
    if t["resume_mode"] == "from_path" and not t["resume_path"]:
        problems.append("trainer.resume_mode=from_path needs trainer.resume_path (a global_step_N folder)")
    if problems:
        raise LaunchError("; ".join(problems))
    return full


@dataclass(frozen=True)
class Launch:
    """The fields of a launch document the trainer reads."""

    document: dict[str, Any]
    recipe: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> Launch:
        try:
            document = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise LaunchError(f"--launch {path}: cannot read the launch document ({exc})") from exc
        return cls.from_document(document, str(path))

    @classmethod
    def from_document(cls, document: Any, where: str = "launch document") -> Launch:
        if not isinstance(document, dict):
            raise LaunchError(f"{where}: expected a mapping with run, artifacts, inputs, trainer sections")
        missing = [s for s in ("run", "runtime", "ray", "artifacts", "inputs", "trainer") if s not in document]
        if missing:
            raise LaunchError(f"{where}: missing sections {missing}; regenerate it with the resolve_launch rule")
        return cls(document, check_recipe(document["trainer"]))

    def _field(self, section: str, key: str) -> Any:
        try:
            return self.document[section][key]
        except (KeyError, TypeError) as exc:
            raise LaunchError(f"launch document lacks {section}.{key}; regenerate it with resolve_launch") from exc

    @property
    def run_id(self) -> str:
        return str(self._field("run", "id"))

    @property
    def version(self) -> str:
        return str(self._field("run", "version"))

    @property
    def seed(self) -> int:
        return int(self.recipe["trainer"]["seed"])

    @property
    def ray_address(self) -> str | None:
        return self.document["ray"].get("address") or os.environ.get("RAY_ADDRESS") or None

    @property
    def checkpoint_root(self) -> str:
        return str(self._field("artifacts", "checkpoint_root")).rstrip("/")

    @property
    def metrics_uri(self) -> str:
        return str(self._field("artifacts", "metrics_uri"))

    @property
    def terminal_manifest_uri(self) -> str:
        return str(self._field("artifacts", "terminal_manifest_uri"))

    @property
    def resume_checkpoint_count(self) -> int:
        count = int(self._field("artifacts", "resume_checkpoint_count"))
        if count < 1:
            raise LaunchError(f"artifacts.resume_checkpoint_count={count} must be >= 1 (the last one is resumed)")
        return count

    @property
    def model_uri(self) -> str:
        return str(self.document["inputs"]["model"]["uri"])

    @property
    def train_uris(self) -> list[str]:
        return [str(entry["uri"]) for entry in self.document["inputs"]["train_data"]]

    @property
    def validation_uris(self) -> list[str]:
        return [str(entry["uri"]) for entry in self.document["inputs"].get("validation_data") or []]

    @property
    def policy_world_size(self) -> int:
        p = self.recipe["trainer"]["placement"]
        return int(p["policy_num_nodes"]) * int(p["policy_num_gpus_per_node"])


def reference_ranks(recipe: dict[str, Any]) -> int:
    """Workers of a reference role with GPUs of its own; 0 when the reference lives in the policy workers.

    The role plan gives the reference its own nodes with `colocate_all: false` and `ref_num_nodes > 0`
    (rendered as `colocate_policy_ref: false`); without a KL term there is nothing for it to do.
    """
    placement, algorithm = recipe["trainer"]["placement"], recipe["trainer"]["algorithm"]
    if placement["colocate_all"] or placement["colocate_policy_ref"] or not algorithm["use_kl_loss"]:
        return 0
    return int(placement["ref_num_nodes"]) * int(placement["ref_num_gpus_per_node"])
