"""`python -m trainer episode`: replay a file of actions through exactly the environment and sandbox a launch
document trains with, and print what each action got back.

The debugging tool of agent training: when a trajectory looks wrong, replay its actions (or your own) against the
same row, environment class, limits and sandbox, and see each observation, the reward and the time taken. The
actions go through the same episode player the trainer uses (trainer/agents/episodes.py), as if a policy had typed them:
each is tokenised with the launch's tokenizer, ended with the turn stop when it lacks one, and cut where the
policy's would be (tokens per turn, context).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlbuild.contracts.launch import load_launch
from rlbuild.contracts.manifest import materialise
from trainer import data
from trainer.agents.episodes import Episode, EpisodePlayer, is_played
from trainer.errors import TrainerError
from trainer.workers.engines import Rollout, SamplingParams

SPLITS = {"train": "train_data", "validation": "validation_data"}


class ReplayError(TrainerError):
    """A replay that cannot start: a row out of range, an environment that plays no episodes, no actions."""


class Typed:
    """The engines' `generate` for one episode: the next action of the file, as the policy would have typed it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, actions: list[str], turn_stop: str) -> None:
        self.tokenizer, self.actions, self.turn_stop, self.turn = tokenizer, actions, turn_stop, 0

    def __call__(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
        if self.turn >= len(self.actions):
            raise ReplayError(
                f"the episode is not over after the file's {len(self.actions)} actions and wants another: add "
                "actions to the file (one a line)"
            )
        action = self.actions[self.turn]
        self.turn += 1
        ended = action if action.endswith(self.turn_stop) else action + self.turn_stop
        ids = self.tokenizer(ended, add_special_tokens=False)["input_ids"][: params.max_tokens]
        stopped = bool(ids) and ids[-1] in params.stop_token_ids
        return [Rollout(ids, [0.0] * len(ids), False, stopped)] * len(prompts)


def replay(launch_path: str, split: str, row: int, actions: list[str]) -> tuple[Episode, float]:
    """Play one episode of the launch's `split` row `row` with `actions`; returns it and the seconds it took."""
    launch = load_launch(launch_path)
    section, env_class = launch.recipe.environment, launch.recipe.environment.env_class
    if not is_played(env_class, section):
        raise ReplayError(
            f"environment.env_class={env_class!r} scores single completions (reward()); replay plays agent "
            "environments (init/step). Score a completion with `python -m trainer eval` instead"
        )
    if not actions:
        raise ReplayError("the actions file has no actions: write one action a line")
    with tempfile.TemporaryDirectory(prefix="rlbuild-replay-") as cache:
        tokenizer = AutoTokenizer.from_pretrained(materialise(launch.inputs.model.uri, Path(cache)))
        entries = getattr(launch.inputs, SPLITS[split])
        rows = data.load_rows([entry.uri for entry in entries], Path(cache))
    if not 0 <= row < len(rows):
        raise ReplayError(f"--row {row} is not a row of the {split} split, which has rows 0..{len(rows) - 1}")
    player = EpisodePlayer(env_class, section, tokenizer)
    started = time.perf_counter()
    try:
        params = SamplingParams.from_recipe(launch.recipe.generator.sampling_params)
        [episode] = player.play(Typed(tokenizer, actions, section.turn_stop), [rows[row]], params, seed=0)
    finally:
        player.close()
    return episode, time.perf_counter() - started


def as_json(episode: Episode, seconds: float) -> dict[str, Any]:
    return {
        "turns": [{"action": t.action, "observation": t.observation} for t in episode.turns],
        "reward": episode.reward,
        "done": episode.ended == "done",
        "ended": episode.ended,
        "error": episode.error,
        "seconds": round(seconds, 4),
    }


def add_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("episode", help="replay actions through a launch's environment and sandbox")
    parser.add_argument("--launch", required=True, help="the launch document (a path or storage URI)")
    parser.add_argument("--split", choices=sorted(SPLITS), default="validation")
    parser.add_argument("--row", type=int, default=0, help="the row of the split (0-based)")
    parser.add_argument("--actions", required=True, type=Path, help="a file of actions, one a line")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the turns")

    def run(args: argparse.Namespace) -> int:
        actions = [line for line in args.actions.read_text().splitlines() if line.strip()]
        episode, seconds = replay(args.launch, args.split, args.row, actions)
        if args.json:
            print(json.dumps(as_json(episode, seconds)))
            return 0
        for number, turn in enumerate(episode.turns, 1):
            print(f"[{number}] $ {turn.action}\n{turn.observation}\n    reward {turn.reward:g}, {turn.seconds:.3f} s")
        error = f" ({episode.error})" if episode.error else ""
        print(f"reward {episode.reward:g}; ended: {episode.ended}{error}; {seconds:.3f} s")
        return 0

    parser.set_defaults(func=run)
