"""The optional publish stage: an export uploaded to a Hugging Face Hub model repo, tagged per version.

`execution.publish: {repo_id, private, revision_tag}` turns it on (off when absent). The token is HF_TOKEN from
the environment only (never an experiment value). The verified model folder is copied into a temporary folder,
its card given the eval stage's results, and uploaded with `upload_folder` (huggingface_hub 2 folded
`upload_large_folder` into it: with hf_xet it commits large folders in batches, and a rerun after an
interruption skips committed files and deduplicated data, so it resumes). The version's tag then points at the
commit uploaded, and the stage's output records the repo, the tag and the revision (written last).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, ModelCard

from rlbuild.contracts.artifacts import EXPORT_MODEL
from rlbuild.contracts.manifest import verify_local
from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError, Violation
from rlbuild.stages.modelcard import CARD, with_eval_results

TOKEN_ENV = "HF_TOKEN"


class PublishError(RlbuildError):
    """The export cannot be published: no token, or the Hub refused the upload."""


def token_problem(environ: Mapping[str, str]) -> Violation | None:
    """The preflight check of a configured publish stage: a token must be set (its value is never read here)."""
    if environ.get(TOKEN_ENV):
        return None
    return Violation(
        "execution.publish",
        f"publishing needs a Hugging Face token, and {TOKEN_ENV} is not set in the environment",
        f"export {TOKEN_ENV}=<a write token> (never in the experiment file), or remove execution.publish",
    )


def prepare_upload(export_dir: Path, results: Mapping[str, Any], upload_dir: Path) -> Path:
    """The verified model folder copied into `upload_dir` with the eval stage's results in its card."""
    verify_local(export_dir)  # a changed file is corruption, never a published model
    model = Path(export_dir) / EXPORT_MODEL
    shutil.copytree(model, upload_dir, dirs_exist_ok=True)
    with_eval_results(ModelCard.load(model / CARD), results).save(upload_dir / CARD)
    return upload_dir


def publish(
    upload_dir: Path, repo_id: str, *, private: bool, tag: str, environ: Mapping[str, str], version: str
) -> dict[str, Any]:
    """Upload `upload_dir` to `repo_id` (created if absent), tag the commit; return what was published."""
    token = environ.get(TOKEN_ENV)
    if not token:
        raise PublishError(str(token_problem(environ)))
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id, folder_path=upload_dir, repo_type="model", commit_message=f"rlbuild version {version}"
    )
    revision = commit.oid
    api.create_tag(repo_id, tag=tag, revision=revision, tag_message=f"rlbuild version {version}", exist_ok=True)
    return {"repo_id": repo_id, "tag": tag, "revision": revision, "url": f"{api.endpoint}/{repo_id}/tree/{tag}"}


def run_publish(
    export_dir: Path,
    results_file: Path,
    out: Path,
    settings: Mapping[str, Any],
    environ: Mapping[str, str],
    version: str,
) -> dict[str, Any]:
    """The stage: prepare the upload, publish it, record what was published in `out` (last)."""
    results = storage.read_json(str(results_file))
    if results is None:
        raise PublishError(f"{results_file} is missing: evaluate the version first (the eval rule)")
    with tempfile.TemporaryDirectory(prefix="rlbuild-publish-") as tmp:
        upload = prepare_upload(Path(export_dir), results, Path(tmp) / "model")
        published = publish(
            upload,
            settings["repo_id"],
            private=settings["private"],
            tag=settings["tag"],
            environ=environ,
            version=version,
        )
    storage.write_json(str(out), published)
    return published
