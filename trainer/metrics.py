"""Per-step metrics: `metrics.jsonl` beside the checkpoints, a console line, and W&B when configured.

The file is rewritten whole each step (S3 has no append); on resume, lines after the resumed step are dropped
so the file always describes one consistent run.

W&B (`trainer.logger: wandb`) reads its usual environment: online it needs WANDB_API_KEY; with WANDB_MODE=offline
it needs no account or network and writes `wandb/offline-run-*` under WANDB_DIR (default: the working directory),
which `wandb sync` uploads later.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

from rlbuild import storage
from rlbuild.launch import LaunchDocument
from rlbuild.redact import redact_text
from trainer.batch import UpdateBatch
from trainer.engines import Rollout
from trainer.errors import TrainerError

CONSOLE_KEYS = ("reward_mean", "eval_accuracy", "kl", "entropy", "grad_norm", "step_time_s")


class Stopwatch:
    """Wall time of a step's phases: `lap(name)` ends the phase that started at the previous lap."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name], self.last = now - self.last, now

    def total(self) -> float:
        return time.perf_counter() - self.started


def step_metrics(
    rewards: torch.Tensor,
    group_size: int,
    rollouts: list[Rollout],
    batch: UpdateBatch,
    stats: dict[str, float],
    sync_error: float,
    clock: Stopwatch,
) -> dict[str, Any]:
    """What a step logs: rewards, the policy's statistics, throughput and where the time went."""
    completion_tokens = float(sum(len(r.token_ids) for r in rollouts))
    grouped = rewards.view(-1, group_size)
    return {
        "reward_mean": float(rewards.mean()),
        "frac_correct": float((rewards >= 1.0).float().mean()),
        "zero_variance_groups": float((grouped.std(dim=1) == 0).float().mean()),
        "trained_sequences": int((batch.tensors["completion_mask"].sum(dim=1) > 0).sum()),
        "response_length": completion_tokens / len(rollouts),
        **stats,
        "weight_sync_max_abs_diff": sync_error,
        "rollout_tokens_per_s": completion_tokens / max(clock.laps["rollout"], 1e-9),
        "train_tokens_per_s": stats["train_tokens"] / max(clock.laps["train"], 1e-9),
        "rollout_time_s": clock.laps["rollout"],
        "train_time_s": clock.laps["train"],
        "sync_time_s": clock.laps["sync"],
    }


class MetricsWriter:
    def __init__(self, uri: str, kept_until: int, max_steps: int, wandb_run: Any = None) -> None:
        """Lines of an earlier attempt up to step `kept_until` are kept (a resume); -1 starts afresh."""
        self.uri, self.max_steps, self.wandb = uri, max_steps, wandb_run
        self.lines: list[str] = []
        existing = storage.read_text(self.uri) or ""
        for line in existing.splitlines():
            if line.strip() and json.loads(line).get("step", 0) <= kept_until:
                self.lines.append(line)

    @classmethod
    def for_launch(cls, launch: LaunchDocument, kept_until: int) -> MetricsWriter:
        t = launch.recipe.trainer
        run = open_wandb(t.project_name, launch.run.id, launch.recipe.model_dump()) if t.logger == "wandb" else None
        return cls(launch.artifacts.metrics_uri, kept_until, t.max_steps, run)

    def log(self, step: int, values: dict[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in values.items()}}
        self.lines.append(json.dumps(record))
        storage.write_text(self.uri, "\n".join(self.lines) + "\n")
        shown = " ".join(f"{k}={record[k]:.4g}" for k in CONSOLE_KEYS if isinstance(record.get(k), float | int))
        print(f"[trainer] step {step}/{self.max_steps} {shown}", file=sys.stderr, flush=True)
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


def open_wandb(project: str, run_id: str, config: dict[str, Any]) -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise TrainerError(
            "trainer.logger=wandb but the wandb package is not installed; run scripts/setup.sh "
            "or set trainer.logger: console"
        ) from exc
    root = os.environ.get("WANDB_DIR")
    if root:  # made here: wandb would quietly fall back to the system temp directory for one it cannot write
        try:
            os.makedirs(root, exist_ok=True)
            writable = os.access(root, os.W_OK | os.X_OK)
        except OSError:
            writable = False
        if not writable:
            raise TrainerError(f"WANDB_DIR={root} is not a writable directory; point WANDB_DIR at one or unset it")
    try:
        return wandb.init(project=project, name=run_id, id=run_id, resume="allow", config=config)
    except wandb.Error as exc:
        lines = str(exc).strip().splitlines()
        reason = redact_text(lines[0]) if lines else type(exc).__name__
        raise TrainerError(
            f"trainer.logger=wandb: wandb.init failed ({reason}); export WANDB_API_KEY, or set WANDB_MODE=offline "
            "(no account or network needed), or use trainer.logger: console"
        ) from exc


def _plain(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value
