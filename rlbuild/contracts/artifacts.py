"""The artifact table: every kind of artifact, the rule that writes it, where it lives and where its record is.

Defined once; the rules, the plan printer, the records and `rlbuild status` read it. Paths are relative to the
experiment root `<storage root>/<experiment name>`; Snakemake runs with that root as its working directory
(local storage) or default storage prefix (S3), so they are also the targets users type.
"""

from __future__ import annotations

from dataclasses import dataclass

RECORD_NAME = "identity.json"
METRICS_NAME = (
    "metrics.jsonl"  # the train artifact's merged metrics, beside terminal.json (rlbuild/contracts/metricstream.py)
)
MUTABLE_VERSION = "dev"
# The export's model (weights, config, tokenizer, generation config, card) sits in this folder of the export's
# version folder; its manifest and Snakemake's marker sit beside it, so the model folder is exactly the model.
EXPORT_MODEL = "model"


@dataclass(frozen=True)
class Artifact:
    """One kind of artifact, in build order."""

    kind: str  # the identity kind in records: `<experiment>/<kind>@<version>:<fingerprint>`
    rule: str  # the Snakemake rule that writes it
    folder: str  # versions live in `<folder>/v<version>/`
    output: str  # the file the rule declares inside the version folder; "" when the folder itself is the output
    # The control documents of the version folder that steer later stages: the record names their digests
    # (rlbuild/contracts/records.py) and the next stage verifies them.
    documents: tuple[str, ...] = ()

    def version_folder(self, version: str) -> str:
        return f"{self.folder}/v{version}"

    def path(self, version: str = "{version}") -> str:
        """The rule's output: the version folder, or the file in it (`{version}` for the rule's pattern)."""
        folder = self.version_folder(version)
        return f"{folder}/{self.output}" if self.output else folder

    def file(self, version: str, name: str) -> str:
        """Another file the artifact keeps in its version folder (the train artifact's `metrics.jsonl`)."""
        return f"{self.version_folder(version)}/{name}"

    def record(self, version: str = "{version}") -> str:
        """Where the identity record lives: beside the version folder, never inside a directory output, so that
        it is uploaded after the whole artifact (rules declare it last) and its presence means complete."""
        return record_of(self.version_folder(version))

    @property
    def is_directory(self) -> bool:
        return not self.output


ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("base_model", "base_model", "base_model", ""),
    Artifact("stage_model", "stage_model", "stage/model", "", ("manifest.json",)),
    Artifact("stage_data", "stage_data", "stage/data", "", ("manifest.json",)),
    Artifact("launch", "resolve_launch", "launch", "launch.yaml", ("launch.yaml",)),
    Artifact("train", "train", "train", "terminal.json", ("terminal.json", METRICS_NAME)),
    Artifact("export", "export", "export", "", ("manifest.json",)),
    Artifact("eval", "eval", "eval", "results.json", ("results.json",)),
)


def record_of(version_folder: str) -> str:
    """The record beside a version folder (a path or URI)."""
    return f"{version_folder.rstrip('/')}.{RECORD_NAME}"


BY_KIND = {a.kind: a for a in ARTIFACTS}
KINDS = tuple(a.kind for a in ARTIFACTS)


def artifact(kind: str) -> Artifact:
    return BY_KIND[kind]


def kind_of_target(target: str) -> str | None:
    """The artifact kind a target path (`export/v2026.09.21`, `stage/model/vdev/config.json`) belongs to."""
    for a in sorted(ARTIFACTS, key=lambda a: -len(a.folder)):
        if target == a.folder or target.startswith(f"{a.folder}/v"):
            return a.kind
    return None


@dataclass(frozen=True)
class TemporaryPaths:
    """Checkpoints, attempt state and the metrics stream of one training run: under `tmp/ttl=<N>d/` so a bucket
    lifecycle rule can expire them. A `dev` run's live under its fingerprint, so a changed configuration never
    resumes another's."""

    version: str
    ttl_days: int
    fingerprint: str

    @property
    def root(self) -> str:
        base = f"tmp/ttl={self.ttl_days}d/{artifact('train').version_folder(self.version)}"
        return f"{base}/{self.fingerprint}" if self.version == MUTABLE_VERSION else base

    @property
    def checkpoints(self) -> str:
        return f"{self.root}/checkpoints"

    @property
    def attempts(self) -> str:
        return f"{self.root}/attempts"

    @property
    def metrics(self) -> str:
        """The metrics stream's segments while the run goes; merged into `train/v<version>/metrics.jsonl` at its end."""
        return f"{self.root}/metrics"
