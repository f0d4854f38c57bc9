"""The GRPO training loop, read top to bottom (`python -m trainer run --launch launch.yaml`).

    run()    where to start (fresh, resumed, or refused), the inputs, the roles on Ray; train(); terminal.json
    train()  each step: its samples (prompts -> rollouts -> rewards, trainer/sampling.py; under fully_async taken
             from a generator thread running ahead) -> advantages -> update -> weight sync -> held-out
             eval and checkpoint when due -> metrics (appended; merged into metrics.jsonl at the end); before a
             wall-clock limit, a checkpoint and exit "to be continued" (trainer/continuation.py)

The driver (this process) owns the data order, rewards, advantages and loss weights; the policy workers own
the model and optimizer; the engines own sampling. Everything random derives from (seed, step), so a run resumed
from a checkpoint takes the same steps as an uninterrupted one (under fully_async the same prompts; which weights
sample them depends on timing).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlbuild.contracts import runtime
from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.manifest import materialise, verify_stored
from rlbuild.contracts.metricstream import read_run_metrics, write_run_metrics
from rlbuild.core import storage
from trainer import continuation, data, sampling
from trainer import env as environments
from trainer.agents.episodes import EpisodePlayer, is_played
from trainer.checkpoint import CheckpointManager, Resume
from trainer.commands import evaluate
from trainer.env import Environment
from trainer.errors import TrainerError
from trainer.metrics import MetricsWriter, Stopwatch, step_metrics
from trainer.sandbox import registry
from trainer.terminal import write_terminal
from trainer.workers import grpo, startup
from trainer.workers.batch import update_batch
from trainer.workers.engines import resolve_backend
from trainer.workers.placement import start_roles
from trainer.workers.roles import Roles


@dataclass(frozen=True)
class Inputs:
    """What the driver holds: the tokenizer, the reward environment (or the episode player of an agent environment:
    trainer/agents/episodes.py), the rows, and the weight-sync probe."""

    tokenizer: PreTrainedTokenizerBase
    environment: Environment | EpisodePlayer
    train_rows: list[dict[str, Any]]
    validation_rows: list[dict[str, Any]]
    probe: tuple[list[int], int]


def run(launch: LaunchDocument, terminal_uri: str | None = None, allow_retrain: bool = False) -> dict[str, Any]:
    """Train as the launch document says; write checkpoints, metrics and the terminal manifest. Returns it."""
    continuation.listen()  # before anything slow: a wall-clock warning must not find the trainer deaf
    terminal_uri = terminal_uri or launch.artifacts.terminal_manifest_uri
    artifacts, max_steps = launch.artifacts, launch.recipe.trainer.max_steps
    checkpoints = CheckpointManager(
        artifacts.checkpoint_root, artifacts.resume_checkpoint_count, runtime.source_digest(), launch.run.fingerprint
    )
    resume = start_point(launch, terminal_uri, checkpoints, allow_retrain)
    if resume is not None and resume.step == max_steps:
        # The final checkpoint is complete but terminal.json is not (deleted outputs, or a crash in between).
        print(f"[trainer] {resume.uri} is the completed final step; writing its terminal manifest", flush=True)
        verify_stored(resume.uri, resume.files)  # every file, before terminal.json vouches for it
        records = read_run_metrics(artifacts.metrics_uri, artifacts.metrics_segments_root)[0]
        write_run_metrics(artifacts.metrics_uri, records)  # the run may have ended before it was written
        return write_terminal(launch, checkpoints, records, terminal_uri)
    # A fresh verified copy per run: a dev version re-staged at the same URI must never meet a stale cache.
    with tempfile.TemporaryDirectory(prefix="rlbuild-inputs-") as cache:
        if launch.recipe.environment.sandbox is not None:
            registry.prove(launch.recipe.environment.sandbox)
        inputs = load_inputs(launch, Path(cache))
        backend = resolve_backend(launch.recipe.generator.backend)
        roles = start_roles(launch, cache, backend)
        startup.reached("actors")
        continuation.listen()  # again: ray.init replaces the SIGTERM handler with its own
        try:
            records = train(launch, roles, inputs, checkpoints, resume)
        finally:
            roles.shutdown()
    return write_terminal(launch, checkpoints, records, terminal_uri)


def train(
    launch: LaunchDocument, roles: Roles, inputs: Inputs, checkpoints: CheckpointManager, resume: Resume | None
) -> list[dict[str, Any]]:
    """The steps from the resume point (or 0) to max_steps; returns every metrics record of the run."""
    t, g = launch.recipe.trainer, launch.recipe.generator
    step, cursor = (resume.step, resume.data_cursor) if resume else (0, 0)
    if resume:
        roles.load_checkpoint(resume.uri, resume.files)
        roles.sync_weights(*inputs.probe, g.weight_sync_check_tolerance)
        print(f"[trainer] resumed from {resume.uri} at step {step}", flush=True)
    # A fresh start (also --allow-retrain / resume_mode none) drops every earlier line; a resume keeps its past.
    metrics = MetricsWriter.for_launch(launch, kept_until=step if resume else -1)
    if isinstance(inputs.environment, EpisodePlayer) and metrics.progress is not None:
        inputs.environment.liveness.publish = metrics.progress.episodes  # status sees episodes before a step ends
    if step == 0 and t.eval_before_train:
        metrics.log(0, accuracies(launch, roles, inputs))
    player = inputs.environment if isinstance(inputs.environment, EpisodePlayer) else None
    sample = partial(
        sampling.sample_step, roles, inputs.tokenizer, inputs.environment, inputs.train_rows, launch.recipe
    )
    source = sampling.open_source(t.entrypoint, sample, player, step, cursor, t.fully_async.max_staleness_steps)
    try:
        return _steps(launch, roles, inputs, checkpoints, metrics, source, step)
    finally:
        source.close()


def _steps(
    launch: LaunchDocument,
    roles: Roles,
    inputs: Inputs,
    checkpoints: CheckpointManager,
    metrics: MetricsWriter,
    source: sampling.StepSource,
    step: int,
) -> list[dict[str, Any]]:
    """Each step after `step`: its samples from `source`, then advantages, update, weight sync, eval, checkpoint."""
    t, g = launch.recipe.trainer, launch.recipe.generator
    pad_id = inputs.tokenizer.pad_token_id
    minis = t.train_batch_size // t.policy_mini_batch_size
    while step < t.max_steps:
        step += 1
        clock = Stopwatch()
        taken = source.take(step)
        sampled, cursor = taken.step, taken.step.cursor
        write_trajectories(launch, step, sampled.drawn)
        clock.lap("rollout", taken.generate_s)
        startup.reached("rollout")
        update = sampled.update
        advantages = grpo.group_advantages(
            update.rewards, g.n_samples_per_prompt, t.algorithm.grpo_norm_by_std, t.algorithm.advantage_eps
        )
        batch = update_batch(update.prompts, update.rollouts, update.rewards, advantages, launch.recipe, pad_id)
        stats = roles.update(batch, minis, t.micro_train_batch_size_per_gpu)
        clock.lap("train")
        startup.reached("step")
        sync_error = roles.sync_weights(*inputs.probe, g.weight_sync_check_tolerance)
        source.synced(step)
        clock.lap("sync")
        values = step_metrics(sampled, g.n_samples_per_prompt, batch, stats, sync_error, clock) | taken.metrics
        if isinstance(inputs.environment, EpisodePlayer):  # where an agent run's rollout time went
            values["perf/environment_time_s"] = taken.environment_s
            values["perf/sandboxes_started"] = taken.sandboxes_started
        if _due(step, t.eval_interval, t.max_steps):
            values |= accuracies(launch, roles, inputs)
        stop = continuation.requested() if step < t.max_steps else None  # once per step: the hand-over point
        checkpointed = _due(step, t.ckpt_interval, t.max_steps) or stop is not None
        if checkpointed:
            state = {"seed": t.seed, "run_id": launch.run.id, "policy_world_size": t.placement.policy_world_size}
            # Only the terminal checkpoint gathers an HF folder (trainer/checkpoint.py says why).
            write = partial(roles.save_checkpoint, with_hf_folder=step == t.max_steps)
            checkpoints.save(step, cursor, state, write)
        values["perf/step_time_s"] = clock.total()
        # Lines up to a checkpoint must survive a kill: a resume from it keeps them (and drops the later ones).
        metrics.log(step, values, flush=checkpointed)
        if said := startup.summary():
            print(f"[trainer] {said}", flush=True)
        if stop:
            metrics.close(None)  # the run goes on in the next link: no metrics.jsonl yet
            raise continuation.ToBeContinued(step, checkpoints.step_uri(step), *stop)
    metrics.close(launch.artifacts.metrics_uri)
    return metrics.records()


def start_point(
    launch: LaunchDocument, terminal_uri: str, checkpoints: CheckpointManager, allow_retrain: bool
) -> Resume | None:
    """Where training starts: None for step 0, or the checkpoint to resume (the final one: nothing left to train).

    Refuses when the terminal manifest exists. Retraining a completed fixed version is refused earlier, before
    Snakemake deletes anything (rlbuild/workflow.py); `allow_retrain` starts over from step 0.
    """
    if storage.exists(terminal_uri):
        raise TrainerError(
            f"terminal manifest {terminal_uri} already exists: this version is trained. Use a new version (or delete "
            "it for version dev)."
        )
    t = launch.recipe.trainer
    return None if allow_retrain else checkpoints.resolve(t.resume_mode, t.resume_path)


def load_inputs(launch: LaunchDocument, cache_dir: Path) -> Inputs:
    """Materialise and verify the staged model and data; keep the prompts that fit."""
    recipe = launch.recipe
    tokenizer = AutoTokenizer.from_pretrained(materialise(launch.inputs.model.uri, cache_dir))
    train_rows = data.load_rows([entry.uri for entry in launch.inputs.train_data], cache_dir)
    validation_rows = data.load_rows([entry.uri for entry in launch.inputs.validation_data], cache_dir)
    kept = data.prompts_that_fit(
        train_rows, tokenizer, recipe.generator.max_prompt_length, recipe.trainer.train_batch_size
    )
    section, env_class = recipe.environment, recipe.environment.env_class
    played = is_played(env_class, section)
    return Inputs(
        tokenizer=tokenizer,
        environment=EpisodePlayer(env_class, section, tokenizer) if played else environments.make(env_class),
        train_rows=kept,
        validation_rows=validation_rows,
        probe=data.probe_sequence(tokenizer, (validation_rows or kept)[0]),
    )


def accuracies(launch: LaunchDocument, roles: Roles, inputs: Inputs) -> dict[str, float]:
    """Greedy exact-match accuracy on the validation rows (`eval/accuracy`) and, beside it, on as many train rows
    (`eval/train_accuracy`), sampled by the run's own engines. A wide gap between the two is memorisation: the
    policy answers the prompts it trains on and not the task."""
    if not inputs.validation_rows:
        return {}
    score = partial(
        evaluate.score,
        roles.generate,
        inputs.tokenizer,
        max_tokens=launch.recipe.generator.eval_sampling_params.max_generate_length,
        seed=launch.recipe.trainer.seed,
        env_class=launch.recipe.environment.env_class,
        player=inputs.environment if isinstance(inputs.environment, EpisodePlayer) else None,
    )
    n = len(inputs.validation_rows)
    train_sample = inputs.train_rows[:: max(len(inputs.train_rows) // n, 1)][:n]  # spread over the whole split
    return {
        "eval/accuracy": float(score(inputs.validation_rows)["accuracy"]),
        "eval/train_accuracy": float(score(train_sample)["accuracy"]),
    }


def write_trajectories(launch: LaunchDocument, step: int, drawn: sampling.Samples) -> None:
    """A sample of the step's episodes (the first of each group, up to `environment.trajectories_per_step`) as
    JSONL: what a person reads to see what the policy does in the environment while it trains."""
    wanted, group = launch.recipe.environment.trajectories_per_step, launch.recipe.generator.n_samples_per_prompt
    if drawn.episodes is None or wanted == 0:
        return
    lines = [json.dumps({"step": step, **e.record()}) + "\n" for e in drawn.episodes[::group][:wanted]]
    storage.write_text(f"{launch.artifacts.trajectories_root}/step-{step:06d}.jsonl", "".join(lines))


def _due(step: int, interval: int, max_steps: int) -> bool:
    """Every `interval` steps (never when it is -1), and always at the last step."""
    return step == max_steps or (interval > 0 and step % interval == 0)
