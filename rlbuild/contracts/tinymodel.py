"""The embedded tiny model's architecture: one home (`tiny_model.json`) that both sides read.

`trainer/tiny.py` builds the model from it; preflight reads it to check the experiment against the model before
anything is built (heads vs tensor parallelism, positions vs token budgets), without importing the trainer.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

TINY_MODEL_FILE = Path(__file__).resolve().parent / "tiny_model.json"


@cache
def tiny_model_config() -> dict[str, Any]:
    """The tiny model's config.json fields (a fresh dict each caller may not change: it is cached)."""
    return json.loads(TINY_MODEL_FILE.read_text())
