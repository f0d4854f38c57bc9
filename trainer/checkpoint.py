"""Checkpoints under `artifacts.checkpoint_root` (a local path or s3:// URI).

Layout:
    global_step_N/sharded/         torch.distributed.checkpoint folder: `.metadata` and one `__<rank>_0.distcp` per
                                   policy rank, holding that rank's shards of the weights and AdamW state (and the
                                   scheduler); what a resume reads (trainer/workers/sharding.py)
    global_step_N/policy/          HF model folder (model.safetensors, config.json, tokenizer files), gathered by
                                   rank 0: the terminal checkpoint only (what export publishes)
    global_step_N/trainer_state.json  {global_step, data_cursor, seed, runtime_source_digest, ...}: after the payload
    global_step_N/manifest.json    sha256 and size of every file above (each rank hashes what it wrote; the driver
                                   the state): export, a resume and the terminal manifest verify what they read
    latest                         "N": written last, so a checkpoint without it was never completed

Only the terminal checkpoint carries the HF folder: it costs a full gather into one host's memory and a second
copy of the weights in storage, a resume never reads it, and only the terminal checkpoint is exported.

Sampling and data order are derived from (seed, step), so step + data cursor is the full RNG state: a resumed
run continues exactly as the uninterrupted one would have.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlbuild.contracts import checkpoints as layout
from rlbuild.contracts.artifacts import sha256_bytes
from rlbuild.contracts.checkpoints import LATEST, STATE, STEP_DIR
from rlbuild.contracts.manifest import MANIFEST, ManifestError, read_manifest
from rlbuild.core import storage
from trainer.errors import TrainerError


class CheckpointError(TrainerError):
    """A checkpoint that cannot be resumed; the message says which and what to do."""


@dataclass(frozen=True)
class Resume:
    step: int
    data_cursor: int
    uri: str
    files: dict[str, Any]  # the checkpoint's manifest entries, to verify before loading


class CheckpointManager:
    def __init__(self, root: str, keep: int, runtime_digest: str, launch_fingerprint: str = "") -> None:
        """`launch_fingerprint` names the configuration; `latest` never resumes another configuration's state."""
        self.root = root.rstrip("/")
        self.keep = keep
        self.runtime_digest = runtime_digest
        self.launch_fingerprint = launch_fingerprint

    def step_uri(self, step: int) -> str:
        return layout.step_uri(self.root, step)

    def latest_step(self) -> int | None:
        return layout.latest_step(self.root)

    def save(
        self, step: int, data_cursor: int, extra: dict[str, Any], write_policy: Callable[[str], dict[str, Any]]
    ) -> str:
        """Policy + optimizer (via `write_policy`, which returns the manifest entries of what it wrote), then trainer
        state, then the manifest of both, then `latest`; then prune old ones."""
        uri = self.step_uri(step)
        # What an interrupted earlier save of this step left (a resume from an older checkpoint gets here again).
        storage.remove(uri)
        try:
            self._write(uri, step, data_cursor, extra, write_policy)
        except OSError as error:  # a full disk, a quota, a permission: also as a rank's error, wrapped by Ray
            cause = getattr(error, "cause", None) or error
            storage.remove(uri)  # nothing half-written, and its space back for the attempt's log to say why
            # A failed write() names no file: the checkpoint's folder, then, in the OSError form status reads.
            named = OSError(cause.errno, cause.strerror, cause.filename or uri) if cause.errno else cause
            raise CheckpointError(
                f"checkpoint of step {step} not written (what was written is removed): {named}"
            ) from None
        storage.write_text(storage.join(self.root, LATEST), str(step))
        self._prune(step)
        return uri

    def _write(
        self,
        uri: str,
        step: int,
        data_cursor: int,
        extra: dict[str, Any],
        write_policy: Callable[[str], dict[str, Any]],
    ) -> None:
        """The checkpoint's files and its manifest, as `save` says."""
        files = write_policy(uri)
        state = {
            "global_step": step,
            "data_cursor": data_cursor,
            "runtime_source_digest": self.runtime_digest,
            "launch_fingerprint": self.launch_fingerprint,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **extra,
        }
        state_bytes = json.dumps(state, indent=2).encode()
        storage.write_bytes(storage.join(uri, STATE), state_bytes)
        files[STATE] = {"sha256": sha256_bytes(state_bytes), "size": len(state_bytes)}
        storage.write_json(storage.join(uri, MANIFEST), {"files": files})

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
            return self._load(path.rstrip("/"), same_configuration=False)
        if mode != "latest":
            raise CheckpointError(f"trainer.resume_mode={mode!r} is not supported; use latest, none or from_path")
        step = self.latest_step()
        return None if step is None else self._load(self.step_uri(step), same_configuration=True)

    def _load(self, uri: str, same_configuration: bool) -> Resume:
        state = layout.read_state(uri)  # verified against the manifest
        if state is None:
            raise CheckpointError(f"{uri} has no {STATE}: it is not a complete checkpoint; resume another one")
        try:
            files = read_manifest(uri)["files"]
        except ManifestError as error:
            raise CheckpointError(f"{error} Resume another checkpoint (resume_mode from_path).") from None
        if state.get("runtime_source_digest") != self.runtime_digest:
            raise CheckpointError(
                f"checkpoint {uri} was written by runtime source digest {state.get('runtime_source_digest')}, but the "
                f"running code has {self.runtime_digest}: resuming would mix code versions. Train a new version, or "
                "pass --allow-retrain (or set trainer.resume_mode: none) to start from step 0."
            )
        stored = state.get("launch_fingerprint")
        if same_configuration and self.launch_fingerprint and stored != self.launch_fingerprint:
            raise CheckpointError(
                f"checkpoint {uri} belongs to launch fingerprint {stored}, not this launch's "
                f"{self.launch_fingerprint}: it was trained with another configuration. Resume it with "
                "resume_mode: from_path if that is meant, or start from step 0 (--allow-retrain, or resume_mode: none)."
            )
        return Resume(int(state["global_step"]), int(state["data_cursor"]), uri, files)
