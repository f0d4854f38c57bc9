"""The base_model stage: the tiny warm-started model, built by the trainer's command line, and its cache.

The build is deterministic: the same code, seed and CPU give the same bits (trainer/tiny.py pins the numerics).
So a folder named by the digest of what builds it (the runtime's source digest, which covers trainer/tiny.py, the
architecture files and uv.lock's packages, plus the variant, the seed and the CPU) holds a copy that any later
build of that key may take instead of ~20 s of warm start. The cache is opt-in ($RLBUILD_BASE_MODEL_CACHE names
its folder): the test suite sets it once a session, so every graph it runs reuses one build per (source, variant,
seed).
"""

from __future__ import annotations

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
    `build` (an exit code) and then kept there. The kept copy appears whole or not at all (a rename), so a build
    killed midway, or two builds at once, never leave a partial model to be copied."""
    kept = folder / cache_key(seed, variant) if folder is not None else None
    if kept is not None and kept.is_dir():
        shutil.copytree(kept, out, dirs_exist_ok=True)
        return 0
    code = build(out)
    if code != 0 or kept is None:
        return code
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{kept.name}.partial-", dir=kept.parent))
    except OSError as error:  # a cache that cannot be written costs the next build its copy, not this build
        print(f"rlbuild: base model built, not kept in ${CACHE_ENV} ({error}); fix or unset it", file=sys.stderr)
        return 0
    shutil.copytree(out, partial, dirs_exist_ok=True)
    try:
        partial.rename(kept)
    except OSError:  # another build of the same key was kept first: the same bits
        shutil.rmtree(partial, ignore_errors=True)
    return 0
