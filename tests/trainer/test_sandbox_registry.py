"""The sandbox providers' shape (trainer/sandbox/registry.py): a provider registered under a name is what a recipe
naming it gets, the trainer's registry and the plan's declarations (rlbuild/contracts/recipe.py
`SANDBOX_PROVIDERS`) hold the same names, and no module outside the provider packages, the registry and the
declarations names a provider."""

from __future__ import annotations

import re
import shutil
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rlbuild.contracts.recipe import SANDBOX_PROVIDERS, SandboxBackend, SandboxSection
from trainer.sandbox import CommandResult, SandboxError, SandboxTimings, registry
from trainer.sandbox.base import Provider
from trainer.sandbox.pool import SandboxPool

REPO = Path(__file__).resolve().parents[2]


class EchoSandbox:
    """A sandbox that answers each command with its text and the files of its folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.timings = SandboxTimings()
        self.ended = False
        self.resets = 0

    def run(self, command: str) -> CommandResult:
        files = sorted(p.relative_to(self.folder).as_posix() for p in self.folder.rglob("*") if p.is_file())
        return CommandResult(f"{command} {files}", 0, 0.0)

    def reset(self) -> None:
        self.resets += 1
        for path in self.folder.iterdir():
            path.unlink()

    def load(self, files: Mapping[str, str | bytes]) -> None:
        for name in files:
            (self.folder / name).write_text("loaded")

    def close(self) -> None:
        self.ended = True
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> EchoSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EchoProvider(Provider):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.started: list[EchoSandbox] = []

    def start(self, spec: SandboxSection, folder: Path) -> EchoSandbox:
        self.started.append(EchoSandbox(folder))
        return self.started[-1]

    def task_environment(self, spec: SandboxSection, keywords: dict[str, Any]) -> Any:
        raise SandboxError("the echo provider runs no Harbor task")


def test_a_provider_registered_from_a_test_is_what_its_name_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    echo = EchoProvider("echo")
    monkeypatch.setitem(registry.PROVIDERS, "echo", echo)
    spec = SandboxSection().model_copy(update={"backend": "echo"})  # the schema knows only the declared names
    sandbox = registry.open_sandbox(spec, {"k1": "key", "sub/k2": b"key"})
    assert sandbox is echo.started[0]
    assert sandbox.run("ls").output == "ls ['k1', 'sub/k2']"
    # The pool an episode player keeps reaches the provider through the registry too, and lends its sandbox again.
    with SandboxPool(spec) as pool:
        with pool.acquire({"k1": "key"}) as lent:
            assert lent.run("ls").output == "ls ['k1']"
        with pool.acquire({"k3": "key"}) as again:
            assert again.run("ls").output == "ls ['k3']"
            assert len(echo.started) == 2 and echo.started[1].resets == 1


def test_a_name_without_a_provider_is_refused_with_the_names_known() -> None:
    spec = SandboxSection().model_copy(update={"backend": "echo"})
    with pytest.raises(SandboxError, match=r"environment.sandbox.backend 'echo' has no provider.*'local', 'daytona'"):
        registry.open_sandbox(spec, {})


def test_a_provider_of_harbor_tasks_only_refuses_an_episode_of_files() -> None:
    """What a recipe naming a Harbor environment's backend got for an environment that is not a Harbor task: a
    KeyError before providers were packages, a sentence now."""
    harbor_backends = [name for name, declared in SANDBOX_PROVIDERS.items() if declared.harbor_type is not None]
    assert harbor_backends
    for name in harbor_backends:
        with pytest.raises(SandboxError, match=rf"backend '{name}' starts sandboxes for Harbor tasks only"):
            registry.open_sandbox(SandboxSection(backend=name), {"k1": "key"})


def test_every_declared_backend_has_one_provider_and_the_schema_takes_each() -> None:
    assert list(registry.PROVIDERS) == list(SANDBOX_PROVIDERS) == list(typing.get_args(SandboxBackend))
    assert all(provider.name == name for name, provider in registry.PROVIDERS.items())


# Where a provider may be named: its packages and the registry, the declarations the plan reads, and the stand-in
# of Daytona's API that the daytona backend's tests run against.
NAMING_ALLOWED = ("trainer/sandbox/", "rlbuild/contracts/recipe.py", "rlbuild/dev/daytona.py")
# Docker also names an image format and its tools, which are not the provider.
DOCKER_THE_IMAGE = r"(?!://|-compose| buildx)"


def _naming(name: str) -> re.Pattern[str]:
    """How a module names a provider: its name as a word, or, for a name that is an ordinary word (local), beside
    `backend` (`backend == "local"` too)."""
    if name == "local":
        return re.compile(r"\blocal\W{0,3}(sandbox )?backend\b|\bbackend\W{1,5}local\b")
    return re.compile(rf"\b{re.escape(name)}\b{DOCKER_THE_IMAGE if name == 'docker' else ''}", re.IGNORECASE)


def test_no_module_outside_the_provider_packages_and_the_registries_names_a_provider() -> None:
    code = [p for folder in ("rlbuild", "trainer", "plugins") for p in sorted((REPO / folder).rglob("*.py"))]
    code += [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
    found = [
        f"{relative}:{number}: {line.strip()}"
        for path in code
        if not (relative := path.relative_to(REPO).as_posix()).startswith(NAMING_ALLOWED)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(_naming(name).search(line) for name in SANDBOX_PROVIDERS)
    ]
    assert found == []
    # The patterns find what they are for: a comparison, a docstring, and Docker the image left alone.
    assert _naming("local").search('if sandbox.backend == "local":')
    assert _naming("daytona").search("started on Daytona's API")
    assert not _naming("docker").search("docker://name@sha256:")
