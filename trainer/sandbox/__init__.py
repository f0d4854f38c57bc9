"""The sandbox seam: where an agent episode's commands run. A model's actions are untrusted input, so each episode
gets a sandbox of its own, opened with the episode's files and closed (processes and folder gone) at its end, or
lent by a pool (trainer/sandbox/pool.py) that resets a sandbox between episodes to what a fresh one would be.

Each provider is a package behind one interface (trainer/sandbox/base.py `Provider`), found by the recipe's
`environment.sandbox.backend` in trainer/sandbox/registry.py (`open_sandbox`), the only place that maps a name to a
package; a Harbor task's sandbox (trainer/sandbox/task.py) drives any provider's Harbor environment."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Protocol, Self

from trainer.errors import TrainerError


class SandboxError(TrainerError):
    """A sandbox that cannot be set up (no bwrap, no user namespaces, a bad file path); an action that fails inside
    a sandbox is not one: its observation says what happened."""


@dataclass(frozen=True)
class CommandResult:
    output: str  # stdout and stderr interleaved, as the command wrote them, cut to max_output_bytes
    exit_code: int | None  # None: the command did not finish
    seconds: float
    note: str = ""  # a sentence for the observation when something other than a plain finish happened
    ended: bool = False  # the sandbox is gone: the episode must end


# What a compacted observation may hold: printable ASCII, whitespace as single spaces.
PRINTABLE = frozenset(string.printable) - frozenset(string.whitespace) | {" "}


def compact_output(text: str, reserved: str = "") -> str:
    """A command's output for a small model's context: whitespace collapsed to single spaces, and characters that
    are not printable or that the episode's format reserves (a turn stop) shown as `?`, so they only ever mean
    what the format says."""
    shown = PRINTABLE - frozenset(reserved)
    return "".join(c if c in shown else "?" for c in " ".join(text.split()))


@dataclass
class SandboxTimings:
    start_s: float = 0.0  # opening, until the shell answers
    commands: int = 0
    command_s: float = 0.0  # all commands together: what the episode's time limit counts


class ClosedOnExit:
    """`with` closes it: the context-manager half every sandbox and pool shares."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


class Sandbox(Protocol):
    timings: SandboxTimings

    def run(self, command: str) -> CommandResult: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None: ...


def write_files(folder: Path, files: Mapping[str, str | bytes]) -> None:
    """Write an episode's files into its folder; every name is checked before the first is written, so a refused
    name leaves the folder as it was."""
    paths = {folder / _relative(name): content for name, content in files.items()}
    for path, content in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def _relative(name: str) -> PurePosixPath:
    """An episode's file may land only inside its own folder."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise SandboxError(f"sandbox file {name!r}: give a path relative to the episode's working folder, without '..'")
    return path
