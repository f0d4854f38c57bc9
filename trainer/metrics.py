"""Per-step metrics: an append-only stream beside the run, a progress line, and W&B when configured.

Names are namespaced the way W&B groups them (`reward/mean`, `policy/kl`, `perf/step_time_s`, `eval/accuracy`;
the full list is in docs/design.md). Lines go to the metrics stream (rlbuild/contracts/metricstream.py): segments under
`artifacts.metrics_segments_root` while the run goes, one merged `metrics.jsonl` at `artifacts.metrics_uri` at
its end. On resume, lines after the resumed step are dropped, so the stream always describes one consistent run.

W&B (`trainer.logger: wandb`) reads its usual environment: online it needs WANDB_API_KEY; with WANDB_MODE=offline
it needs no account or network and writes `wandb/offline-run-*` under WANDB_DIR (default: the working directory),
which `wandb sync` uploads later.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psutil

from rlbuild.contracts.artifacts import version_of
from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.metricstream import ELAPSED, ZERO_REWARD_STEPS, MetricsStream
from rlbuild.contracts.progress import Progress
from rlbuild.core.redact import redact_text
from trainer.agents.episodes import episode_statistics, sandbox_statistics
from trainer.errors import TrainerError
from trainer.sampling import Step
from trainer.workers import grpo
from trainer.workers.batch import UpdateBatch

# When this process started, by the OS's clock (interpreter start-up and imports count): `perf/elapsed_s` is what a run
# of this geometry costs from its first second, which the plan's training cost is estimated from.
PROCESS_STARTED = psutil.Process().create_time()

# What the progress line shows, and how it labels it.
PROGRESS = (
    ("reward/mean", "reward"),
    ("eval/accuracy", "held-out"),
    ("eval/train_accuracy", "train-acc"),
    ("policy/kl", "kl"),
    ("policy/entropy", "entropy"),
    ("policy/grad_norm", "grad"),
    ("perf/step_time_s", "s/step"),
)


# The policy's statistics that are means over the update's tokens.
PER_TOKEN = ("kl", "entropy", "clip_frac", "log_ratio_rollout", "abs_log_ratio_rollout")


class Stopwatch:
    """Wall time of a step's phases: `lap(name)` ends the phase that started at the previous lap."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str, seconds: float | None = None) -> None:
        """`seconds`: the phase's own time where it ran in another thread (fully_async's generation), not the
        wait for it."""
        now = time.perf_counter()
        self.laps[name], self.last = (now - self.last if seconds is None else seconds), now

    def total(self) -> float:
        return time.perf_counter() - self.started


def step_metrics(
    sampled: Step,
    group_size: int,
    batch: UpdateBatch,
    stats: dict[str, float],
    sync_error: float,
    clock: Stopwatch,
) -> dict[str, Any]:
    """What a step logs: rewards, the policy's statistics (`policy/*`), throughput and where the time went.

    Rewards and responses describe every sample the step drew (under dynamic sampling more than it trained on,
    and without its bias towards groups with signal). Per-token statistics of an update without tokens
    (`zero_variance_filter` kept no group) are absent, not 0.
    """
    rewards, rollouts = sampled.drawn.rewards, sampled.drawn.rollouts
    completion_tokens = float(sum(len(r.token_ids) for r in rollouts))
    train_tokens = stats["train_tokens"]
    policy = {k: v for k, v in stats.items() if k != "train_tokens" and (train_tokens > 0 or k not in PER_TOKEN)}
    episodes = sampled.drawn.episodes
    played: dict[str, float] = {}
    if episodes is not None:
        played |= {f"episode/{k}": v for k, v in episode_statistics(episodes).items()}
        played |= {f"sandbox/{k}": v for k, v in sandbox_statistics(episodes).items()}
        # Episodes that finished per minute of the step's rollout: what falls to 0 when sandboxes starve.
        played["episode/per_minute"] = played["episode/finished"] * 60 / max(clock.laps["rollout"], 1e-9)
    return played | {
        "reward/mean": float(rewards.mean()),
        "reward/min": float(rewards.min()),
        "reward/max": float(rewards.max()),
        "reward/frac_correct": float((rewards >= 1.0).float().mean()),
        "reward/zero_variance_groups": float(grpo.uniform_groups(rewards, group_size).float().mean()),
        "response/length_mean": completion_tokens / len(rollouts),
        "response/finished_frac": sum(r.finished for r in rollouts) / len(rollouts),
        "policy/trained_sequences": int((batch.tensors["completion_mask"].sum(dim=1) > 0).sum()),
        "sampling/batches": sampled.batches,
        "sampling/signal_groups": int((~grpo.uniform_groups(sampled.update.rewards, group_size)).sum()),
        **{f"policy/{name}": value for name, value in policy.items()},
        "sync/max_abs_logprob_diff": sync_error,
        "perf/tokens_per_s": completion_tokens / max(clock.total(), 1e-9),
        "perf/rollout_tokens_per_s": completion_tokens / max(clock.laps["rollout"], 1e-9),
        "perf/train_tokens_per_s": train_tokens / max(clock.laps["train"], 1e-9),
        "perf/rollout_time_s": clock.laps["rollout"],
        "perf/train_time_s": clock.laps["train"],
        "perf/sync_time_s": clock.laps["sync"],
        # Since this process started (Ray, model load, evals and checkpoints included): with the step time, what
        # the plan's cost of a run of this geometry is estimated from (rlbuild/plan/planview.py, Cost).
        ELAPSED: time.time() - PROCESS_STARTED,
    }


LOG_FIRST_STEPS = 10  # steps a log shows each of, from a run's (or resume's) start
LOG_LINES = 50  # progress lines a log shows over the rest of a run, besides checkpoints and evals


class MetricsWriter:
    """Appends each step's line to the metrics stream, prints the progress line, warns when rewards stay zero."""

    def __init__(
        self,
        stream: MetricsStream,
        max_steps: int,
        zero_reward_warning_steps: int = 0,
        wandb_run: Any = None,
        progress: Progress | None = None,
    ) -> None:
        self.stream, self.max_steps, self.wandb, self.progress = stream, max_steps, wandb_run, progress
        self.warn_after = zero_reward_warning_steps
        kept = stream.records()
        self.zero_reward_steps = int(kept[-1].get(ZERO_REWARD_STEPS, 0)) if kept else 0
        self.first_step = max(stream.kept_until, 0)
        self.started = time.monotonic()

    @classmethod
    def for_launch(cls, launch: LaunchDocument, kept_until: int) -> MetricsWriter:
        """Lines of earlier attempts up to step `kept_until` are kept (a resume); -1 starts afresh."""
        t = launch.recipe.trainer
        # The arms of one series (and every configuration of a version) are one W&B group; each is a run of its own.
        group = f"{launch.run.name}-{version_of(launch.run.version)}"
        config = launch.recipe.model_dump()
        run = open_wandb(t.project_name, launch.run.id, group, config) if t.logger == "wandb" else None
        stream = MetricsStream(launch.artifacts.metrics_segments_root, kept_until)
        # What `rlbuild status` reads: the attempt's last step and when it ended.
        progress = Progress(launch.artifacts.attempts_root, t.max_steps)
        progress.started(max(kept_until, 0))
        return cls(stream, t.max_steps, t.zero_reward_warning_steps, run, progress)

    def log(self, step: int, values: dict[str, Any], flush: bool = False) -> None:
        """Append the step's line (`flush`: make it durable now, as at a checkpoint), print progress, send to W&B."""
        if "reward/mean" in values:
            self._watch_rewards(step, values)
        record = {"step": step, **{k: _plain(v) for k, v in values.items()}}
        self.stream.append(record)
        if flush:
            self.stream.flush()
        if self.progress is not None:
            self.progress.step(step, force=flush)
        self._print_progress(record, kept=flush or step >= self.max_steps or "eval/accuracy" in values)
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def _watch_rewards(self, step: int, values: dict[str, Any]) -> None:
        all_zero = values["reward/min"] == 0 and values["reward/max"] == 0
        self.zero_reward_steps = self.zero_reward_steps + 1 if all_zero else 0
        values[ZERO_REWARD_STEPS] = self.zero_reward_steps
        if self.warn_after and self.zero_reward_steps == self.warn_after:
            print(
                f"[trainer] WARNING: every reward was 0 for {self.warn_after} consecutive steps "
                f"({step - self.warn_after + 1}-{step}): no learning signal. Check that the base model can answer "
                "in the reward's format at all (sample it), and the prompt format, before training longer.",
                file=sys.stderr,
                flush=True,
            )

    def _print_progress(self, record: dict[str, Any], kept: bool) -> None:
        """On a terminal, one line updated in place (kept in the scrollback at checkpoints, evals and the end). In a
        log, every step of the first LOG_FIRST_STEPS, then about LOG_LINES lines over the run, and every kept step:
        a 500-step job log holds some 60 progress lines, not 500."""
        line, step = self.progress_line(record), int(record["step"])
        if sys.stderr.isatty():
            print(f"\r\033[K{line}", end="\n" if kept else "", file=sys.stderr, flush=True)
            return
        every = max(1, self.max_steps // LOG_LINES)
        if kept or step - self.first_step <= LOG_FIRST_STEPS or step % every == 0:
            print(line, file=sys.stderr, flush=True)

    def progress_line(self, record: dict[str, Any]) -> str:
        """`step 41/500 | 0:00:12 elapsed, ETA 0:02:25 | reward 0.004 | kl 0.014 | ...`"""
        step = record["step"]
        elapsed = time.monotonic() - self.started
        done = step - self.first_step
        eta = _clock(elapsed / done * (self.max_steps - step)) if done > 0 else "?"
        shown = [f"{label} {record[k]:.4g}" for k, label in PROGRESS if isinstance(record.get(k), int | float)]
        if self.zero_reward_steps >= max(self.warn_after, 1):
            shown.append(f"all rewards 0 for {self.zero_reward_steps} steps")
        return " | ".join([f"[trainer] step {step}/{self.max_steps}", f"{_clock(elapsed)} elapsed, ETA {eta}", *shown])

    def records(self) -> list[dict[str, Any]]:
        return self.stream.records()

    def close(self, metrics_uri: str | None) -> None:
        """Make every line durable and finish W&B; with `metrics_uri` (the run is complete) also write the run's
        metrics.jsonl, once. A run that goes on in another attempt passes None."""
        if metrics_uri is None:
            self.stream.flush()
        else:
            self.stream.finish(metrics_uri)
        if self.wandb is not None:
            self.wandb.finish()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def open_wandb(project: str, run_id: str, group: str, config: dict[str, Any]) -> Any:
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
        return wandb.init(project=project, name=run_id, id=run_id, group=group, resume="allow", config=config)
    except wandb.Error as exc:
        lines = str(exc).strip().splitlines()
        reason = redact_text(lines[0]) if lines else type(exc).__name__
        raise TrainerError(
            f"trainer.logger=wandb: wandb.init failed ({reason}); export WANDB_API_KEY, or set WANDB_MODE=offline "
            "(no account or network needed), or use trainer.logger: console"
        ) from exc


def _plain(value: Any) -> Any:
    """Floats to 7 significant digits (float32 precision): short lines, and a 3e-7 learning rate stays 3e-7."""
    return float(f"{value:.7g}") if isinstance(value, float) else value
