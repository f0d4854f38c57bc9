"""What the model can hold, checked before any job: its config read from its source while the graph is built, and
the staged tokenizer against the staged data when the launch is resolved.

The config comes from the tiny model's architecture (`artifact:base_model`: the variant its revision label names),
a `local:` folder's config.json, or a pinned Hugging Face revision: the local HF cache first, else one download of
config.json only (a short timeout, no retries; unreachable means "not known yet", and the staged model's config is
checked instead).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from rlbuild.contracts.recipe import Recipe
from rlbuild.contracts.sources import SourceError, parse_source
from rlbuild.contracts.tinymodel import VARIANT_FILES, tiny_model_config
from rlbuild.core.errors import Violation
from rlbuild.plan.spec import Experiment

CONFIG_FILE = "config.json"
HUB_TIMEOUT_S = 5.0
TP_FIELD = "role_plan.inference_engine_tensor_parallel_size"
BASE_MODEL_SOURCE = "artifact:base_model"


@dataclass(frozen=True)
class ModelConfig:
    """A model's config.json fields, or None with the reason they are not known yet."""

    values: dict[str, Any] | None
    origin: str


def source_model_config(experiment: Experiment) -> ModelConfig:
    """The config of the model the experiment names, read from its source (never the network for local sources)."""
    model = experiment.model
    try:
        source = parse_source(model.source, model.revision)
    except SourceError as exc:
        return ModelConfig(None, str(exc))  # reported by check_sources
    if source.scheme == "artifact":
        if model.revision not in VARIANT_FILES:
            return ModelConfig(None, f"revision {model.revision!r} names no tiny model variant")  # check_base_model
        return ModelConfig(tiny_model_config(model.revision), f"the tiny model ({VARIANT_FILES[model.revision].name})")
    if source.scheme == "local":
        path = source.local_path() / CONFIG_FILE
        return ModelConfig(_read_json(path), str(path))
    if source.scheme == "hf" and not source.check():
        cache_dir = os.environ.get("HF_HUB_CACHE") or (
            str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else None
        )
        return _hub_config(source.hf_repo_id, source.hf_subpath, source.revision, cache_dir)
    return ModelConfig(None, f"{source} has no config to read")


def base_model_revision(experiment: Experiment) -> str | None:
    """The tiny model variant the graph's base_model rule builds: the revision label of the model, else of the
    tokenizer, that comes from `artifact:base_model` (None: neither does)."""
    model = experiment.model
    named = [e.revision for e in (model, model.tokenizer) if e.source == BASE_MODEL_SOURCE]
    return named[0] if named else None


def check_base_model(experiment: Experiment) -> list[Violation]:
    """Every revision of `artifact:base_model` names a tiny model variant, and the same one: the graph builds one
    base model per experiment, and the staged model and tokenizer are both taken from it."""
    model, built = experiment.model, base_model_revision(experiment)
    out: list[Violation] = []
    for field, entry in (("model.revision", model), ("model.tokenizer.revision", model.tokenizer)):
        if entry.source != BASE_MODEL_SOURCE:
            continue
        if entry.revision not in VARIANT_FILES:
            out.append(
                Violation(
                    field,
                    f"{entry.revision!r} names no tiny model variant of {BASE_MODEL_SOURCE}",
                    f"use one of {', '.join(VARIANT_FILES)} (rlbuild/contracts/tinymodel.py)",
                )
            )
        elif entry.revision != built and built in VARIANT_FILES:
            out.append(
                Violation(
                    field,
                    f"{entry.revision!r} differs from model.revision {built!r}: one base model is built per experiment",
                    f"use {built!r} for both",
                )
            )
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@cache
def _hub_config(repo_id: str, subpath: str, revision: str, cache_dir: str | None) -> ModelConfig:
    from huggingface_hub import hf_hub_url, try_to_load_from_cache
    from huggingface_hub.utils import build_hf_headers

    filename = f"{subpath}/{CONFIG_FILE}" if subpath else CONFIG_FILE
    cached = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=revision)
    if isinstance(cached, str):
        return ModelConfig(_read_json(Path(cached)), f"hf:{repo_id}@{revision[:12]} (HF cache)")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return ModelConfig(None, f"hf:{repo_id}@{revision[:12]} is not in the HF cache and HF_HUB_OFFLINE is set")
    request = urllib.request.Request(hf_hub_url(repo_id, filename, revision=revision), headers=build_hf_headers())
    try:
        with urllib.request.urlopen(request, timeout=HUB_TIMEOUT_S) as response:
            values = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return ModelConfig(None, f"hf:{repo_id}@{revision[:12]}/{filename} could not be read ({exc})")
    return ModelConfig(values if isinstance(values, dict) else None, f"hf:{repo_id}@{revision[:12]} (Hub)")


def check_model(config: dict[str, Any], experiment: Experiment, recipe: Recipe | None) -> list[Violation]:
    """Engine geometry and token budgets against the model's config (heads vs TP, positions vs lengths)."""
    out = _heads_against_tp(config, experiment.role_plan.inference_engine_tensor_parallel_size)
    positions = config.get("max_position_embeddings")
    if recipe is None or not isinstance(positions, int):
        return out
    g = recipe.generator
    for name, sampling in (("sampling_params", g.sampling_params), ("eval_sampling_params", g.eval_sampling_params)):
        budget = g.max_prompt_length + sampling.max_generate_length
        if budget > positions:
            out.append(
                Violation(
                    f"recipe.generator.{name}.max_generate_length",
                    f"max_prompt_length {g.max_prompt_length} + max_generate_length {sampling.max_generate_length} "
                    f"= {budget} tokens, more than the model's max_position_embeddings={positions}",
                    f"keep generator.max_prompt_length + {name}.max_generate_length <= {positions}",
                )
            )
    return out + _episode_context(recipe, positions)


def _episode_context(recipe: Recipe, positions: int) -> list[Violation]:
    """An agent episode's tokens against the model's positions: `max_context_tokens` where stated (the episode ends
    truncated there), else what its turns can add up to, prompt + max_turns x max_generate_length (null: the
    episode may grow to the model's own context, trainer/agents/episodes.py `context_limit`)."""
    env, g = recipe.environment, recipe.generator
    if env.max_context_tokens is not None:
        if env.max_context_tokens <= positions:
            return []
        return [
            Violation(
                "recipe.environment.max_context_tokens",
                f"{env.max_context_tokens} tokens of an agent episode, more than the model's "
                f"max_position_embeddings={positions}",
                f"keep environment.max_context_tokens <= {positions} (or null: the model's own context)",
            )
        ]
    per_turn = g.sampling_params.max_generate_length
    turns = g.max_prompt_length + env.max_turns * per_turn
    if env.max_turns == 1 or turns <= positions:  # one turn is the prompt + generation budget checked above
        return []
    reachable = (positions - g.max_prompt_length) // per_turn
    lower = f"lower environment.max_turns to {reachable}, or " if reachable >= 1 else ""
    return [
        Violation(
            "recipe.environment.max_turns",
            f"max_prompt_length {g.max_prompt_length} + max_turns {env.max_turns} x max_generate_length {per_turn} = "
            f"{turns} tokens of an agent episode, more than the model's max_position_embeddings={positions}: with "
            "max_context_tokens null an episode is cut at the model's context, so its last turns never play",
            f"{lower}state environment.max_context_tokens: {positions} to train on episodes that end truncated there",
        )
    ]


def _heads_against_tp(config: dict[str, Any], tp: int) -> list[Violation]:
    out: list[Violation] = []
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = config.get(key)
        if isinstance(heads, int) and heads % tp and not (key == "num_key_value_heads" and tp % heads == 0):
            out.append(
                Violation(
                    TP_FIELD,
                    f"TP={tp} does not divide the model's {key}={heads}, so vLLM cannot shard it",
                    f"choose TP among the divisors of {heads}",
                )
            )
    return out


def check_staged_inputs(model_dir: Path, train_files: list[Path], recipe: Recipe) -> list[Violation]:
    """The staged tokenizer against the model and the staged train rows (counted as trainer/data.py counts them):
    a tokenizer larger than the embedding, or fewer fitting prompts than a batch, fail here, before the train job."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    out: list[Violation] = []
    vocab = (_read_json(model_dir / CONFIG_FILE) or {}).get("vocab_size")
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        out.append(
            Violation(
                "model.tokenizer",
                f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}: token ids past "
                f"{vocab - 1} index outside the embedding",
                "stage the tokenizer that belongs to the model (model.tokenizer.source and revision)",
            )
        )
    g, need = recipe.generator, recipe.trainer.train_batch_size
    rows = [json.loads(line) for file in train_files for line in file.read_text().splitlines() if line.strip()]
    lengths = [len(tokenizer(row["prompt"])["input_ids"]) for row in rows]
    fitting = sum(length <= g.max_prompt_length for length in lengths)
    if fitting < need:
        enough = len(lengths) >= need
        out.append(
            Violation(
                "recipe.generator.max_prompt_length",
                f"only {fitting} of {len(rows)} train rows fit max_prompt_length={g.max_prompt_length} (the longest "
                f"prompt is {max(lengths, default=0)} tokens), fewer than trainer.train_batch_size={need}",
                f"raise max_prompt_length to at least {sorted(lengths)[need - 1]}, or add shorter prompts"
                if enough
                else "add train data: the split holds fewer rows than one batch",
            )
        )
    return out
