"""Harbor task episodes on the `daytona` backend (trainer/sandbox/task.py `open_task_sandbox`), against a
recording stand-in of Daytona's API (rlbuild/dev/daytona.py; no Daytona account exists here): Harbor's
DaytonaEnvironment and the daytona SDK talk real HTTP to it, and the episode's commands run in rlbuild's bubblewrap
sandbox. The tests read what crossed: the calls in order, where the API key went, and that no AWS_*/R2_* value of
the trainer's environment was sent."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import uuid
import zlib
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlbuild.contracts.recipe import SandboxSection
from rlbuild.dev.daytona import Call, DaytonaStandIn, Ran, daytona_stand_in
from trainer.sandbox import CommandResult
from trainer.sandbox.local.bubblewrap import as_sandbox_user, bwrap_argv, hand_over

pytest.importorskip("harbor", reason="the harbor extra (scripts/setup.sh --extra harbor)")

from trainer.sandbox.task import open_task_sandbox

SPEC = SandboxSection(backend="daytona", command_timeout_s=10.0, memory_mb=1024)
# Values of the trainer's own credentials, fresh each run, so a match in a request can only be a leak.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": f"aws-id-{uuid.uuid4().hex}",
    "AWS_SECRET_ACCESS_KEY": f"aws-secret-{uuid.uuid4().hex}",
    "R2_ACCESS_KEY_ID": f"r2-id-{uuid.uuid4().hex}",
}
# The requests an episode is told by, besides its commands: (methods, path, step).
STEPS = [
    ("GET", r"/api/object-storage/push-access", "push access"),
    ("HEAD PUT POST", r"/storage/.+", "upload context"),
    ("POST", r"/api/sandbox", "create"),
    ("POST", r"/toolbox/\w+/files/bulk-upload", "upload"),
    ("POST", r"/toolbox/\w+/files/bulk-download", "download"),
    ("DELETE", r"/api/sandbox/\w+", "delete"),
]
VERIFIER = """#!/bin/bash
if cmp -s /app/answer.txt /app/hello.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def bwrap_runner(root: Path, command: str, env: Mapping[str, str], cwd: str) -> Ran:
    """A stand-in sandbox's command in rlbuild's bubblewrap sandbox, its top-level folders bound at their paths."""
    hand_over(root)  # what the stand-in wrote since the last command (uploads) goes to the sandbox's user too
    work = root / "work"
    work.mkdir(exist_ok=True)
    places = {f"/{p.name}": p for p in root.iterdir() if p.is_dir() and p != work}
    variables = [option for name, value in env.items() for option in ("--setenv", name, value)]
    argv = bwrap_argv(SPEC, work, *variables, binds=places)
    try:
        done = subprocess.run(
            [*argv, "/usr/bin/env", "-C", cwd, "/bin/sh", "-c", command],
            capture_output=True,
            env={},
            timeout=SPEC.command_timeout_s,
            **as_sandbox_user(work),
        )
    except subprocess.TimeoutExpired:
        return Ran(124, b"", b"timed out")
    return Ran(done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def server() -> Iterator[DaytonaStandIn]:
    """One stand-in for the module: Harbor's Daytona client is one per process, made with the first address."""
    import daytona._async.object_storage as object_storage

    plain_store = object_storage.S3Store

    def loopback_store(*args: object, client_options: dict[str, object] | None = None, **kwargs: object) -> object:
        # obstore refuses a plain-http storage URL unless told; Daytona's real one is https, the stand-in's is not.
        return plain_store(*args, client_options={**(client_options or {}), "allow_http": True}, **kwargs)

    with pytest.MonkeyPatch.context() as patch, daytona_stand_in(bwrap_runner) as stand_in:
        patch.setattr(object_storage, "S3Store", loopback_store)
        for name, value in {**CREDENTIALS, **stand_in.env()}.items():
            patch.setenv(name, value)
        yield stand_in


@pytest.fixture
def stand_in(server: DaytonaStandIn) -> DaytonaStandIn:
    server.calls.clear()
    return server


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    """A Harbor task: copy hello.txt (its image holds it in /app) to answer.txt."""
    task = tmp_path / "copy-hello"
    files = {
        "instruction.md": "Copy /app/hello.txt to /app/answer.txt.\n",
        "task.toml": 'version = "1.0"\n',
        "environment/Dockerfile": "FROM ubuntu:24.04\nWORKDIR /app\nCOPY hello.txt /app/hello.txt\n",
        "environment/hello.txt": "rlbuild\n",
        "tests/test.sh": VERIFIER,
    }
    for name, content in files.items():
        (task / name).parent.mkdir(parents=True, exist_ok=True)
        (task / name).write_text(content)
    (task / "tests/test.sh").chmod(0o755)
    return task


def _episode(task_dir: Path, command: str) -> tuple[CommandResult, float]:
    """Open the task's sandbox, run one command, score it with the task's verifier, close it."""
    with open_task_sandbox(SPEC, task_dir) as sandbox:
        result = sandbox.run(command)
        return result, sandbox.verify()


def _step(call: Call) -> str | None:
    """What a request did in the episode's terms; None for the requests that only serve another (a command's
    session, status and logs) and for the SDK's event socket, which the stand-in refuses (the SDK then polls)."""
    path = call.path.split("?")[0]
    if path.endswith("/exec"):
        return "exec: " + json.loads(call.body)["command"]
    for method, pattern, step in STEPS:
        if call.method in method and re.fullmatch(pattern, path):
            return step
    return None


def _readable(body: bytes) -> bytes:
    """A request's body with its gzip streams (Harbor's tarballs) inflated, so a value inside them shows."""
    out, start = [body], body.find(b"\x1f\x8b")
    while start >= 0:
        inflater = zlib.decompressobj(wbits=31)
        with contextlib.suppress(zlib.error):  # two bytes that only look like a gzip stream's start
            out.append(inflater.decompress(body[start:]))
        start = body.find(b"\x1f\x8b", start + 2)
    return b"".join(out)


def _sent(calls: list[Call], value: str) -> list[str]:
    """The requests (method and path) that carry `value` anywhere: path, a header, the body."""
    needle = value.encode()
    return [
        f"{call.method} {call.path}"
        for call in calls
        if needle in call.path.encode() + json.dumps(call.headers).encode() + _readable(call.body)
    ]


def test_one_episode_crosses_as_create_exec_verify_delete(stand_in: DaytonaStandIn, task_dir: Path) -> None:
    result, reward = _episode(task_dir, "cp hello.txt answer.txt")

    assert (result.exit_code, reward) == (0, 1.0)
    steps = [step for step in map(_step, stand_in.calls) if step]
    assert [step.split(":")[0] for step in steps] == [
        "push access",  # the Dockerfile's context goes to Daytona's object storage: HEAD, then a multipart upload
        *("upload context", "upload context", "upload context", "upload context", "create"),
        *("exec", "exec"),  # Harbor's log folders made; the agent's command
        *("exec", "upload", "exec", "exec", "exec", "exec"),  # the verifier: old rewards out, tests/ in, test.sh
        *("exec", "download", "exec", "delete"),  # /logs/verifier packed, fetched, its tarball removed
    ]
    commands = [step.removeprefix("exec: ") for step in steps if step.startswith("exec: ")]
    assert "mkdir -p /logs/agent /logs/verifier /logs/artifacts" in commands[0]
    assert commands[1] == "timeout 10 bash -c 'cp hello.txt answer.txt'"
    assert "tar -xzf /tmp/runtime_upload_" in commands[3] and "-C /tests" in commands[3]
    assert "(/tests/test.sh) > /logs/verifier/test-stdout.txt" in commands[6]
    assert "tar -czf /tmp/runtime_download_" in commands[7] and "-C /logs/verifier" in commands[7]
    assert not any(stand_in.folder.iterdir())  # the delete removed the sandbox


def test_episodes_in_a_row_and_side_by_side(stand_in: DaytonaStandIn, task_dir: Path) -> None:
    """Harbor's Daytona client is one per process and bound to an event loop: every episode uses it, whichever
    thread plays it; the verifier scores each episode's own sandbox."""
    commands = ["cp hello.txt answer.txt", "echo wrong > answer.txt"]
    in_a_row = [_episode(task_dir, command)[1] for command in commands]
    with ThreadPoolExecutor(2) as pool:
        side_by_side = [reward for _, reward in pool.map(lambda command: _episode(task_dir, command), commands)]

    assert in_a_row == side_by_side == [1.0, 0.0]
    assert [sum(_step(call) == step for call in stand_in.calls) for step in ("create", "delete")] == [4, 4]


def test_the_api_key_travels_only_as_the_bearer_token(stand_in: DaytonaStandIn, task_dir: Path) -> None:
    _episode(task_dir, "true")

    bearer = ("Authorization", f"Bearer {stand_in.api_key}")
    api = [call for call in stand_in.calls if call.path.startswith(("/api/sandbox", "/api/object", "/toolbox/"))]
    assert api and all(bearer in call.headers.items() for call in api)
    # Without that header, no request (the storage upload and the event socket included) holds the key.
    rest = [Call(c.method, c.path, {k: v for k, v in c.headers.items() if (k, v) != bearer}, c.body) for c in api]
    assert _sent(rest + [call for call in stand_in.calls if call not in api], stand_in.api_key) == []


def test_no_aws_or_r2_value_reaches_daytona(stand_in: DaytonaStandIn, task_dir: Path) -> None:
    # The agent's command lists its environment: a value there would come back in the command's logs.
    result, _ = _episode(task_dir, "env")

    assert "PATH=" in result.output
    assert {name: _sent(stand_in.calls, value) for name, value in CREDENTIALS.items()} == {
        name: [] for name in CREDENTIALS
    }


def test_a_value_the_task_sends_is_seen(stand_in: DaytonaStandIn, task_dir: Path) -> None:
    """The check above can fail: a task that asks for a variable of the trainer's environment by name
    ([environment.env], resolved by Harbor) sends its value, and the recorded requests show it."""
    (task_dir / "task.toml").write_text('version = "1.0"\n[environment.env]\nLEAK = "${R2_ACCESS_KEY_ID}"\n')

    _episode(task_dir, "true")

    assert "POST /api/sandbox" in _sent(stand_in.calls, CREDENTIALS["R2_ACCESS_KEY_ID"])
