"""Stage models and data sets into storage with a manifest; materialise them on a node, verified.

A staged directory holds its payload files and `manifest.json` ({"files": {relpath: {sha256, size}}}),
written last: a directory without a manifest is not staged. Materialising copies a staged directory
from storage (a local folder or S3) to node-local disk and checks every file against the manifest; a
mismatch is an error, never a silent re-download, because it means storage or the cache was changed
under a fixed identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec
import yaml

from rlbuild.sources import Source, SourceError, StagingError, parse_source

__all__ = [
    "ManifestMismatchError",
    "Source",
    "SourceError",
    "StagingError",
    "filesystem",
    "local_content_digest",
    "manifest_digest",
    "materialise",
    "materialise_inputs",
    "parse_source",
    "stage_data",
    "stage_model",
    "verify_manifest",
    "verify_staged",
    "write_manifest",
]

MANIFEST = "manifest.json"
# Files in a staged directory that the manifest does not cover: the records (written after the
# manifest) and the marker Snakemake puts into every directory output.
UNMANIFESTED = frozenset({MANIFEST, "identity.json", ".snakemake_timestamp"})

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

DATA_COLUMNS = ("prompt", "answer")
_CHUNK = 1 << 20


class ManifestMismatchError(StagingError):
    """Files of a staged directory differ from its manifest. `problems` lists every one of them."""

    def __init__(self, where: str, problems: Sequence[str], fix: str) -> None:
        self.where = where
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{where} does not match its manifest ({len(self.problems)} problems):\n{lines}\n{fix}")


# --------------------------------------------------------------------------- manifests


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _payload_files(directory: Path) -> Iterator[tuple[str, Path]]:
    """(posix relpath, path) of every payload file under `directory`, sorted."""
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel not in UNMANIFESTED:
            yield rel, path


def write_manifest(directory: Path) -> dict[str, Any]:
    """Record sha256 and size of every payload file in `directory`/manifest.json (atomically)."""
    directory = Path(directory)
    files = {rel: {"sha256": _sha256_file(p), "size": p.stat().st_size} for rel, p in _payload_files(directory)}
    manifest = {"files": files}
    _atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of the manifest's files: the content identity of a staged dir."""
    return hashlib.sha256(json.dumps(manifest["files"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read_manifest(text: str, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
        files = manifest["files"]
        if not isinstance(files, dict) or not all(
            isinstance(v, dict) and {"sha256", "size"} <= v.keys() for v in files.values()
        ):
            raise TypeError("files entries need sha256 and size")
    except (ValueError, KeyError, TypeError) as exc:
        raise StagingError(
            f'{where} is not a valid manifest ({exc}); expected {{"files": {{relpath: {{sha256, size}}}}}}. '
            "Restage the directory (rerun its stage rule)."
        ) from exc
    return manifest


def _compare(expected: Mapping[str, Any], actual: Mapping[str, tuple[str | None, int]]) -> list[str]:
    """Problems of `actual` ({relpath: (sha256 or None if unread, size)}) against the manifest files."""
    problems = [f"{rel}: missing" for rel in sorted(expected.keys() - actual.keys())]
    problems += [f"{rel}: extra file not in the manifest" for rel in sorted(actual.keys() - expected.keys())]
    for rel in sorted(expected.keys() & actual.keys()):
        sha, size = actual[rel]
        want = expected[rel]
        if size != want["size"]:
            problems.append(f"{rel}: size {size} bytes, manifest says {want['size']}")
        elif sha is not None and sha != want["sha256"]:
            problems.append(f"{rel}: sha256 {sha[:16]}..., manifest says {want['sha256'][:16]}...")
    return problems


def verify_manifest(directory: Path, manifest: Mapping[str, Any] | None = None) -> None:
    """Check every file of `directory` against its manifest (or the given one); raise on any difference.

    Raises ManifestMismatchError listing every missing, extra, resized or changed file at once.
    """
    directory = Path(directory)
    if manifest is None:
        path = directory / MANIFEST
        if not path.is_file():
            raise StagingError(
                f"{directory} has no {MANIFEST}, so it is not a completed staged directory; "
                "rerun the stage rule that makes it."
            )
        manifest = _read_manifest(path.read_text(), str(path))
    actual: dict[str, tuple[str | None, int]] = {}
    for rel, path in _payload_files(directory):
        size = path.stat().st_size
        want = manifest["files"].get(rel)
        # Hash only files whose size matches: a wrong size is already a mismatch.
        actual[rel] = (_sha256_file(path) if want is not None and want["size"] == size else None, size)
    problems = _compare(manifest["files"], actual)
    if problems:
        raise ManifestMismatchError(
            str(directory), problems, "The payload was changed after staging; restage it (rerun its stage rule)."
        )


# --------------------------------------------------------------------------- local writes


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _copy_file(src: Path, dest: Path) -> None:
    """Copy (following symlinks, as in the Hub cache) under a temporary name, then rename."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


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
    files = list(_payload_files(folder))
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
            _copy_file(path, out_dir / rel)
    except BaseException:
        # Leave nothing that looks like (part of) a model behind.
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return write_manifest(out_dir)


def local_content_digest(source: Source) -> str:
    """Digest of the content a `local:` source holds now, in the manifest_digest form.

    A local revision is only a label the user types, so the identity of a local input must also carry
    its content: edit a file and the fingerprint changes. Hashes every file, so it costs one read of
    the source.
    """
    if source.scheme != "local":
        raise SourceError(f"source {source}: only local: sources need a content digest; the others are pinned")
    path = _local_path(source)
    files = {path.name: path} if path.is_file() else dict(_folder_files(path))
    return manifest_digest(
        {"files": {rel: {"sha256": _sha256_file(p), "size": p.stat().st_size} for rel, p in files.items()}}
    )


# --------------------------------------------------------------------------- stage_data


def _check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise StagingError(f"{where}: a row is {type(row).__name__}, expected an object with {DATA_COLUMNS}")
    missing = [c for c in DATA_COLUMNS if c not in row]
    if missing:
        raise StagingError(
            f"{where}: missing column(s) {missing}; every row needs {list(DATA_COLUMNS)} "
            f"(found {sorted(row)}). Rename the columns in the data set or point the source at one that has them."
        )
    return row


def read_jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise StagingError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            yield _check_row(row, f"{path}:{lineno}")


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    missing = [c for c in DATA_COLUMNS if c not in names]
    if missing:
        raise StagingError(
            f"{path}: missing column(s) {missing}; a parquet data set needs columns {list(DATA_COLUMNS)} "
            f"(found {names}). Rename the columns or point the source at a file that has them."
        )
    yield from pq.read_table(path, columns=list(DATA_COLUMNS)).to_pylist()


def _file_rows(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return read_jsonl_rows(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    raise StagingError(f"{path}: data files must be .jsonl or .parquet")


def _data_rows(source: Source, artifact_dirs: Mapping[str, Path] | None) -> Iterable[dict[str, Any]]:
    if source.scheme == "task":
        problems = source.check()
        if problems:
            raise SourceError("; ".join(problems))
        # The trainer (and its torch import) is only needed when a task set is generated.
        from trainer.tasks import generate

        task, split = source.task
        try:
            rows = generate(task, split, source.revision)
        except ValueError as exc:
            raise SourceError(f"source {source} at revision {source.revision}: {exc}") from exc
        return (_check_row(row, f"task {task}/{split}") for row in rows)
    path = _resolve(source, artifact_dirs, "dataset")
    if path.is_file():
        return _file_rows(path)
    # A folder is one data set split over files, read in name order.
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in {".jsonl", ".parquet"})
    if not files:
        raise StagingError(f"data source {source} ({path}) holds no .jsonl or .parquet files")
    return (row for f in files for row in _file_rows(f))


def _write_split(sources: Sequence[Source], out_dir: Path, split: str, artifact_dirs: Any) -> None:
    for i, source in enumerate(sources):
        dest = out_dir / split / f"{i}.jsonl"
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        count = 0
        with tmp.open("w") as f:
            for row in _data_rows(source, artifact_dirs):
                f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
                count += 1
        if count == 0:
            tmp.unlink()
            raise StagingError(f"data.{split}[{i}] source {source} at {source.revision} yielded no rows")
        os.replace(tmp, dest)


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


# --------------------------------------------------------------------------- storage access


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path within it) for a local path or an `s3://` URI.

    S3 settings come from the variables the Snakemake S3 storage plugin reads
    (SNAKEMAKE_STORAGE_S3_{ENDPOINT_URL,ACCESS_KEY,SECRET_KEY,TOKEN,REGION}), so jobs reach the same
    store as Snakemake; unset ones fall back to boto's AWS_* chain.
    """
    if not uri.startswith("s3://"):
        if "://" in uri:
            raise StagingError(f"storage URI {uri!r}: only local absolute paths and s3:// URIs are supported")
        return fsspec.filesystem("file"), uri
    env = os.environ
    client_kwargs = {}
    if env.get("SNAKEMAKE_STORAGE_S3_REGION"):
        client_kwargs["region_name"] = env["SNAKEMAKE_STORAGE_S3_REGION"]
    # No listing or instance cache: a verification must see storage as it is now.
    fs = fsspec.filesystem(
        "s3",
        endpoint_url=env.get("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL") or None,
        key=env.get("SNAKEMAKE_STORAGE_S3_ACCESS_KEY") or None,
        secret=env.get("SNAKEMAKE_STORAGE_S3_SECRET_KEY") or None,
        token=env.get("SNAKEMAKE_STORAGE_S3_TOKEN") or None,
        client_kwargs=client_kwargs,
        skip_instance_cache=True,
        use_listings_cache=False,
    )
    return fs, uri.removeprefix("s3://")


def _join(base: str, rel: str) -> str:
    return f"{base.rstrip('/')}/{rel}" if rel else base


def _staged_root(fs: fsspec.AbstractFileSystem, uri: str) -> tuple[str, str]:
    """(root, relpath): the nearest directory at or above `uri` that holds a manifest."""
    if not uri.startswith("s3://") and not Path(uri).is_absolute():
        raise StagingError(f"input URI {uri!r} is relative; launch documents carry absolute paths or s3:// URIs")
    scheme = "s3://" if uri.startswith("s3://") else ""
    parts = PurePosixPath(uri.removeprefix(scheme).rstrip("/")).parts
    # An S3 root stops at the bucket; a local one at "/".
    floor = 1 if scheme else 0
    for n in range(len(parts), floor, -1):
        root = scheme + str(PurePosixPath(*parts[:n]))
        if fs.isfile(_join(root, MANIFEST)):
            return root, "/".join(parts[n:])
    raise StagingError(
        f"no {MANIFEST} at or above {uri}: it is not inside a staged directory (or staging did not finish). "
        "Run the stage rule that makes it; launch documents must point into stage/model or stage/data."
    )


def _cache_path(cache_dir: Path, root: str) -> Path:
    """Where the copy of a staged root lives: one folder per storage location, readable by a person."""
    if root.startswith("s3://"):
        return cache_dir / "s3" / root.removeprefix("s3://")
    return cache_dir / "local" / root.lstrip("/")


def _download_verified(fs: fsspec.AbstractFileSystem, root: str, files: Mapping[str, Any], dest: Path) -> None:
    """Copy every manifest file of `root` into `dest`, hashing as it streams; raise listing all problems."""
    listed = {}
    for path, info in fs.find(root, detail=True).items():
        rel = PurePosixPath(path).relative_to(PurePosixPath(root.removeprefix("s3://"))).as_posix()
        if rel not in UNMANIFESTED:
            listed[rel] = int(info.get("size") or 0)
    actual: dict[str, tuple[str | None, int]] = {}
    for rel, size in listed.items():
        if rel not in files or size != files[rel]["size"]:
            actual[rel] = (None, size)
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with fs.open(_join(root, rel), "rb") as src, target.open("wb") as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
        actual[rel] = (digest.hexdigest(), target.stat().st_size)
    problems = _compare(files, actual)
    if problems:
        raise ManifestMismatchError(
            root,
            problems,
            "Storage was changed after staging (or staging was interrupted); restage it by rerunning its "
            "stage rule (with a new version if this one is fixed). Nothing was materialised.",
        )


def materialise(uri: str, dest: Path) -> Path:
    """Copy the staged directory holding `uri` under the cache folder `dest`, verified; return the local `uri`.

    The copy lives at `dest/s3/<bucket>/<key>` or `dest/local/<path>` so one cache serves every input.
    A cached copy is reused only if it verifies against the manifest in storage; otherwise this raises
    ManifestMismatchError naming the files (delete the cached copy to fetch it again).
    """
    fs, _ = filesystem(uri)
    root, rel = _staged_root(fs, uri)
    with fs.open(_join(root, MANIFEST), "r") as f:
        manifest_text = f.read()
    manifest = _read_manifest(manifest_text, _join(root, MANIFEST))
    local_root = _cache_path(Path(dest), root)
    if not local_root.exists():
        local_root.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{local_root.name}.partial-", dir=local_root.parent))
        try:
            _download_verified(fs, root, manifest["files"], partial)
            (partial / MANIFEST).write_text(manifest_text)
            partial.rename(local_root)
        except OSError:
            # Another process on this node finished the same copy first; its copy is checked below.
            if not local_root.exists():
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    try:
        verify_manifest(local_root, manifest)
    except ManifestMismatchError as exc:
        raise ManifestMismatchError(
            f"cached copy {local_root} of {root}",
            exc.problems,
            f"The cached copy differs from the manifest in storage; it is never replaced silently. Delete "
            f"{local_root} to materialise it again (and find out what changed it).",
        ) from None
    local = local_root / rel if rel else local_root
    if not local.exists():
        raise StagingError(f"{uri}: {rel!r} is not a file of the staged directory {root}")
    return local


def verify_staged(path: Path) -> Path:
    """Verify the staged directory holding the local `path` (a file in it, or the directory); return its root.

    For stages that get their inputs as local files (Snakemake already copied them from storage):
    the same check materialise does, without copying.
    """
    path = Path(path).resolve()
    root, _ = _staged_root(fsspec.filesystem("file"), str(path))
    verify_manifest(Path(root))
    return Path(root)


def materialise_inputs(launch: str | Path | Mapping[str, Any], cache_dir: Path) -> dict[str, Any]:
    """Materialise the model, tokenizer and data of a launch document; return their local paths.

    Returns {"model": Path, "tokenizer": Path, "train_data": [Path], "validation_data": [Path]}.
    """
    if isinstance(launch, Mapping):
        doc = launch
    else:
        fs, path = filesystem(str(launch))
        with fs.open(path, "r") as f:
            doc = yaml.safe_load(f)
    try:
        inputs = doc["inputs"]
        model = inputs["model"]
        model_uri = model["uri"]
        tokenizer_uri = model.get("tokenizer_uri") or model_uri
        train = [entry["uri"] for entry in inputs["train_data"]]
        validation = [entry["uri"] for entry in inputs.get("validation_data") or []]
    except (KeyError, TypeError) as exc:
        raise StagingError(
            f"launch document lacks inputs field {exc}; expected inputs.model.uri and inputs.train_data[*].uri "
            "(see docs/design.md, 'The launch document'). Regenerate it with resolve_launch."
        ) from exc
    cache_dir = Path(cache_dir)
    return {
        "model": materialise(model_uri, cache_dir),
        "tokenizer": materialise(tokenizer_uri, cache_dir),
        "train_data": [materialise(uri, cache_dir) for uri in train],
        "validation_data": [materialise(uri, cache_dir) for uri in validation],
    }
