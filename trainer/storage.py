"""Storage adapter: local paths and s3:// URIs through fsspec, plus the calls into rlbuild the trainer needs.

`materialise` comes from rlbuild.staging (verified copies of staged inputs) and `runtime_source_digest` from
rlbuild.identity; everything else the trainer stores (checkpoints, metrics, terminal.json, exports) goes
through `filesystem` here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import fsspec

from rlbuild import identity, staging


def filesystem(uri: str) -> fsspec.AbstractFileSystem:
    """fsspec for a local path or s3:// URI, reaching the same store as Snakemake (see rlbuild.staging)."""
    return staging.filesystem(uri)[0]


def materialise(uri: str, cache_dir: Path) -> Path:
    """A verified local copy of a staged input (file or directory) under `cache_dir`."""
    return staging.materialise(uri, Path(cache_dir))


def runtime_source_digest() -> str:
    """The digest of the code that is running now: what checkpoints are stamped with and compared against."""
    return identity.runtime_source_digest()


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def exists(uri: str) -> bool:
    return filesystem(uri).exists(uri)


def read_text(uri: str) -> str | None:
    fs = filesystem(uri)
    if not fs.exists(uri):
        return None
    with fs.open(uri, "r") as f:
        return f.read()


def write_text(uri: str, text: str) -> None:
    """Whole-file write; atomic on local paths (rename), a single PUT on S3."""
    if uri.startswith("s3://"):
        with filesystem(uri).open(uri, "w") as f:
            f.write(text)
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def put_dir(local: Path, uri: str) -> None:
    """Copy the contents of a local folder to `uri` (replacing what is there)."""
    if uri.startswith("s3://"):
        fs = filesystem(uri)
        if fs.exists(uri):
            fs.rm(uri, recursive=True)
        fs.put(f"{str(local).rstrip('/')}/", uri.rstrip("/") + "/", recursive=True)
        return
    target = Path(uri)
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(local, target)


def get_dir(uri: str, local: Path) -> Path:
    """A local copy of a stored folder (the folder itself when it is already local)."""
    if not uri.startswith("s3://"):
        return Path(uri)
    filesystem(uri).get(uri.rstrip("/") + "/", f"{str(local).rstrip('/')}/", recursive=True)
    return local


def remove(uri: str) -> None:
    fs = filesystem(uri)
    if fs.exists(uri):
        fs.rm(uri, recursive=True)


def list_dirs(uri: str) -> list[str]:
    """Names of the entries directly under `uri` (empty when it does not exist)."""
    fs = filesystem(uri)
    if not fs.exists(uri):
        return []
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(uri, detail=False)]
