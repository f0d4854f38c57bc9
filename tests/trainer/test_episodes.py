"""Agent episodes (trainer/agents/episodes.py): exact tokens turn by turn, observation tokens masked from every loss
term, truncation, environments that fail, and an environment written to skyrl-gym's convention played unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlbuild.contracts.recipe import EnvironmentSection, Recipe
from tests.trainer.skyrl_convention import RetryAddition
from trainer import tiny
from trainer.agents.episodes import EpisodePlayer, EpisodeSetupError, episode_statistics, is_played, turn_stop_ids
from trainer.workers import grpo
from trainer.workers.batch import update_batch
from trainer.workers.engines import Rollout, SamplingParams, TorchEngine
from trainer.workers.policy import forward_logprobs

TOKENIZER = tiny.build_tokenizer()
SKYRL = "tests.trainer.skyrl_convention:RetryAddition"
ROW = {"prompt": "3+4=", "answer": "7"}


def _ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


class Script:
    """The engines' `generate` for these tests: each row plays its list of actions in turn (text; `<eos>` at the
    end of one means the policy ended it with <eos>), stopping at the turn stop as the engines do."""

    def __init__(self, actions: dict[str, list[str]]) -> None:
        self.actions = actions
        self.calls: list[tuple[list[list[int]], SamplingParams, int]] = []

    def __call__(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
        self.calls.append((prompts, params, seed))
        out = []
        for prompt in prompts:
            text = TOKENIZER.decode(prompt, skip_special_tokens=True)
            turn = text.count("no.")  # every earlier turn was answered "no."
            action = self.actions[text.split("=")[0] + "="][turn]
            eos = action.endswith("<eos>")
            ids = _ids(action.removesuffix("<eos>"))[: params.max_tokens] + ([TOKENIZER.eos_token_id] if eos else [])
            stop = next((i for i, t in enumerate(ids) if t in params.stop_token_ids), None)
            ids = ids if stop is None else ids[: stop + 1]
            out.append(Rollout(ids, [-0.25] * len(ids), eos and stop is None, stop is not None))
        return out


def _section(**keys: Any) -> EnvironmentSection:
    return EnvironmentSection.model_validate({"env_class": SKYRL, "turn_stop": ".", **keys})


def _play(script: Script, rows: list[dict[str, Any]], **keys: Any) -> list[Any]:
    player = EpisodePlayer(keys.pop("env_class", SKYRL), _section(**keys), TOKENIZER)
    try:
        return player.play(script, rows, SamplingParams(max_tokens=6), seed=5)
    finally:
        player.close()


def test_an_episode_is_exact_tokens_with_observation_tokens_masked() -> None:
    script = Script({"3+4=": ["8.", "7."]})
    [episode] = _play(script, [ROW], max_turns=3, max_context_tokens=64)
    # The second turn continued from the first turn's exact ids plus the observation's, never re-tokenised text.
    first, second = script.calls
    assert second[0] == [first[0][0] + _ids("8.") + _ids("no.")]
    assert second[2] != first[2]  # each turn samples with its own seed
    assert episode.prompt_ids == TOKENIZER("3+4=")["input_ids"]
    assert episode.rollout.token_ids == _ids("8.") + _ids("no.") + _ids("7.")
    assert episode.rollout.loss_mask == [1, 1, 0, 0, 0, 1, 1]
    assert episode.rollout.logprobs == [-0.25, -0.25, 0.0, 0.0, 0.0, -0.25, -0.25]
    assert (episode.reward, episode.ended, episode.error) == (1.0, "done", None)
    assert [(t.action, t.observation, t.reward) for t in episode.turns] == [("8.", "no.", 0.0), ("7.", "", 1.0)]
    assert [(t.action_tokens, t.observation_tokens) for t in episode.turns] == [(2, 3), (2, 0)]
    record = episode.record()
    assert record["turns"][0]["observation"] == "no." and record["reward"] == 1.0
    assert record["tokens"] == {"prompt": 5, "completion": 7}


def test_episodes_end_at_max_turns_at_the_context_limit_and_at_eos() -> None:
    script = Script({"3+4=": ["1.", "2.", "3."], "1+1=": ["5<eos>"], "2+2=": ["9.", "8."]})
    rows = [ROW, {"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    turns, eos = _play(script, rows[:2], env_class=f"{__name__}:Patient", max_turns=2, max_context_tokens=64)
    assert (turns.ended, turns.reward, len(turns.turns), turns.truncated) == ("max_turns", 0.0, 2, True)
    assert turns.rollout.loss_mask == [1, 1, 0, 0, 0, 1, 1]  # no observation after the last action
    assert (eos.ended, eos.rollout.finished, len(eos.turns)) == ("eos", True, 1)
    assert eos.rollout.token_ids[-1] == TOKENIZER.eos_token_id
    # 5 prompt ids + "9." + "no." leaves 2 of a 12-token context: the second action is cut there, and ends it.
    [cut] = _play(Script({"2+2=": ["9.", "888."]}), [rows[2]], max_turns=3, max_context_tokens=12)
    assert (cut.ended, cut.truncated) == ("context", True)
    assert len(cut.prompt_ids) + len(cut.rollout.token_ids) == 12
    assert cut.rollout.loss_mask == [1, 1, 0, 0, 0, 1, 1]
    stats = episode_statistics([turns, eos, cut])
    assert stats["truncated_frac"] == pytest.approx(2 / 3) and stats["ended_eos_frac"] == pytest.approx(1 / 3)
    assert stats["turns_max"] == 2.0


class Patient(RetryAddition):
    """Never ends an episode itself but on a right answer: the player's max_turns has to."""

    def __init__(self, env_config: dict[str, Any] | None = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__(env_config, extras)
        self.max_turns = 100


class Failing(RetryAddition):
    """Fails on its second step (a bug in the environment, or its sandbox gone)."""

    def step(self, action: str) -> dict[str, Any]:
        if self.turns == 1:
            raise RuntimeError("the verifier crashed")
        return super().step(action)


class FailingAtInit(RetryAddition):
    def init(self, prompt: str) -> tuple[str, dict[str, Any]]:
        raise ValueError("no such task")


def test_an_environment_that_raises_ends_its_episode_as_an_error_and_the_others_play_on() -> None:
    script = Script({"3+4=": ["1.", "7."], "2+2=": ["4."]})
    rows = [ROW, {"prompt": "2+2=", "answer": "4"}]
    failed, solved = _play(script, rows, env_class=f"{__name__}:Failing", max_turns=3, max_context_tokens=64)
    assert (failed.ended, failed.reward) == ("error", 0.0)
    assert failed.error is not None and failed.error.startswith("step: RuntimeError: the verifier crashed at ")
    assert (solved.ended, solved.reward) == ("done", 1.0)
    [never] = _play(script, rows[:1], env_class=f"{__name__}:FailingAtInit", max_turns=3, max_context_tokens=64)
    assert (never.ended, never.reward, never.turns) == ("error", 0.0, [])
    assert (never.rollout.token_ids, never.rollout.loss_mask) == ([TOKENIZER.eos_token_id], [0])  # trains nothing
    assert never.error is not None and never.error.startswith("init: ValueError: no such task")
    assert episode_statistics([failed, solved, never])["error_frac"] == pytest.approx(2 / 3)


def test_settings_no_episode_can_be_played_with_are_refused_by_name() -> None:
    with pytest.raises(EpisodeSetupError, match=r"environment.turn_stop='\|' is in no token"):
        turn_stop_ids(TOKENIZER, "|")
    assert turn_stop_ids(TOKENIZER, ".") == tuple(_ids("."))
    with pytest.raises(EpisodeSetupError, match=r"'exact_match' scores one completion.*max_turns=3 and a sandbox"):
        is_played("exact_match", EnvironmentSection.model_validate({"max_turns": 3, "sandbox": {}}))
    assert not is_played("exact_match", EnvironmentSection())
    assert is_played(SKYRL, _section())


def test_observation_tokens_move_no_loss_term(tmp_path: Path) -> None:
    """The policy loss, KL and entropy terms take no gradient through an observation token's own prediction: an
    episode whose last tokens are an observation (cut at the context limit) trains exactly the same whatever that
    observation says, and the logits predicting observation tokens get a zero gradient."""
    torch.manual_seed(0)
    model = tiny.build_model(TOKENIZER, seed=0)
    recipe = Recipe.model_validate(
        {
            "trainer": {"train_batch_size": 1, "policy_mini_batch_size": 1, "algorithm": {"use_kl_loss": True}},
            "generator": {"n_samples_per_prompt": 2},
        }
    )
    prompt = TOKENIZER("3+4=")["input_ids"]

    def gradient(observation: str) -> tuple[torch.Tensor, torch.Tensor]:
        observed = _ids(observation)
        rollouts = [
            Rollout(_ids("8.") + observed, [-1.0, -1.0] + [0.0] * len(observed), False, loss_mask=[1, 1] + [0] * 3),
            Rollout(_ids("7."), [-1.0, -1.0], False, True),
        ]
        rewards = torch.tensor([0.0, 1.0])
        advantages = grpo.group_advantages(rewards, 2)
        batch = update_batch([prompt, prompt], rollouts, rewards, advantages, recipe, TOKENIZER.pad_token_id).tensors
        model.zero_grad()
        logp, entropy = forward_logprobs(model, batch, 1.0, True)
        assert entropy is not None
        mask = batch["completion_mask"]
        policy, _ = grpo.policy_loss(
            logp, logp.detach() + 0.1, batch["advantages"][:, None].expand_as(logp), eps_clip_low=0.2, eps_clip_high=0.2
        )
        kl = grpo.kl_k3(logp, logp.detach() - 0.3)
        loss = (policy * batch["loss_weights"]).sum() + (kl * batch["seq_weights"]).sum()
        loss = loss - 0.01 * (entropy * batch["token_weights"]).sum()
        logp.retain_grad()
        loss.backward()
        assert logp.grad is not None
        assert mask[0].tolist()[:5] == [1.0, 1.0, 0.0, 0.0, 0.0]
        assert torch.all(logp.grad[0, 2:5] == 0) and torch.all(logp.grad[0, :2] != 0)
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), logp.detach()

    told, told_logp = gradient("no.")
    other, other_logp = gradient("yes")
    assert not torch.equal(told_logp[0, 2:5], other_logp[0, 2:5])  # the observations did differ
    assert torch.equal(told, other)


def test_a_skyrl_convention_environment_plays_on_the_torch_engine(tmp_path: Path) -> None:
    """The real engine stops each turn at the turn stop and continues from the observation's tokens."""
    model = tiny.build_model(TOKENIZER, seed=1)
    model.save_pretrained(tmp_path)
    TOKENIZER.save_pretrained(tmp_path)
    engine = TorchEngine(tmp_path)
    player = EpisodePlayer(SKYRL, _section(max_turns=3, max_context_tokens=40), TOKENIZER)
    try:
        episodes = player.play(engine.generate, [ROW] * 4, SamplingParams(max_tokens=5, temperature=1.0), seed=2)
    finally:
        player.close()
    stop = _ids(".")[0]
    for episode in episodes:
        assert episode.ended in ("done", "eos", "max_turns", "context")
        mask, ids = episode.rollout.loss_mask, episode.rollout.token_ids
        assert mask is not None and len(mask) == len(ids) == len(episode.rollout.logprobs)
        sampled = [t for t, m in zip(ids, mask, strict=True) if m]
        assert sum(t.action_tokens for t in episode.turns) == len(sampled)
        # An action ends at the turn stop, at <eos> (which ends the episode) or at max_tokens; every observation is
        # the environment's "no." exactly, after each turn but the last.
        for turn in episode.turns:
            assert turn.action.count(".") <= 1 and turn.action_tokens <= 5
        assert [t.observation for t in episode.turns[:-1]] == ["no."] * (len(episode.turns) - 1)
        observed = [t for t, m in zip(ids, mask, strict=True) if not m]
        assert observed == _ids("no.") * (len(episode.turns) - 1)
        actions = [t for t, m in zip(ids, mask, strict=True) if m]
        assert actions.count(stop) == sum(t.action.endswith(".") for t in episode.turns)


def test_the_replay_command_plays_a_file_of_actions_through_the_launch_environment(tmp_path: Path) -> None:
    from rlbuild.contracts.launch import load_launch
    from rlbuild.contracts.rows import read_rows
    from rlbuild.dev.launches import write_test_launch

    environment = {"env_class": SKYRL, "max_turns": 3, "turn_stop": ".", "max_context_tokens": 48}
    launch = write_test_launch(tmp_path, recipe={"environment": environment})
    uri = load_launch(str(launch)).inputs.validation_data[0].uri
    row = next(read_rows(Path(uri)))
    wrong = str(int(row["answer"]) + 1)
    actions = tmp_path / "actions.txt"
    actions.write_text(f"{wrong}\n{row['answer']}.\n")
    command = [sys.executable, "-m", "trainer", "episode", "--launch", str(launch), "--row", "0"]
    result = subprocess.run([*command, "--actions", str(actions), "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    replayed = json.loads(result.stdout)
    assert replayed["turns"] == [
        {"action": f"{wrong}.", "observation": "no."},  # the turn stop is added where a line lacks it
        {"action": f"{row['answer']}.", "observation": ""},
    ]
    assert (replayed["reward"], replayed["done"], replayed["ended"]) == (1.0, True, "done")
    assert 0 < replayed["seconds"] < 30
    readable = subprocess.run([*command, "--actions", str(actions)], capture_output=True, text=True)
    assert readable.returncode == 0 and f"[1] $ {wrong}.\nno.\n" in readable.stdout
    assert "reward 1; ended: done" in readable.stdout
    actions.write_text(f"{wrong}\n")  # the episode wants a second action
    short = subprocess.run([*command, "--actions", str(actions)], capture_output=True, text=True)
    assert short.returncode == 2 and "not over after the file's 1 actions" in short.stderr
    out_of_range = subprocess.run([*command[:-1], "99", "--actions", str(actions)], capture_output=True, text=True)
    assert out_of_range.returncode == 2 and "--row 99 is not a row of the validation split" in out_of_range.stderr
