"""The base_model stage: the tiny warm-started model, built by the trainer's command line, and its cache.

The build is deterministic: the same code, seed and CPU give the same bits (trainer/tiny.py pins the numerics).
So a folder named by the digest of what builds it (the runtime's source digest, which covers trainer/tiny.py, the
architecture files and uv.lock's packages, plus the variant, the seed and the CPU) holds a copy that any later
build of that key may take instead of ~20 s of warm start. The cache is opt-in ($RLBUILD_BASE_MODEL_CACHE names
its folder): the test suite sets it once a session, so every graph it runs reuses one build per (source, variant,
seed).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

from rlbuild.contracts.runtime import source_digest

CACHE_ENV = "RLBUILD_BASE_MODEL_CACHE"


@cache
def _cpu() -> str:
    """The CPU model: Intel and AMD boxes build different bits even with pinned numerics (trainer/tiny.py)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cache_key(seed: int, variant: str) -> str:
    """What builds the base model `variant` of `seed` on this machine, as one digest."""
    parts = [source_digest(), variant, str(seed), platform.machine(), _cpu()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cache_folder() -> Path | None:
    folder = os.environ.get(CACHE_ENV)
    return Path(folder) if folder else None


def build_or_copy(out: Path, seed: int, variant: str, build: Callable[[Path], int], folder: Path | None) -> int:
    """Make the base model `variant` of `seed` in `out`: copied from `folder`'s build of the same key, or built by
    `build` (an exit code) and then kept there. Builds of one key take turns (a lock file beside the kept copy), so
    two graphs or tests that want the same model at once build it once (the agent variant's warm start takes
    minutes); the kept copy appears whole or not at all (a rename), so a build killed midway never leaves a partial
    model to be copied."""
    if folder is None:
        return build(out)
    kept = folder / cache_key(seed, variant)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = (folder / f".{kept.name}.lock").open("a")
    except OSError as error:  # a cache that cannot be written costs this build its copy, not the build
        said = f"the base model is built but not kept in ${CACHE_ENV} ({folder}: {error}); fix or unset it"
        print(f"rlbuild: {said}", file=sys.stderr)
        return build(out)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or with the process
        if kept.is_dir():
            shutil.copytree(kept, out, dirs_exist_ok=True)
            return 0
        code = build(out)
        if code == 0:
            partial = Path(tempfile.mkdtemp(prefix=f".{kept.name}.partial-", dir=folder))
            shutil.copytree(out, partial, dirs_exist_ok=True)
            partial.rename(kept)
        return code
