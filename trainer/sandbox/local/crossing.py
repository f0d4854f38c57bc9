"""Copies across a sandbox's boundary that nothing inside can redirect: the host's own files into a folder the
sandbox writes (a bind's host side), and the sandbox's files out of one.

The sandbox controls every name under a bind, while it runs and between two copies: any of them may be a link, a
folder swapped for a link, or a hard link to another of its files. So a path under a bind is never resolved by
the kernel in one go: each component is opened from the bind's root with `openat` and O_NOFOLLOW (a link there
fails to open instead of being followed), and a file is written only as a new inode (O_CREAT|O_EXCL after
removing what the sandbox left at its name), so a link, a hard link or a file the sandbox still holds open never
receives the host's bytes. The bind's root is the host's (a folder of the trial's, which the sandbox cannot name).

Into a sandbox, what the sandbox put on the way is the sandbox's own state and is replaced; out of one, a link or
anything but a folder or a regular file is refused (`CrossingError`, naming it), as nothing the host copies may
come from outside the sandbox. Hard links cannot reach the host: link(2) never crosses mount points, and every
bind, like the read-only /usr, is a mount point of its own, so a hard link inside names a file of the same bind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from trainer.sandbox import SandboxError
from trainer.sandbox.local.reachable import SANDBOX_UID, changes_user

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO the sandbox left opens at once (and is refused by its type) instead of waiting for a writer.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LINKED = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)  # what opening a link with O_NOFOLLOW answers
CHUNK = 1 << 20


class CrossingError(SandboxError):
    """A copy out of a sandbox met a link or a special file where the host reads: the sandbox's own doing."""


def copy_in(source: Path, root: Path, inside: PurePosixPath, *, into: bool = False, fresh: bool = False) -> None:
    """Copy the host's `source` (a file, or a folder's contents) to `inside` (relative to the bind whose host side
    is `root`), as Docker's COPY does: a file to `inside`, or into it when `into` or it is a folder. `fresh`: the
    folder `inside` is emptied first, so it holds the source's files alone, never one the sandbox left."""
    _refuse_link(source)
    with _root(root) as top, _folder_in(top, inside.parts[:-1], create=True) as parent:
        name = inside.name
        here = (name,) if name else ()  # no name: the bind's root itself
        if source.is_dir():
            with _folder_in(parent, here, create=True) as folder:
                if fresh:
                    for entry in os.listdir(folder):
                        _remove(folder, entry)
                _put_tree(source, folder)
        elif into or not name or _lstat(parent, name, stat.S_ISDIR):
            with _folder_in(parent, here, create=True) as folder:
                _put_file(source, folder, source.name)
        else:
            _put_file(source, parent, name)


def copy_out(root: Path, inside: PurePosixPath, target: Path, shown: str) -> None:
    """Copy the sandbox's file or folder at `inside` (relative to the bind whose host side is `root`; `shown`: its
    path in the sandbox, for messages) to the host path `target` (a folder's contents into the folder `target`); a
    link or special file on the way is refused, after the rest is copied."""
    refused: list[str] = []
    with _root(root) as top, _folder_in(top, inside.parts[:-1], create=False, shown=shown) as parent:
        _get(parent, inside.name or ".", target, PurePosixPath(shown), refused)
    if refused:
        raise CrossingError(
            f"the sandbox left {', '.join(refused[:5])}{' and more' if len(refused) > 5 else ''} where the host "
            "copies its results from: a link or special file is never followed out of a sandbox, so it was not "
            "copied; a verifier must write plain files"
        )


def _get(parent: int, name: str, target: Path, shown: PurePosixPath, refused: list[str]) -> None:
    try:
        fd = os.open(name, _READ, dir_fd=parent)
    except OSError as error:
        if error.errno in _LINKED:
            refused.append(f"{shown} (a link)")
            return
        if error.errno == errno.ENXIO:  # a socket
            refused.append(f"{shown} (not a regular file)")
            return
        raise
    with _closing(fd):
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            target.mkdir(parents=True, exist_ok=True)
            for entry in sorted(os.listdir(fd)):
                _get(fd, entry, target / entry, shown / entry, refused)
        elif stat.S_ISREG(mode):
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as out:
                while chunk := os.read(fd, CHUNK):
                    out.write(chunk)
        else:
            refused.append(f"{shown} (not a regular file)")


def _put_tree(source: Path, folder: int) -> None:
    for entry in sorted(source.iterdir()):
        _refuse_link(entry)
        if entry.is_dir():
            with _folder_in(folder, (entry.name,), create=True) as inner:
                _put_tree(entry, inner)
        else:
            _put_file(entry, folder, entry.name)


def _put_file(source: Path, folder: int, name: str) -> None:
    """Write `source` as a new file `name` of `folder`, whatever the sandbox left there removed first."""
    _refuse_link(source)
    with open(source, "rb") as data:
        _remove(folder, name)
        # O_EXCL: a name the sandbox filled again since the removal fails here rather than being written through.
        fd = os.open(name, _WRITE, os.fstat(data.fileno()).st_mode & 0o777, dir_fd=folder)  # no setuid, sticky
        with _closing(fd):
            while chunk := data.read(CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            _give(fd)


@contextlib.contextmanager
def _root(root: Path) -> Iterator[int]:
    with _closing(os.open(root, _FOLDER)) as fd:
        yield fd


@contextlib.contextmanager
def _folder_in(top: int, parts: tuple[str, ...], *, create: bool, shown: str = "") -> Iterator[int]:
    """The folder at `parts` under `top`, each component opened without following a link. `create`: a missing
    component is made and anything else there (a link, a file) replaced by a folder; else a link is refused."""
    fd = os.dup(top)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise SandboxError(f"{'/'.join(parts)!r}: a path into a sandbox names no '.' or '..'")
            try:
                inner = os.open(part, _FOLDER, dir_fd=fd)
            except OSError as error:
                if not create:
                    if error.errno in _LINKED:
                        raise CrossingError(
                            f"the sandbox made {part!r} (on the way to {shown}) a link or a file where the host "
                            "reads a folder: a link is never followed out of a sandbox, so nothing was copied"
                        ) from None
                    raise
                if error.errno != errno.ENOENT:
                    _remove(fd, part)
                os.mkdir(part, 0o755, dir_fd=fd)
                inner = os.open(part, _FOLDER, dir_fd=fd)
                _give(inner)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _remove(folder: int, name: str) -> None:
    """Remove what `name` is in `folder`, a link itself rather than what it names; nothing there is no error."""
    try:
        if _lstat(folder, name, stat.S_ISDIR):
            shutil.rmtree(name, dir_fd=folder)  # removes by file descriptors: a link inside is unlinked, not followed
        else:
            os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


def _lstat(folder: int, name: str, test: Callable[[int], bool]) -> bool:
    try:
        return test(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _refuse_link(path: Path) -> None:
    """The host's side of a copy in is task data, which is never a link (rows.py refuses them when staging)."""
    if path.is_symlink():
        raise SandboxError(f"{path} is a link: a task's files are copied into a sandbox only as files and folders")
    if not path.exists():
        raise SandboxError(f"{path} does not exist: nothing to copy into the sandbox")


def _give(fd: int) -> None:
    """A root trainer's sandbox runs as SANDBOX_UID, which must own what it is given (bubblewrap.hand_over)."""
    if changes_user():
        os.fchown(fd, SANDBOX_UID, SANDBOX_UID)
