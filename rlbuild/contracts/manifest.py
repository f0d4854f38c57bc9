"""Manifests: the sha256 and size of every payload file of a directory artifact, and verified copies of it.

A manifested directory holds its payload and `manifest.json` ({"files": {relpath: {sha256, size}}}), written
after the payload: a directory without a manifest is incomplete. Materialising copies a manifested directory
from storage (a local folder or S3) to node-local disk and checks every file on the way; a mismatch is an error
naming the files, never a silent re-download, because it means storage or a cache changed under a fixed identity.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError

if TYPE_CHECKING:
    import fsspec

    from rlbuild.contracts.launch import LaunchDocument

MANIFEST = "manifest.json"
# Files a manifest does not cover: itself and the marker Snakemake puts into every directory output.
UNMANIFESTED = frozenset({MANIFEST, ".snakemake_timestamp"})
_CHUNK = 1 << 20


class ManifestError(RlbuildError):
    """A directory that is not a complete manifested artifact (no manifest, or an unreadable one)."""


class ManifestMismatchError(ManifestError):
    """Files of a manifested directory differ from its manifest. `problems` lists every one of them."""

    def __init__(self, where: str, problems: Sequence[str], fix: str) -> None:
        self.where, self.problems, self.fix = where, list(problems), fix
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{where} does not match its manifest ({len(self.problems)} problems):\n{lines}\n{fix}")

    def __reduce__(self) -> tuple[type, tuple[str, list[str], str]]:
        # Raised inside a Ray actor, it is pickled to the driver: rebuild it from its parts, not its message.
        return (type(self), (self.where, self.problems, self.fix))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def payload_files(directory: Path) -> Iterator[tuple[str, Path]]:
    """(posix relpath, path) of every payload file under `directory`, sorted."""
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel not in UNMANIFESTED:
            yield rel, path


def describe_files(files: Mapping[str, Path]) -> dict[str, Any]:
    """The manifest of `files` ({relpath: path})."""
    return {"files": {rel: {"sha256": sha256_file(p), "size": p.stat().st_size} for rel, p in sorted(files.items())}}


def write_manifest(directory: Path) -> dict[str, Any]:
    """Record sha256 and size of every payload file in `directory`/manifest.json (atomically); return it."""
    directory = Path(directory)
    manifest = describe_files(dict(payload_files(directory)))
    storage.write_json(str(directory / MANIFEST), manifest)
    return manifest


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of the manifest's files: the content identity of a directory."""
    return hashlib.sha256(json.dumps(manifest["files"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def parse_manifest(text: str, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
        files = manifest["files"]
        if not isinstance(files, dict) or not all(
            isinstance(v, dict) and {"sha256", "size"} <= v.keys() for v in files.values()
        ):
            raise TypeError("files entries need sha256 and size")
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(
            f'{where} is not a valid manifest ({exc}); expected {{"files": {{relpath: {{sha256, size}}}}}}. '
            "Rebuild the artifact (rerun the rule that makes it)."
        ) from exc
    return manifest


def compare(expected: Mapping[str, Any], actual: Mapping[str, tuple[str | None, int]]) -> list[str]:
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
            raise ManifestError(
                f"{directory} has no {MANIFEST}, so it is not a complete artifact; rerun the rule that makes it."
            )
        manifest = parse_manifest(path.read_text(), str(path))
    actual: dict[str, tuple[str | None, int]] = {}
    for rel, path in payload_files(directory):
        size = path.stat().st_size
        want = manifest["files"].get(rel)
        # Hash only files whose size matches: a wrong size is already a mismatch.
        actual[rel] = (sha256_file(path) if want is not None and want["size"] == size else None, size)
    problems = compare(manifest["files"], actual)
    if problems:
        raise ManifestMismatchError(
            str(directory), problems, "The payload was changed after it was written; rebuild it (rerun its rule)."
        )


def manifested_root(fs: fsspec.AbstractFileSystem, uri: str) -> tuple[str, str]:
    """(root, relpath): the nearest directory at or above `uri` that holds a manifest."""
    if not storage.is_s3(uri) and not Path(uri).is_absolute():
        raise ManifestError(f"input URI {uri!r} is relative; launch documents carry absolute paths or s3:// URIs")
    scheme = storage.S3 if storage.is_s3(uri) else ""
    parts = PurePosixPath(uri.removeprefix(scheme).rstrip("/")).parts
    # An S3 root stops at the bucket; a local one at "/".
    floor = 1 if scheme else 0
    for n in range(len(parts), floor, -1):
        root = scheme + str(PurePosixPath(*parts[:n]))
        if fs.isfile(storage.join(root, MANIFEST).removeprefix(scheme)):
            return root, "/".join(parts[n:])
    raise ManifestError(
        f"no {MANIFEST} at or above {uri}: it is not inside a manifested artifact (or writing it did not finish). "
        "Run the rule that makes it; launch documents must point into stage/model or stage/data."
    )


def _cache_path(cache_dir: Path, root: str) -> Path:
    """Where the copy of a manifested root lives: one folder per storage location, readable by a person."""
    if storage.is_s3(root):
        return cache_dir / "s3" / root.removeprefix(storage.S3)
    return cache_dir / "local" / root.lstrip("/")


def _stream(fs: fsspec.AbstractFileSystem, path: str, out: Path | None = None) -> tuple[str, int]:
    """sha256 and size of a stored file, read once; copied to `out` on the way when given."""
    digest, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as src, out.open("wb") if out else nullcontext() as sink:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if sink is not None:
                sink.write(chunk)
    return digest.hexdigest(), size


def _download_verified(fs: fsspec.AbstractFileSystem, root: str, files: Mapping[str, Any], dest: Path) -> None:
    """Copy every manifest file of `root` into `dest`, hashing as it streams; raise listing all problems."""
    base = root.removeprefix(storage.S3)
    listed = {}
    for path, info in fs.find(base, detail=True).items():
        rel = PurePosixPath(path).relative_to(PurePosixPath(base)).as_posix()
        if rel not in UNMANIFESTED:
            listed[rel] = int(info.get("size") or 0)
    actual: dict[str, tuple[str | None, int]] = {}
    for rel, size in listed.items():
        if rel not in files or size != files[rel]["size"]:
            actual[rel] = (None, size)
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        actual[rel] = _stream(fs, f"{base}/{rel}", target)
    problems = compare(files, actual)
    if problems:
        raise ManifestMismatchError(
            root,
            problems,
            "Storage was changed after the artifact was written (or writing was interrupted); rebuild it by "
            "rerunning its rule (with a new version if this one is fixed). Nothing was materialised.",
        )


def subtree(files: Mapping[str, Any], folder: str) -> dict[str, Any]:
    """The manifest entries under `folder`, relative to it."""
    prefix = folder.rstrip("/") + "/"
    return {rel.removeprefix(prefix): entry for rel, entry in files.items() if rel.startswith(prefix)}


def read_manifest(root: str) -> dict[str, Any]:
    """The manifest of the stored directory `root`; ManifestError when it has none."""
    uri = storage.join(root, MANIFEST)
    text = storage.read_text(uri)
    if text is None:
        raise ManifestError(
            f"{root} has no {MANIFEST}, so it is not a complete artifact (writing it did not finish); "
            "rerun the rule that makes it."
        )
    return parse_manifest(text, uri)


def fetch_verified(root: str, files: Mapping[str, Any], dest: Path) -> Path:
    """Copy the stored folder `root` to the new local folder `dest`, checking it holds exactly `files`.

    For a part of a manifested artifact (the HF folder of a checkpoint): pass `subtree(manifest, part)`.
    """
    fs, _ = storage.filesystem(root)
    dest.mkdir(parents=True, exist_ok=False)
    _download_verified(fs, root, files, dest)
    return dest


def verify_stored(root: str, files: Mapping[str, Any]) -> None:
    """Check the given manifest entries of the stored folder `root` by reading each once (nothing is listed, so
    ranks can split one folder's files between them); raise listing every problem."""
    fs, base = storage.filesystem(root)
    actual: dict[str, tuple[str | None, int]] = {}
    for rel in sorted(files):
        try:
            actual[rel] = _stream(fs, f"{base.rstrip('/')}/{rel}")
        except FileNotFoundError:
            continue
    problems = compare(files, actual)
    if problems:
        raise ManifestMismatchError(
            root, problems, "Storage was changed after the checkpoint was written; resume from another checkpoint."
        )


def materialise(uri: str, dest: Path) -> Path:
    """Copy the manifested directory holding `uri` under the cache folder `dest`, verified; return the local `uri`.

    The copy lives at `dest/s3/<bucket>/<key>` or `dest/local/<path>` so one cache serves every input.
    A cached copy is reused only if it verifies against the manifest in storage; otherwise this raises
    ManifestMismatchError naming the files (delete the cached copy to fetch it again).
    """
    fs, _ = storage.filesystem(uri)
    root, rel = manifested_root(fs, uri)
    manifest_text = storage.read_text(storage.join(root, MANIFEST)) or ""
    manifest = parse_manifest(manifest_text, storage.join(root, MANIFEST))
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
        raise ManifestError(f"{uri}: {rel!r} is not a file of the manifested directory {root}")
    return local


def verify_local(path: Path) -> Path:
    """Verify the manifested directory holding the local `path` (a file in it, or the directory); return its root.

    For stages that get their inputs as local files (Snakemake already copied them from storage): the same
    check materialise does, without copying.
    """
    path = Path(path).resolve()
    fs, _ = storage.filesystem(str(path))
    root, _ = manifested_root(fs, str(path))
    verify_manifest(Path(root))
    return Path(root)


def materialise_inputs(launch: LaunchDocument, cache_dir: Path) -> dict[str, Any]:
    """Materialise the model and data of a launch document; return their local paths.

    Returns {"model": Path, "train_data": [Path], "validation_data": [Path]}.
    """
    inputs = launch.inputs
    return {
        "model": materialise(inputs.model.uri, cache_dir),
        "train_data": [materialise(entry.uri, cache_dir) for entry in inputs.train_data],
        "validation_data": [materialise(entry.uri, cache_dir) for entry in inputs.validation_data],
    }
