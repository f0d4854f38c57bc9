"""Scoring: greedy accuracy and pass@k of a policy on `{prompt, answer}` rows, or on agent episodes.

`score` works with any generate function (a local TorchEngine, or the trainer's Ray engines), so the numbers
the trainer logs and the numbers `python -m trainer eval` reports are computed the same way. With an episode
player (trainer/agents/episodes.py) a row is an episode: `accuracy` is the share of greedy episodes solved
(reward >= 1), beside it the turn statistics, and the greedy trajectories come back under `trajectories`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlbuild.contracts.recipe import EnvironmentSection
from rlbuild.contracts.rows import read_rows
from rlbuild.core import storage
from trainer import env as environments
from trainer.agents.episodes import Episode, EpisodePlayer, episode_statistics, is_played
from trainer.data import encode_prompts
from trainer.rewards import rewards
from trainer.workers.engines import Rollout, SamplingParams, TorchEngine

Generate = Callable[[list[list[int]], SamplingParams, int], list[Rollout]]


def score(
    generate: Generate,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    max_tokens: int,
    k: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
    env_class: str = "exact_match",
    player: EpisodePlayer | None = None,
) -> dict[str, Any]:
    """Greedy accuracy; with k > 1 also pass@k (k samples at `temperature`, solved if any is correct)."""

    def play(rows: list[dict[str, Any]], params: SamplingParams, seed: int) -> tuple[list[float], list[Episode]]:
        if player is not None:
            episodes = player.play(generate, rows, params, seed)
            return [e.reward for e in episodes], episodes
        environment = environments.make(env_class)
        return rewards(tokenizer, environment, rows, generate(encode_prompts(tokenizer, rows), params, seed)), []

    greedy, episodes = play(rows, SamplingParams(max_tokens, 0.0), seed)
    result: dict[str, Any] = {"n": len(rows), "accuracy": sum(r >= 1.0 for r in greedy) / max(len(rows), 1)}
    if episodes:
        result |= {"episodes": episode_statistics(episodes), "trajectories": [e.record() for e in episodes]}
    if k > 1:
        repeated = [row for row in rows for _ in range(k)]
        scores, _ = play(repeated, SamplingParams(max_tokens, temperature), seed + 1)
        solved = [any(s >= 1.0 for s in scores[i * k : (i + 1) * k]) for i in range(len(rows))]
        result |= {"k": k, "pass_at_k": sum(solved) / max(len(rows), 1), "temperature": temperature}
    return result


def evaluate(
    model_dir: Path,
    rows: list[dict[str, Any]],
    k: int = 1,
    *,
    max_tokens: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    environment: EnvironmentSection | None = None,
) -> dict[str, Any]:
    """Score the HF model folder `model_dir` on `rows` with a local torch engine, playing episodes where the
    environment (the recipe's section) is an agent's."""
    environment = environment or EnvironmentSection()
    engine = TorchEngine(Path(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env_class = environment.env_class
    player = EpisodePlayer(env_class, environment, tokenizer) if is_played(env_class, environment) else None
    try:
        return score(
            engine.generate,
            tokenizer,
            rows,
            max_tokens=max_tokens,
            k=k,
            temperature=temperature,
            seed=seed,
            env_class=env_class,
            player=player,
        )
    finally:
        if player is not None:
            player.close()


def add_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="greedy accuracy and pass@k of an HF model folder on JSONL rows")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--data", required=True, type=Path, nargs="+", help="JSONL files of {prompt, answer} rows")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-class", help="the reward environment that scores answers (default exact_match)")
    parser.add_argument(
        "--environment", type=json.loads, help="the recipe's whole `environment` section as JSON (agent episodes)"
    )
    parser.add_argument("--trajectories", help="where the greedy episodes go, one JSON object a line")

    def run(args: argparse.Namespace) -> int:
        section = EnvironmentSection.model_validate(args.environment or {})
        if args.env_class:
            section = section.model_copy(update={"env_class": args.env_class})
        rows = [row for path in args.data for row in read_rows(path)]
        result = evaluate(args.model, rows, args.k, max_tokens=args.max_tokens, seed=args.seed, environment=section)
        trajectories = result.pop("trajectories", None)
        if trajectories is not None and args.trajectories:
            storage.write_text(args.trajectories, "".join(json.dumps(t) + "\n" for t in trajectories))
        storage.write_json(str(args.out), result)
        print(json.dumps(result))
        return 0

    parser.set_defaults(func=run)
