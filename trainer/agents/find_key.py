"""Find the key: a multi-turn agent task in skyrl-gym's text convention, played against a real shell.

Each episode's sandbox holds two files of three digits: the key, whose name is `k` and two letters, and a decoy
named by three letters. The model types shell commands and reads their output; its answer scores 1.0 only if it
is the key file's content. The rule (list the files, open the one starting with `k`, answer what it says) takes
three turns:

    find key:|ls|>dhe kbj|cat kbj|>927|ans 927<eos>

The prompt ends with the turn stop `|`; each action ends with it too (the engine stops a turn there), except the
answer, which ends the episode with <eos>; each observation starts with `>` and ends with `|`, so the next action
starts after a separator. A tiny model learns this format in its warm start (trainer/agents/warm_start.py), and
GRPO has to teach it which file to open.

Rows are `{"prompt", "answer", "files"}`. Train and validation draw file names and values from disjoint pools, so
validation measures names and values that training never saw.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from trainer.sandbox import PRINTABLE, Sandbox, compact_output
from trainer.tasks import TaskError, revision_seed, split_rows

PROMPT = "find key:|"
TURN_STOP = "|"
OBSERVATION_START = ">"
ANSWER_PREFIX = "ans "
KEY_PREFIX = "k"
# Names are three letters from ten: a 2-layer model learns to copy a letter token by token, and with all 26 letters
# it still took the third letter from the other name one time in six after 1000 warm-start steps (held-out success
# stalled near 0.8); with ten, sampled episodes miscopied 0.02 of names after 500. The key is `k` and two of them.
NAME_LETTERS = "abcdefghij"
NAME_LENGTH = 3
VALUES = range(100, 1000)
ROWS = {"train": 512, "validation": 64}
# An observation shows this many characters of output at most: a listing of two names or a file's digits fit with
# room to spare, and a long error message does not crowd the tiny model's 128 positions.
OBSERVATION_CHARS = 20
# What an observation may hold: printable ASCII but the turn stop, so `|` only ever separates turns (the agent
# tokenizer has a token for each; trainer/tiny.py).
SHOWN = PRINTABLE - frozenset(TURN_STOP)
DEFAULT_MAX_TURNS = 3


class EpisodeError(TaskError):
    """An episode played without what it needs (a sandbox, the row's files)."""


def all_names() -> tuple[list[str], list[str]]:
    """Every key name (KEY_PREFIX and two letters) and every decoy name (three letters; KEY_PREFIX is not one)."""
    decoys = ["".join(letters) for letters in itertools.product(NAME_LETTERS, repeat=NAME_LENGTH)]
    keys = [KEY_PREFIX + "".join(rest) for rest in itertools.product(NAME_LETTERS, repeat=NAME_LENGTH - 1)]
    return keys, decoys


def _name_pools(split: str, revision: str) -> tuple[list[str], list[str]]:
    """The key names and the decoy names `split` draws from: disjoint from the other split's."""
    keys, decoys = all_names()
    return split_rows(keys, split, revision), split_rows(decoys, split, revision)


def make_files(key: str, decoy: str, key_value: int, decoy_value: int) -> dict[str, str]:
    """The episode's folder: each file holds its value and a newline, as `echo` writes it."""
    return {key: f"{key_value}\n", decoy: f"{decoy_value}\n"}


def observation(text: str) -> str:
    """A command's output as the model reads it: whitespace collapsed to single spaces, characters outside SHOWN
    as `?`, cut to OBSERVATION_CHARS, between `>` and the turn stop."""
    return f"{OBSERVATION_START}{compact_output(text, TURN_STOP)[:OBSERVATION_CHARS]}{TURN_STOP}"


def answer_of(action: str) -> str | None:
    """The answer an action gives (`ans 927` -> `927`), or None when the action is a command."""
    text = action.removesuffix(TURN_STOP).strip()
    if text == ANSWER_PREFIX.strip() or text.startswith(ANSWER_PREFIX):
        return text[len(ANSWER_PREFIX) :].strip()
    return None


class FindTheKey:
    """One episode of find-the-key (built per episode as `FindTheKey(env_config, extras)`), and the task's rows
    (built bare, `FindTheKey()`, to generate them)."""

    def __init__(self, env_config: dict[str, Any] | None = None, extras: dict[str, Any] | None = None) -> None:
        self.extras = dict(extras or {})
        self.max_turns = int(self.extras.get("max_turns", DEFAULT_MAX_TURNS))
        self.turns = 0

    def rows(self, split: str, revision: str) -> list[dict[str, Any]]:
        """ROWS[split] episodes, each a key and a decoy drawn from `split`'s pools of names and values."""
        if split not in ROWS:
            raise TaskError(f"split={split!r} is not a split of find_key; use one of {', '.join(ROWS)}")
        keys, decoys = _name_pools(split, revision)
        values = split_rows(list(VALUES), split, revision)
        rng = random.Random(f"find_key:{revision_seed(revision)}:{split}")
        out = []
        for _ in range(ROWS[split]):
            key_value, decoy_value = rng.sample(values, 2)
            files = make_files(rng.choice(keys), rng.choice(decoys), key_value, decoy_value)
            out.append({"prompt": PROMPT, "answer": str(key_value), "files": files})
        return out

    def init(self, prompt: str) -> tuple[str, dict[str, Any]]:
        return prompt, {}

    def step(self, action: str) -> dict[str, Any]:
        """Answer: scored, and the episode ends. Anything else runs as a shell command and its output comes back,
        until max_turns ends the episode unanswered (reward 0)."""
        self.turns += 1
        answer = answer_of(action)
        if answer is not None:
            return _end(self._score(answer))
        if self.turns >= self.max_turns:
            return _end(0.0)
        result = self._sandbox().run(action.removesuffix(TURN_STOP))
        if result.ended:
            return _end(0.0)
        shown = result.output if result.output.strip() else result.note
        return {
            "observations": [{"role": "user", "content": observation(shown)}],
            "reward": 0.0,
            "done": False,
            "metadata": {},
        }

    def _score(self, answer: str) -> float:
        """1.0 if `answer` is the key the row put in the sandbox: the row's copy, which no command reaches, so a
        model that rewrites the key file (`echo 1>kbj`) and answers what it wrote earns nothing."""
        return 1.0 if answer == str(self.extras.get("answer")) else 0.0

    def _sandbox(self) -> Sandbox:
        sandbox = self.extras.get("sandbox")
        if sandbox is None:
            raise EpisodeError(
                "FindTheKey.step needs extras['sandbox'] (an open sandbox holding the row's files); play episodes "
                "through the episode runner with recipe.environment.sandbox set"
            )
        return sandbox


def _end(reward: float) -> dict[str, Any]:
    return {"observations": [], "reward": reward, "done": True, "metadata": {}}
