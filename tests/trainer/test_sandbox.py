"""The local sandbox (trainer/sandbox/local/bubblewrap.py) on real bubblewrap: the shell an episode keeps, and one
test per kind of hostile action, each checking what the observation says, how long the episode took, and that the
host is as it was; and the pool (trainer/sandbox/pool.py): what a reused sandbox keeps of the episode before it
(nothing)."""

from __future__ import annotations

import gc
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox import Sandbox, SandboxError, registry
from trainer.sandbox.local import bubblewrap
from trainer.sandbox.local.bubblewrap import LocalSandbox, _children, _Output
from trainer.sandbox.local.reachable import SANDBOX_UID, reachable_by
from trainer.sandbox.pool import SandboxPool, _Lease
from trainer.sandbox.registry import open_sandbox

REPO = Path(__file__).resolve().parents[2]
SPEC = SandboxSection(
    command_timeout_s=1.0,
    episode_timeout_s=30.0,
    memory_mb=256,
    max_processes=16,
    max_output_bytes=4096,
    max_file_bytes=4096,
)
SLACK_S = 1.0  # what a loaded machine may add to a deadline before the episode has ended


@pytest.fixture
def sandbox() -> Iterator[LocalSandbox]:
    with open_sandbox(SPEC, {}) as opened:
        assert isinstance(opened, LocalSandbox)
        yield opened


def _alive_in(namespace: str) -> list[int]:
    """Host pids of the processes still running in a PID namespace (a zombie waits for the host's init only)."""
    pids = []
    for link in glob.glob("/proc/[0-9]*/ns/pid"):
        pid = int(link.split("/")[2])
        try:
            if os.readlink(link) == namespace and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                pids.append(pid)
        except (OSError, psutil.NoSuchProcess):
            continue  # gone while listed
    return pids


def _ended_within(sandbox: Sandbox, command: str, bound_s: float) -> str:
    """Run a command that must end the episode; its note."""
    began = time.monotonic()
    result = sandbox.run(command)
    assert result.ended and result.exit_code is None, result
    assert time.monotonic() - began < bound_s + SLACK_S
    assert sandbox.run("echo again").ended
    return result.note


def test_one_shell_keeps_its_directory_and_variables(sandbox: LocalSandbox) -> None:
    assert sandbox.run("mkdir -p a/b && cd a/b && X=kept").exit_code == 0
    result = sandbox.run('pwd; echo "$X"; echo err >&2; false')
    assert (result.output, result.exit_code, result.note, result.ended) == ("/work/a/b\nkept\nerr\n", 1, "", False)
    assert sandbox.timings.commands == 2 and 0 < sandbox.timings.command_s < 2 * SPEC.command_timeout_s
    assert sandbox.timings.start_s > 0


def test_a_command_fails_alone_on_a_syntax_error_or_reading_stdin(sandbox: LocalSandbox) -> None:
    """A command is one quoted word of `command eval`: an unclosed quote is its own syntax error, not the start of
    a string swallowing the next line; its stdin is /dev/null, so `cat` ends at once; several lines are one
    command."""
    unclosed = sandbox.run("echo 'abc")
    assert unclosed.exit_code == 2 and "Unterminated quoted string" in unclosed.output
    assert sandbox.run("cat").exit_code == 0
    assert sandbox.run("echo 'two\nlines'\necho third").output == "two\nlines\nthird\n"


def test_the_episode_files_are_there_writable_and_removed_on_close() -> None:
    with open_sandbox(SPEC, {"k1": "one\n", "sub/dir/data.bin": b"\x00\x01"}) as sandbox:
        assert isinstance(sandbox, LocalSandbox)
        assert sandbox.run("cat k1; wc -c < sub/dir/data.bin").output == "one\n2\n"
        assert sandbox.run("echo two >> k1 && touch sub/new").exit_code == 0
        assert (sandbox.folder / "k1").read_text() == "one\ntwo\n"
    assert not sandbox.folder.exists()
    sandbox.close()  # again: nothing to do


@pytest.mark.parametrize("name", ["/etc/cron.d/x", "../x", "a/../../x", ""])
def test_a_file_outside_the_episode_folder_is_refused(name: str) -> None:
    with pytest.raises(SandboxError, match="relative to the episode's working folder"):
        open_sandbox(SPEC, {name: "x"})


def test_host_files_are_not_visible(sandbox: LocalSandbox) -> None:
    for command in ("cat /etc/passwd", "ls /root", "ls /home", f"ls {REPO}", "ls /work/main"):
        result = sandbox.run(command)
        assert result.exit_code != 0 and "No such file or directory" in result.output, (command, result)
    # /proc is the sandbox's own: its pid 1 is bwrap's init, whose environment is empty.
    assert sandbox.run("cat /proc/1/environ").output == ""
    assert sandbox.run("ls /").output.split() == ["bin", "dev", "lib", "lib64", "proc", "tmp", "usr", "work"]


def test_writes_outside_the_episode_folder_fail_or_stay_inside(sandbox: LocalSandbox) -> None:
    probe = f"rlbuild-sandbox-probe-{os.getpid()}"
    touched = sandbox.run(f"touch /usr/{probe}")
    assert touched.exit_code != 0 and "Read-only file system" in touched.output
    assert sandbox.run(f"echo x > /tmp/{probe} && cat /tmp/{probe}").output == "x\n"
    # The repo's own path: under /work the sandbox makes it in its private folder; elsewhere the read-only root
    # refuses it. Either way the host's repo is untouched.
    into_repo = sandbox.run(f"mkdir -p {REPO} && echo x > {REPO}/{probe}")
    if into_repo.exit_code == 0:
        assert sandbox.run(f"cat {REPO}/{probe}").output == "x\n"
    else:
        assert "Read-only file system" in into_repo.output, into_repo
    assert not Path("/usr", probe).exists() and not Path("/tmp", probe).exists() and not (REPO / probe).exists()


def test_a_file_past_max_file_bytes_is_cut(sandbox: LocalSandbox) -> None:
    result = sandbox.run("head -c 100000 /dev/zero > big")
    assert result.exit_code != 0 and "File size limit exceeded" in result.output
    assert (sandbox.folder / "big").stat().st_size == SPEC.max_file_bytes
    assert sandbox.run("echo alive").output == "alive\n"


def test_the_network_is_unreachable(sandbox: LocalSandbox) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        port = server.getsockname()[1]
        connect = "python3 -c 'import socket; socket.create_connection((\"{}\", {}), timeout=1)'"
        loopback = sandbox.run(connect.format("127.0.0.1", port))
        assert loopback.exit_code == 1 and "ConnectionRefusedError" in loopback.output
        outside = sandbox.run(connect.format("1.1.1.1", 53))
        assert outside.exit_code == 1 and "Network is unreachable" in outside.output
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing came


def test_the_process_cap_binds_and_a_fork_bomb_is_contained(sandbox: LocalSandbox) -> None:
    namespace = os.readlink(f"/proc/{sandbox.init_pid}/ns/pid")
    spawner = """python3 - <<'END'
import subprocess
started = []
try:
    for _ in range(200):
        started.append(subprocess.Popen(["sleep", "5"]))
except OSError as error:
    print(len(started), error.strerror)
for sleeper in started:
    sleeper.kill()
    sleeper.wait()
END"""
    # The init, the shell and python count too: 13 sleeps fill 16.
    assert sandbox.run(spawner).output == f"{SPEC.max_processes - 3} Resource temporarily unavailable\n"
    began = time.monotonic()
    assert sandbox.run("bomb() { bomb | bomb & }; bomb").exit_code == 0
    time.sleep(0.5)
    assert len(_alive_in(namespace)) <= SPEC.max_processes
    alive = sandbox.run("echo alive")  # a builtin: the shell answers, under the bomb's "Cannot fork" lines
    assert alive.exit_code == 0 and not alive.ended
    sandbox.close()
    # The host's processes are as before: not one of the sandbox's is left (a count of all the host's processes
    # would also count whatever else the machine started meanwhile).
    assert _alive_in(namespace) == [] and time.monotonic() - began < 0.5 + SLACK_S


def test_endless_output_is_cut_and_ends_at_the_command_timeout(sandbox: LocalSandbox) -> None:
    rss = psutil.Process().memory_info().rss
    began = time.monotonic()
    result = sandbox.run("yes")
    assert time.monotonic() - began < SPEC.command_timeout_s + SLACK_S
    assert result.ended and result.output == "y\n" * (SPEC.max_output_bytes // 2)
    assert result.note == "output cut at 4096 bytes; the command ran past its 1 s limit; the sandbox was stopped"
    assert psutil.Process().memory_info().rss - rss < 50 << 20


def test_a_command_sleeping_forever_ends_at_the_command_timeout(sandbox: LocalSandbox) -> None:
    note = _ended_within(sandbox, "sleep 1000", SPEC.command_timeout_s)
    assert note == "the command ran past its 1 s limit; the sandbox was stopped"


def test_the_episode_time_limit_counts_over_commands() -> None:
    spec = SPEC.model_copy(update={"episode_timeout_s": 1.5})
    with open_sandbox(spec, {}) as sandbox:
        began = time.monotonic()
        assert sandbox.run("sleep 0.6").exit_code == 0 and sandbox.run("sleep 0.6").exit_code == 0
        note = _ended_within(sandbox, "sleep 0.6", 0.3)
        assert note == "the episode's 1.5 s of sandbox time are used up; the sandbox was stopped"
        assert time.monotonic() - began < spec.episode_timeout_s + SLACK_S


def test_memory_past_the_limit_fails_inside_and_the_sandbox_lives_on() -> None:
    with open_sandbox(SPEC.model_copy(update={"memory_mb": 128}), {}) as sandbox:
        result = sandbox.run('python3 -c "x = bytearray(2**30)"')
        assert result.exit_code == 1 and "MemoryError" in result.output and not result.ended
        assert sandbox.run("echo alive").output == "alive\n"


def test_the_tmpfs_hold_at_most_half_of_memory_mb_each() -> None:
    spec = SPEC.model_copy(update={"memory_mb": 32, "max_file_bytes": 64 << 20})
    with open_sandbox(spec, {}) as sandbox:
        for place in ("/tmp", "/dev/shm"):
            result = sandbox.run(f"head -c 20000000 /dev/zero > {place}/fill")
            assert result.exit_code != 0 and "No space left on device" in result.output, result
            assert sandbox.run(f"wc -c < {place}/fill").output.strip() == str(16 << 20)


def test_no_user_namespace_can_be_made_inside(sandbox: LocalSandbox) -> None:
    result = sandbox.run("unshare -r id")
    assert result.exit_code != 0 and "uid=0" not in result.output, result


def test_the_host_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "rlbuild-fake-secret")
    with open_sandbox(SPEC, {}) as sandbox:
        names = sorted(line.split("=")[0] for line in sandbox.run("env").output.splitlines())
        environs = sandbox.run("cat /proc/1/environ /proc/self/environ").output
    assert names == ["HOME", "PATH", "PWD"]
    assert "rlbuild-fake-secret" not in environs and "AWS_" not in environs


def test_a_shell_that_exits_ends_the_episode(sandbox: LocalSandbox) -> None:
    namespace = os.readlink(f"/proc/{sandbox.init_pid}/ns/pid")
    assert _ended_within(sandbox, "sleep 100 & exit 3", 0.5) == "the sandbox's shell exited (code 3)"
    assert _alive_in(namespace) == []


def test_only_the_shells_marker_line_ends_a_command() -> None:
    """The marker may come split over reads, and a line that starts like it but is not the shell's (which a
    command could print only after reading the shell's memory) is output, never an exit code."""
    output = _Output(b"m4rk ", 64)
    assert not output.feed(b"a m4rk x\nb m4")
    assert not output.feed(b"rk 1")
    assert output.feed(b"7\nlater")
    assert (bytes(output.kept), output.exit_code, output.after) == (b"a m4rk x\nb ", 17, b"later")


# What an episode sees of its sandbox's state, with builtins only so the probe's own processes are not listed:
# cwd, umask, variables, functions, aliases, traps, signal dispositions, processes, files and System V IPC.
PROBE = r"""pwd; umask; env | sort; alias; type leak ll 2>&1; trap; echo "${LEAK-unset}"
for p in /proc/[0-9]*; do read -r name < "$p/comm" && echo "process $name"; done
while read -r key value; do case $key in SigIgn:|SigBlk:) echo "$key $value";; esac; done < /proc/$$/status
find /work /tmp /dev/shm -mindepth 1 | sort; stat -c '%A %U %n' /work /tmp /dev/shm; ipcs -m | tail -n +4"""
LEFTOVERS = (
    "sleep 1000 &",
    "setsid -f sleep 1000",
    "nohup sleep 1000 >/dev/null 2>&1 &",
    "(sleep 1000 &) ; sh -c 'sleep 1000 & exec sleep 1000' &",
    "echo x > .dot && mkdir -p d/.e && touch d/.e/f /tmp/t /tmp/.t /dev/shm/s && chmod 0 d && chmod 700 /tmp",
    "ipcmk -M 64 >/dev/null && export LEAK=1 && leak() { :; } && alias ll=ls && trap 'echo bye' EXIT && trap '' INT",
    "cd /tmp && umask 077",
)


def _probe(sandbox: Sandbox) -> str:
    result = sandbox.run(PROBE)
    assert result.exit_code == 0, result
    return result.output


def test_a_reused_sandbox_keeps_nothing_of_the_last_episode() -> None:
    files = {"new": "2\n", "sub/.hidden": "3\n"}
    with open_sandbox(SPEC, files) as fresh:
        expected = _probe(fresh)
    assert "process bwrap\nprocess sh\nSigBlk:" in expected and "/work/sub/.hidden\n" in expected
    with SandboxPool(SPEC) as pool:
        with pool.acquire({"old": "1\n", ".old": "1\n"}) as first:
            for command in LEFTOVERS:
                assert first.run(command).exit_code == 0, command
            assert "process sleep" in first.run(PROBE).output
        assert first.run("echo late").note == "the episode gave its sandbox back; the command was not run"
        with pool.acquire(files) as second:
            assert isinstance(first, _Lease) and isinstance(second, _Lease) and second.sandbox is first.sandbox
            sandbox = second.sandbox
            assert isinstance(sandbox, LocalSandbox)
            namespace = os.readlink(f"/proc/{sandbox.init_pid}/ns/pid")
            assert sorted(_alive_in(namespace)) == sorted([sandbox.init_pid, *_children(sandbox.init_pid)])
            assert len(_alive_in(namespace)) == 2  # the init and the shell: every sleep is gone
            assert _probe(second) == expected
            assert second.timings.commands == 1 and first.timings.commands == len(LEFTOVERS) + 1
        assert (pool.started, pool.reused) == (1, 1)


def test_a_trainer_started_under_nohup_still_reuses_its_sandboxes() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup hands every process it starts
    try:
        with SandboxPool(SPEC) as pool:
            with pool.acquire({}) as first:
                assert first.run("trap").output == ""  # nothing ignored inside, as after a reset
            with pool.acquire({}) as second:
                assert isinstance(first, _Lease) and isinstance(second, _Lease) and second.sandbox is first.sandbox
            assert (pool.started, pool.reused) == (1, 1)
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.parametrize("ending", ["sleep 1000", "exit 3"])
def test_a_sandbox_the_episode_ended_is_not_reused(ending: str) -> None:
    with SandboxPool(SPEC) as pool:
        with pool.acquire({}) as first:
            assert first.run(ending).ended
        with pool.acquire({"k": "v"}) as second:
            assert isinstance(first, _Lease) and isinstance(second, _Lease)
            assert second.sandbox is not first.sandbox and second.run("cat k").output == "v"
        assert (pool.started, pool.reused) == (2, 0)


@pytest.mark.parametrize("command", ["ulimit -t 1000", "ulimit -v 4000"])
def test_a_reset_that_fails_closes_the_sandbox_and_the_pool_starts_a_fresh_one(command: str) -> None:
    """A hard limit lowered cannot be raised back (the restarted shell's limits differ from a fresh one's); an
    address space too small for the restart kills the shell. Either way the sandbox is closed, not lent."""
    with SandboxPool(SPEC) as pool:
        with pool.acquire({}) as first:
            assert isinstance(first, _Lease) and isinstance(first.sandbox, LocalSandbox)
            namespace = os.readlink(f"/proc/{first.sandbox.init_pid}/ns/pid")
            assert first.run(f"sleep 1000 & {command}").exit_code == 0
        with pool.acquire({}) as second:  # after the reset, which runs in the pool's threads, has failed
            assert isinstance(second, _Lease) and isinstance(second.sandbox, LocalSandbox)
            assert second.sandbox is not first.sandbox and first.sandbox.ended and not first.sandbox.folder.exists()
            # The kernel may give the new sandbox the freed namespace's number: it frees one only once empty.
            reused = os.readlink(f"/proc/{second.sandbox.init_pid}/ns/pid") == namespace
            assert reused or _alive_in(namespace) == []
            assert second.run("ulimit -t; echo alive").output == "unlimited\nalive\n"
        assert (pool.started, pool.reused) == (2, 0)


def test_episodes_waiting_on_resets_that_all_fail_start_sandboxes_of_their_own() -> None:
    """Eight episodes wait on four resets that fail (a lowered hard limit): each must go on, not only one."""
    with ThreadPoolExecutor(8) as threads, SandboxPool(SPEC) as pool:
        first = [threads.submit(pool.acquire, {}).result() for _ in range(4)]
        for lease in first:
            assert lease.run("ulimit -t 1000").exit_code == 0
        for lease in first:
            lease.close()
        later = [threads.submit(pool.acquire, {}) for _ in range(8)]
        leases = [future.result(timeout=30) for future in later]  # hung for all but one before
        assert all(lease.run("echo ok").output == "ok\n" for lease in leases)
        assert (pool.started, pool.reused) == (12, 0)
        for lease in leases:
            lease.close()


def test_episodes_in_threads_each_see_their_own_files_and_closing_the_pool_leaves_no_process() -> None:
    pool = SandboxPool(SPEC)

    def episode(n: int) -> str:
        with pool.acquire({f"f{n}": f"{n}\n"}) as sandbox:
            return sandbox.run("ls -A; cat f*").output

    with ThreadPoolExecutor(4) as threads:
        assert list(threads.map(episode, range(16))) == [f"f{n}\n{n}\n" for n in range(16)]
        assert pool.started <= 4 and pool.started + pool.reused == 16
        lent = threads.submit(pool.acquire, {}).result()
        assert lent.run("sleep 1000 &").exit_code == 0
        sandboxes = [s for s in gc.get_objects() if isinstance(s, LocalSandbox) and not s.ended]
        namespaces = [os.readlink(f"/proc/{s.init_pid}/ns/pid") for s in sandboxes]
        pool.close()
        assert all(_alive_in(namespace) == [] for namespace in namespaces)
        assert not any(s.folder.exists() for s in sandboxes)
        assert lent.run("echo late").ended
        with pytest.raises(SandboxError, match="pool was closed"):
            pool.acquire({})


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox changes user only under a root trainer")
def test_a_root_trainer_in_a_private_home_starts_sandboxes_its_user_can_reach(tmp_path: Path) -> None:
    """A clone under a mode-700 home, run as root (most containers): its .venv's bwrap and its TMPDIR are where the
    sandbox's user cannot look. Every sandbox failed to start there ("Permission denied"), and a run trained on
    nothing but start failures."""
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    home.chmod(0o700)
    # The wheel as a private home's .venv holds it: its package and the libraries it finds two folders up.
    wheel = Path(bubblewrap._installed_bwrap())
    site = home / "venv" / "site-packages"
    shutil.copytree(wheel.parents[1], site / wheel.parents[1].name)
    shutil.copytree(wheel.parents[2] / f"{wheel.parents[1].name}.libs", site / f"{wheel.parents[1].name}.libs")
    private = site / wheel.relative_to(wheel.parents[2])
    assert not reachable_by(private, SANDBOX_UID) and not reachable_by(home / "tmp", SANDBOX_UID)
    script = f"""
from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox.local import bubblewrap
from trainer.sandbox import registry
from trainer.sandbox.registry import open_sandbox
bubblewrap._installed_bwrap = lambda: {str(private)!r}
with open_sandbox(SandboxSection(), {{"hello.txt": "hi\\n"}}) as sandbox:
    print(sandbox.run("id -u; cat hello.txt").output, end="")
    print(sandbox.folder)
print(bubblewrap.bwrap())
"""
    env = {**os.environ, "TMPDIR": str(home / "tmp")}
    ran = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr[-3000:]
    uid, said, folder, runs = ran.stdout.splitlines()
    assert (uid, said) == (str(SANDBOX_UID), "hi")
    assert not Path(folder).is_relative_to(home) and not Path(runs).is_relative_to(home)
    assert reachable_by(Path(folder).parent, SANDBOX_UID)
    assert not Path(runs).exists(), "the copy of bwrap is removed when the trainer exits"


def test_a_run_proves_its_local_sandbox_before_it_builds_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    registry.prove(SPEC)  # this node starts one and runs `true` in it
    registry.prove(SPEC.model_copy(update={"backend": "daytona"}))  # a remote provider's first sandbox is an episode's
    monkeypatch.setattr(bubblewrap, "_installed_bwrap", lambda: "/nonexistent/bwrap")
    with pytest.raises(
        SandboxError, match=r"no local sandbox can start on this node, so no episode could: .*/nonexistent/bwrap"
    ):
        registry.prove(SPEC)
