"""What the episode player records of its episodes' health (trainer/agents/episodes.py), in real local sandboxes:
each episode's first failure by kind (a command past its limit, past the episode's time, a shell that exited, an
environment that could not set up), the step's sandbox statistics, and the liveness it publishes while a batch
plays (forced at the batch's beginning and end, counts carried over batches that finished nothing)."""

from __future__ import annotations

from typing import Any

import pytest

from rlbuild.contracts.recipe import EnvironmentSection
from tests.trainer.skyrl_convention import BaseTextEnv
from trainer import tiny
from trainer.agents.episodes import (
    SANDBOX_ERRORS,
    Episode,
    EpisodePlayer,
    ended_kind,
    episode_statistics,
    sandbox_statistics,
)
from trainer.sandbox import CommandResult, Sandbox
from trainer.sandbox.registry import open_sandbox
from trainer.workers.engines import Rollout, SamplingParams

TOKENIZER = tiny.build_tokenizer()
COMMAND_TIMEOUT_S = 0.5


class RunsItsCommand(BaseTextEnv):
    """Runs its row's `command` in the episode's sandbox at its one step (reward 1 if the command finished); a row
    without one cannot set up."""

    def __init__(self, env_config: dict[str, Any] | None = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.extras = extras or {}

    def init(self, prompt: str) -> tuple[str, dict[str, Any]]:
        if self.extras.get("command") is None:
            raise RuntimeError("the task's files could not be prepared")
        return prompt, {}

    def step(self, action: str) -> dict[str, Any]:
        result = self.extras["sandbox"].run(self.extras["command"])
        return {"observations": [], "reward": float(not result.ended), "done": True, "metadata": {}}


class OpensItsOwn(RunsItsCommand):
    """Opens its own sandbox from the recipe's spec, as a Harbor task does (`opens_sandbox`): the player lends none
    and reads the failure from the sandbox it exposes. A row without a command: the sandbox does not start."""

    opens_sandbox = True

    def init(self, prompt: str) -> tuple[str, dict[str, Any]]:
        if self.extras.get("command") is None:
            raise TimeoutError("the provider did not start the sandbox in 120 s")
        self.sandbox: Sandbox = open_sandbox(self.extras["sandbox_spec"], {})
        return prompt, {}

    def step(self, action: str) -> dict[str, Any]:
        result = self.sandbox.run(self.extras["command"])
        return {"observations": [], "reward": float(not result.ended), "done": True, "metadata": {}}

    def close(self) -> None:
        if hasattr(self, "sandbox"):
            self.sandbox.close()


def _answer(prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
    ids = TOKENIZER("1.", add_special_tokens=False)["input_ids"]
    return [Rollout(ids, [-0.5] * len(ids), False, True) for _ in prompts]


def _player(episode_timeout_s: float = 20.0, env: str = "RunsItsCommand") -> EpisodePlayer:
    sandbox = {"command_timeout_s": COMMAND_TIMEOUT_S, "episode_timeout_s": episode_timeout_s}
    section = {"env_class": f"{__name__}:{env}", "turn_stop": ".", "max_context_tokens": 64}
    return EpisodePlayer(
        section["env_class"], EnvironmentSection.model_validate(section | {"sandbox": sandbox}), TOKENIZER
    )


def _row(command: str | None) -> dict[str, Any]:
    return {"prompt": "1+1=", "answer": "2", "command": command}


def test_each_episode_records_its_first_failure_and_the_player_publishes_them_as_they_end() -> None:
    player = _player()
    published: list[tuple[dict[str, Any], bool]] = []
    player.liveness.publish = lambda state, now: published.append((state, now))
    try:
        rows = [_row("true"), _row("sleep 30"), _row("exit 3"), _row(None), _row("echo ok")]
        episodes = player.play(_answer, rows, SamplingParams(max_tokens=4), seed=1)
    finally:
        player.close()
    assert [e.sandbox_error for e in episodes] == [None, "command_timeout", "sandbox_ended", "setup_error", None]
    assert [e.ended for e in episodes] == ["done", "done", "done", "error", "done"]
    assert episodes[1].record()["sandbox_error"] == "command_timeout"
    stats = sandbox_statistics(episodes)
    assert stats["errors"] == 3 and stats["errors_command_timeout"] == 1 and stats["errors_start_error"] == 0
    assert {f"errors_{kind}" for kind in SANDBOX_ERRORS} <= set(stats)
    assert COMMAND_TIMEOUT_S <= stats["command_s_max"] < COMMAND_TIMEOUT_S + 5, stats
    assert 0 < stats["command_s_mean"] < stats["command_s_max"] and 0 < stats["start_s_mean"] <= stats["start_s_max"]
    assert episode_statistics(episodes)["finished"] == 2
    (first, forced), (last, at_end) = published[0], published[-1]
    assert forced and first["playing"] and first["finished"] == 0 and first["errors"] == {}
    assert at_end and not last["playing"] and last["finished"] == 2 and last["last_finished"] is not None
    assert last["errors"] == {"command_timeout": 1, "sandbox_ended": 1, "setup_error": 1}, last
    assert any(not now for _, now in published[1:-1])  # as episodes end, throttled by the writer


def test_batches_that_finish_nothing_carry_their_count_and_since() -> None:
    player = _player()
    published: list[dict[str, Any]] = []
    player.liveness.publish = lambda state, now: published.append(state)
    try:
        for _ in range(2):
            player.play(_answer, [_row("exit 1")] * 2, SamplingParams(max_tokens=4), seed=1)
        first_since = published[-1]["since"]
        assert published[-1]["errors"] == {"sandbox_ended": 4} and published[-1]["finished"] == 0
        player.play(_answer, [_row("true")], SamplingParams(max_tokens=4), seed=1)
        assert published[-1]["since"] == first_since and published[-1]["finished"] == 1
        player.play(_answer, [_row("true")], SamplingParams(max_tokens=4), seed=1)  # after one finished: afresh
        assert published[-1]["since"] > first_since and published[-1]["errors"] == {}
    finally:
        player.close()


def test_an_episode_out_of_sandbox_time_is_an_episode_timeout() -> None:
    player = _player(episode_timeout_s=0.3)  # less than the command's own limit
    try:
        [episode] = player.play(_answer, [_row("sleep 30")], SamplingParams(max_tokens=4), seed=1)
    finally:
        player.close()
    assert episode.sandbox_error == "episode_timeout"


def test_a_sandbox_the_environment_opens_itself_is_watched_too() -> None:
    player = _player(env="OpensItsOwn")
    try:
        rows = [_row("true"), _row("sleep 30"), _row("exit 3"), _row(None)]
        episodes = player.play(_answer, rows, SamplingParams(max_tokens=4), seed=1)
    finally:
        player.close()
    assert player.sandboxes is None  # nothing pooled: each episode's sandbox is its environment's
    assert [e.sandbox_error for e in episodes] == [None, "command_timeout", "sandbox_ended", "start_error"]
    assert episodes[0].sandbox["commands"] == 1 and episodes[0].sandbox["start_s"] > 0, episodes[0].sandbox


@pytest.mark.parametrize(
    ("seconds", "left", "kind"),
    [
        (10.02, 60.0, "command_timeout"),
        (3.0, 3.0, "episode_timeout"),  # the episode had less time left than a command's limit
        (0.0, -1.0, "episode_timeout"),  # used up before the command
        (0.0, 60.0, "sandbox_ended"),  # gone before the command
        (1.2, 60.0, "sandbox_ended"),  # the shell exited or was killed mid-command
    ],
)
def test_which_limit_a_command_that_ended_its_sandbox_ran_into(seconds: float, left: float, kind: str) -> None:
    assert ended_kind(CommandResult("", None, seconds, "", True), left, 10.0) == kind


def test_statistics_of_episodes_without_a_sandbox_have_no_latencies() -> None:
    episode = Episode(row={}, prompt_ids=[1], rollout=Rollout([2], [0.0], True), reward=0.0, ended="eos")
    assert "start_s_mean" not in sandbox_statistics([episode]) and sandbox_statistics([episode])["errors"] == 0
