"""Checkpoints under `artifacts.checkpoint_root` (a local path or s3:// URI).

Layout:
    global_step_N/policy/          HF model folder (model.safetensors, config.json, tokenizer files)
    global_step_N/optimizer.pt     full (unsharded) AdamW + scheduler state
    global_step_N/trainer_state.json  {global_step, data_cursor, seed, runtime_source_digest, ...}
    latest                         "N": written last, so a checkpoint without it was never completed

Sampling and data order are derived from (seed, step), so step + data cursor is the full RNG state: a resumed
run continues exactly as the uninterrupted one would have.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlbuild import storage
from trainer.errors import TrainerError

STEP_DIR = re.compile(r"^global_step_(\d+)$")
LATEST = "latest"
STATE = "trainer_state.json"


class CheckpointError(TrainerError):
    """A checkpoint that cannot be resumed; the message says which and what to do."""


@dataclass(frozen=True)
class Resume:
    step: int
    data_cursor: int
    uri: str


class CheckpointManager:
    def __init__(self, root: str, keep: int, runtime_digest: str) -> None:
        self.root = root.rstrip("/")
        self.keep = keep
        self.runtime_digest = runtime_digest

    def step_uri(self, step: int) -> str:
        return storage.join(self.root, f"global_step_{step}")

    def latest_step(self) -> int | None:
        text = storage.read_text(storage.join(self.root, LATEST))
        if text is None:
            return None
        if not text.strip().isdigit():
            raise CheckpointError(f"{storage.join(self.root, LATEST)} holds {text!r}, not a step number; delete it")
        return int(text.strip())

    def save(self, step: int, data_cursor: int, extra: dict[str, Any], write_policy: Callable[[str], None]) -> str:
        """Policy + optimizer (via `write_policy`), then trainer state, then `latest`; then prune old ones."""
        uri = self.step_uri(step)
        write_policy(uri)
        state = {
            "global_step": step,
            "data_cursor": data_cursor,
            "runtime_source_digest": self.runtime_digest,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **extra,
        }
        storage.write_text(storage.join(uri, STATE), json.dumps(state, indent=2))
        storage.write_text(storage.join(self.root, LATEST), str(step))
        self._prune(step)
        return uri

    def _prune(self, newest: int) -> None:
        steps = sorted(int(m[1]) for name in storage.list_names(self.root) if (m := STEP_DIR.match(name)))
        for step in [s for s in steps if s <= newest][: -self.keep]:
            storage.remove(self.step_uri(step))

    def resolve(self, mode: str, path: str | None) -> Resume | None:
        """The checkpoint to resume from for `resume_mode`, digest-checked; None means start at step 0."""
        if mode == "none":
            return None
        if mode == "from_path":
            if not path or not STEP_DIR.match(path.rstrip("/").rsplit("/", 1)[-1]):
                raise CheckpointError(
                    f"trainer.resume_path={path!r} must name a global_step_N folder for resume_mode from_path"
                )
            return self._load(path.rstrip("/"))
        if mode != "latest":
            raise CheckpointError(f"trainer.resume_mode={mode!r} is not supported; use latest, none or from_path")
        step = self.latest_step()
        return None if step is None else self._load(self.step_uri(step))

    def _load(self, uri: str) -> Resume:
        text = storage.read_text(storage.join(uri, STATE))
        if text is None:
            raise CheckpointError(f"{uri} has no {STATE}: it is not a complete checkpoint; resume another one")
        state = json.loads(text)
        if state.get("runtime_source_digest") != self.runtime_digest:
            raise CheckpointError(
                f"checkpoint {uri} was written by runtime source digest {state.get('runtime_source_digest')}, but the "
                f"running code has {self.runtime_digest}: resuming would mix code versions. Train a new version, or "
                "pass --allow-retrain (or set trainer.resume_mode: none) to start from step 0."
            )
        return Resume(int(state["global_step"]), int(state["data_cursor"]), uri)
