"""The embedded default policy: a tiny untied Qwen2-style model and a character tokenizer, built in code.

Nothing is downloaded. Exact-match tasks give almost no reward from a random init, so the model is warm-started
for a few seconds with supervised steps that play the part of pretraining: task prompts with *random, wrong*
answers (it learns the answer format, "1-3 characters, then <eos>", but not the answers) and counting on the
number line ("next 4:" -> "5", "prev 5:" -> "4"). It knows no addition: its greedy addition accuracy stays at
chance, and GRPO has to teach the rest. Counting gives the digits an order, which is what lets GRPO's addition
generalise to pairs it never trains on (measured in trainer/README.md).
"""

from __future__ import annotations

import argparse
import random
import string
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from rlbuild.contracts.tinymodel import tiny_model_config
from trainer.errors import TrainerError
from trainer.tasks import REVERSAL_ALPHABET, REVERSAL_LENGTH

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = string.digits + string.ascii_lowercase + string.ascii_uppercase + " +-=*/:?.,!'()"
# The architecture lives in rlbuild/tiny_model.json, which preflight reads too. Small on purpose: at hidden 128,
# GRPO memorised the 80 train pairs and reached 0.3-0.5 on the 20 held-out ones; at 32 it learns a rule that
# carries over (0.6-0.8 on held-out pairs, see trainer/README.md).
ARCHITECTURE = tiny_model_config()
HIDDEN_SIZE = ARCHITECTURE["hidden_size"]
NUM_LAYERS = ARCHITECTURE["num_hidden_layers"]
WARM_START_STEPS = 150
WARM_START_BATCH = 64
# Gentle on purpose: random answers teach the model that the prompt is irrelevant, and a stronger warm start
# washes out the prompt features GRPO builds on.
WARM_START_LR = 1e-3
FORMAT_FRACTION = 0.4  # the rest is counting, half up, half down
# What the base_model rule always had (Snakemake gives a job without `threads:` OMP_NUM_THREADS=1): tests,
# benchmarks and the graph build the same base model on any machine.
WARM_START_THREADS = 1
COUNT_TO = 19


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; every encoding starts with <bos>; decoding round-trips text exactly.

    Characters are stored byte-level (a space is `Ġ`), as Qwen2's tokenizer reads them: `AutoTokenizer` loads a
    folder whose config says qwen2 as `Qwen2Tokenizer`, which re-applies byte-level pre-tokenization and drops
    tokens its vocabulary lacks. With a plain space in the vocabulary, "rev abc:" loaded as "revabc:", a prompt
    the warm start never showed (reversal then learned nothing). Both ways now give the same ids.
    """
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *(_byte_level(c) for c in CHARACTERS)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex("."), behavior="isolated"), byte_level])
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=tiny_model_config()["max_position_embeddings"],
    )


def _byte_level(character: str) -> str:
    """How byte-level pre-tokenization spells one printable ASCII character (a space is `Ġ`)."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(character)[0][0]


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> torch.nn.Module:
    # Untied embeddings (tiny_model.json): vLLM's CPU backend keeps a stale lm_head after a weight reload when
    # they are tied.
    if len(tokenizer) != ARCHITECTURE["vocab_size"]:
        raise TrainerError(
            f"the tiny tokenizer has {len(tokenizer)} tokens but rlbuild/tiny_model.json says vocab_size="
            f"{ARCHITECTURE['vocab_size']}; update the JSON with the tokenizer"
        )
    config = Qwen2Config(
        **{k: v for k, v in ARCHITECTURE.items() if k not in ("architectures", "model_type")},
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _warm_start_example(rng: random.Random) -> tuple[str, str]:
    """A task prompt with a random answer of the right shape (not the right value), or a counting example."""
    roll = rng.random()
    if roll < FORMAT_FRACTION:
        if rng.random() < 0.5:
            return f"{rng.randrange(10)}+{rng.randrange(10)}=", str(rng.randrange(19))
        word = "".join(rng.choice(REVERSAL_ALPHABET) for _ in range(REVERSAL_LENGTH))
        return f"rev {word}:", "".join(rng.choice(REVERSAL_ALPHABET) for _ in range(REVERSAL_LENGTH))
    n = rng.randrange(COUNT_TO)
    return (f"next {n}:", str(n + 1)) if roll < (1 + FORMAT_FRACTION) / 2 else (f"prev {n + 1}:", str(n))


def warm_start(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, seed: int, steps: int) -> float:
    """Supervised steps on counting and random answers (loss on the answer and <eos> only); returns the last loss."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_START_LR)
    model.train()
    last = 0.0
    for _ in range(steps):
        ids, labels = [], []
        for _ in range(WARM_START_BATCH):
            prompt, answer = _warm_start_example(rng)
            p = tokenizer(prompt)["input_ids"]
            a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            ids.append(p + a)
            labels.append([-100] * len(p) + a)
        width = max(map(len, ids))
        # Right padding is fine here: no generation, and padded positions are masked out of the loss.
        input_ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids])
        label_ids = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
        attention = (torch.arange(width)[None, :] < torch.tensor([len(x) for x in ids])[:, None]).long()
        loss = model(input_ids=input_ids, attention_mask=attention, labels=label_ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last = loss.item()
    model.eval()
    return last


def build_base_model(out_dir: Path, seed: int, warm_start_steps: int = WARM_START_STEPS) -> dict[str, Any]:
    """Build, warm-start and save the tiny model + tokenizer as an HF folder; deterministic for `seed`.

    The warm start runs on WARM_START_THREADS threads whatever the machine or caller: sums split over another
    number of threads round differently (~1e-6 in the weights), and GRPO on a sparse reward amplifies that (one
    reversal recipe ended at 0.84 and at 0.28 held-out from the 2- and the 1-thread build).
    """
    started = time.perf_counter()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(WARM_START_THREADS)
    try:
        loss = warm_start(model, tokenizer, seed, warm_start_steps)
    finally:
        torch.set_num_threads(threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {
        "architecture": "Qwen2ForCausalLM",
        "hidden_size": HIDDEN_SIZE,
        "num_layers": NUM_LAYERS,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "seed": seed,
        "warm_start_steps": warm_start_steps,
        "warm_start_final_loss": round(loss, 4),
        "seconds": round(time.perf_counter() - started, 2),
    }


def add_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("base-model", help="build the tiny warm-started base model as an HF folder")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)

    def run(args: argparse.Namespace) -> int:
        print(build_base_model(args.out, args.seed))
        return 0

    parser.set_defaults(func=run)
