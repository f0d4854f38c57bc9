"""Artifact storage: local paths and `s3://` URIs through one fsspec layer, with whole-object writes.

Every part (the rules' subcommands, the trainer, the gang bootstrap) reads and writes storage through these
functions. A write is atomic: readers see the old object or the whole new one (a local file is written under a
temporary name and renamed, an S3 object is one PUT). Files are created readable by the group and others as the
process umask allows, like any other file the user writes.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import fsspec

from rlbuild.errors import RlbuildError

S3 = "s3://"


class StorageError(RlbuildError):
    """A storage location that cannot be used as given."""


def is_s3(uri: str) -> bool:
    return uri.startswith(S3)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path within it) for a local path or an `s3://` URI (settings: `fsspec_options`)."""
    if not is_s3(uri):
        if "://" in uri:
            raise StorageError(f"storage URI {uri!r}: only local paths and s3:// URIs are supported")
        return fsspec.filesystem("file"), uri
    return fsspec.filesystem("s3", **fsspec_options(uri)), uri.removeprefix(S3)


def fsspec_options(uri: str) -> dict[str, Any]:
    """The fsspec settings for `uri`, for libraries that open storage themselves (torch.distributed.checkpoint).

    S3 settings come from the variables the Snakemake S3 storage plugin reads
    (SNAKEMAKE_STORAGE_S3_{ENDPOINT_URL,ACCESS_KEY,SECRET_KEY,TOKEN,REGION}), so jobs reach the same store as
    Snakemake; unset ones fall back to boto's AWS_* chain.
    """
    if not is_s3(uri):
        return {}
    env = os.environ
    client_kwargs = {}
    if env.get("SNAKEMAKE_STORAGE_S3_REGION"):
        client_kwargs["region_name"] = env["SNAKEMAKE_STORAGE_S3_REGION"]
    # No listing or instance cache: a verification must see storage as it is now.
    return {
        "endpoint_url": env.get("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL") or None,
        "key": env.get("SNAKEMAKE_STORAGE_S3_ACCESS_KEY") or None,
        "secret": env.get("SNAKEMAKE_STORAGE_S3_SECRET_KEY") or None,
        "token": env.get("SNAKEMAKE_STORAGE_S3_TOKEN") or None,
        "client_kwargs": client_kwargs,
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }


def join(root: str, *parts: str) -> str:
    """`root/part/...` for a local path or URI; empty parts are skipped."""
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts if p)])


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return bool(fs.exists(path))


def read_text(uri: str) -> str | None:
    """The whole object as text; None when it does not exist."""
    fs, path = filesystem(uri)
    try:
        with fs.open(path, "r", encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_json(uri: str) -> Any:
    """A JSON document; None when it does not exist."""
    text = read_text(uri)
    return None if text is None else json.loads(text)


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object atomically: local files under a temporary name, then renamed; S3 in one PUT."""
    if is_s3(uri):
        fs, path = filesystem(uri)
        fs.pipe_file(path, data)
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    # os.open with 0o666 honours the umask, unlike mkstemp's 0o600.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str, value: Any) -> None:
    write_text(uri, json.dumps(value, indent=2, sort_keys=True) + "\n")


def put_dir(local: Path, uri: str) -> None:
    """Copy the contents of a local folder to `uri`, replacing what is there."""
    if is_s3(uri):
        fs, path = filesystem(uri)
        if fs.exists(path):
            fs.rm(path, recursive=True)
        fs.put(f"{str(local).rstrip('/')}/", path.rstrip("/") + "/", recursive=True)
        return
    target = Path(uri)
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(local, target)


def get_dir(uri: str, local: Path) -> Path:
    """A local copy of a stored folder (the folder itself when it is already local)."""
    if not is_s3(uri):
        return Path(uri)
    fs, path = filesystem(uri)
    fs.get(path.rstrip("/") + "/", f"{str(local).rstrip('/')}/", recursive=True)
    return local


def remove(uri: str) -> None:
    fs, path = filesystem(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def list_names(uri: str) -> list[str]:
    """Names of the entries directly under `uri` (empty when it does not exist)."""
    fs, path = filesystem(uri)
    try:
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))
    except FileNotFoundError:
        return []
