"""Harbor tasks, run for real: the shipped task set (config/harbor/find-key) staged as data, its tasks loaded by
Harbor's own task loader, run in rlbuild's bubblewrap sandbox plugged into Harbor as its environment class, and
scored by each task's own verifier (tests/test.sh); the tiny agent trains on them and its export is evaluated on the
held-out tasks. Harbor's remote backends are exercised against a recording stand-in of their API elsewhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlbuild.contracts.artifacts import EXPORT_MODEL
from rlbuild.contracts.launch import load_launch
from rlbuild.contracts.recipe import EnvironmentSection, SandboxSection
from rlbuild.contracts.rows import local_image, task_folders, task_row
from rlbuild.dev.launches import write_shipped_launch
from trainer import loop, tiny
from trainer.agents.episodes import EpisodePlayer
from trainer.commands.evaluate import evaluate
from trainer.commands.export import export
from trainer.data import load_rows
from trainer.sandbox import SandboxError
from trainer.sandbox.task import open_task_sandbox
from trainer.workers.engines import Rollout, SamplingParams

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "config" / "harbor" / "find-key"
EXPERIMENTS = REPO / "config" / "experiments"
SPEC = SandboxSection(backend="local", command_timeout_s=5, episode_timeout_s=20)
STEPS = 3


def _key(task: str) -> str:
    """The answer a find-key task's verifier accepts: its name ends with it (find-key-<key file>-<value>)."""
    return task.rsplit("-", 1)[1]


def test_a_task_runs_in_the_local_sandbox_and_its_own_verifier_scores_it() -> None:
    task = task_folders(TASKS / "train")[0]
    key_file = task.name.split("-")[2]
    for answer, reward in ((_key(task.name), 1.0), ("100", 0.0)):
        with open_task_sandbox(SPEC, task) as sandbox:
            listing = sandbox.run("ls").output.split()
            assert key_file in listing and len(listing) == 2  # the image's WORKDIR holds the COPY'd files only
            assert sandbox.run(f"cat {key_file}").output.strip() == _key(task.name)
            # `ans` is the task's own program (COPY'd outside /app, on PATH by the Dockerfile's ENV)
            assert sandbox.run(f"ans {answer}").exit_code == 0
            assert sandbox.verify() == reward


def test_a_task_that_needs_its_image_built_is_refused_naming_it_and_the_backends_that_can(tmp_path: Path) -> None:
    task = tmp_path / "needs-build"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("do it\n")
    (task / "task.toml").write_text('schema_version = "1.4"\n')
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN apt-get install -y git\n")
    assert "line 2: RUN apt-get" in str(local_image(task))
    with pytest.raises(SandboxError, match=r"'needs-build' cannot run on the local backend.*daytona, modal, e2b"):
        open_task_sandbox(SPEC, task)


class RightPolicy:
    """The engines' `generate` for a test: the find-key rule, read off each prompt's last observation (list, open
    the file starting with `k`, answer what it holds), in the tiny agent's language; records each call's batch."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.batches: list[int] = []

    def __call__(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
        self.batches.append(len(prompts))
        out = []
        for prompt in prompts:
            seen = self.tokenizer.decode(prompt, skip_special_tokens=True).split(">")
            if len(seen) == 1:
                action, end = "ls|", []
            elif len(seen) == 2:
                action, end = f"cat {next(n for n in seen[1].rstrip('|').split() if n.startswith('k'))}|", []
            else:
                action, end = f"ans {seen[2].rstrip('|')}", [self.tokenizer.eos_token_id]
            ids = self.tokenizer(action, add_special_tokens=False)["input_ids"] + end
            out.append(Rollout(ids, [-0.5] * len(ids), bool(end), not end))
        return out


def test_episodes_through_the_player_are_scored_by_the_verifier_at_most_max_concurrent_at_once() -> None:
    experiment = yaml.safe_load((EXPERIMENTS / "tiny-harbor.yaml").read_text())
    section = experiment["recipe"]["environment"]
    section["sandbox"] = {**section["sandbox"], "max_concurrent": 2}
    rows = [task_row(task) for task in task_folders(TASKS / "train")[:5]]
    tokenizer = tiny.build_tokenizer("tiny-agent-h64-l2")
    policy = RightPolicy(tokenizer)
    player = EpisodePlayer("harbor", EnvironmentSection.model_validate(section), tokenizer)
    try:
        episodes = player.play(policy, rows, SamplingParams(max_tokens=12), seed=0)
    finally:
        player.close()
    assert [e.record()["task"] for e in episodes] == [row["task"] for row in rows]
    assert [(e.reward, e.ended, len(e.turns)) for e in episodes] == [(1.0, "eos", 3)] * 5, [e.error for e in episodes]
    assert policy.batches == [2, 2, 2, 2, 2, 2, 1, 1, 1]  # three waves (2, 2, 1) of three turns each


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_tiny_agent_trains_on_harbor_tasks_and_its_export_is_evaluated_on_held_out_ones(tmp_path: Path) -> None:
    schedule = {"max_steps": STEPS, "ckpt_interval": STEPS, "eval_interval": STEPS, "eval_before_train": True}
    launch = load_launch(str(write_shipped_launch(tmp_path, "tiny-harbor", recipe={"trainer": schedule})))
    summary = loop.run(launch)["metrics"]
    records = [json.loads(line) for line in Path(launch.artifacts.metrics_uri).read_text().splitlines()]
    assert [r["step"] for r in records if "reward/mean" in r] == list(range(1, STEPS + 1))

    # Every trajectory names its task, and the reward is the task's verifier's: 1 exactly when the last action
    # answered the task's key (the base model finds it about one time in four, so both kinds occur).
    train_tasks = {task.name for task in task_folders(TASKS / "train")}
    trajectories = [
        json.loads(line)
        for path in sorted(Path(launch.artifacts.trajectories_root).glob("step-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert trajectories and {t["task"] for t in trajectories} <= train_tasks
    for trajectory in trajectories:
        answers = [t["action"].removesuffix("|").split() for t in trajectory["turns"] if t["action"].startswith("ans")]
        solved = bool(answers) and answers[-1] == ["ans", _key(trajectory["task"])]
        assert trajectory["reward"] == float(solved), trajectory

    # The export, evaluated greedily on the held-out tasks as the eval stage does.
    exported = export(launch, launch.artifacts.terminal_manifest_uri, str(tmp_path / "export"))
    validation = load_rows([entry.uri for entry in launch.inputs.validation_data], tmp_path / "rows")
    recipe = launch.recipe
    tokens = recipe.generator.eval_sampling_params.max_generate_length
    model = Path(exported) / EXPORT_MODEL
    result = evaluate(model, validation, max_tokens=tokens, environment=recipe.environment, seed=recipe.trainer.seed)
    held_out = {task.name for task in task_folders(TASKS / "validation")}
    assert [t["task"] for t in result["trajectories"]] == sorted(held_out)
    assert result["episodes"]["error_frac"] == 0.0
    # Greedy, on the same weights: what the run's last eval measured (the summary keeps 7 digits).
    assert result["accuracy"] == pytest.approx(summary["final_eval_accuracy"], abs=1e-6)
