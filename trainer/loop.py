"""The training loop, top to bottom: inputs -> Ray roles -> (rollout, reward, advantage, train, sync) x steps
-> checkpoints -> terminal manifest.

The driver (this process) owns the data order, rewards, advantages and loss weights; the policy workers own
the model and optimizer; the engines own sampling. Everything random is derived from (seed, step), so a run
resumed from a checkpoint produces the same steps as an uninterrupted one.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch
from transformers import AutoTokenizer

from trainer import env as environments
from trainer import evaluate, grpo, storage
from trainer.checkpoint import CheckpointManager, Resume
from trainer.config import Launch, LaunchError
from trainer.engines import Rollout, SamplingParams, max_abs_difference, resolve_backend
from trainer.metrics import MetricsWriter
from trainer.ray_cluster import Roles, bundles_needed, connect, place_roles, rendezvous
from trainer.tasks import read_jsonl
from trainer.weight_sync import TensorSpec

DEV_VERSION = "dev"


class TrainError(RuntimeError):
    """The run cannot start or continue; the message says why and what to do."""


class WeightSyncError(TrainError):
    """After a weight sync the engine's logprobs differ from the policy's beyond the tolerance."""


# ----------------------------------------------------------------------------------------------- data


def load_rows(uris: list[str], cache_dir: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for uri in uris:
        rows += read_jsonl(storage.materialise(uri, cache_dir))
    return rows


def batch_rows(rows: list[dict[str, str]], cursor: int, count: int, seed: int) -> list[dict[str, str]]:
    """`count` rows starting at `cursor` in an endless stream of per-epoch shuffles (epoch e uses seed + e)."""
    out = []
    for index in range(cursor, cursor + count):
        epoch, position = divmod(index, len(rows))
        order = list(range(len(rows)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(rows[order[position]])
    return out


def group(rows: list[dict[str, str]], group_size: int) -> list[dict[str, str]]:
    """Each prompt repeated group_size times, contiguously: every GRPO group holds exactly one prompt."""
    return [row for row in rows for _ in range(group_size)]


def build_batch(prompts: list[list[int]], rollouts: list[Rollout], pad_id: int) -> dict[str, torch.Tensor]:
    """[left-padded prompt | right-padded completion] tensors for the policy workers."""
    prompt_width = max(map(len, prompts))
    completion_width = max(len(r.token_ids) for r in rollouts)
    n = len(prompts)
    ids = torch.full((n, prompt_width + completion_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((n, completion_width))
    rollout_logp = torch.zeros((n, completion_width))
    for i, (prompt, rollout) in enumerate(zip(prompts, rollouts, strict=True)):
        length = len(rollout.token_ids)
        ids[i, prompt_width - len(prompt) : prompt_width] = torch.tensor(prompt)
        ids[i, prompt_width : prompt_width + length] = torch.tensor(rollout.token_ids)
        attention[i, prompt_width - len(prompt) : prompt_width + length] = 1
        mask[i, :length] = 1.0
        rollout_logp[i, :length] = torch.tensor(rollout.logprobs)
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": mask, "rollout_logprobs": rollout_logp}


def add_loss_weights(batch: dict[str, torch.Tensor], mini_rows: int, reduction: str) -> None:
    """Per-token weights normalised over each whole optimizer mini-batch (HEAD semantics, no micro bias)."""
    mask = batch["completion_mask"]
    loss_w, seq_w = torch.zeros_like(mask), torch.zeros_like(mask)
    for start in range(0, mask.shape[0], mini_rows):
        rows = slice(start, start + mini_rows)
        loss_w[rows] = grpo.reduction_weights(mask[rows], reduction)
        seq_w[rows] = grpo.reduction_weights(mask[rows], "seq_mean_token_mean")
    batch["loss_weights"], batch["seq_weights"] = loss_w, seq_w


def drop_zero_variance_groups(
    batch: dict[str, torch.Tensor], rewards: torch.Tensor, group_size: int, mini_rows: int, world: int
) -> tuple[dict[str, torch.Tensor], int]:
    """Keep only groups whose rewards differ (the others have advantage 0: no policy gradient).

    Each mini-batch keeps its own informative rows, padded (completion mask 0, so zero weight) to a common
    size that splits evenly over the ranks. Returns the new batch and its rows per mini-batch.
    """
    informative = (rewards.view(-1, group_size).std(dim=1) > 0).repeat_interleave(group_size)
    n = informative.shape[0]
    kept = [torch.nonzero(informative[s : s + mini_rows]).flatten() + s for s in range(0, n, mini_rows)]
    width = max(world, -(-max(len(k) for k in kept) // world) * world)
    index, padding = [], []
    for start, rows in zip(range(0, n, mini_rows), kept, strict=True):
        fill = width - len(rows)
        index.append(torch.cat([rows, torch.full((fill,), start, dtype=torch.long)]))
        padding.append(torch.cat([torch.zeros(len(rows), dtype=torch.bool), torch.ones(fill, dtype=torch.bool)]))
    out = {k: v[torch.cat(index)] for k, v in batch.items()}
    out["completion_mask"] = out["completion_mask"].masked_fill(torch.cat(padding)[:, None], 0.0)
    return out, width


def shard(batch: dict[str, torch.Tensor], mini_rows: int, world: int) -> list[dict[str, torch.Tensor]]:
    """Rank r gets the r-th contiguous slice of every mini-batch, so each optimizer step spans all ranks."""
    per_rank = mini_rows // world
    n = batch["input_ids"].shape[0]
    shards = []
    for rank in range(world):
        index = torch.cat(
            [torch.arange(s + rank * per_rank, s + (rank + 1) * per_rank) for s in range(0, n, mini_rows)]
        )
        shards.append({k: v[index] for k, v in batch.items()})
    return shards


# ----------------------------------------------------------------------------------------------- roles


@dataclass
class Cluster:
    roles: Roles
    started_ray: bool
    weight_specs: list[TensorSpec] = field(default_factory=list)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
        """Split the prompts over the engines in contiguous chunks (groups stay on one engine when they fit)."""
        engines = self.roles.engines
        size = -(-len(prompts) // len(engines))
        futures = [
            e.generate.remote(prompts[i * size : (i + 1) * size], params, seed + i) for i, e in enumerate(engines)
        ]
        return [r for part in ray.get(futures) for r in part]

    def reference_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Score the batch on the reference workers, a contiguous share of rows each."""
        workers = self.roles.reference
        size = -(-batch["input_ids"].shape[0] // len(workers))
        parts = [{k: v[i * size : (i + 1) * size] for k, v in batch.items()} for i in range(len(workers))]
        return torch.cat(ray.get([w.logprobs.remote(p) for w, p in zip(workers, parts, strict=True)]))

    def open_weight_sync(self, backend: str) -> None:
        """Open the policy -> engines broadcast group (trainer/weight_sync.py) and learn what it will carry."""
        policy, engines = self.roles.policy, self.roles.engines
        if backend == "nccl" and not torch.cuda.is_available() and ray.cluster_resources().get("GPU", 0) == 0:
            raise TrainError(
                "generator.weight_sync_backend=nccl needs GPUs on the policy and the engines; this cluster has "
                "none. Use weight_sync_backend: gloo on CPU."
            )
        ranks = ray.get([e.sync_ranks.remote() for e in engines])
        first_ranks = [1 + sum(ranks[:i]) for i in range(len(engines))]
        master_addr, port = rendezvous(
            policy[0], ray.get([policy[0].node.remote(), *[e.node.remote() for e in engines]])
        )
        world = 1 + sum(ranks)
        ray.get(
            [
                policy[0].open_weight_sync.remote(backend, master_addr, port, world),
                *[
                    e.open_weight_sync.remote(backend, master_addr, port, r, world)
                    for e, r in zip(engines, first_ranks, strict=True)
                ],
            ]
        )
        self.weight_specs = ray.get([w.weight_specs.remote() for w in policy])[0]

    def sync_weights(self, probe: list[int], probe_start: int, tolerance: float) -> float:
        """Broadcast the policy's full weights to every engine, then check engine logprobs == policy logprobs."""
        ray.get(
            [w.broadcast_weights.remote() for w in self.roles.policy]
            + [e.receive_weights.remote(self.weight_specs) for e in self.roles.engines]
        )
        expected = ray.get([w.sequence_logprobs.remote(probe, probe_start) for w in self.roles.policy])[0]
        worst = 0.0
        for engine in self.roles.engines:
            worst = max(
                worst, max_abs_difference(expected, ray.get(engine.sequence_logprobs.remote(probe, probe_start)))
            )
        if worst > tolerance:
            raise WeightSyncError(
                f"after the weight sync, engine logprobs differ from the policy's by {worst:.3g} > "
                f"generator.weight_sync_check_tolerance={tolerance}: the engine is not running the policy's weights "
                "(tied embeddings or a renamed parameter?)"
            )
        return worst

    def shutdown(self) -> None:
        ray.get([w.shutdown.remote() for w in self.roles.policy])
        self.roles.shutdown()
        if self.started_ray:
            ray.shutdown()


# ----------------------------------------------------------------------------------------------- run


def check_can_start(launch: Launch, terminal_uri: str, allow_retrain: bool, manager: CheckpointManager) -> None:
    if storage.exists(terminal_uri):
        raise TrainError(
            f"terminal manifest {terminal_uri} already exists: this version is trained. Use a new version (or delete "
            "it for version dev)."
        )
    final = int(launch.recipe["trainer"]["max_steps"])
    if launch.version != DEV_VERSION and not allow_retrain and manager.latest_step() == final:
        raise TrainError(
            f"{launch.checkpoint_root} already holds the completed final step {final} of immutable version "
            f"{launch.version}, but its terminal manifest is missing (a forced retrain?). Use a new version, or pass "
            "--allow-retrain to train again from step 0."
        )


def run(launch: Launch, terminal_uri: str | None = None, allow_retrain: bool = False) -> dict[str, Any]:
    """Train as the launch document says; write checkpoints, metrics and the terminal manifest. Returns it."""
    t = launch.recipe["trainer"]
    terminal_uri = terminal_uri or launch.terminal_manifest_uri
    digest = storage.runtime_source_digest()
    manager = CheckpointManager(launch.checkpoint_root, launch.resume_checkpoint_count, digest)
    check_can_start(launch, terminal_uri, allow_retrain, manager)
    resume = None if allow_retrain else manager.resolve(t["resume_mode"], t["resume_path"])
    # A fresh verified copy per run: a dev version re-staged at the same URI must never meet a stale cache.
    cache_dir = Path(tempfile.mkdtemp(prefix="rlbuild-inputs-"))
    try:
        return _run_with_inputs(launch, terminal_uri, resume, manager, cache_dir)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _run_with_inputs(
    launch: Launch, terminal_uri: str, resume: Resume | None, manager: CheckpointManager, cache_dir: Path
) -> dict[str, Any]:
    recipe, t, g = launch.recipe, launch.recipe["trainer"], launch.recipe["generator"]
    model_dir = storage.materialise(launch.model_uri, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    environment = environments.make(recipe["environment"]["env_class"])
    train_rows, validation_rows = load_rows(launch.train_uris, cache_dir), load_rows(launch.validation_uris, cache_dir)
    max_prompt = int(g["max_prompt_length"])
    kept = [row for row in train_rows if len(tokenizer(row["prompt"])["input_ids"]) <= max_prompt]
    if len(kept) < int(t["train_batch_size"]):
        raise LaunchError(
            f"only {len(kept)} of {len(train_rows)} train rows fit generator.max_prompt_length={max_prompt}, fewer "
            f"than trainer.train_batch_size={t['train_batch_size']}; raise max_prompt_length or add data"
        )
    backend = resolve_backend(g["backend"])
    started = connect(launch.ray_address, bundles_needed(recipe))
    cluster = Cluster(place_roles(recipe, launch.model_uri, str(cache_dir), backend), started)
    try:
        cluster.open_weight_sync(g["weight_sync_backend"])
        return _train(launch, cluster, manager, resume, tokenizer, environment, kept, validation_rows, terminal_uri)
    finally:
        cluster.shutdown()


def _train(
    launch: Launch,
    cluster: Cluster,
    manager: CheckpointManager,
    resume: Resume | None,
    tokenizer: Any,
    environment: Any,
    train_rows: list[dict[str, str]],
    validation_rows: list[dict[str, str]],
    terminal_uri: str,
) -> dict[str, Any]:
    t, g = launch.recipe["trainer"], launch.recipe["generator"]
    seed, max_steps = launch.seed, int(t["max_steps"])
    prompts_per_step, group_size = int(t["train_batch_size"]), int(g["n_samples_per_prompt"])
    mini_rows = int(t["policy_mini_batch_size"]) * group_size
    minis = int(t["train_batch_size"]) // int(t["policy_mini_batch_size"])
    world = launch.policy_world_size
    sampling = SamplingParams.from_recipe(g["sampling_params"])
    eval_tokens = int(g["eval_sampling_params"]["max_generate_length"])
    tolerance = float(g["weight_sync_check_tolerance"])
    # A fixed sequence for the weight-sync check: a validation prompt followed by its answer and <eos>.
    probe_row = (validation_rows or train_rows)[0]
    probe_prompt = tokenizer(probe_row["prompt"])["input_ids"]
    probe = (
        probe_prompt + tokenizer(probe_row["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    )

    step, cursor = (resume.step, resume.data_cursor) if resume else (0, 0)
    if resume:
        ray.get([w.load_checkpoint.remote(resume.uri) for w in cluster.roles.policy])
        cluster.sync_weights(probe, len(probe_prompt), tolerance)
        print(f"[trainer] resumed from {resume.uri} at step {step}", flush=True)
    # A fresh start (also --allow-retrain / resume_mode none) drops every earlier line; a resume keeps its past.
    kept_until = step if resume else -1
    metrics = MetricsWriter(
        launch.metrics_uri, kept_until, t["logger"], t["project_name"], launch.run_id, launch.recipe
    )

    def held_out_accuracy() -> float | None:
        if not validation_rows:
            return None
        result = evaluate.score(
            cluster.generate,
            tokenizer,
            validation_rows,
            max_tokens=eval_tokens,
            seed=seed,
            env_class=launch.recipe["environment"]["env_class"],
        )
        return float(result["accuracy"])

    if step == 0 and t["eval_before_train"]:
        metrics.log(0, {"eval_accuracy": held_out_accuracy()}, max_steps)
    while step < max_steps:
        step += 1
        began = time.perf_counter()
        rows = group(batch_rows(train_rows, cursor, prompts_per_step, seed), group_size)
        cursor += prompts_per_step
        prompts = evaluate.encode_prompts(tokenizer, rows)
        rollouts = cluster.generate(prompts, sampling, seed * 1_000_003 + step)
        generated = time.perf_counter()
        rewards = torch.tensor(evaluate.rewards(tokenizer, environment, rows, rollouts))
        advantages = grpo.group_advantages(rewards, group_size, bool(t["algorithm"]["grpo_norm_by_std"]))
        batch = build_batch(prompts, rollouts, tokenizer.pad_token_id)
        batch["advantages"] = advantages
        rows_per_mini = mini_rows
        if t["algorithm"]["zero_variance_filter"]:
            batch, rows_per_mini = drop_zero_variance_groups(batch, rewards, group_size, mini_rows, world)
        add_loss_weights(batch, rows_per_mini, t["algorithm"]["loss_reduction"])
        if cluster.roles.reference:
            batch["ref_logprobs"] = cluster.reference_logprobs(batch)
        shards = shard(batch, rows_per_mini, world)
        micro = int(t["micro_train_batch_size_per_gpu"])
        results = ray.get(
            [w.train_step.remote(s, minis, micro) for w, s in zip(cluster.roles.policy, shards, strict=True)]
        )
        trained = time.perf_counter()
        sync_error = cluster.sync_weights(probe, len(probe_prompt), tolerance)
        synced = time.perf_counter()
        completion_tokens = float(sum(len(r.token_ids) for r in rollouts))
        grouped = rewards.view(-1, group_size)
        values: dict[str, Any] = {
            "reward_mean": float(rewards.mean()),
            "frac_correct": float((rewards >= 1.0).float().mean()),
            "zero_variance_groups": float((grouped.std(dim=1) == 0).float().mean()),
            "trained_sequences": int((batch["completion_mask"].sum(dim=1) > 0).sum()),
            "response_length": completion_tokens / len(rollouts),
            **results[0],
            "weight_sync_max_abs_diff": sync_error,
            "rollout_tokens_per_s": completion_tokens / max(generated - began, 1e-9),
            "train_tokens_per_s": results[0]["train_tokens"] / max(trained - generated, 1e-9),
            "rollout_time_s": generated - began,
            "train_time_s": trained - generated,
            "sync_time_s": synced - trained,
        }
        if step == max_steps or (int(t["eval_interval"]) > 0 and step % int(t["eval_interval"]) == 0):
            values["eval_accuracy"] = held_out_accuracy()
        if step == max_steps or step % int(t["ckpt_interval"]) == 0:
            manager.save(
                step,
                cursor,
                {"seed": seed, "run_id": launch.run_id, "policy_world_size": world},
                lambda uri: ray.get([w.save_checkpoint.remote(uri) for w in cluster.roles.policy]),
            )
        values["step_time_s"] = time.perf_counter() - began
        metrics.log(step, values, max_steps)
    metrics.close()
    return write_terminal(launch, manager, step, metrics.records(), terminal_uri)


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The terminal manifest's metrics: held-out accuracy before/after, and the last 10 steps' averages."""
    steps = [r for r in records if r["step"] > 0 and "reward_mean" in r]
    tail = steps[-10:]
    evals = [r for r in records if r.get("eval_accuracy") is not None]

    def mean(key: str, rows: list[dict[str, Any]]) -> float | None:
        return sum(r[key] for r in rows) / len(rows) if rows else None

    return {
        "steps_logged": len(steps),
        "initial_eval_accuracy": evals[0]["eval_accuracy"] if evals and evals[0]["step"] == 0 else None,
        "final_eval_accuracy": evals[-1]["eval_accuracy"] if evals else None,
        "final_reward_mean": mean("reward_mean", tail),
        "final_frac_correct": mean("frac_correct", tail),
        "final_kl": mean("kl", tail),
        "mean_step_time_s": mean("step_time_s", steps),
        "total_step_time_s": sum(r["step_time_s"] for r in steps),
    }


def write_terminal(
    launch: Launch,
    manager: CheckpointManager,
    step: int,
    records: list[dict[str, Any]],
    terminal_uri: str,
) -> dict[str, Any]:
    """terminal.json, written once and last: the terminal checkpoint's policy/ folder is the HF export."""
    checkpoint = manager.step_uri(step)
    manifest = {
        "global_step": step,
        "checkpoint_path": checkpoint,
        "hf_path": storage.join(checkpoint, "policy"),
        "export_path": launch.document["artifacts"].get("export_root"),
        "runtime_source_digest": manager.runtime_digest,
        "metrics": summarise(records),
    }
    if storage.exists(terminal_uri):
        raise TrainError(f"terminal manifest {terminal_uri} appeared during training; refusing to overwrite it")
    storage.write_text(terminal_uri, json.dumps(manifest, indent=2) + "\n")
    return manifest
