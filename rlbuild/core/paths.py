"""What is wrong with a local path a person named (an experiment file, a `local:` source), as one sentence.

A path that is not there is one thing; a symlink loop, a link to nothing, a folder that cannot be listed, a file
that cannot be read and a FIFO, socket or device (reading one blocks or never ends) are others, and each is named
for what it is instead of surfacing as a traceback or a hang in whatever reads the path first.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Literal

Wanted = Literal["file", "folder", "file or folder"]
MAX_LISTED = 3  # problems named inside one folder; the rest are counted
_SPECIAL = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def path_problem(path: Path, wanted: Wanted = "file or folder") -> str | None:
    """Why `path` cannot be read as a `wanted`, as a sentence that starts after the path ("is a symlink loop");
    None when it can."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return _stat_failure(path, exc)
    kind = stat.S_IFMT(info.st_mode)
    if kind == stat.S_IFDIR:
        if wanted == "file":
            return "is a folder, not a file"
        return None if os.access(path, os.R_OK | os.X_OK) else "is a folder that cannot be listed (permission denied)"
    if kind != stat.S_IFREG:
        return f"is {_SPECIAL.get(kind, 'not a regular file')}, not a {wanted}"
    if wanted == "folder":
        return "is a file, not a folder"
    return None if os.access(path, os.R_OK) else "cannot be read (permission denied)"


def tree_problems(root: Path) -> list[str]:
    """Problems with the entries of the folder `root` (links to nothing, loops, unreadable or special files), as
    sentences naming each path relative to `root`: at most MAX_LISTED, then how many more there are."""
    found: list[str] = []

    def unlistable(exc: OSError) -> None:
        found.append(f"{_relative(Path(exc.filename or root), root)} cannot be listed ({exc.strerror})")

    for folder, subfolders, files in os.walk(root, onerror=unlistable):
        subfolders.sort()  # walked in name order: the same problems named first every time
        for name in sorted([*files, *(s for s in subfolders if os.path.islink(os.path.join(folder, s)))]):
            entry = Path(folder, name)
            problem = path_problem(entry)
            if problem is not None:
                found.append(f"{_relative(entry, root)} {problem}")
    if len(found) > MAX_LISTED:
        return [*found[:MAX_LISTED], f"and {len(found) - MAX_LISTED} more"]
    return found


def _stat_failure(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symlink loop (its links lead back to themselves)"
    if exc.errno in (errno.ENOENT, errno.ENOTDIR) and os.path.islink(path):
        return f"is a link to {os.readlink(path)}, which does not exist"
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return "does not exist"
    return f"cannot be read ({exc.strerror})"


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
