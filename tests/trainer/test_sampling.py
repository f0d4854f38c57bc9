"""Dynamic sampling: a step draws sample batches until enough groups carry signal, trains on those first, and
draws the same samples again when resumed at its cursor."""

from __future__ import annotations

from typing import Any

from rlbuild.contracts.recipe import Recipe
from trainer import sampling, tiny
from trainer.env import ExactMatch
from trainer.workers.engines import Rollout, SamplingParams

TOKENIZER = tiny.build_tokenizer()
# Prompts whose groups carry signal: half their samples answer right. Every other group is all wrong.
SOLVABLE = {"1+1=", "2+2="}
ROWS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(8)]


class Engines:
    """The roles' `generate` for this test: a right answer in every other sample of a solvable prompt."""

    def __init__(self) -> None:
        self.seeds: list[int] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
        self.seeds.append(seed)
        out = []
        for i, prompt in enumerate(prompts):
            text = TOKENIZER.decode(prompt, skip_special_tokens=True)
            answer = str(2 * int(text[0])) if text in SOLVABLE and i % 2 else "x"
            ids = TOKENIZER(answer, add_special_tokens=False)["input_ids"] + [TOKENIZER.eos_token_id]
            out.append(Rollout(ids, [-0.5] * len(ids), True))
        return out


def _recipe(dynamic: dict[str, Any]) -> Recipe:
    return Recipe.model_validate(
        {
            "trainer": {"train_batch_size": 2, "seed": 3, "algorithm": {"dynamic_sampling": dynamic}},
            "generator": {"n_samples_per_prompt": 4},
        }
    )


def _step(dynamic: dict[str, Any], cursor: int = 0) -> tuple[sampling.Step, Engines]:
    engines = Engines()
    step = sampling.sample_step(engines, TOKENIZER, ExactMatch(), ROWS, _recipe(dynamic), 5, cursor)  # type: ignore[arg-type]
    return step, engines


def _signal(samples: sampling.Samples) -> list[bool]:
    return [len(set(g.rewards.tolist())) > 1 for g in samples.groups(4)]


def test_without_dynamic_sampling_a_step_trains_on_the_one_batch_it_drew() -> None:
    step, engines = _step({"type": None})
    assert step.batches == 1 and step.cursor == 2 and step.update is step.drawn
    assert engines.seeds == [sampling.rollout_seed(3, 5, 0)]


def test_filter_draws_until_enough_groups_carry_signal_and_trains_on_them_first() -> None:
    step, engines = _step({"type": "filter", "max_sample_batches": 8})
    assert _signal(step.update) == [True, True]
    assert step.cursor == 2 * step.batches and len(step.drawn.rows) == 2 * 4 * step.batches
    assert 1 < step.batches <= 8 and sum(_signal(step.drawn)) == 2
    assert engines.seeds == [sampling.rollout_seed(3, 5, k) for k in range(step.batches)]
    assert len(set(engines.seeds)) == step.batches
    again, _ = _step({"type": "filter", "max_sample_batches": 8})
    assert again.update.rows == step.update.rows and again.cursor == step.cursor


def test_filter_tops_up_with_groups_without_signal_when_its_batches_run_out() -> None:
    step, _ = _step({"type": "filter", "max_sample_batches": 1})
    assert step.batches == 1 and len(step.update.rows) == 2 * 4
    signal = _signal(step.update)
    assert signal == sorted(signal, reverse=True)  # signal first, then the top-up
