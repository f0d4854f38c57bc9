"""The embedded default policy: a tiny untied Qwen2-style model and a character tokenizer, built in code.

Nothing is downloaded. The model is warm-started with supervised steps that play the part of pretraining: counting
on the number line ("next 4:" -> "5", "prev 5:" -> "4") and the built-in tasks' prompts, answered right some of the
time and with a systematic wrong answer (the task's decoy) otherwise. Like a pretrained model that half knows a
task, it samples the right answer now and then and answers the decoy greedily; GRPO has to make the right answer
the one it gives. Random answers instead (rounds 1-2) made the reward so sparse that whether GRPO took off at all
rode on the seed and on the CPU's floating point (trainer/README.md, "The tiny default").
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import string
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from rlbuild.contracts.tinymodel import AGENT_VARIANT, DEFAULT_VARIANT, VARIANT_FILES, tiny_model_config
from trainer.agents import warm_start as agent_warm_start
from trainer.errors import TrainerError
from trainer.tasks import REVERSAL_ALPHABET, REVERSAL_LENGTH

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = string.digits + string.ascii_lowercase + string.ascii_uppercase + " +-=*/:?.,!'()"
# The agent variant reads shell output: every printable ASCII character has a token (the `|` between turns, the `>`
# before an observation among them). The single-turn characters keep their ids.
AGENT_CHARACTERS = CHARACTERS + "".join(c for c in string.punctuation if c not in CHARACTERS)
# The architectures live in rlbuild/contracts/tiny_*.json, which preflight reads too. Small on purpose: at hidden
# 128, GRPO memorised the 80 train pairs of addition and reached 0.2-0.4 on the 20 held-out ones (round 1).
WARM_START_STEPS = 600
WARM_START_BATCH = 64
WARM_START_LR = 3e-3
TASK_FRACTION = 0.6  # the rest is counting, half up, half down
# The warm start answers a task prompt right RIGHT_SHARE of the time and with the task's decoy (a systematic wrong
# answer) otherwise. The base model then samples the right answer one time in three to five (a dense reward: every
# seed and machine gets a signal from the first step) while its greedy answer is mostly the decoy, and GRPO has to
# move a preference that all prompts share: what generalises to prompts it never trains on. At 0.2, one seed's
# policy learnt that shift and then memorised its train pairs (trainer/README.md, "The tiny default").
RIGHT_SHARE = 0.3
# The warm start's numerics, the same on every x86-64 CPU: one thread (sums split over two threads round otherwise),
# torch's portable kernels instead of the AVX2 or AVX-512 ones the CPU would pick, and MKL's reproducible code path
# instead of the one tuned for the CPU. Unpinned, an Intel box and an AVX-512 AMD EPYC built base models of seed 42
# that answered 0.35 and 0.60 of addition's held-out pairs greedily, and GRPO took them to 1.00 and 0.75. Pinned,
# the weights' bits did not move under any other ISA oneDNN or MKL was held to (MKL_CBWR=COMPATIBLE,STRICT,
# ONEDNN_MAX_CPU_ISA=AVX2/SSE41), at 1.5x the unpinned build's time. Torch and MKL read these when they load, so
# only a fresh process can take them: `base-model` re-runs itself with them. ARM CPUs (a Mac) build other bits.
PINNED_NUMERICS = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
COUNT_TO = 19
# A warm-start example: text segments in order, each with whether the loss trains on it. The first is encoded with
# <bos>; <eos> follows the last, trained (the model learns where an answer, or an episode, ends).
Example = list[tuple[str, bool]]


@dataclass(frozen=True)
class Variant:
    """What builds one tiny model variant besides its architecture: its characters and its warm start."""

    characters: str
    example: Callable[[random.Random], Example]
    warm_start_steps: int


def build_tokenizer(variant: str = DEFAULT_VARIANT) -> PreTrainedTokenizerFast:
    """One token per character; every encoding starts with <bos>; decoding round-trips text exactly.

    Characters are stored byte-level (a space is `Ġ`), as Qwen2's tokenizer reads them: `AutoTokenizer` loads a
    folder whose config says qwen2 as `Qwen2Tokenizer`, which re-applies byte-level pre-tokenization and drops
    tokens its vocabulary lacks. With a plain space in the vocabulary, "rev abc:" loaded as "revabc:", a prompt
    the warm start never showed (reversal then learned nothing). Both ways now give the same ids.
    """
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    characters = _variant(variant).characters
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *(_byte_level(c) for c in characters)])}
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
        model_max_length=tiny_model_config(variant)["max_position_embeddings"],
    )


def _byte_level(character: str) -> str:
    """How byte-level pre-tokenization spells one printable ASCII character (a space is `Ġ`)."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(character)[0][0]


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int, variant: str = DEFAULT_VARIANT) -> torch.nn.Module:
    # Untied embeddings (tiny_model.json): vLLM's CPU backend keeps a stale lm_head after a weight reload when
    # they are tied.
    architecture = tiny_model_config(variant)
    if len(tokenizer) != architecture["vocab_size"]:
        raise TrainerError(
            f"the {variant} tokenizer has {len(tokenizer)} tokens but {VARIANT_FILES[variant].name} says "
            f"vocab_size={architecture['vocab_size']}; update the JSON with the tokenizer"
        )
    config = Qwen2Config(
        **{k: v for k, v in architecture.items() if k not in ("architectures", "model_type")},
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _decoy(prompt: str, answer: str) -> str:
    """The task's systematic wrong answer: one more for addition, the first two letters swapped for reversal
    ("rev abc:" -> "bac" where "cba" is right). Never the right answer, except for reversal's "aaa"-like strings."""
    if prompt.startswith("rev "):
        return answer[1] + answer[2] + answer[0]
    return str(int(answer) + 1)


def _task_example(rng: random.Random) -> Example:
    """A task prompt (training's or not: the warm start stands in for pretraining, which saw the world) and its
    answer: the right one or the decoy."""
    if rng.random() < 0.5:
        a, b = rng.randrange(10), rng.randrange(10)
        prompt, right = f"{a}+{b}=", str(a + b)
    else:
        word = "".join(rng.choice(REVERSAL_ALPHABET) for _ in range(REVERSAL_LENGTH))
        prompt, right = f"rev {word}:", word[::-1]
    return [(prompt, False), (right if rng.random() < RIGHT_SHARE else _decoy(prompt, right), True)]


def _warm_start_example(rng: random.Random) -> Example:
    """A task example, or a counting example."""
    roll = rng.random()
    if roll < TASK_FRACTION:
        return _task_example(rng)
    n = rng.randrange(COUNT_TO)
    prompt, answer = (f"next {n}:", str(n + 1)) if roll < (1 + TASK_FRACTION) / 2 else (f"prev {n + 1}:", str(n))
    return [(prompt, False), (answer, True)]


VARIANTS = {
    DEFAULT_VARIANT: Variant(CHARACTERS, _warm_start_example, WARM_START_STEPS),
    AGENT_VARIANT: Variant(AGENT_CHARACTERS, agent_warm_start.scripted_episode, agent_warm_start.WARM_START_STEPS),
}


def _variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise TrainerError(
            f"--variant {name!r} is not a tiny model variant; use one of {', '.join(VARIANTS)}"
        ) from None


def warm_start(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    seed: int,
    steps: int,
    example: Callable[[random.Random], Example],
) -> float:
    """Supervised steps on `example`s (loss on their trained segments and <eos> only); returns the last loss."""
    rng = random.Random(seed)
    # A few hundred distinct strings, tokenized once each (the tokenizer took a quarter of a step; same ids).
    encode = functools.cache(lambda text, special: tuple(tokenizer(text, add_special_tokens=special)["input_ids"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_START_LR)
    model.train()
    last = 0.0
    for _ in range(steps):
        ids, labels = [], []
        for _ in range(WARM_START_BATCH):
            x, y = [], []
            for i, (text, trained) in enumerate(example(rng)):
                segment = list(encode(text, i == 0))
                x += segment
                y += segment if trained else [-100] * len(segment)
            ids.append([*x, tokenizer.eos_token_id])
            labels.append([*y, tokenizer.eos_token_id])
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


def build_base_model(out_dir: Path, seed: int, variant: str = DEFAULT_VARIANT) -> dict[str, Any]:
    """Build, warm-start and save the tiny model + tokenizer of `variant` as an HF folder: the same bits for `seed`
    on any x86-64 CPU, in a process started with PINNED_NUMERICS (`python -m trainer base-model` starts one)."""
    unpinned = {k: os.environ.get(k) for k, v in PINNED_NUMERICS.items() if os.environ.get(k) != v}
    if unpinned:
        raise TrainerError(
            f"the tiny base model is built with pinned CPU numerics, but this process has {unpinned}; build it with "
            f"`python -m trainer base-model`, which sets {PINNED_NUMERICS}"
        )
    started = time.perf_counter()
    recipe = _variant(variant)
    steps = recipe.warm_start_steps
    tokenizer = build_tokenizer(variant)
    model = build_model(tokenizer, seed, variant)
    loss = warm_start(model, tokenizer, seed, steps, recipe.example)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    architecture = tiny_model_config(variant)
    return {
        "architecture": "Qwen2ForCausalLM",
        "variant": variant,
        "hidden_size": architecture["hidden_size"],
        "num_layers": architecture["num_hidden_layers"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "seed": seed,
        "warm_start_steps": steps,
        "warm_start_final_loss": round(loss, 4),
        "seconds": round(time.perf_counter() - started, 2),
    }


def add_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("base-model", help="build the tiny warm-started base model as an HF folder")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", choices=list(VARIANTS), default=DEFAULT_VARIANT, help="which tiny model")

    def run(args: argparse.Namespace) -> int:
        if any(os.environ.get(k) != v for k, v in PINNED_NUMERICS.items()):
            command = [sys.executable, "-m", "trainer", "base-model", "--out", str(args.out), "--seed", str(args.seed)]
            command += ["--variant", args.variant]
            return subprocess.run(command, env={**os.environ, **PINNED_NUMERICS}, check=False).returncode
        print(build_base_model(args.out, args.seed, args.variant))
        return 0

    parser.set_defaults(func=run)
