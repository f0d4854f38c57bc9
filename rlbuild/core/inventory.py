"""What storage holds under one experiment root, learned in a bounded number of listings and asked many times.

A dry run, `rlbuild status` and `rlbuild check` ask of every version whether its records, outputs, checkpoints
and leases exist, and read the records. Asked object by object that is O(files x versions) round trips (4 s a
version on S3, issue 21); here it is one paginated listing per top-level folder of the root (`stage/`, `train/`,
...), all listed at once (concurrently) when the first is asked about, and every existence, size and mtime
question is answered from them. `tmp/` (checkpoints, attempts and metrics segments: many objects a run) is never
listed whole: a question about it walks its first levels with one delimiter listing per folder, shared by every
version.

Reads of what a listing shows are made concurrently (`storage.read_many`), and on S3 remembered on this machine
by the object's ETag (`cache_dir()`): a later run reads an unchanged record from there, the same bytes, and
fetches only what changed. What the listing does not show is absent, without a request; `changed` asks storage
again, for the moment a run is about to act on what it planned (a record written after the listing).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from rlbuild.core import storage
from rlbuild.core.storage import StoredObject

DEEP_FOLDERS = frozenset({"tmp"})  # folders walked level by level, never listed whole
# Snakemake's own bookkeeping (locally its working directory is the experiment root): no question of rlbuild's is
# about it, and it grows with every run, so the first question does not list it with the others.
NOT_LISTED_AHEAD = frozenset({".snakemake"})
DEEP_LEVELS = 4  # tmp/ttl=<N>d/train/v<version>: the levels every version shares


def cache_dir() -> Path:
    """Where record contents are remembered by ETag: RLBUILD_CACHE_DIR, else $XDG_CACHE_HOME/rlbuild, else
    ~/.cache/rlbuild."""
    if os.environ.get("RLBUILD_CACHE_DIR"):
        return Path(os.environ["RLBUILD_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlbuild"


class Inventory:
    """The objects under `root` (a local folder or `s3://` URI), one listing per top-level folder, thread-safe."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._folders: dict[str, dict[str, StoredObject]] = {}
        self._listed_all = False  # every top-level folder listed (the first `folder` call lists them at once)
        self._listing = threading.Lock()  # held while they are listed: one listing of each, whoever asks first
        self._ahead: Future[None] | None = None  # the background listing `list_ahead` started
        self._children: dict[str, set[str]] = {}
        self._texts: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def _parts(self, uri: str) -> list[str] | None:
        """`uri`'s path below the root, or None when it lies elsewhere."""
        if not uri.startswith(f"{self.root}/"):
            return None
        return [p for p in uri[len(self.root) + 1 :].split("/") if p]

    def list_ahead(self) -> None:
        """Start listing every top-level folder in the background (`folder` waits for it when first asked): a dry
        run parses its rules meanwhile, and the listing's round trips cost it no wall time. A daemon thread: a
        command that never asks does not wait for storage at exit."""
        with self._lock:
            if self._ahead is not None or self._listed_all:
                return
            self._ahead = ahead = Future()

        def run() -> None:
            try:
                self._list_all()
            except BaseException as error:  # handed to whoever asks first
                ahead.set_exception(error)
            else:
                ahead.set_result(None)

        threading.Thread(target=run, name="rlbuild-inventory", daemon=True).start()

    def folder(self, name: str) -> dict[str, StoredObject]:
        """Every object under the top-level folder `name`, listed once. The first call lists every top-level
        folder the root holds, concurrently (a dry run, status and check ask about each of them: one round trip
        instead of one per folder); a name the root does not hold is empty without a request."""
        if self._ahead is not None:
            self._ahead.result()  # a failed listing fails the question, as it would have unprefetched
        self._list_all()
        held = self.children(self.root)
        with self._lock:
            if name not in self._folders:
                self._folders[name] = storage.list_tree(storage.join(self.root, name)) if name in held else {}
            return self._folders[name]

    def _list_all(self) -> None:
        with self._listing:
            if self._listed_all:
                return
            names = sorted(self.children(self.root) - DEEP_FOLDERS - NOT_LISTED_AHEAD)
            with ThreadPoolExecutor(max_workers=max(1, min(len(names), storage.READ_WORKERS))) as pool:
                uris = [storage.join(self.root, n) for n in names]
                listed = dict(zip(names, pool.map(storage.list_tree, uris), strict=True))
            with self._lock:
                self._folders.update(listed)
                self._listed_all = True

    def children(self, uri: str) -> set[str]:
        """Names directly under the folder `uri`, listed once."""
        with self._lock:
            if uri not in self._children:
                self._children[uri] = storage.list_children(uri)
            return self._children[uri]

    def top_folder(self, uri: str) -> str | None:
        """The top-level folder of the root that holds `uri` and is listed whole; None for any other URI. (Asked
        of every object Snakemake looks at in a dry run: the first part only, not the whole path split.)"""
        if not uri.startswith(f"{self.root}/"):
            return None
        name = uri[len(self.root) + 1 :].lstrip("/").split("/", 1)[0]
        return f"{self.root}/{name}" if name and name not in DEEP_FOLDERS else None

    def listed(self, uri: str) -> bool:
        """Whether the listings answer for `uri` (it lies under the root, in a folder that is listed whole)."""
        return self.top_folder(uri) is not None

    def top_folders(self) -> list[str]:
        """Every top-level folder of the root that is listed whole (one delimiter listing of the root)."""
        return [storage.join(self.root, name) for name in sorted(self.children(self.root) - DEEP_FOLDERS)]

    def get(self, uri: str) -> StoredObject | None:
        """The object at `uri` as listed; None when the listing shows none (ask `listed` first)."""
        parts = self._parts(uri)
        return self.folder(parts[0]).get(uri) if parts else None

    def under(self, uri: str) -> list[StoredObject]:
        """The objects inside the folder `uri` as listed."""
        parts = self._parts(uri)
        prefix = uri.rstrip("/") + "/"
        return [o for key, o in self.folder(parts[0]).items() if key.startswith(prefix)] if parts else []

    def may_exist(self, uri: str) -> bool:
        """False only when a listing shows nothing at or under `uri`; True where no listing answers for it."""
        parts = self._parts(uri)
        if not parts:
            return True
        if parts[0] not in DEEP_FOLDERS:
            return self.get(uri) is not None or bool(self.under(uri))
        folder = self.root
        for part in parts[:DEEP_LEVELS]:
            if part not in self.children(folder):
                return False
            folder = storage.join(folder, part)
        return True

    def read_texts(self, uris: list[str]) -> dict[str, str | None]:
        """The content of each object (None: absent), read at once: what the listings show absent without a
        request, the rest from this machine's ETag cache or storage (concurrently); outside the listings, asked."""
        wanted = [u for u in dict.fromkeys(uris) if u not in self._texts]
        fetch: list[str] = []
        for uri in wanted:
            if not self.listed(uri):
                fetch.append(uri)
            elif (found := self.get(uri)) is None:
                self._texts[uri] = None
            elif (text := _remembered(found)) is not None:
                self._texts[uri] = text
            else:
                fetch.append(uri)
        for uri, read in storage.read_many(fetch).items():
            self._texts[uri] = None if read is None else read[0]
            if read is not None and storage.is_s3(uri):
                _remember(uri, *read)
        return {uri: self._texts[uri] for uri in uris}

    def read_text(self, uri: str) -> str | None:
        return self.read_texts([uri])[uri]

    def changed(self, uri: str) -> bool:
        """Whether the object at `uri` differs now from what this inventory answered (written, replaced or
        deleted since the listing): asked of storage, one request."""
        if not self.listed(uri):
            return False
        before, now = self.get(uri), storage.stat(uri)
        return (before is None) != (now is None) or (before is not None and now is not None and before.tag != now.tag)


def _cache_path(uri: str, tag: str) -> Path:
    return cache_dir() / "objects" / hashlib.sha256(f"{uri}\0{tag}".encode()).hexdigest()


def _remembered(found: StoredObject) -> str | None:
    if not storage.is_s3(found.uri):
        return None  # a local read costs what the cache would
    try:
        return _cache_path(found.uri, found.tag).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _remember(uri: str, text: str, tag: str) -> None:
    """Keep `text` as the content of `uri` at ETag `tag`; a plain ETag is the MD5 of the bytes, and must match."""
    etag = tag.strip('"')
    if "-" not in etag and len(etag) == 32 and hashlib.md5(text.encode()).hexdigest() != etag:
        return
    with contextlib.suppress(OSError):  # an unwritable cache only costs the next run a read
        storage.write_text(str(_cache_path(uri, tag)), text)
