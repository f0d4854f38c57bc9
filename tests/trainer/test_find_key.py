"""Find the key (trainer/agents/find_key.py) and the tiny agent model it is learnt with (trainer/tiny.py,
trainer/agents/warm_start.py): the single-turn model as it was, the agent variant's tokenizer round-tripping its
transcripts, rows reproducible with disjoint splits, episodes scored against a real shell in the real sandbox, and
preflight naming an unknown variant."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from rlbuild.contracts.recipe import SandboxSection
from rlbuild.contracts.tinymodel import AGENT_VARIANT, DEFAULT_VARIANT, tiny_model_config
from rlbuild.plan.preflight import check_experiment, parse_experiment
from tests.conftest import EXPERIMENTS
from trainer import tiny
from trainer.agents import find_key, warm_start
from trainer.agents.find_key import FindTheKey
from trainer.sandbox import Sandbox
from trainer.sandbox.registry import open_sandbox

SANDBOX = SandboxSection(command_timeout_s=5, episode_timeout_s=20)
ROW = {"prompt": find_key.PROMPT, "answer": "927", "files": find_key.make_files("kbj", "dhe", 927, 413)}


def test_the_single_turn_variant_is_the_one_addition_and_reversal_learnt_with() -> None:
    assert tiny_model_config() == tiny_model_config(DEFAULT_VARIANT)
    assert {k: tiny_model_config()[k] for k in ("vocab_size", "hidden_size", "max_position_embeddings")} == {
        "vocab_size": 80,
        "hidden_size": 32,
        "max_position_embeddings": 64,
    }
    tokenizer = tiny.build_tokenizer()
    assert len(tokenizer) == 80
    assert tokenizer("3+4=7 rev abc:")["input_ids"] == [1, 7, 67, 8, 69, 11, 66, 31, 18, 35, 66, 14, 15, 16, 72]


def test_the_agent_variant_builds_and_its_saved_tokenizer_round_trips_transcripts(tmp_path: Path) -> None:
    tokenizer = tiny.build_tokenizer(AGENT_VARIANT)
    model = tiny.build_model(tokenizer, seed=0, variant=AGENT_VARIANT)
    assert model.config.max_position_embeddings >= 128 and model.config.vocab_size == len(tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)  # as the trainer loads it: Qwen2's byte-level tokenizer
    rng = random.Random(0)
    transcripts = ["".join(text for text, _ in warm_start.scripted_episode(rng)) for _ in range(20)]
    shown = "".join(sorted(find_key.SHOWN))  # every character an observation may hold
    for text in [*transcripts, shown, find_key.observation("cat: zzz: No such file or directory\n")]:
        ids = tokenizer(text)["input_ids"]
        assert loaded(text)["input_ids"] == ids, text
        assert len(ids) == len(text) + 1 and tokenizer.unk_token_id not in ids, text
        assert loaded.decode(ids, skip_special_tokens=True) == text
    # The single-turn characters keep their ids: the agent tokenizer only adds to them.
    old = tiny.build_tokenizer()
    assert tokenizer(tiny.CHARACTERS)["input_ids"] == old(tiny.CHARACTERS)["input_ids"]


def test_rows_are_reproducible_and_validation_holds_names_and_values_train_never_has() -> None:
    task = FindTheKey()
    train, validation = task.rows("train", "seed-0"), task.rows("validation", "seed-0")
    assert train == task.rows("train", "seed-0") and train != task.rows("train", "seed-1")
    for row in train + validation:
        assert row["prompt"] == find_key.PROMPT
        keys = [name for name in row["files"] if name.startswith(find_key.KEY_PREFIX)]
        assert len(keys) == 1 and len(row["files"]) == 2 and row["files"][keys[0]] == f"{row['answer']}\n"

    def names(rows: list[dict]) -> set[str]:
        return {name for row in rows for name in row["files"]}

    def values(rows: list[dict]) -> set[str]:
        return {content for row in rows for content in row["files"].values()}

    assert not names(train) & names(validation) and not values(train) & values(validation)


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with open_sandbox(SANDBOX, ROW["files"]) as opened:
        yield opened


def _play(sandbox: Sandbox, actions: list[str], max_turns: int = 3, row: dict | None = None) -> tuple[float, str]:
    """Play `actions` until the episode is done: its reward and its transcript as the model reads it."""
    env = FindTheKey({}, {**(row or ROW), "max_turns": max_turns, "sandbox": sandbox})
    transcript, _ = env.init(find_key.PROMPT)
    for action in actions:
        out = env.step(action)
        transcript += action + "".join(m["content"] for m in out["observations"])
        if out["done"]:
            return out["reward"], transcript
    raise AssertionError(f"{actions} did not end the episode")


def test_the_rule_finds_the_key_and_its_transcript_is_the_warm_starts(sandbox: Sandbox) -> None:
    reward, transcript = _play(sandbox, ["ls|", "cat kbj|", "ans 927"])
    assert (reward, transcript) == (1.0, "find key:|ls|>dhe kbj|cat kbj|>927|ans 927")
    assert _play(sandbox, ["ls|", "cat kbj|", "ans 927|"])[0] == 1.0  # the answer may end with the turn stop
    # The warm start writes the shell's output instead of running it: the same text as the real shell's.
    assert find_key.observation(warm_start.listing(ROW["files"])) == ">dhe kbj|"


def test_a_wrong_answer_a_rewritten_key_and_no_answer_score_nothing(sandbox: Sandbox) -> None:
    assert _play(sandbox, ["ls|", "cat dhe|", "ans 413"]) == (0.0, "find key:|ls|>dhe kbj|cat dhe|>413|ans 413")
    assert _play(sandbox, ["echo 1 >kbj|", "ans 1"])[0] == 0.0  # the key as the row has it, not as rewritten
    reward, transcript = _play(sandbox, ["cat zzz|", "hello|", "ls|"])
    assert reward == 0.0  # three turns and no answer: the last action does not run
    # Commands that fail are answered with the shell's error (its wording is the shell's), cut short.
    missing, unknown = transcript.split("|")[2:5:2]
    assert missing.startswith(">cat: zzz: No such") and len(missing) == 1 + find_key.OBSERVATION_CHARS
    assert unknown.startswith(">") and len(unknown) <= 1 + find_key.OBSERVATION_CHARS
    assert transcript.endswith(f"{unknown}|ls|")


def test_an_unknown_base_model_revision_fails_preflight_naming_the_choices() -> None:
    doc = yaml.safe_load((EXPERIMENTS / "tiny-agent.yaml").read_text())
    assert check_experiment(parse_experiment(doc, "tiny-agent"))[1] == []
    doc["model"]["revision"] = "tiny-agent-h99"
    found = {v.field: (v.message, v.fix) for v in check_experiment(parse_experiment(doc, "t"))[1]}
    assert found == {
        "model.revision": (
            "'tiny-agent-h99' names no tiny model variant of artifact:base_model",
            f"use one of {DEFAULT_VARIANT}, {AGENT_VARIANT} (rlbuild/contracts/tinymodel.py)",
        )
    }
    doc["model"]["revision"] = DEFAULT_VARIANT  # (its 64 positions are too few for the episode, also reported)
    found = {v.field: v.message for v in check_experiment(parse_experiment(doc, "t"))[1]}
    assert found["model.tokenizer.revision"] == (
        f"'{AGENT_VARIANT}' differs from model.revision '{DEFAULT_VARIANT}': one base model is built per experiment"
    )
