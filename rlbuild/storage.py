"""Where artifacts live, and how they are written so that a reader never sees half an artifact.

Paths are relative to the experiment root `<storage root>/<experiment name>`; Snakemake runs with that root
as its working directory (local storage) or default storage prefix (S3).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbuild.identity import RECORD_NAME


@dataclass(frozen=True)
class ArtifactPaths:
    """Relative paths of one experiment version's artifacts."""

    version: str
    ttl_days: int

    @property
    def base_model(self) -> str:
        return f"base_model/v{self.version}"

    @property
    def staged_model(self) -> str:
        return f"stage/model/v{self.version}"

    @property
    def staged_data(self) -> str:
        return f"stage/data/v{self.version}"

    @property
    def launch(self) -> str:
        return f"launch/v{self.version}/launch.yaml"

    @property
    def terminal(self) -> str:
        return f"train/v{self.version}/terminal.json"

    @property
    def export(self) -> str:
        return f"export/v{self.version}"

    @property
    def eval(self) -> str:
        return f"eval/v{self.version}"

    @property
    def temporary_root(self) -> str:
        # A `ttl=Nd` key prefix lets a bucket lifecycle rule expire checkpoints and attempts.
        return f"tmp/ttl={self.ttl_days}d/train/v{self.version}"

    @property
    def checkpoints(self) -> str:
        return f"{self.temporary_root}/checkpoints"

    @property
    def attempts(self) -> str:
        return f"{self.temporary_root}/attempts"

    def record(self, kind: str) -> str:
        """Where the identity record of an artifact kind lives."""
        folders = {
            "base_model": self.base_model,
            "stage_model": self.staged_model,
            "stage_data": self.staged_data,
            "launch": f"launch/v{self.version}",
            "train": f"train/v{self.version}",
            "export": self.export,
            "eval": self.eval,
        }
        return f"{folders[kind]}/{RECORD_NAME}"


def join(root: str, relative: str) -> str:
    return f"{root.rstrip('/')}/{relative}"


def read_json(uri: str) -> dict[str, Any] | None:
    """Read a JSON document from a local path or s3:// URI; None when it does not exist."""
    from rlbuild.staging import filesystem

    fs, path = filesystem(uri)
    try:
        with fs.open(path, "r") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def atomic_write_text(path: Path, text: str) -> None:
    """Write a local file so that readers see the old content or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")
