"""The embedded tiny models' architectures: one home (a JSON file per variant) that both sides read.

`trainer/tiny.py` builds a model from one; preflight reads it to check the experiment against the model before
anything is built (heads vs tensor parallelism, positions vs token budgets), without importing the trainer. The
variant is named by the model's revision label (`model.revision` of `artifact:base_model`), so the label says which
weights an experiment trains, as a Hub revision would.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from rlbuild.core.errors import RlbuildError

HERE = Path(__file__).resolve().parent
# The single-turn tasks' model (addition, reversal): 64 positions, an 80-symbol vocabulary.
DEFAULT_VARIANT = "tiny-qwen2-h32-l2"
# The agent tasks' model (find_key): transcripts of several turns need more positions and the separators.
AGENT_VARIANT = "tiny-agent-h64-l2"
VARIANT_FILES = {DEFAULT_VARIANT: HERE / "tiny_model.json", AGENT_VARIANT: HERE / "tiny_agent_model.json"}
TINY_MODEL_FILE = VARIANT_FILES[DEFAULT_VARIANT]


class UnknownVariantError(RlbuildError, ValueError):
    """A revision label of `artifact:base_model` that names no tiny model variant."""


def variant_file(variant: str) -> Path:
    """The architecture file of `variant`, or UnknownVariantError naming the choices."""
    try:
        return VARIANT_FILES[variant]
    except KeyError:
        raise UnknownVariantError(
            f"revision {variant!r} names no tiny model variant; use one of {', '.join(VARIANT_FILES)}"
        ) from None


@cache
def tiny_model_config(variant: str = DEFAULT_VARIANT) -> dict[str, Any]:
    """The variant's config.json fields (a fresh dict each caller may not change: it is cached)."""
    return json.loads(variant_file(variant).read_text())
