"""The agent variant's warm start: transcripts of scripted find-the-key episodes (trainer/agents/find_key.py).

The scripted policy lists the files, opens one and answers what it read, in exactly the format an episode produces
(the prompt, each action with its turn stop, each observation as `observation` formats the command's output), with
the loss on the actions and the final <eos> only. It opens the key file RIGHT_SHARE of the time and the decoy
otherwise: like the single-turn tasks' warm start (trainer/tiny.py), the base model then samples the right episode
now and then (GRPO's signal from the first step) and opens the decoy greedily, so GRPO has to teach it which file to
open. Names and values come from every split's pools: the warm start stands in for pretraining, which saw the world;
what GRPO learns on train names is measured on validation's.

The shell's output is written here rather than run (a warm start plays tens of thousands of episodes):
tests/trainer/test_find_key.py checks it against the real environment and shell.
"""

from __future__ import annotations

import random

from trainer.agents.find_key import (
    ANSWER_PREFIX,
    PROMPT,
    TURN_STOP,
    VALUES,
    all_names,
    make_files,
    observation,
)

RIGHT_SHARE = 0.3
# Copying a file name from the listing is what takes the steps: after 500, 2% of sampled episodes miscopied a name
# (seed 42, the slowest of three), and the base models sample a solved episode 0.21-0.40 of the time after 600
# (trainer/README.md, "The tiny agent model").
WARM_START_STEPS = 600
KEYS, DECOYS = all_names()


def listing(files: dict[str, str]) -> str:
    """What `ls` prints in the episode's folder (one name a line, sorted: its output to a pipe)."""
    return "".join(f"{name}\n" for name in sorted(files))


def scripted_episode(rng: random.Random) -> list[tuple[str, bool]]:
    """One episode's transcript as (text, trained) segments: list, open the key or the decoy, answer it."""
    key, decoy = rng.choice(KEYS), rng.choice(DECOYS)
    key_value, decoy_value = rng.sample(VALUES, 2)
    files = make_files(key, decoy, key_value, decoy_value)
    opened = key if rng.random() < RIGHT_SHARE else decoy
    return [
        (PROMPT, False),
        (f"ls{TURN_STOP}", True),
        (observation(listing(files)), False),
        (f"cat {opened}{TURN_STOP}", True),
        (observation(files[opened]), False),
        (f"{ANSWER_PREFIX}{files[opened].strip()}", True),
    ]
