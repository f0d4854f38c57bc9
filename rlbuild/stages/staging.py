"""Stage models and data sets: turn a source (`hf:`, `local:`, `artifact:`, `task:`, `harbor:`) into a folder in
storage.

A staged folder holds its payload and `manifest.json` (rlbuild/contracts/manifest.py), written after the payload, so a
folder without a manifest was never completely staged.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from rlbuild.contracts.manifest import (
    MANIFEST,
    manifest_digest,
    payload_files,
    sha256_file,
    verify_manifest,
    write_manifest,
)
from rlbuild.contracts.rows import COLUMNS, check_row, data_files, read_rows, task_rows
from rlbuild.contracts.sources import FOLDER_SCHEMES, Source, SourceError, StagingError
from rlbuild.core import storage

# Names that make up a tokenizer in a Hugging Face model folder; when the tokenizer has its own source,
# these come from there and never from the model source.
TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "tokenizer.model",
        "spiece.model",
        "chat_template.jinja",
        "chat_template.json",
    }
)
# Alternative weight formats a Hub repo may carry next to the safetensors/bin weights the trainer loads.
HF_IGNORE_PATTERNS = ("*.onnx", "*.onnx_data", "*.h5", "*.msgpack", "*.ot", "*.tflite", "*.gguf", "*.mlmodel")
_HF_IGNORE_DIRS = frozenset({"onnx", "openvino", "coreml", "original", ".cache", ".git"})
# A repo that ships safetensors often also ships the same weights as a pickle; stage one copy, the safe one.
_PICKLED_WEIGHTS = "pytorch_model*.bin"


def _prepare_out_dir(out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise StagingError(
            f"output directory {out_dir} is not empty; staging writes a fresh directory. "
            "Remove it (Snakemake does this for a rerun) and stage again."
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


# --------------------------------------------------------------------------- resolving sources


def _hf_snapshot(source: Source, repo_type: str) -> Path:
    """The local snapshot folder of a pinned Hub repo, downloaded into (or found in) the HF cache.

    Environment is read here, not at import of huggingface_hub, so HF_HUB_OFFLINE / HF_HOME /
    HF_HUB_CACHE set by the caller (or a test) after import still apply.
    """
    problems = source.check()
    if problems:
        raise SourceError("; ".join(problems))
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache_dir = os.environ.get("HF_HUB_CACHE") or (
        str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else None
    )
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    subpath = source.hf_subpath
    skip = HF_IGNORE_PATTERNS
    if repo_type == "model" and not offline:
        # One listing call saves downloading the weights twice; offline, the copy step filters instead.
        try:
            skip = _skip_patterns(
                HfApi().list_repo_files(source.hf_repo_id, revision=source.revision, repo_type=repo_type)
            )
        except Exception:
            # Only an optimisation: snapshot_download below reports the actual problem, or uses the cache.
            skip = HF_IGNORE_PATTERNS
    try:
        folder = snapshot_download(
            source.hf_repo_id,
            repo_type=repo_type,
            revision=source.revision,
            cache_dir=cache_dir,
            local_files_only=offline,
            allow_patterns=[subpath, f"{subpath}/*"] if subpath else None,
            ignore_patterns=list(skip),
        )
    except LocalEntryNotFoundError as exc:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached"
        raise StagingError(
            f"source {source} at {source.revision} is not in the Hugging Face cache "
            f"({cache_dir or 'the default HF cache'}) and {why}. Prefetch it with `hf download "
            f"{source.hf_repo_id} --repo-type {repo_type} --revision {source.revision}` on a machine with "
            "access and point HF_HUB_CACHE at that cache" + (", or unset HF_HUB_OFFLINE." if offline else ".")
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise StagingError(
            f"source {source} revision {source.revision}: {type(exc).__name__}; check the repo id and that "
            "the commit exists (a private or gated repo needs HF_TOKEN)."
        ) from exc
    except HfHubHTTPError as exc:
        raise StagingError(f"source {source} revision {source.revision}: download failed: {exc}") from exc
    return Path(folder) / subpath if subpath else Path(folder)


def _artifact_dir(source: Source, artifact_dirs: Mapping[str, Path] | None) -> Path:
    path = (artifact_dirs or {}).get(source.location)
    if path is None:
        raise SourceError(
            f"source {source}: no directory was given for rule {source.location!r}; the stage rule must "
            f"take that rule's output as an input and pass it (artifact_dirs={{'{source.location}': <dir>}})."
        )
    path = Path(path)
    if not path.exists():
        raise StagingError(f"source {source}: the output of rule {source.location!r} ({path}) does not exist")
    if (path / MANIFEST).is_file():
        verify_manifest(path)
    return path


def _local_path(source: Source) -> Path:
    problems = source.check()
    if problems:
        raise SourceError("; ".join(problems))
    return source.local_path()


def _resolve(source: Source, artifact_dirs: Mapping[str, Path] | None, repo_type: str) -> Path:
    """The local file or folder holding the content of a `hf:`, `local:` or `artifact:` source."""
    if source.scheme == "hf":
        return _hf_snapshot(source, repo_type)
    if source.scheme == "local":
        return _local_path(source)
    if source.scheme == "artifact":
        return _artifact_dir(source, artifact_dirs)
    raise SourceError(f"source {source}: a {source.scheme}: source cannot be staged as a {repo_type}")


def _skip_patterns(names: Iterable[str]) -> tuple[str, ...]:
    """File patterns not worth staging from a model folder or repo holding `names`."""
    if any(name.endswith(".safetensors") for name in names):
        return (*HF_IGNORE_PATTERNS, _PICKLED_WEIGHTS)
    return HF_IGNORE_PATTERNS


def _folder_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """(relpath, path) of the files of a model folder worth staging: no records, caches or other formats."""
    files = list(payload_files(folder))
    skip = _skip_patterns(rel for rel, _ in files)
    for rel, path in files:
        parts = PurePosixPath(rel).parts
        if set(parts[:-1]) & _HF_IGNORE_DIRS or any(PurePosixPath(rel).match(p) for p in skip):
            continue
        yield rel, path


# --------------------------------------------------------------------------- stage_model


def stage_model(
    model_source: Source,
    tokenizer_source: Source,
    out_dir: Path,
    *,
    artifact_dirs: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """Copy a model folder (and its tokenizer, from its own source if that differs) into `out_dir`.

    Payload first, `manifest.json` last; returns the manifest.
    """
    model_dir = _resolve(model_source, artifact_dirs, "model")
    if not (model_dir / "config.json").is_file():
        raise StagingError(
            f"model source {model_source} ({model_dir}) has no config.json, so it is not a Hugging Face "
            "model folder; point model.source at the folder that holds config.json and the weights."
        )
    separate_tokenizer = tokenizer_source != model_source
    files = {
        rel: path
        for rel, path in _folder_files(model_dir)
        if not (separate_tokenizer and PurePosixPath(rel).name in TOKENIZER_FILES)
    }
    if separate_tokenizer:
        tokenizer_dir = _resolve(tokenizer_source, artifact_dirs, "model")
        tokenizer_files = {
            rel: path for rel, path in _folder_files(tokenizer_dir) if PurePosixPath(rel).name in TOKENIZER_FILES
        }
        if not tokenizer_files:
            raise StagingError(
                f"tokenizer source {tokenizer_source} ({tokenizer_dir}) holds none of {sorted(TOKENIZER_FILES)}; "
                "point model.tokenizer.source at a folder with the tokenizer files."
            )
        files.update(tokenizer_files)
    out_dir = _prepare_out_dir(out_dir)
    try:
        for rel, path in files.items():
            (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out_dir / rel)  # follows links, as in the Hub cache
    except BaseException:
        # Leave nothing that looks like (part of) a model behind.
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return write_manifest(out_dir)


def local_content_digest(source: Source, cache_file: Path | None = None) -> str:
    """Digest of the content a `local:` source holds now, in the manifest_digest form.

    A local revision is only a label the user types, so a local input's identity also carries its content: edit
    a file and the fingerprint changes. Each file's sha256 is remembered by (path, size, mtime, inode) in
    `cache_file` (default: $XDG_CACHE_HOME/rlbuild/content-digests.json), as git's index does, so a dry run reads
    only files that changed since the last one.
    """
    if source.scheme not in FOLDER_SCHEMES:
        raise SourceError(f"source {source}: only folder sources (local:, harbor:) need a content digest")
    path = _local_path(source)
    files = {path.name: path} if path.is_file() else dict(_folder_files(path))
    cache = _DigestCache(cache_file or _default_digest_cache())
    described = {rel: {"sha256": cache.sha256(p), "size": p.stat().st_size} for rel, p in sorted(files.items())}
    cache.save()
    return manifest_digest({"files": described})


def cached_sha256(file: Path, cache_file: Path | None = None) -> str:
    """The sha256 of one file, remembered like a `local:` source's files (a SIF image is gigabytes)."""
    cache = _DigestCache(cache_file or _default_digest_cache())
    digest = cache.sha256(file)
    cache.save()
    return digest


def _default_digest_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlbuild" / "content-digests.json"


class _DigestCache:
    """sha256 of files keyed by what changes when their content does; a lost or torn cache is only slower."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.entries: dict[str, list[Any]] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        self.changed = False

    def sha256(self, file: Path) -> str:
        stat = file.stat()
        key = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        name = str(file.resolve())
        entry = self.entries.get(name)
        if isinstance(entry, list) and entry[:3] == key:
            return str(entry[3])
        digest = sha256_file(file)
        self.entries[name] = [*key, digest]
        self.changed = True
        return digest

    def save(self) -> None:
        if not self.changed:
            return
        with contextlib.suppress(OSError):  # a read-only home only costs rehashing next time
            storage.write_text(str(self.path), json.dumps(self.entries))


# --------------------------------------------------------------------------- stage_data


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise StagingError(
            f"{path}: missing column(s) {missing}; a parquet data set needs columns {list(COLUMNS)} "
            f"(found {names}). Rename the columns or point the source at a file that has them."
        )
    yield from pq.read_table(path, columns=list(COLUMNS)).to_pylist()


def _file_rows(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return read_rows(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    raise StagingError(f"{path}: data files must be .jsonl or .parquet")


def _data_rows(source: Source, artifact_dirs: Mapping[str, Path] | None) -> Iterable[dict[str, Any]]:
    if source.scheme == "task":
        return (check_row(row, f"{source}") for row in _task_rows(source))
    if source.scheme == "harbor":
        return task_rows(_local_path(source))
    path = _resolve(source, artifact_dirs, "dataset")
    files = data_files(path)
    if not files:
        raise StagingError(f"data source {source} ({path}) holds no .jsonl or .parquet files")
    return (row for f in files for row in _file_rows(f))


def _task_rows(source: Source) -> list[dict[str, Any]]:
    """A built-in or plug-in task's rows, generated by the trainer's own command line (rlbuild never imports it)."""
    problems = source.check()
    if problems:
        raise SourceError("; ".join(problems))
    task, split = source.task
    with tempfile.TemporaryDirectory(prefix="rlbuild-task-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        command = [sys.executable, "-m", "trainer", "make-data", "--task", task, "--split", split]
        result = subprocess.run(
            [*command, "--revision", source.revision, "--out", str(out)], capture_output=True, text=True, check=False
        )
        if result.returncode:
            reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
            raise SourceError(f"source {source} at revision {source.revision}: {reason}")
        return list(read_rows(out))


def _write_split(sources: Sequence[Source], out_dir: Path, split: str, artifact_dirs: Any) -> None:
    for i, source in enumerate(sources):
        dest = out_dir / split / f"{i}.jsonl"
        dest.parent.mkdir(parents=True, exist_ok=True)
        count = 0
        with dest.open("w") as f:
            for row in _data_rows(source, artifact_dirs):
                f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
                count += 1
        if count == 0:
            raise StagingError(f"data.{split}[{i}] source {source} at {source.revision} yielded no rows")


def stage_data(
    train_sources: Sequence[Source],
    validation_sources: Sequence[Source],
    out_dir: Path,
    *,
    artifact_dirs: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """Write `out_dir/train/<i>.jsonl` and `out_dir/validation/<i>.jsonl` ({prompt, answer} rows).

    Payload first, `manifest.json` last; returns the manifest.
    """
    if not train_sources:
        raise StagingError("data.train is empty; list at least one source")
    out_dir = _prepare_out_dir(out_dir)
    try:
        _write_split(train_sources, out_dir, "train", artifact_dirs)
        _write_split(validation_sources, out_dir, "validation", artifact_dirs)
    except BaseException:
        # Leave nothing that looks like (part of) a data set behind.
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return write_manifest(out_dir)
