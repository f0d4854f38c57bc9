"""Built-in verifiable tasks: environments (trainer/env.py) that generate deterministic `{prompt, answer}` rows for
GRPO and evaluation, declared as entry points in pyproject.toml like any plug-in's.

Tasks:
- ``addition``: ``"a+b="`` -> ``str(a + b)`` for single digits a, b (100 pairs): 20 validation pairs and 80 train
  pairs, disjoint. Held-out accuracy is greedy exact match on pairs that training never samples.
- ``reversal``: ``"rev abc:"`` -> ``"cba"`` over 3 letters from a-e (125 strings): 25 validation strings and
  100 train strings, disjoint.

A revision ``seed-N`` picks the split with seed N; any other revision string is hashed to a seed, so every
revision is reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import random
from pathlib import Path

from rlbuild.contracts.rows import dump_rows
from rlbuild.core import storage
from trainer.env import ExactMatch, make_task
from trainer.errors import TrainerError

SPLITS = ("train", "validation")
VALIDATION_FRACTION = 0.2
REVERSAL_ALPHABET = "abcde"
REVERSAL_LENGTH = 3


class TaskError(TrainerError):
    """A task, split or revision that this module cannot generate."""


def revision_seed(revision: str) -> int:
    if revision.startswith("seed-") and revision[5:].isdigit():
        return int(revision[5:])
    return int(hashlib.sha256(revision.encode()).hexdigest()[:8], 16)


def split_rows[T](rows: list[T], split: str, revision: str) -> list[T]:
    """The rows of `split`: the two splits are disjoint and together cover every row, chosen by the revision (rows
    or anything a task draws its rows from: find_key splits its file names and values so)."""
    order = list(range(len(rows)))
    random.Random(revision_seed(revision)).shuffle(order)
    n_val = round(len(rows) * VALIDATION_FRACTION)
    chosen = sorted(order[:n_val]) if split == "validation" else sorted(order[n_val:])
    return [rows[i] for i in chosen]


class Addition(ExactMatch):
    """`"a+b="` -> `str(a + b)` for single digits a, b, scored by exact match."""

    def rows(self, split: str, revision: str) -> list[dict[str, str]]:
        pairs = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
        return split_rows(pairs, split, revision)


class Reversal(ExactMatch):
    """`"rev abc:"` -> `"cba"` over 3 letters from a-e, scored by exact match."""

    def rows(self, split: str, revision: str) -> list[dict[str, str]]:
        words = ("".join(p) for p in itertools.product(REVERSAL_ALPHABET, repeat=REVERSAL_LENGTH))
        return split_rows([{"prompt": f"rev {w}:", "answer": w[::-1]} for w in words], split, revision)


def generate(task: str, split: str, revision: str) -> list[dict[str, str]]:
    """The rows of `split` for `task`, an environment that generates rows (built in, or a plug-in)."""
    if split not in SPLITS:
        raise TaskError(f"split={split!r} is not a split; use one of {', '.join(SPLITS)}")
    return [dict(row) for row in make_task(task).rows(split, revision)]


def add_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("make-data", help="write a built-in task split as JSONL")
    parser.add_argument("--task", required=True, help="an environment that generates rows (trainer/env.py)")
    parser.add_argument("--split", required=True, choices=SPLITS)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--out", required=True, type=Path)

    def run(args: argparse.Namespace) -> int:
        storage.write_text(str(args.out), dump_rows(generate(args.task, args.split, args.revision)))
        return 0

    parser.set_defaults(func=run)
