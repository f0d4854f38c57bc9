"""The export's model card: README.md in the Hub's convention.

The card is built with huggingface_hub's `ModelCard`/`ModelCardData`, so `ModelCard.load` reads it back and the
Hub renders it: YAML metadata (`base_model` and `datasets` where the sources are Hub repos, the tags, and a
`model-index` of held-out results) and a body with the provenance: the role plan, steps, GPU-hours, the identity,
the runtime digest and every source with its revision.

At export time the results are the trainer's own held-out greedy accuracy at the terminal step (the last
`eval/accuracy` of the run's metrics, scored by the same function as the eval stage), beside the base model's
(its step-0 eval, where `trainer.eval_before_train` measured one); the publish stage writes the eval stage's
results (greedy accuracy and pass@k) into the card it uploads (`with_eval_results`). The metadata's `license`
is the experiment's (`license:`, default `other`, which the body explains); the quick start asks the first
prompt of the staged validation split.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from rlbuild.contracts.artifacts import DEFAULT_LICENSE, read_record
from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.metricstream import read_run_metrics
from rlbuild.contracts.recipe import Recipe
from rlbuild.contracts.rows import check_row
from rlbuild.contracts.sources import SourceError, parse_source
from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError
from rlbuild.stages.evaluation import base_accuracy

CARD = "README.md"
TAGS = ["rlbuild", "grpo", "reinforcement-learning"]
TASK = "text-generation"


def hub_repo(source: str, revision: str) -> str | None:
    """The Hub repo id of an `hf:` source; None for sources that are not on the Hub (task:, local:, artifact:)."""
    try:
        parsed = parse_source(source, revision)
    except SourceError:
        return None
    return parsed.hf_repo_id if parsed.scheme == "hf" else None


@dataclass(frozen=True)
class CardFacts:
    """What the card says beyond the launch document and the records: the experiment's license and a validation
    prompt for the quick start (None: the split has none to show)."""

    license: str = DEFAULT_LICENSE
    prompt: str | None = None


def last_eval(records: Sequence[Mapping[str, Any]]) -> tuple[int, float] | None:
    """(step, held-out accuracy) of the run's last eval step, or None when it never evaluated."""
    found = [(int(r["step"]), float(r["eval/accuracy"])) for r in records if "eval/accuracy" in r]
    return found[-1] if found else None


def reference_placement(recipe: Recipe) -> str:
    """Where the reference model of the KL term lives, as the trainer places it (Recipe.reference_workers)."""
    algorithm, placement = recipe.trainer.algorithm, recipe.trainer.placement
    if not algorithm.use_kl_loss:
        return "no reference model (no KL term)"
    if not recipe.reference_workers:
        return "the reference in the policy's workers, on their GPUs"
    return f"the reference on {placement.ref_num_nodes} node(s) x {placement.ref_num_gpus_per_node} GPU(s) of its own"


def first_prompt(uris: Sequence[str]) -> str | None:
    """The first row's prompt of the staged validation files (local paths or s3:// URIs), checked as staging
    checks rows; None when they hold no row."""
    for uri in uris:
        for number, line in enumerate((storage.read_text(uri) or "").splitlines(), 1):
            if line.strip():
                return str(check_row(json.loads(line), f"{uri}:{number}")["prompt"])
    return None


def gpu_hours(launch: LaunchDocument, records: Sequence[Mapping[str, Any]]) -> float | None:
    """Steps' wall time times the gang's GPUs; None on CPU ranks or without step times."""
    allocation = launch.allocation
    seconds = sum(float(r["perf/step_time_s"]) for r in records if "perf/step_time_s" in r)
    if allocation.gpu_variant == "cpu" or not seconds:
        return None
    return seconds * allocation.num_nodes * allocation.gpus_per_node / 3600


def _results(scores: Mapping[str, float], dataset: str, dataset_type: str) -> list[EvalResult]:
    return [
        EvalResult(
            task_type=TASK,
            dataset_type=dataset_type,
            dataset_name=dataset,
            dataset_split="validation",
            metric_type=metric,
            metric_name=name,
            metric_value=value,
        )
        for (metric, name), value in scores.items()
    ]


def build_card(
    launch: LaunchDocument,
    model_record: Mapping[str, Any],
    data_record: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    identity: str = "",
    facts: CardFacts = CardFacts(),
) -> ModelCard:
    """The export's card from the launch document, the staged model's and data's records, the run's metrics, the
    export's identity (`<experiment>/export@<version>:<fingerprint>`) and the experiment's license and a
    validation prompt (`facts`)."""
    model = model_record["fields"]["model"]
    data = data_record["fields"]["data"]
    sources = [(split, d["source"], d["revision"]) for split in ("train", "validation") for d in data[split]]
    datasets = sorted({repo for _, s, r in sources if (repo := hub_repo(s, r))})
    validation = [(s, r) for split, s, r in sources if split == "validation"]
    evaluated = last_eval(records)
    name = f"{launch.run.name}-v{launch.run.version}"
    scores = {("accuracy", f"held-out greedy accuracy (step {evaluated[0]})"): evaluated[1]} if evaluated else {}
    # The model-index's dataset: the validation sources (a Hub repo id where they are one).
    dataset = ", ".join(source for source, _ in validation) or "none"
    dataset_type = next((repo for s, r in validation if (repo := hub_repo(s, r))), dataset)
    metadata = ModelCardData(
        base_model=hub_repo(model["source"], model["revision"]),
        license=facts.license,
        datasets=datasets or None,
        tags=TAGS,
        library_name="transformers",
        pipeline_tag=TASK,
        model_name=name,
        eval_results=_results(scores, dataset, dataset_type) or None,
    )
    body = _body(launch, model, sources, records, name, identity, facts)
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}")


def card_for_run(
    launch: LaunchDocument, model_record: str, data_record: str, identity: str, license_id: str
) -> ModelCard:
    """The card of the export `identity` of `launch`, from the stored records of its staged model and data, its
    metrics, its staged validation split and the experiment's license (`license_id`)."""
    found = {path: read_record(path) for path in (model_record, data_record)}
    missing = [path for path, record in found.items() if record is None]
    if missing:
        raise RlbuildError(f"{missing} missing: the staged inputs of this launch have no record; rerun staging")
    records, _ = read_run_metrics(launch.artifacts.metrics_uri, launch.artifacts.metrics_segments_root)
    prompt = first_prompt([entry.uri for entry in launch.inputs.validation_data])
    facts = CardFacts(license_id, prompt)
    return build_card(launch, found[model_record], found[data_record], records, identity, facts)


def with_eval_results(card: ModelCard, results: Mapping[str, Any]) -> ModelCard:
    """The card with the eval stage's scores (greedy accuracy, pass@k) as its model-index, on the dataset the
    export's card names."""
    scores = {
        ("accuracy", "held-out greedy accuracy (eval stage)"): float(results["accuracy"]),
        ("pass@k", f"pass@{results['k']} (eval stage)"): float(results["pass_at_k"]),
    }
    known = card.data.eval_results or []
    dataset = known[0].dataset_name if known else ", ".join(results.get("validation_files", [])) or "validation"
    card.data.eval_results = _results(scores, dataset, known[0].dataset_type if known else dataset)
    return ModelCard(f"---\n{card.data.to_yaml()}\n---\n{card.text}")


def _task(launch: LaunchDocument, evaluated: tuple[int, float] | None, before: float | None) -> list[str]:
    """What the policy was trained to do, and how well it does it (and the base model did), in the card's words."""
    environment = launch.recipe.environment
    base = f"; the base model, before training: {before:.3f} (step 0)" if before is not None and evaluated else ""
    if environment.max_turns == 1 and environment.sandbox is None:
        solved = (
            f"answers {evaluated[1]:.3f} of held-out prompts right (greedy, step {evaluated[0]}){base}"
            if evaluated
            else ""
        )
        return [
            f"- environment `{environment.env_class}`: one completion per prompt, scored by its reward",
            *([f"- success: it {solved}"] if solved else []),
        ]
    sandbox = environment.sandbox
    where = f"in a `{sandbox.backend}` sandbox (one shell per episode, no network)" if sandbox else "without a sandbox"
    lines = [
        f"- agent environment `{environment.env_class}`: episodes of up to {environment.max_turns} turns, each action "
        f"ending at {environment.turn_stop!r}, run {where}; the environment's verifier gives the reward",
    ]
    if evaluated:
        lines.append(f"- success: {evaluated[1]:.3f} of held-out episodes solved (greedy, step {evaluated[0]}){base}")
    return lines


def _body(
    launch: LaunchDocument,
    model: Mapping[str, Any],
    sources: Sequence[tuple[str, str, str]],
    records: Sequence[Mapping[str, Any]],
    name: str,
    identity: str,
    facts: CardFacts,
) -> str:
    trainer, generator = launch.recipe.trainer, launch.recipe.generator
    placement, allocation = trainer.placement, launch.allocation
    steps = max((int(r["step"]) for r in records), default=trainer.max_steps)
    hours = gpu_hours(launch, records)
    evaluated, before = last_eval(records), base_accuracy(records)
    tokenizer = model["tokenizer"]
    lines = [
        f"# {name}",
        "",
        f"A policy trained with GRPO by rlbuild from `{model['source']}` (revision `{model['revision']}`).",
        "",
        "## The task",
        "",
        *_task(launch, evaluated, before),
        "",
        "## How it was trained",
        "",
        f"- entrypoint `{launch.runtime.entrypoint}`, strategy `{launch.runtime.strategy}`, seed {launch.run.seed}",
        f"- the training loop: {trainer.loop()}",
        f"- steps: {steps} of {trainer.max_steps}; {trainer.train_batch_size} prompts x "
        f"{generator.n_samples_per_prompt} samples a step, lr {trainer.policy.optimizer_config.lr}",
        f"- role plan: policy {placement.policy_num_nodes} node(s) x {placement.policy_num_gpus_per_node} GPU(s), "
        f"{reference_placement(launch.recipe)}, {generator.num_inference_engines} engine(s) of TP "
        f"{generator.inference_engine_tensor_parallel_size}, colocate_all {placement.colocate_all}",
        f"- hardware: {allocation.num_nodes} node(s) x {allocation.gpus_per_node} {allocation.gpu_variant}",
        f"- GPU-hours: {f'{hours:.3f}' if hours is not None else 'not measured (CPU ranks or no step times)'}",
        f"- held-out greedy accuracy at step {evaluated[0]}: {evaluated[1]:.3f}" if evaluated else "- no eval step",
        f"- held-out greedy accuracy of the base model (step 0, before training): {before:.3f}"
        if before is not None
        else "- the base model was not scored before training (trainer.eval_before_train is off)",
        "",
        "## License",
        "",
        _license(facts.license),
        "",
        "## Provenance",
        "",
        *([f"- identity: `{identity}`"] if identity else []),
        f"- launch fingerprint: `{launch.run.fingerprint}` (run `{launch.run.id}`)",
        f"- runtime digest: `{launch.runtime.source_digest}`",
        f"- model: `{model['source']}` @ `{model['revision']}`; tokenizer `{tokenizer['source']}` @ "
        f"`{tokenizer['revision']}`",
        *(f"- {split} data: `{source}` @ `{revision}`" for split, source, revision in sources),
        "",
        *_quick_start(facts.prompt),
    ]
    return "\n".join(lines)


def _license(license_id: str) -> str:
    if license_id == DEFAULT_LICENSE:
        return (
            f"`{DEFAULT_LICENSE}`: the default, as the experiment names no `license:`. The base model's and the "
            "training data's terms apply; set `license:` in the experiment file (a Hub license id, e.g. apache-2.0)."
        )
    return f"`{license_id}`, as the experiment file's `license:` says."


def _quick_start(prompt: str | None) -> list[str]:
    """Load the policy and ask it the first held-out prompt, exactly as the policy saw such prompts."""
    asking = [
        f'inputs = tokenizer({prompt!r}, return_tensors="pt")  # the first prompt of the validation split',
        "print(tokenizer.decode(model.generate(**inputs)[0]))  # sampling settings: generation_config.json",
    ]
    return [
        "## Quick start",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'path = "."  # this folder, or the Hub repo it was published to',
        "tokenizer = AutoTokenizer.from_pretrained(path)",
        "model = AutoModelForCausalLM.from_pretrained(path)",
        *(asking if prompt is not None else ["# the validation split holds no prompt to show"]),
        "```",
        "",
    ]
