"""How often the agent base model (`tiny-agent-h64-l2`) finds the key before any RL: greedy and sampled success on
find_key's validation rows, per build seed, each episode played against the real environment in a real sandbox.

The warm start (trainer/agents/warm_start.py) should leave greedy success well under a half (GRPO has something to
teach) and sampled success clearly above zero (GRPO gets a signal from its first step). Episodes are played here with a
plain token loop over the HF model, as the episode runner plays them: stop a turn at `|` or <eos>, append the
observation's tokens, at most MAX_TURNS turns.

    .venv/bin/python benchmarks/find_key_base.py --seeds 42 1 7
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlbuild.contracts.recipe import SandboxSection
from rlbuild.contracts.tinymodel import AGENT_VARIANT
from trainer.agents.find_key import TURN_STOP, FindTheKey
from trainer.sandbox.registry import open_sandbox

MAX_TURNS = 3
TOKENS_PER_TURN = 12  # the experiment's max_generate_length (config/experiments/tiny-agent.yaml)
SANDBOX = SandboxSection(backend="local", command_timeout_s=5, episode_timeout_s=20)


def play(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, row: dict, greedy: bool, generator: torch.Generator
) -> tuple[float, str]:
    """One episode's reward and transcript."""
    stops = {tokenizer(TURN_STOP, add_special_tokens=False)["input_ids"][0], tokenizer.eos_token_id}
    with open_sandbox(SANDBOX, row["files"]) as sandbox:
        env = FindTheKey({}, {**row, "max_turns": MAX_TURNS, "sandbox": sandbox})
        prompt, _ = env.init(row["prompt"])
        ids = tokenizer(prompt)["input_ids"]
        while True:
            turn: list[int] = []
            while len(turn) < TOKENS_PER_TURN and (not turn or turn[-1] not in stops):
                with torch.no_grad():
                    logits = model(torch.tensor([ids + turn])).logits[0, -1]
                token = logits.argmax() if greedy else torch.multinomial(logits.softmax(-1), 1, generator=generator)
                turn.append(int(token))
            ids += turn
            out = env.step(tokenizer.decode(turn, skip_special_tokens=True))
            if out["done"]:
                return out["reward"], tokenizer.decode(ids, skip_special_tokens=True)
            ids += tokenizer(out["observations"][0]["content"], add_special_tokens=False)["input_ids"]


def measure(model_dir: Path, rows: list[dict], samples: int, seed: int) -> dict[str, object]:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(seed)
    greedy = [play(model, tokenizer, row, True, generator) for row in rows]
    sampled = [play(model, tokenizer, row, False, generator)[0] for row in rows for _ in range(samples)]
    return {
        "greedy": sum(r for r, _ in greedy) / len(greedy),
        "sampled": sum(sampled) / len(sampled),
        "example": greedy[0][1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--samples", type=int, default=4, help="sampled episodes per validation row")
    parser.add_argument("--revision", default="seed-0", help="find_key's data revision")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = FindTheKey().rows("validation", args.revision)
    with tempfile.TemporaryDirectory(prefix="find-key-base-") as scratch:
        for seed in args.seeds:
            out = Path(scratch) / f"seed-{seed}"
            started = time.perf_counter()
            command = [sys.executable, "-m", "trainer", "base-model", "--variant", AGENT_VARIANT]
            subprocess.run([*command, "--out", str(out), "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
            built = time.perf_counter() - started
            result = measure(out, rows, args.samples, seed)
            print(json.dumps({"seed": seed, "build_s": round(built, 1), **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
