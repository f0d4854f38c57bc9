"""An environment written the way a SkyRL team writes one, for the tests: skyrl-gym's text convention (a base class
with `turns` and `max_turns`, built as `Env(env_config, extras)`, `init(prompt)`, `step(action)` returning
`{observations, reward, done, metadata, postprocessed_action}`), with no rlbuild import anywhere in it.

skyrl-gym itself pulls ~160 MB (pandas, numpy...) for one base class, so this is the interface, written here.
"""

from __future__ import annotations

from typing import Any


class BaseTextEnv:
    """skyrl-gym's `BaseTextEnv` interface: one instance per episode."""

    def __init__(self) -> None:
        self.turns = 0
        self.max_turns = 1

    def init(self, prompt: str) -> tuple[str, dict[str, Any]]:
        return prompt, {}

    def step(self, action: str) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class RetryAddition(BaseTextEnv):
    """`a+b=`: the answer ends with `.`; a wrong one is told `no.` and may try again until `max_turns`."""

    def __init__(self, env_config: dict[str, Any] | None = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.answer = str(extras.get("answer", ""))
        self.max_turns = int(extras.get("max_turns", 2))
        self.closed = False

    def step(self, action: str) -> dict[str, Any]:
        self.turns += 1
        guess = action.strip().removesuffix(".")
        right = guess == self.answer
        done = right or self.turns >= self.max_turns
        observations = [] if done else [{"role": "user", "content": "no."}]
        return {
            "observations": observations,
            "reward": 1.0 if right else 0.0,
            "done": done,
            "metadata": {"guess": guess},
            "postprocessed_action": action,
        }

    def close(self) -> None:
        self.closed = True
