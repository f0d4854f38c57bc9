"""What agent episodes cost on this machine: the sandbox designs, and a tiny-agent training step.

The step (`measure_step`): the shipped tiny-agent experiment's recipe (config/experiments/tiny-agent.yaml: find the
key, 3 turns, the local sandbox) trained for a few steps by the real trainer on its base model; from the run's own
metrics, medians over the steps: episodes per second of rollout, the step's seconds, and the share of the step the
environment side took (`perf/environment_time_s`: sandboxes started and closed, commands run), against the goal of
at most 20%.

The sandbox (trainer/sandbox/local/bubblewrap.py): one bubblewrap shell kept for an episode against a new bubblewrap
sandbox for every command, and against a kept shell lent by a warm pool (trainer/sandbox/pool.py: acquired with the
episode's files, reset when given back), for the same episode of commands (`ls`, `cat k1`, `echo 1` in a folder
holding k1), with the same limits. Rows, each the median over the episodes: seconds to open the kept shell, per
command in it, to close it, and an episode's whole sandbox time; per command in a new sandbox, and its episode (the
folder made and removed as open_sandbox and close do); the pooled shell's acquire, command, give-back and episode,
its episodes back to back (the pool resets a sandbox in its own threads, so each acquire waits for the last reset);
the ratios. The kept shell and the new sandbox alternate, an episode of each a round, so a shared machine's drift
over minutes falls on both. All must give the same outputs before anything is timed.

    uv run python benchmarks/agent_rollout.py [--episodes 50] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlbuild.contracts.launch import load_launch  # noqa: E402
from rlbuild.contracts.recipe import SandboxSection  # noqa: E402
from rlbuild.contracts.tinymodel import AGENT_VARIANT  # noqa: E402
from rlbuild.dev.launches import base_model_dir, write_test_launch  # noqa: E402
from rlbuild.plan.series import deep_merge  # noqa: E402
from trainer.sandbox import Sandbox  # noqa: E402
from trainer.sandbox.local.bubblewrap import as_sandbox_user, bwrap_argv  # noqa: E402
from trainer.sandbox.pool import SandboxPool  # noqa: E402
from trainer.sandbox.registry import open_sandbox  # noqa: E402

COMMANDS = ("ls", "cat k1", "echo 1")
FILES = {"k1": "the first key\n"}
SPEC = SandboxSection()  # the recipe's defaults


def kept_shell_episode() -> tuple[float, list[float], float, list[str]]:
    """(seconds to open, per command, to close; the outputs) of one episode in one kept shell."""
    return _shell_episode(lambda: open_sandbox(SPEC, FILES))


def pooled_episode(pool: SandboxPool) -> tuple[float, list[float], float, list[str]]:
    """The same, in a kept shell lent by `pool`: closing gives it back, which resets it."""
    return _shell_episode(lambda: pool.acquire(FILES))


def _shell_episode(open_shell: Callable[[], Sandbox]) -> tuple[float, list[float], float, list[str]]:
    began = time.perf_counter()
    sandbox = open_shell()
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


def _record(times: dict[str, list[float]], episode: tuple[float, list[float], float, list[str]]) -> None:
    opened, seconds, closed, _ = episode
    times["open"].append(opened)
    times["command"] += seconds
    times["close"].append(closed)
    times["episode"].append(opened + sum(seconds) + closed)


def measure_sandbox(episodes: int) -> dict[str, float]:
    """Medians over `episodes` episodes each way, after one untimed episode each way that must agree (the pool's
    first starts its sandbox; the timed ones reuse it)."""
    with SandboxPool(SPEC) as pool:
        kept_outputs, fresh_outputs = kept_shell_episode()[3], sandbox_per_command_episode()[2]
        pooled_outputs = pooled_episode(pool)[3]
        assert kept_outputs == fresh_outputs == pooled_outputs, (kept_outputs, fresh_outputs, pooled_outputs)
        kept: dict[str, list[float]] = {"open": [], "command": [], "close": [], "episode": []}
        pooled: dict[str, list[float]] = {"open": [], "command": [], "close": [], "episode": []}
        fresh_commands, fresh_episodes = [], []
        for _ in range(episodes):
            _record(kept, kept_shell_episode())
            seconds, episode, _ = sandbox_per_command_episode()
            fresh_commands += seconds
            fresh_episodes.append(episode)
        # Back to back: the pool resets a sandbox in its own threads, so each acquire waits for the last episode's
        # reset, and an episode's time is what one after another costs.
        for _ in range(episodes):
            _record(pooled, pooled_episode(pool))
        assert pool.reused == episodes, "every timed pooled episode reuses the pool's sandbox"
    row = {f"{side}_s": statistics.median(values) for side, values in kept.items()}
    row |= {f"pool_{side}_s": statistics.median(values) for side, values in pooled.items()}
    row["fresh_command_s"] = statistics.median(fresh_commands)
    row["fresh_episode_s"] = statistics.median(fresh_episodes)
    row["command_ratio"] = row["fresh_command_s"] / row["command_s"]
    row["episode_ratio"] = row["fresh_episode_s"] / row["episode_s"]
    row["pool_ratio"] = row["episode_s"] / row["pool_episode_s"]
    row["pool_fresh_ratio"] = row["fresh_episode_s"] / row["pool_episode_s"]
    return row


def measure_step(steps: int, prompts: int | None = None) -> dict[str, float]:
    """Medians over `steps` training steps of the shipped tiny-agent recipe (`prompts` a step: its own by default)."""
    experiment = yaml.safe_load((REPO / "config" / "experiments" / "tiny-agent.yaml").read_text())
    role_plan = {k: experiment["role_plan"][k] for k in ("train_batch_size", "policy_mini_batch_size")}
    if prompts is not None:
        role_plan = {"train_batch_size": prompts, "policy_mini_batch_size": prompts}
    role_plan |= {k: experiment["role_plan"][k] for k in ("micro_train_batch_size_per_gpu", "n_samples_per_prompt")}
    recipe = deep_merge(experiment["recipe"], {"trainer": {"max_steps": steps, "eval_interval": -1}})
    with tempfile.TemporaryDirectory(prefix="rlbuild-agent-step-") as tmp:
        launch = write_test_launch(
            Path(tmp),
            task="find_key",
            model_dir=base_model_dir(experiment["seed"], AGENT_VARIANT),
            role_plan=role_plan,
            recipe=recipe,
        )
        command = [sys.executable, "-m", "trainer", "run", "--launch", str(launch)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        metrics = Path(load_launch(str(launch)).artifacts.metrics_uri).read_text().splitlines()
    records = [r for r in map(json.loads, metrics) if "perf/step_time_s" in r]
    assert len(records) == steps, records
    return step_row(records, role_plan["train_batch_size"] * role_plan["n_samples_per_prompt"])


def step_row(records: list[dict[str, float]], episodes: int) -> dict[str, float]:
    """Medians over a run's step records (its metrics lines with `perf/step_time_s`) of `episodes` episodes each."""

    def median(key: str) -> float:
        return statistics.median(float(r[key]) for r in records)

    row = {
        "episodes_per_step": float(episodes),
        "step_s": median("perf/step_time_s"),
        "rollout_s": median("perf/rollout_time_s"),
        "environment_s": median("perf/environment_time_s"),
        "turns_mean": median("episode/turns_mean"),
    }
    row["episodes_per_s"] = episodes / row["rollout_s"]
    row["environment_share"] = row["environment_s"] / row["step_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=50, help="episodes each way (default 50)")
    parser.add_argument("--steps", type=int, default=4, help="tiny-agent training steps (default 4)")
    args = parser.parse_args()
    step = measure_step(args.steps)
    print(f"tiny-agent step, {args.steps} steps of {step['episodes_per_step']:.0f} episodes, medians:")
    print(f"  step {step['step_s']:.2f} s, rollout {step['rollout_s']:.2f} s, ", end="")
    print(f"{step['episodes_per_s']:.1f} episodes/s, {step['turns_mean']:.2f} turns an episode")
    share = f"{step['environment_s']:.2f} s = {step['environment_share']:.0%}"
    print(f"  environment and sandbox {share} of the step (goal: at most 20%)")
    episodes = args.episodes
    row = measure_sandbox(episodes)
    print(f"sandbox, {episodes} episodes of {len(COMMANDS)} commands ({', '.join(COMMANDS)}), medians:")
    print(f"  kept shell: open {row['open_s'] * 1e3:.1f} ms, command {row['command_s'] * 1e3:.2f} ms, ", end="")
    print(f"close {row['close_s'] * 1e3:.1f} ms, episode {row['episode_s'] * 1e3:.1f} ms")
    print(f"  sandbox per command: command {row['fresh_command_s'] * 1e3:.1f} ms, ", end="")
    print(f"episode {row['fresh_episode_s'] * 1e3:.1f} ms")
    print(f"  per command: {row['command_ratio']:.1f}x; per episode: {row['episode_ratio']:.2f}x (new / kept)")
    print(
        f"  pooled shell, back to back: acquire (the last reset included) {row['pool_open_s'] * 1e3:.1f} ms, "
        f"command {row['pool_command_s'] * 1e3:.2f} ms, ",
        end="",
    )
    print(f"give back {row['pool_close_s'] * 1e3:.1f} ms, episode {row['pool_episode_s'] * 1e3:.1f} ms")
    print(f"  per episode: kept / pooled {row['pool_ratio']:.2f}x, ", end="")
    print(f"sandbox per command / pooled {row['pool_fresh_ratio']:.2f}x")


if __name__ == "__main__":
    main()
