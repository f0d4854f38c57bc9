"""What agent episodes cost on this machine.

The sandbox (trainer/sandbox/local.py): one bubblewrap shell kept for an episode against a new bubblewrap sandbox
for every command, for the same episode of commands (`ls`, `cat k1`, `echo 1` in a folder holding k1), with the
same limits. Rows, each the median over the episodes: seconds to open the kept shell, per command in it, to close
it, and an episode's whole sandbox time; per command in a new sandbox, and its episode (the folder made and
removed as open_sandbox and close do); the ratios. The two sides alternate, an episode of each a round, so a
shared machine's drift over minutes falls on both. Both must give the same outputs before anything is timed.

    uv run python benchmarks/agent_rollout.py [--episodes 50]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlbuild.contracts.recipe import SandboxSection  # noqa: E402
from trainer.sandbox import open_sandbox  # noqa: E402
from trainer.sandbox.local import as_sandbox_user, bwrap_argv  # noqa: E402

COMMANDS = ("ls", "cat k1", "echo 1")
FILES = {"k1": "the first key\n"}
SPEC = SandboxSection()  # the recipe's defaults


def kept_shell_episode() -> tuple[float, list[float], float, list[str]]:
    """(seconds to open, per command, to close; the outputs) of one episode in one kept shell."""
    began = time.perf_counter()
    sandbox = open_sandbox(SPEC, FILES)
    opened = time.perf_counter() - began
    seconds, outputs = [], []
    for command in COMMANDS:
        began = time.perf_counter()
        result = sandbox.run(command)
        seconds.append(time.perf_counter() - began)
        assert result.exit_code == 0 and not result.note, result
        outputs.append(result.output)
    began = time.perf_counter()
    sandbox.close()
    return opened, seconds, time.perf_counter() - began, outputs


def sandbox_per_command_episode() -> tuple[list[float], float, list[str]]:
    """(seconds per command; the whole episode; the outputs) with a new sandbox for each command."""
    began = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="rlbuild-sandbox-"))
    for name, content in FILES.items():
        (folder / name).write_text(content)
    user = as_sandbox_user(folder)
    argv = bwrap_argv(SPEC, folder)
    seconds, outputs = [], []
    for command in COMMANDS:
        started = time.perf_counter()
        done = subprocess.run(
            [*argv, "/bin/sh", "-c", command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={},
            check=True,
            timeout=SPEC.command_timeout_s,
            **user,
        )
        seconds.append(time.perf_counter() - started)
        outputs.append(done.stdout.decode(errors="replace"))
    shutil.rmtree(folder)
    return seconds, time.perf_counter() - began, outputs


def measure_sandbox(episodes: int) -> dict[str, float]:
    """Medians over `episodes` episodes each way, after one untimed episode each way that must agree."""
    kept_outputs, fresh_outputs = kept_shell_episode()[3], sandbox_per_command_episode()[2]
    assert kept_outputs == fresh_outputs, (kept_outputs, fresh_outputs)
    opens, commands, closes, kept_episodes, fresh_commands, fresh_episodes = [], [], [], [], [], []
    for _ in range(episodes):
        opened, seconds, closed, _ = kept_shell_episode()
        opens.append(opened)
        commands += seconds
        closes.append(closed)
        kept_episodes.append(opened + sum(seconds) + closed)
        seconds, episode, _ = sandbox_per_command_episode()
        fresh_commands += seconds
        fresh_episodes.append(episode)
    row = {
        "open_s": statistics.median(opens),
        "command_s": statistics.median(commands),
        "close_s": statistics.median(closes),
        "episode_s": statistics.median(kept_episodes),
        "fresh_command_s": statistics.median(fresh_commands),
        "fresh_episode_s": statistics.median(fresh_episodes),
    }
    row["command_ratio"] = row["fresh_command_s"] / row["command_s"]
    row["episode_ratio"] = row["fresh_episode_s"] / row["episode_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=50, help="episodes each way (default 50)")
    episodes = parser.parse_args().episodes
    row = measure_sandbox(episodes)
    print(f"sandbox, {episodes} episodes of {len(COMMANDS)} commands ({', '.join(COMMANDS)}), medians:")
    print(f"  kept shell: open {row['open_s'] * 1e3:.1f} ms, command {row['command_s'] * 1e3:.2f} ms, ", end="")
    print(f"close {row['close_s'] * 1e3:.1f} ms, episode {row['episode_s'] * 1e3:.1f} ms")
    print(f"  sandbox per command: command {row['fresh_command_s'] * 1e3:.1f} ms, ", end="")
    print(f"episode {row['fresh_episode_s'] * 1e3:.1f} ms")
    print(f"  per command: {row['command_ratio']:.1f}x; per episode: {row['episode_ratio']:.2f}x (new / kept)")


if __name__ == "__main__":
    main()
