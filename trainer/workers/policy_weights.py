"""What a policy rank does with its weights besides updating them: the broadcast to the engines, sharded
checkpoints (save, verify, load) and the terminal checkpoint's Hugging Face folder.

A mixin of trainer/workers/policy.py's PolicyWorker (the Ray actor), so the update there reads top to bottom alone; it
uses the worker's model, optimizer, scheduler, rank and staged model folder.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rlbuild.contracts import checkpoints as layout
from rlbuild.contracts.manifest import describe_files, payload_files, verify_stored
from rlbuild.core import storage
from trainer.workers import sharding, weight_sync


class PolicyWeights:
    rank: int
    model: Any  # a transformers model, sharded by trainer/workers/sharding.py
    model_dir: Path
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    def open_weight_sync(self, backend: str, master_addr: str, port: int, world_size: int) -> None:
        """Host the weight-sync group as its rank 0 (called on rank 0, with every engine joining at once)."""
        self.weight_sync = (weight_sync.open_group(backend, master_addr, port, 0, world_size), backend)

    def weight_specs(self) -> list[weight_sync.TensorSpec] | None:
        """Names, shapes and dtypes of the full weights, on rank 0; None elsewhere. Every rank must call this."""
        state = sharding.full_state(self.model)
        return weight_sync.specs_of(state) if self.rank == 0 else None

    def broadcast_weights(self) -> None:
        """Gather the full weights and broadcast them to the engines (rank 0 sends). Every rank must call this."""
        state = sharding.full_state(self.model)
        if self.rank == 0:
            group, backend = self.weight_sync
            weight_sync.send(group, state, backend)

    def save_checkpoint(self, step_uri: str, with_hf_folder: bool) -> dict[str, Any]:
        """Every rank writes its shards; with `with_hf_folder`, rank 0 also writes the full weights as an HF folder.
        Returns the manifest entries of the files this rank wrote, relative to `step_uri`."""
        shards = sharding.save(storage.join(step_uri, layout.SHARDED), self.model, self.optimizer, self.scheduler)
        files = {f"{layout.SHARDED}/{rel}": entry for rel, entry in shards.items()}
        if with_hf_folder:
            state = sharding.full_state(self.model)
            if self.rank == 0:
                hf_files = self._write_hf_folder(state, storage.join(step_uri, layout.HF_FOLDER))
                files |= {f"{layout.HF_FOLDER}/{rel}": entry for rel, entry in hf_files.items()}
        return files

    def _write_hf_folder(self, state: dict[str, torch.Tensor], uri: str) -> dict[str, Any]:
        config = self.model.config
        if config.tie_word_embeddings:
            # A tied head shares the embedding's storage; safetensors refuses shared tensors, HF re-ties on load.
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        with tempfile.TemporaryDirectory(prefix="hf-") as tmp:
            out = Path(tmp)
            save_file(
                {k: v.contiguous() for k, v in state.items()}, out / "model.safetensors", metadata={"format": "pt"}
            )
            config.save_pretrained(out)
            for path in self.model_dir.iterdir():
                if path.name.startswith(("tokenizer", "special_tokens", "generation_config", "vocab", "merges")):
                    shutil.copy2(path, out / path.name)
            files = describe_files(dict(payload_files(out)))["files"]
            storage.put_dir(out, uri)
        return files

    def verify_checkpoint(self, step_uri: str, files: dict[str, Any]) -> None:
        """Check this rank's share of a checkpoint's files against its manifest before any rank loads it."""
        verify_stored(step_uri, files)

    def load_checkpoint(self, step_uri: str) -> None:
        """Load this rank's shards of the weights, optimizer and scheduler. Every rank must call this."""
        sharding.load(storage.join(step_uri, layout.SHARDED), self.model, self.optimizer, self.scheduler)
