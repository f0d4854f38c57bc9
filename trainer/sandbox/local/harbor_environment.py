"""rlbuild's local sandbox as a Harbor environment: Harbor's task loader and verifier run a task on this node, in
bubblewrap (trainer/sandbox/local/bubblewrap.py), without building its image.

Harbor drives an environment through `start`, `exec`, `upload_*`, `download_*` and `stop` (harbor/environments/
base.py). This one lays the task's image out from what its Dockerfile says (rlbuild/contracts/rows.py
`local_image`: WORKDIR, COPY, ENV; the base image's programs are the host's) in host folders bound at those paths
in the sandbox, with Harbor's own places (/logs, /tests, /solution) beside them; uploads and downloads are copies
between host folders, since every writable path of the sandbox is one, made by crossing.py so that no link, hard
link or swapped folder the sandbox made redirects them, and only once every process an action or the verifier
left running is killed, so none races them; an upload to /tests or /solution replaces what the agent
left there, so the verifier runs the task's own tests. A task whose Dockerfile needs building is refused when the
environment is made (and, for the whole task set, by preflight before a run starts).

The sandbox's limits are the recipe's (`environment.sandbox`); the command's `user` is not honoured (one
unprivileged user runs everything, verifier included), nor a network: the sandbox has none.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from rlbuild.contracts.recipe import BUILDING_BACKENDS, SandboxSection
from rlbuild.contracts.rows import LocalImage, local_image
from trainer.sandbox import SandboxError
from trainer.sandbox.local.bubblewrap import LocalSandbox, hand_over
from trainer.sandbox.local.crossing import copy_in, copy_out

# Harbor's places in a sandbox (harbor/models/trial/paths.py EnvironmentPaths), besides the task's own.
HARBOR_PLACES = ("/logs", "/tests", "/solution")
# Where Harbor uploads the task's own files (its tests before the verifier runs): the agent may have written there.
TASK_PLACES = ("/tests", "/solution")
TIMED_OUT = 124  # what `timeout` answers: Harbor's callers read a command past its limit as this code
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BubblewrapEnvironment(BaseEnvironment):
    """A Harbor task's environment in rlbuild's local sandbox. Built by Harbor's callers' keywords plus
    `sandbox_spec` (the recipe's `environment.sandbox`)."""

    def __init__(self, *args: Any, sandbox_spec: SandboxSection, **kwargs: Any) -> None:
        self.spec = sandbox_spec
        self.sandbox: LocalSandbox | None = None
        super().__init__(*args, **kwargs)
        self.folder = Path(self.trial_paths.trial_dir) / "sandbox"

    @staticmethod
    def type() -> str:
        return "rlbuild-local"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        self.image = _image(Path(self.environment_dir).parent)

    async def start(self, force_build: bool) -> None:
        places = {_top(self.image.workdir), *(_top(dest) for _, dest in self.image.copies), *HARBOR_PLACES}
        binds = {place: self.folder / "root" / place.lstrip("/") for place in sorted(places)}
        for source in binds.values():
            source.mkdir(parents=True, exist_ok=True)
        self.binds = binds
        for source, destination in self.image.copies:
            root, inside = self._place(destination)
            copy_in(Path(self.environment_dir) / source, root, inside, into=destination.endswith("/"))
        root, inside = self._place(self.image.workdir)
        (root / inside).mkdir(parents=True, exist_ok=True)  # nothing runs in the sandbox yet
        for place in ("agent", "verifier", "artifacts"):  # Harbor's trials make these before an agent runs
            (binds["/logs"] / place).mkdir(exist_ok=True)
        (self.folder / "work").mkdir(exist_ok=True)
        hand_over(self.folder)
        self.sandbox = LocalSandbox(self.spec, self.folder / "work", binds=binds)
        exports = "".join(f"export {name}={_expandable(value)}; " for name, value in self.image.env.items())
        ready = self.sandbox.run(f"{exports}cd {shlex.quote(self.image.workdir)}")
        if ready.exit_code != 0:
            raise SandboxError(f"the task's environment did not set up: {ready.note or ready.output.strip()}")

    async def stop(self, delete: bool) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        if delete:
            shutil.rmtree(self.folder, ignore_errors=True)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if self.sandbox is None:
            raise SandboxError("exec before start: the environment has no sandbox yet")
        setup = [f"cd {shlex.quote(cwd)}"] if cwd else []
        setup += [f"export {name}={shlex.quote(value)}" for name, value in (env or {}).items() if _NAME.fullmatch(name)]
        # A subshell: the command's cwd and variables do not carry over, as in Harbor's other environments.
        line = f"( {' && '.join([*setup, 'true'])} && eval {shlex.quote(command)} )"
        result = self.sandbox.run(line, timeout_s=float(timeout_sec) if timeout_sec else None)
        code = result.exit_code if result.exit_code is not None else TIMED_OUT
        return ExecResult(stdout=result.output, stderr=result.note or None, return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        self._settle()
        copy_in(Path(source_path), *self._place(target_path))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        fresh = PurePosixPath(target_dir) in map(PurePosixPath, TASK_PLACES)
        self._settle()
        copy_in(Path(source_dir), *self._place(target_dir), fresh=fresh)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        self._settle()
        copy_out(*self._place(source_path), Path(target_path), source_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        self._settle()
        copy_out(*self._place(source_dir), Path(target_dir), source_dir)

    def _settle(self) -> None:
        """Before the host copies into or out of the sandbox (Harbor's verifier uploads tests/ first, so before the
        verifier runs, and downloads its results last): no process an action or the verifier left running is alive
        to change what the copy reads or writes, or what the verifier sees."""
        if self.sandbox is not None:
            self.sandbox.kill_others()

    def _place(self, path: str) -> tuple[Path, PurePosixPath]:
        """The bind a sandbox path lies in (its host side) and the path relative to it."""
        inside = PurePosixPath(path)
        for place, source in self.binds.items():
            if inside == PurePosixPath(place) or PurePosixPath(place) in inside.parents:
                relative = inside.relative_to(place)
                if ".." in relative.parts:
                    break
                return source, relative
        raise SandboxError(
            f"{path} is outside the sandbox's writable places ({', '.join(self.binds)}): the local backend cannot "
            "put files there"
        )


def _image(task: Path) -> LocalImage:
    image = local_image(task)
    if isinstance(image, str):
        raise SandboxError(
            f"Harbor task {task.name!r} cannot run on the local backend: {image}; run it on one of "
            f"{', '.join(BUILDING_BACKENDS)}"
        )
    if image.problems:
        raise SandboxError(f"Harbor task {task.name!r}: " + "; ".join(map(str, image.problems)))
    return image


def _top(path: str) -> str:
    parts = PurePosixPath(path).parts
    return "/" + parts[1] if len(parts) > 1 else "/"


def _expandable(value: str) -> str:
    """A Dockerfile ENV value as the shell's double-quoted word: `$PATH` in it expands, as Docker expands it."""
    return '"' + re.sub(r'(["\\`])', r"\\\1", value) + '"'
