"""Hostile Harbor tasks and agents on the `local` backend, played through the real sandbox (bubblewrap) and Harbor's
own verifier: each attack on the boundary between the sandbox and the host (a link, a hard link or a swapped folder
where the host copies files in or out) is refused or contained, the host is as it was, and a refusal is the
episode's error."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rlbuild.contracts.recipe import SandboxSection
from rlbuild.contracts.rows import HarborTaskError, task_row, task_rows
from trainer.agents.harbor_task import HarborTask
from trainer.sandbox import SandboxError
from trainer.sandbox.local.bubblewrap import LocalSandbox, bwrap
from trainer.sandbox.task import HarborSandbox, open_task_sandbox

SPEC = SandboxSection(backend="local", command_timeout_s=5, episode_timeout_s=30)
HOST = "host's own bytes\n"


def _task(root: Path) -> Path:
    """A task whose verifier sources a helper from a subfolder of tests/ and rewards 1 when /app/done exists."""
    task = root / "hostile"
    for folder in ("environment/files", "tests/lib"):
        (task / folder).mkdir(parents=True)
    (task / "instruction.md").write_text("Create /app/done.\n")
    (task / "task.toml").write_text('schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 10.0\n')
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nCOPY files/ /app/\n")
    (task / "environment" / "files" / "readme").write_text("hello\n")
    (task / "tests" / "lib" / "helper.sh").write_text("done_file=/app/done\n")
    test = task / "tests" / "test.sh"
    test.write_text(
        '#!/bin/sh\n. /tests/lib/helper.sh\nif [ -e "$done_file" ]; then echo 1; else echo 0; fi '
        "> /logs/verifier/reward.txt\n"
    )
    test.chmod(0o755)
    return task


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host folder the sandbox must never write or read: a file and a folder holding one."""
    folder = tmp_path / "host"
    (folder / "inner").mkdir(parents=True)
    (folder / "secret").write_text(HOST)
    (folder / "inner" / "reward.txt").write_text("1\n")  # a reward the agent would like the host to read back
    folder.chmod(0o755)
    tmp_path.chmod(0o755)  # a root trainer's sandbox runs as another user: the attack is the host's copy, not its
    return folder


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[HarborSandbox]:
    with open_task_sandbox(SPEC, _task(tmp_path / "task")) as opened:
        yield opened


def _host_is_as_it_was(host: Path) -> None:
    assert sorted(p.relative_to(host).as_posix() for p in host.rglob("*")) == ["inner", "inner/reward.txt", "secret"]
    assert (host / "secret").read_text() == HOST and not (host / "secret").is_symlink()
    assert (host / "inner" / "reward.txt").read_text() == "1\n"


def _run(sandbox: HarborSandbox, command: str) -> None:
    result = sandbox.run(command)
    assert result.exit_code == 0, result


def test_a_test_script_replaced_by_a_link_to_a_host_file_is_replaced_not_written_through(
    sandbox: HarborSandbox, host: Path
) -> None:
    _run(sandbox, f"ln -s {shlex.quote(str(host / 'secret'))} /tests/test.sh && touch /app/done")
    try:
        assert sandbox.verify() == 1.0  # the task's own test.sh ran
    finally:
        _host_is_as_it_was(host)  # old code: the secret was overwritten with test.sh, as root


def test_a_tests_subfolder_replaced_by_a_link_to_a_host_folder_is_replaced_not_written_into(
    sandbox: HarborSandbox, host: Path
) -> None:
    _run(sandbox, f"ln -s {shlex.quote(str(host))} /tests/lib")
    try:
        assert sandbox.verify() == 0.0
    finally:
        _host_is_as_it_was(host)  # old code: helper.sh was written into the host folder


def test_what_the_agent_left_in_tests_is_gone_when_the_verifier_runs(sandbox: HarborSandbox) -> None:
    # A file the agent planted (a pytest conftest.py, say), and a hard link from the agent's own file to the name
    # the task's test.sh is uploaded to: the upload writes a new file, never through the agent's inode.
    _run(sandbox, "echo planted > /tests/conftest.py && echo mine > /tests/mine && ln /tests/mine /tests/test.sh")
    assert sandbox.verify() == 0.0
    assert sandbox.run("ls /tests").output.split() == ["lib", "test.sh"]


def test_a_hard_link_never_reaches_beyond_its_own_bind(sandbox: HarborSandbox) -> None:
    """Documents what holds hard links in (true before crossing.py too): link(2) does not cross mount points, and
    every writable place of the sandbox (each Harbor place, the image's folders, /work) and the read-only /usr is a
    mount of its own, so a hard link names a file of the same bind."""
    said = sandbox.run("ln /usr/bin/env /tests/env; ln /app/readme /tests/readme; ln /app/readme /logs/r").output
    assert said.count("Invalid cross-device link") == 3, said


def test_a_link_in_the_verifiers_results_is_refused_and_its_target_never_copied(
    sandbox: HarborSandbox, host: Path
) -> None:
    _run(sandbox, f"ln -s {shlex.quote(str(host / 'secret'))} /logs/verifier/leak && touch /app/done")
    with pytest.raises(SandboxError, match=r"Failed to download verifier directory .*/logs/verifier/leak \(a link\)"):
        sandbox.verify()
    results = sandbox.trial_paths.verifier_dir
    assert not (results / "leak").exists() and HOST not in _contents(results)
    _host_is_as_it_was(host)


def test_the_results_folder_replaced_by_a_link_to_a_host_folder_is_refused(sandbox: HarborSandbox, host: Path) -> None:
    _run(sandbox, f"rm -rf /logs/verifier && ln -s {shlex.quote(str(host / 'inner'))} /logs/verifier")
    with pytest.raises(SandboxError, match=r"the sandbox left /logs/verifier \(a link\)"):
        sandbox.verify()  # old code: the host's inner/reward.txt was copied and read back as the reward, 1.0
    assert not (sandbox.trial_paths.verifier_dir / "reward.txt").exists()
    _host_is_as_it_was(host)


def test_a_refused_copy_is_the_episodes_error_through_the_harbor_environment(tmp_path: Path, host: Path) -> None:
    row = task_row(_task(tmp_path / "task"))
    episode = HarborTask({}, {**row, "sandbox_spec": SPEC, "max_turns": 2})
    try:
        episode.init(row["prompt"])
        episode.step(f"ln -s {shlex.quote(str(host / 'secret'))} /logs/verifier/leak")
        with pytest.raises(SandboxError, match="leak"):
            episode.verify()  # the episode player records it as the episode's error (`_fail("verify", ...)`)
    finally:
        episode.close()
    _host_is_as_it_was(host)


def _contents(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("source", ["{host}/secret", "../../../../../../../..{host}/secret"])
def test_a_dockerfile_copy_from_outside_its_build_context_is_refused_before_the_sandbox_starts(
    tmp_path: Path, host: Path, source: str
) -> None:
    task = _task(tmp_path / "task")
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + f"COPY {source.format(host=host)} /app/\n")
    # old code: the sandbox started and `cat /app/secret` read the host's file
    with pytest.raises(SandboxError, match=rf"'hostile': {dockerfile} line 4: COPY source .*secret"):
        open_task_sandbox(SPEC, task)


@pytest.mark.parametrize("link", ["environment/files/readme", "tests/test.sh", "tests/lib"])
def test_a_link_in_a_task_folder_is_refused_by_staging_naming_it(tmp_path: Path, host: Path, link: str) -> None:
    task = _task(tmp_path / "task")
    path = task / link
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(host / "secret" if "." in path.name else host)
    # old code: the host's file (or folder) was read into the row, and from there into storage and a sandbox
    with pytest.raises(HarborTaskError, match=rf"{path}: is a symbolic link \(to '{host}.*`cp -L`"):
        task_rows(task)


def test_a_folder_swapped_for_a_link_while_the_host_copies_never_redirects_it(
    sandbox: HarborSandbox, host: Path
) -> None:
    # A process the agent left running swaps /tests/lib between a folder and a link to the host for as long as the
    # verifier runs: each component the host opens is opened without following, whichever it finds.
    swap = f"while :; do rm -rf /tests/lib; ln -sfn {shlex.quote(str(host))} /tests/lib; mkdir /tests/lib; done"
    _run(sandbox, f"( {swap} ) >/dev/null 2>&1 &")
    for _ in range(5):
        with contextlib.suppress(Exception):  # the host's copy may meet the link and fail: never follow it
            sandbox.verify()
        _host_is_as_it_was(host)


def _local(sandbox: HarborSandbox) -> LocalSandbox:
    local = sandbox.environment.sandbox
    assert isinstance(local, LocalSandbox)
    return local


def _alive_besides_init_and_shell(local: LocalSandbox) -> list[str]:
    """The command lines of the sandbox's live processes but its init and shell, read from the host."""
    namespace = os.readlink(f"/proc/{local.init_pid}/ns/pid")
    found = []
    for link in glob.glob("/proc/[0-9]*/ns/pid"):
        pid = int(link.split("/")[2])
        with contextlib.suppress(OSError, psutil.NoSuchProcess):
            process = psutil.Process(pid)
            if os.readlink(link) == namespace and process.status() != psutil.STATUS_ZOMBIE:
                found.append((pid, " ".join(process.cmdline())))
    return sorted(line for pid, line in found if pid not in (local.init_pid, local._shell))


def test_the_sandboxs_proc_lists_its_own_processes_only_and_names_no_host_path(sandbox: HarborSandbox) -> None:
    listing = sandbox.run(r"cd /proc && for p in [0-9]*; do echo $p $(tr '\0' ' ' < $p/cmdline); done").output
    lines = listing.splitlines()
    assert lines[0].startswith("1 bwrap --args ") and len(lines) < 10, listing  # no host process is listed
    assert str(sandbox.trial_paths.trial_dir) not in listing, listing  # old code: bwrap's argv bound it at /app...
    assert bwrap() not in listing and "pytest" not in listing, listing
    assert "/tmp" in sandbox.run("tr '\\0' ' ' < /proc/1/environ; echo /tmp").output  # it reads /proc/1: no error


def _verifier_sees(task: Path, script: str) -> None:
    test = task / "tests" / "test.sh"
    test.write_text(script)
    test.chmod(0o755)


def test_processes_an_action_left_running_are_dead_before_the_verifier_runs(tmp_path: Path) -> None:
    task = _task(tmp_path / "task")
    # The verifier records what runs beside it; a process still there could rewrite /tests or /logs/verifier.
    _verifier_sees(
        task, "#!/bin/sh\nfor p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done > /logs/verifier/seen\n"
        "echo 0 > /logs/verifier/reward.txt\n",
    )  # fmt: skip
    with open_task_sandbox(SPEC, task) as sandbox:
        left = "sleep 1001 & setsid sleep 1002 & ( ( sleep 1003 & ) & ) ; ( trap '' HUP TERM; sleep 1004 ) &"
        # and one that would swap the verifier's script for its own the moment the host uploads it
        cheat = "while :; do [ -s /tests/test.sh ] && echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh; done"
        _run(sandbox, f"echo {shlex.quote(cheat)} > /tmp/cheat.sh; {left} sh /tmp/cheat.sh >/dev/null 2>&1 & true")
        # The forks and execs settle in milliseconds, or seconds on a loaded box (a sleep not yet exec'd is a
        # copy of /bin/sh meanwhile, and a subshell may stay beside its sleep): the five long-lived processes, once
        # every one of them runs.
        wanted = {"sleep 1001", "sleep 1002", "sleep 1003", "sleep 1004", "sh /tmp/cheat.sh"}
        deadline = time.monotonic() + 30
        while not wanted <= set(alive := _alive_besides_init_and_shell(_local(sandbox))):
            assert time.monotonic() < deadline, alive
            time.sleep(0.05)
        assert sandbox.verify() == 0.0  # the task's own verifier ran, untouched
        seen = (sandbox.trial_paths.verifier_dir / "seen").read_text()
        assert "sleep" not in seen and "cheat" not in seen, seen  # old code: sleep 1001..1004 ran beside it
        assert _alive_besides_init_and_shell(_local(sandbox)) == []


def test_processes_the_verifier_left_running_are_dead_before_its_results_are_copied_out(tmp_path: Path) -> None:
    task = _task(tmp_path / "task")
    # The verifier leaves a process writing to its results for as long as it lives (one swapping a result for a
    # link to a host file, as above, would race the copy the same way).
    writer = "while :; do echo tick >> /logs/verifier/ticks; done"
    wait = "until [ -s /logs/verifier/ticks ]; do :; done"  # the verifier ends once the writer has begun
    _verifier_sees(
        task, f"#!/bin/sh\necho 1 > /logs/verifier/reward.txt\nsetsid sh -c '{writer}' >/dev/null 2>&1 &\n{wait}\n"
    )
    with open_task_sandbox(SPEC, task) as sandbox:
        for _ in range(3):
            assert sandbox.verify() == 1.0
            assert _alive_besides_init_and_shell(_local(sandbox)) == []  # old code: the writing loop
            time.sleep(0.1)
            copied = (sandbox.trial_paths.verifier_dir / "ticks").stat().st_size
            # what the host copied is what the sandbox holds after it: nothing wrote during or after the copy
            assert sandbox.run("wc -c < /logs/verifier/ticks").output.strip() == str(copied)
            assert copied > 0


def test_a_hard_link_to_a_file_outside_work_fails(tmp_path: Path, host: Path) -> None:
    """link(2) never crosses a mount: the read-only /usr, /proc (whose /proc/1/exe is the host's bwrap binary) and
    each writable bind are mounts of their own, and no other host file has a name in the sandbox."""
    with open_task_sandbox(SPEC, _task(tmp_path / "task")) as sandbox:
        targets = ["/usr/bin/env", "/proc/1/exe", "/proc/self/exe", f"{host}/secret", "/app/readme"]
        said = sandbox.run("; ".join(f"ln {target} /work/link{n}" for n, target in enumerate(targets))).output
        assert said.count("Invalid cross-device link") == 4 and "No such file" in said, said
        assert sandbox.run("ls -A /work").output == ""
    _host_is_as_it_was(host)


def test_a_verifier_writing_outside_its_results_folder_changes_no_host_file_and_nothing_is_copied(
    tmp_path: Path, host: Path
) -> None:
    task = _task(tmp_path / "task")
    places = ["/tests", "/app", "/work", "/tmp", "/logs/agent", "/logs", "/", "/usr", str(host), str(tmp_path)]
    writes = "".join(f"echo pwned > {shlex.quote(place)}/pwned 2>/dev/null\n" for place in places)
    _verifier_sees(task, f"#!/bin/sh\n{writes}echo 1 > /logs/verifier/reward.txt\n")
    with open_task_sandbox(SPEC, task) as sandbox:
        trial = sandbox.trial_paths.trial_dir
        assert sandbox.verify() == 1.0
        written = sorted(p.relative_to(trial).as_posix() for p in trial.rglob("pwned"))
        # only into the sandbox's own folders (the host sides of its binds, under sandbox/), never the trial's
        assert all(path.startswith("sandbox/") for path in written), written
        assert sorted(p.name for p in sandbox.trial_paths.verifier_dir.iterdir()) == ["reward.txt", "test-stdout.txt"]
    _host_is_as_it_was(host)
    assert not list(tmp_path.glob("pwned")) and not Path("/pwned").exists() and not Path("/usr/pwned").exists()


def test_an_attack_through_the_replay_command_leaves_the_host_as_it_was_and_is_the_episodes_error(
    tmp_path: Path,
) -> None:
    from rlbuild.contracts.tinymodel import AGENT_VARIANT
    from rlbuild.dev.launches import SPLITS, write_test_launch
    from trainer import tiny

    tasks = tmp_path / "tasks"
    (_task(tasks) / "instruction.md").write_text("go\n")
    data = {split: [{"source": f"harbor:{tasks}", "revision": "v1"}] for split in SPLITS}
    # The tiny agent model's language (config/experiments/tiny-harbor.yaml): 128 positions, `|` ends a turn.
    environment = {"env_class": "harbor", "max_turns": 1, "turn_stop": "|", "max_context_tokens": 128}
    environment["env_config"] = {"template": ">{output}|", "max_chars": 20, "compact": True, "action_suffix": "|"}
    generator = {"max_prompt_length": 16, "sampling_params": {"max_generate_length": 100}}
    recipe = {"environment": {**environment, "sandbox": {"backend": "local"}}, "generator": generator}
    model = tmp_path / "model"  # the tiny agent model untrained: the actions come from the file, not from it
    tokenizer = tiny.build_tokenizer(AGENT_VARIANT)
    tiny.build_model(tokenizer, seed=0, variant=AGENT_VARIANT).save_pretrained(model)
    tokenizer.save_pretrained(model)
    launch = write_test_launch(tmp_path / "launch", data=data, recipe=recipe, model_dir=model)
    # A host path short enough for the model's positions: the host's own /tmp, not the sandbox's.
    host = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    try:
        (host / "s").write_text(HOST)
        actions = tmp_path / "actions.txt"
        # attack 1 (the verifier's upload writing through /tests/test.sh) and 4 (a link in its results)
        actions.write_text(f"cd /tests;ln -s {host}/s test.sh;ln -s {host}/s /logs/verifier/l\n")
        command = [sys.executable, "-m", "trainer", "episode", "--launch", str(launch), "--row", "0", "--actions"]
        result = subprocess.run([*command, str(actions), "--json"], capture_output=True, text=True, timeout=120)
        assert (host / "s").read_text() == HOST and [p.name for p in host.iterdir()] == ["s"]
        assert result.returncode == 0, result.stderr
        replayed = json.loads(result.stdout)
        assert replayed["turns"][0]["action"].startswith("cd /tests;ln -s"), replayed  # played whole
        assert "/logs/verifier/l (a link)" in (replayed["error"] or ""), replayed
    finally:
        shutil.rmtree(host)
