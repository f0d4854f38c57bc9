"""The checkpoint layout under a run's `checkpoint_root`: the contract between the trainer, which writes it, and
the graph and `rlbuild status`, which read it.

    global_step_N/sharded/             torch.distributed.checkpoint: model, optimizer, scheduler (one .distcp a rank)
    global_step_N/policy/              the full model as a Hugging Face folder, at the terminal step only
    global_step_N/trainer_state.json   {global_step, data_cursor, runtime_source_digest, launch_fingerprint, ...}
    global_step_N/manifest.json        sha256 and size of every file above, trainer_state.json included
                                       (rlbuild/contracts/manifest.py): every reader of the state verifies it
    latest                             "N": written last, so a checkpoint it does not name was never completed
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlbuild.contracts.artifacts import CorruptDocumentError, sha256_bytes
from rlbuild.contracts.manifest import ManifestError, read_manifest
from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError

STEP_DIR = re.compile(r"^global_step_(\d+)$")
LATEST = "latest"
STATE = "trainer_state.json"
SHARDED = "sharded"
HF_FOLDER = "policy"


class CheckpointLayoutError(RlbuildError):
    """A checkpoint folder whose bookkeeping files cannot be read."""


def step_uri(root: str, step: int) -> str:
    return storage.join(root, f"global_step_{step}")


def latest_step(root: str) -> int | None:
    """The step `latest` names; None when no checkpoint was ever completed."""
    uri = storage.join(root, LATEST)
    text = storage.read_text(uri)
    if text is None:
        return None
    if not text.strip().isdigit():
        raise CheckpointLayoutError(f"{uri} holds {text!r}, not a step number; delete it")
    return int(text.strip())


def read_state(checkpoint_uri: str) -> dict[str, Any] | None:
    """A checkpoint's trainer_state.json, verified against the checkpoint's manifest (a state edited after the
    checkpoint was written resumes with another data cursor: refused); None when it has none (it is not a
    complete checkpoint). A manifest of before the state was manifested does not list it."""
    uri = storage.join(checkpoint_uri, STATE)
    data = storage.read_bytes(uri)
    if data is None:
        return None
    try:
        listed = read_manifest(checkpoint_uri)["files"].get(STATE)
    except ManifestError:
        listed = None  # not a complete checkpoint: its readers refuse it for that
    if listed is not None and listed.get("sha256") != sha256_bytes(data):
        raise CorruptDocumentError(
            uri,
            "it is not the trainer state its checkpoint's manifest lists (edited or damaged after the checkpoint was "
            "written)",
            "Resume from another checkpoint (trainer.resume_mode: from_path), or start over with "
            "--config allow_retrain=true",
        )
    try:
        return json.loads(data)
    except ValueError as error:
        raise CorruptDocumentError(uri, f"it is not JSON ({error})", "Resume from another checkpoint") from None


def latest_state(root: str) -> dict[str, Any] | None:
    """The trainer state of the newest completed checkpoint under `root`, or None."""
    step = latest_step(root)
    return None if step is None else read_state(step_uri(root, step))
