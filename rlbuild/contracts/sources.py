"""The source grammar of the experiment file: where a model, tokenizer or data set comes from.

`parse_source` only checks the syntax; `Source.check` reports everything else that is knowable
without the network (an unpinned Hugging Face revision, a local path that does not exist, is a symlink loop, a
link to nothing or a FIFO, or a local folder holding such entries), so the preflight can collect every problem
of an experiment during DAG construction.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlbuild.core.errors import RlbuildError
from rlbuild.core.paths import path_problem, tree_problems

# Relative `local:` paths are relative to the repository, not to the working directory: Snakemake
# runs with the experiment root as its working directory.
REPO_ROOT = Path(__file__).resolve().parents[2]

Scheme = Literal["hf", "local", "artifact", "task", "harbor"]
SCHEMES: tuple[Scheme, ...] = ("hf", "local", "artifact", "task", "harbor")
# Sources read from a folder on the submitting machine: a revision is only a label, the content is the identity.
FOLDER_SCHEMES = ("local", "harbor")

_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
_HF_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_RULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TASK_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

GRAMMAR = (
    "hf:<org>/<name>[/<path in repo>], local:<path>, artifact:<rule name>, task:<task>/<split>, "
    "harbor:<folder of Harbor tasks>"
)
# The graph's rules whose output is a model folder that can be staged.
ARTIFACT_SOURCES = ("base_model",)


class StagingError(RlbuildError):
    """Staging or materialising an input failed; the message says which input and what to do."""


class SourceError(StagingError, ValueError):
    """A source string does not follow the grammar, or names something that cannot be staged."""


@dataclass(frozen=True)
class Source:
    """One parsed source: `scheme:location` at `revision`."""

    scheme: Scheme
    location: str
    revision: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.location}"

    @property
    def hf_repo_id(self) -> str:
        """`org/name` of an `hf:` source (the part after it, if any, is a path inside the repo)."""
        return "/".join(self.location.split("/")[:2])

    @property
    def hf_subpath(self) -> str:
        """The path inside the repository of an `hf:` source, or "" for the whole repository."""
        return "/".join(self.location.split("/")[2:])

    @property
    def task(self) -> tuple[str, str]:
        """(task, split) of a `task:` source."""
        task, split = self.location.split("/")
        return task, split

    def local_path(self) -> Path:
        """The filesystem path of a `local:` or `harbor:` source (relative paths are relative to the repo root)."""
        path = Path(self.location).expanduser()
        return path if path.is_absolute() else REPO_ROOT / path

    def check(self) -> list[str]:
        """Problems knowable without the network, as sentences for the person fixing the config."""
        problems: list[str] = []
        if not self.revision.strip():
            problems.append(
                f"source {self} has an empty revision; set `revision:` "
                + ("to the 40-hex commit sha" if self.scheme == "hf" else "to a label for this version")
            )
        if self.scheme == "hf" and self.revision.strip() and not _COMMIT_SHA.fullmatch(self.revision):
            problems.append(
                f"source {self} has revision {self.revision!r}, which is not a commit sha: a branch or tag "
                "moves, so the same config could stage different weights. Pin the 40-hex (lowercase) commit "
                f'sha, e.g. `python -c "from huggingface_hub import HfApi; '
                f"print(HfApi().model_info('{self.hf_repo_id}', revision='{self.revision}').sha)\"` "
                "(dataset_info for a data set), or copy it from the repo's 'Files and versions' history."
            )
        if self.scheme == "artifact" and self.location not in ARTIFACT_SOURCES:
            close = difflib.get_close_matches(self.location, ARTIFACT_SOURCES, n=1)
            problems.append(
                f"source {self}: no rule of the graph named {self.location!r} makes a model folder; "
                + (f"did you mean artifact:{close[0]}?" if close else f"use one of {list(ARTIFACT_SOURCES)}")
            )
        if self.scheme in FOLDER_SCHEMES:
            problems += self._local_problems()
        return problems

    def _local_problems(self) -> list[str]:
        """What would stop staging from reading every file of a `local:` source, as one sentence."""
        path = self.local_path()
        problem = path_problem(path)
        if problem == "does not exist":
            return [
                f"source {self}: path {path} does not exist; relative local paths are relative to the repository "
                f"root {REPO_ROOT}"
            ]
        if problem is not None:
            return [f"source {self}: {path} {problem}; point the source at a readable file or folder"]
        inside = tree_problems(path) if path.is_dir() else []
        if inside:
            return [f"source {self}: in {path}, {'; '.join(inside)}; fix or remove each (staging reads every file)"]
        return []


def parse_source(text: str, revision: str) -> Source:
    """Parse `scheme:location` (see GRAMMAR); raises SourceError on a syntax error."""
    scheme, sep, location = text.strip().partition(":")
    if not sep or scheme not in SCHEMES:
        raise SourceError(f"source {text!r} has no known scheme; expected one of: {GRAMMAR}")
    if not location:
        raise SourceError(f"source {text!r} has an empty location; expected one of: {GRAMMAR}")
    segments = location.split("/")
    if scheme == "hf" and (
        len(segments) < 2 or not all(_HF_SEGMENT.fullmatch(s) for s in segments) or ".." in segments
    ):
        raise SourceError(
            f"source {text!r} is not hf:<org>/<name>[/<path in repo>]; e.g. hf:Qwen/Qwen2.5-0.5B-Instruct"
        )
    if scheme == "artifact" and not _RULE_NAME.fullmatch(location):
        raise SourceError(
            f"source {text!r}: artifact:<rule name> takes the name of a rule in the graph, e.g. artifact:base_model"
        )
    if scheme == "task" and (len(segments) != 2 or not all(_TASK_SEGMENT.fullmatch(s) for s in segments)):
        raise SourceError(f"source {text!r} is not task:<task>/<split>; e.g. task:addition/train")
    return Source(scheme=scheme, location=location, revision=str(revision))
