"""Scoring: greedy accuracy and pass@k of a policy on `{prompt, answer}` rows.

`score` works with any generate function (a local TorchEngine, or the trainer's Ray engines), so the numbers
the trainer logs and the numbers `python -m trainer eval` reports are computed the same way.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from trainer import env as environments
from trainer.engines import Rollout, SamplingParams, TorchEngine
from trainer.tasks import read_jsonl

Generate = Callable[[list[list[int]], SamplingParams, int], list[Rollout]]


def encode_prompts(tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, str]]) -> list[list[int]]:
    return [tokenizer(row["prompt"])["input_ids"] for row in rows]


def rewards(
    tokenizer: PreTrainedTokenizerBase, environment: Any, rows: list[dict[str, str]], rollouts: list[Rollout]
) -> list[float]:
    texts = tokenizer.batch_decode([r.token_ids for r in rollouts], skip_special_tokens=True)
    return [environment.reward(row, text, r.finished) for row, text, r in zip(rows, texts, rollouts, strict=True)]


def score(
    generate: Generate,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, str]],
    *,
    max_tokens: int,
    k: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
    env_class: str = "exact_match",
) -> dict[str, Any]:
    """Greedy accuracy; with k > 1 also pass@k (k samples at `temperature`, solved if any is correct)."""
    environment = environments.make(env_class)
    prompts = encode_prompts(tokenizer, rows)
    greedy = rewards(tokenizer, environment, rows, generate(prompts, SamplingParams(max_tokens, 0.0), seed))
    result: dict[str, Any] = {"n": len(rows), "accuracy": sum(r >= 1.0 for r in greedy) / max(len(rows), 1)}
    if k > 1:
        repeated = [row for row in rows for _ in range(k)]
        sampled = generate([p for p in prompts for _ in range(k)], SamplingParams(max_tokens, temperature), seed + 1)
        scores = rewards(tokenizer, environment, repeated, sampled)
        solved = [any(s >= 1.0 for s in scores[i * k : (i + 1) * k]) for i in range(len(rows))]
        result |= {"k": k, "pass_at_k": sum(solved) / max(len(rows), 1), "temperature": temperature}
    return result


def evaluate(
    model_dir: Path,
    rows: list[dict[str, str]],
    k: int = 1,
    *,
    max_tokens: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    env_class: str = "exact_match",
) -> dict[str, Any]:
    """Score the HF model folder `model_dir` on `rows` with a local torch engine."""
    engine = TorchEngine(Path(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return score(
        engine.generate,
        tokenizer,
        rows,
        max_tokens=max_tokens,
        k=k,
        temperature=temperature,
        seed=seed,
        env_class=env_class,
    )


def add_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="greedy accuracy and pass@k of an HF model folder on a JSONL file")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)

    def run(args: argparse.Namespace) -> int:
        result = evaluate(args.model, read_jsonl(args.data), args.k, max_tokens=args.max_tokens, seed=args.seed)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
        return 0

    parser.set_defaults(func=run)
