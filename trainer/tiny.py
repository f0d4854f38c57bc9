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
# GRPO memorised the 80 train pairs of addition and reached 0.2-0.4 on the 20 held-out ones (round 1).
ARCHITECTURE = tiny_model_config()
HIDDEN_SIZE = ARCHITECTURE["hidden_size"]
NUM_LAYERS = ARCHITECTURE["num_hidden_layers"]
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


def _decoy(prompt: str, answer: str) -> str:
    """The task's systematic wrong answer: one more for addition, the first two letters swapped for reversal
    ("rev abc:" -> "bac" where "cba" is right). Never the right answer, except for reversal's "aaa"-like strings."""
    if prompt.startswith("rev "):
        return answer[1] + answer[2] + answer[0]
    return str(int(answer) + 1)


def _task_example(rng: random.Random) -> tuple[str, str]:
    """A task prompt (training's or not: the warm start stands in for pretraining, which saw the world) and its
    answer: the right one or the decoy."""
    if rng.random() < 0.5:
        a, b = rng.randrange(10), rng.randrange(10)
        prompt, right = f"{a}+{b}=", str(a + b)
    else:
        word = "".join(rng.choice(REVERSAL_ALPHABET) for _ in range(REVERSAL_LENGTH))
        prompt, right = f"rev {word}:", word[::-1]
    return prompt, right if rng.random() < RIGHT_SHARE else _decoy(prompt, right)


def _warm_start_example(rng: random.Random) -> tuple[str, str]:
    """A task example, or a counting example."""
    roll = rng.random()
    if roll < TASK_FRACTION:
        return _task_example(rng)
    n = rng.randrange(COUNT_TO)
    return (f"next {n}:", str(n + 1)) if roll < (1 + TASK_FRACTION) / 2 else (f"prev {n + 1}:", str(n))


def warm_start(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, seed: int, steps: int) -> float:
    """Supervised steps on counting and task answers (loss on the answer and <eos> only); returns the last loss."""
    rng = random.Random(seed)
    # A few hundred distinct strings, tokenized once each (the tokenizer took a quarter of a step; same ids).
    encode = functools.cache(lambda text, special: tuple(tokenizer(text, add_special_tokens=special)["input_ids"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_START_LR)
    model.train()
    last = 0.0
    for _ in range(steps):
        ids, labels = [], []
        for _ in range(WARM_START_BATCH):
            prompt, answer = _warm_start_example(rng)
            p = list(encode(prompt, True))
            a = [*encode(answer, False), tokenizer.eos_token_id]
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
    """Build, warm-start and save the tiny model + tokenizer as an HF folder: the same bits for `seed` on any x86-64
    CPU, in a process started with PINNED_NUMERICS (`python -m trainer base-model` starts one)."""
    unpinned = {k: os.environ.get(k) for k, v in PINNED_NUMERICS.items() if os.environ.get(k) != v}
    if unpinned:
        raise TrainerError(
            f"the tiny base model is built with pinned CPU numerics, but this process has {unpinned}; build it with "
            f"`python -m trainer base-model`, which sets {PINNED_NUMERICS}"
        )
    started = time.perf_counter()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    loss = warm_start(model, tokenizer, seed, warm_start_steps)
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
        if any(os.environ.get(k) != v for k, v in PINNED_NUMERICS.items()):
            command = [sys.executable, "-m", "trainer", "base-model", "--out", str(args.out), "--seed", str(args.seed)]
            return subprocess.run(command, env={**os.environ, **PINNED_NUMERICS}, check=False).returncode
        print(build_base_model(args.out, args.seed))
        return 0

    parser.set_defaults(func=run)
