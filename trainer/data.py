"""The driver's data: staged rows, the order they are drawn in, and prompts as token ids.

Everything random derives from (seed, position): a run resumed at a data cursor draws exactly the prompts the
uninterrupted run would have.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlbuild.contracts.manifest import materialise
from rlbuild.contracts.rows import read_rows
from trainer.errors import TrainerError

Row = dict[str, Any]
# Spreads the seeds derived from (run seed, epoch or step) of different run seeds apart.
SEED_STRIDE = 1_000_003


def load_rows(uris: list[str], cache_dir: Path) -> list[Row]:
    """The rows of staged JSONL files, each materialised and verified against its manifest first."""
    rows: list[Row] = []
    for uri in uris:
        rows += read_rows(materialise(uri, cache_dir))
    return rows


def prompts_that_fit(
    rows: list[Row], tokenizer: PreTrainedTokenizerBase, max_prompt_length: int, need: int
) -> list[Row]:
    """The rows whose prompt fits generator.max_prompt_length (longer ones are dropped, as SkyRL does)."""
    kept = [row for row in rows if len(tokenizer(row["prompt"])["input_ids"]) <= max_prompt_length]
    if len(kept) < need:
        raise TrainerError(
            f"only {len(kept)} of {len(rows)} train rows fit generator.max_prompt_length={max_prompt_length}, fewer "
            f"than trainer.train_batch_size={need}; raise max_prompt_length or add data"
        )
    return kept


def draw(rows: list[Row], cursor: int, count: int, seed: int) -> list[Row]:
    """`count` rows starting at `cursor` in an endless stream of per-epoch shuffles (epoch e uses seed, e)."""
    out = []
    for index in range(cursor, cursor + count):
        epoch, position = divmod(index, len(rows))
        order = list(range(len(rows)))
        random.Random(seed * SEED_STRIDE + epoch).shuffle(order)
        out.append(rows[order[position]])
    return out


def group(rows: list[Row], group_size: int) -> list[Row]:
    """Each prompt repeated group_size times, contiguously: every GRPO group holds exactly one prompt."""
    return [row for row in rows for _ in range(group_size)]


def encode_prompts(tokenizer: PreTrainedTokenizerBase, rows: list[Row]) -> list[list[int]]:
    return [tokenizer(row["prompt"])["input_ids"] for row in rows]


def probe_sequence(tokenizer: PreTrainedTokenizerBase, row: Row) -> tuple[list[int], int]:
    """A fixed sequence for the weight-sync check: a prompt, its answer and <eos>; and where the answer starts."""
    prompt = tokenizer(row["prompt"])["input_ids"]
    answer = tokenizer(str(row["answer"]), add_special_tokens=False)["input_ids"]
    return [*prompt, *answer, tokenizer.eos_token_id], len(prompt)
