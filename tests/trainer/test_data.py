"""Tasks, data order, GRPO group construction and batch layout (no models, no Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlbuild.contracts.rows import read_rows
from trainer import data, tasks
from trainer.errors import TrainerError
from trainer.workers import batch as layout
from trainer.workers import grpo
from trainer.workers.engines import Rollout


@pytest.mark.parametrize(("task", "n_train", "n_validation"), [("addition", 80, 20), ("reversal", 100, 25)])
def test_splits_are_deterministic_disjoint_and_complete(task: str, n_train: int, n_validation: int) -> None:
    train = tasks.generate(task, "train", "seed-0")
    validation = tasks.generate(task, "validation", "seed-0")
    assert train == tasks.generate(task, "train", "seed-0")
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in validation}
    assert len(train) == n_train and len(validation) == n_validation
    assert len({r["prompt"] for r in train + validation}) == n_train + n_validation
    assert validation != tasks.generate(task, "validation", "seed-1")


def test_rows_are_correct() -> None:
    rows = tasks.generate("addition", "train", "seed-0") + tasks.generate("reversal", "validation", "v1")
    for row in rows:
        if "+" in row["prompt"]:
            a, b = row["prompt"].rstrip("=").split("+")
            assert row["answer"] == str(int(a) + int(b))
        else:
            assert row["answer"] == row["prompt"][4:-1][::-1]


def test_unknown_task_and_split_are_errors() -> None:
    with pytest.raises(TrainerError, match="environment 'multiplication' is not installed; installed: addition"):
        tasks.generate("multiplication", "train", "seed-0")
    with pytest.raises(tasks.TaskError, match="split='test'"):
        tasks.generate("addition", "test", "seed-0")


def test_make_data_cli_round_trips_without_importing_torch(tmp_path: Path) -> None:
    """Every staging job runs it: it must not pay torch's and transformers' import (~4 s of CPU each time)."""
    out = tmp_path / "train.jsonl"
    argv = ["make-data", "--task", "addition", "--split", "train", "--revision", "seed-0", "--out", str(out)]
    script = (
        "import sys; from trainer.__main__ import main; code = main(sys.argv[1:]); "
        "heavy = sorted({'torch', 'transformers'} & set(sys.modules)); "
        "assert not heavy, f'make-data imported {heavy}'; sys.exit(code)"
    )
    subprocess.run([sys.executable, "-c", script, *argv], check=True)
    assert list(read_rows(out)) == tasks.generate("addition", "train", "seed-0")
    assert json.loads(out.read_text().splitlines()[0]).keys() == {"prompt", "answer"}


def test_every_group_holds_exactly_one_prompt() -> None:
    rows = tasks.generate("addition", "train", "seed-0")
    for cursor in (0, 16, 92):  # 92 crosses the epoch boundary of 100 rows
        batch = data.group(data.draw(rows, cursor, 16, seed=3), group_size=8)
        groups = [batch[i : i + 8] for i in range(0, len(batch), 8)]
        assert len(groups) == 16
        assert all(len({r["prompt"] for r in g}) == 1 for g in groups)
        if cursor + 16 <= len(rows):  # within one epoch the groups are 16 different prompts
            assert len({g[0]["prompt"] for g in groups}) == 16


def test_data_order_visits_every_row_once_per_epoch_and_depends_on_seed() -> None:
    rows = tasks.generate("addition", "train", "seed-0")
    epoch = data.draw(rows, 0, len(rows), seed=0)
    assert sorted(r["prompt"] for r in epoch) == sorted(r["prompt"] for r in rows)
    assert data.draw(rows, 100, 100, seed=0) != epoch
    assert data.draw(rows, 0, 100, seed=1) != epoch
    assert data.draw(rows, 5, 3, seed=0) == epoch[5:8]


def _batch() -> dict[str, torch.Tensor]:
    prompts = [[1, 5], [1, 6, 7], [1, 5], [1, 6, 7]]
    rollouts = [
        Rollout([9, 2], [-0.1, -0.2], True),
        Rollout([9], [-0.3], False),
        Rollout([8, 8, 2], [-0.4, -0.5, -0.6], True),
        Rollout([2], [-0.7], True),
    ]
    return layout.build_batch(prompts, rollouts, pad_id=0)


def test_build_batch_layout() -> None:
    batch = _batch()
    assert batch["input_ids"].tolist()[0] == [0, 1, 5, 9, 2, 0]
    assert batch["input_ids"].tolist()[2] == [0, 1, 5, 8, 8, 2]
    assert batch["attention_mask"].tolist()[1] == [1, 1, 1, 1, 0, 0]
    assert batch["completion_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert batch["rollout_logprobs"][2].tolist() == pytest.approx([-0.4, -0.5, -0.6])


@pytest.mark.parametrize("reduction", grpo.REDUCTIONS)
def test_sharded_weighted_sums_equal_the_whole_mini_batch(reduction: str) -> None:
    batch = _batch()
    layout.add_loss_weights(batch, mini_rows=4, reduction=reduction)
    loss = torch.arange(12, dtype=torch.float).view(4, 3)
    batch["loss"] = loss
    whole = float((loss * grpo.reduction_weights(batch["completion_mask"], reduction)).sum())
    shards = layout.shard(batch, mini_rows=4, world=2)
    assert [s["loss"].shape[0] for s in shards] == [2, 2]
    assert sum(float((s["loss"] * s["loss_weights"]).sum()) for s in shards) == pytest.approx(whole)


def test_shards_take_a_slice_of_every_mini_batch() -> None:
    batch = {"input_ids": torch.arange(8)[:, None]}
    shards = layout.shard(batch, mini_rows=4, world=2)
    assert [s["input_ids"].flatten().tolist() for s in shards] == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_zero_variance_groups_are_dropped_and_padding_weighs_nothing() -> None:
    batch = {"input_ids": torch.arange(8)[:, None], "completion_mask": torch.ones(8, 2)}
    # Groups of 2; mini-batches of 4 rows. Mini 0: groups [1, 0] (kept) and [1, 1] (dropped);
    # mini 1: groups [0, 0] and [0, 0] (both dropped).
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    out, rows_per_mini = layout.drop_zero_variance_groups(batch, rewards, group_size=2, mini_rows=4, world=2)
    assert rows_per_mini == 2
    assert out["input_ids"].flatten().tolist() == [0, 1, 4, 4]
    assert out["completion_mask"].sum(dim=1).tolist() == [2, 2, 0, 0]
    layout.add_loss_weights(out, rows_per_mini, "seq_mean_token_mean")
    assert out["loss_weights"].flatten().tolist() == pytest.approx([0.25, 0.25, 0.25, 0.25, 0, 0, 0, 0])


def test_the_filter_drops_all_equal_float_groups_whose_std_is_not_exactly_zero() -> None:
    rewards = torch.tensor([0.3] * 8 + [0.3] * 7 + [0.7])
    assert rewards[:8].std() > 0  # float32 rounding: `std > 0` would have kept this group
    batch = {"input_ids": torch.arange(16)[:, None], "completion_mask": torch.ones(16, 1)}
    out, rows_per_mini = layout.drop_zero_variance_groups(batch, rewards, group_size=8, mini_rows=16, world=1)
    assert rows_per_mini == 8 and out["input_ids"].flatten().tolist() == list(range(8, 16))
