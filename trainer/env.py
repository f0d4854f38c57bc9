"""Reward environments: a pluggable registry keyed by the recipe's `environment.env_class`.

An environment scores one completion of one dataset row. Register new ones with `@register("name")`; the
recipe selects them by name. Dataset rows are `{prompt, answer}` (see trainer/tasks.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from trainer.errors import TrainerError


class Environment(Protocol):
    def reward(self, row: dict[str, Any], completion: str, finished: bool) -> float:
        """`completion` is the decoded text without special tokens; `finished` says it ended with <eos>."""
        ...


_REGISTRY: dict[str, Callable[[], Environment]] = {}


def register(name: str) -> Callable[[Callable[[], Environment]], Callable[[], Environment]]:
    def wrap(factory: Callable[[], Environment]) -> Callable[[], Environment]:
        _REGISTRY[name] = factory
        return factory

    return wrap


def make(name: str) -> Environment:
    if name not in _REGISTRY:
        raise TrainerError(
            f"environment.env_class={name!r} is not registered; use one of {', '.join(sorted(_REGISTRY))} "
            "or register one with trainer.env.register"
        )
    return _REGISTRY[name]()


@register("exact_match")
class ExactMatch:
    """1.0 when the completion is exactly the answer and generation stopped with <eos>, else 0.0."""

    def reward(self, row: dict[str, Any], completion: str, finished: bool) -> float:
        return 1.0 if finished and completion == str(row["answer"]) else 0.0
