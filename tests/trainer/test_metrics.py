"""The metrics stream: appended (never rewritten), kept with the train artifact, one consistent run across resumes;
the progress line and the zero-reward warning."""

from __future__ import annotations

import io
import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from rlbuild.contracts.metricstream import MetricsStream, merge, read_run_metrics, read_stream
from rlbuild.core import storage
from trainer.metrics import MetricsWriter, Stopwatch, step_metrics
from trainer.sampling import Samples, Step
from trainer.workers.batch import UpdateBatch
from trainer.workers.engines import Rollout

STEPS = 500
CHECKPOINT_EVERY = 50


def _step_values(step: int) -> dict[str, float]:
    reward = 0.0 if step <= 30 else min(1.0, step / STEPS)
    return {
        "reward/mean": reward,
        "reward/min": 0.0,
        "reward/max": 1.0 if reward else 0.0,
        "policy/kl": step * 1e-4,
        "policy/entropy": 1.5,
        "perf/step_time_s": 0.3,
    }


def test_a_500_step_stream_is_appended_not_rewritten_and_outlives_tmp(
    s3_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: Counter[str] = Counter()
    written_bytes: list[int] = []
    real_write = storage.write_bytes

    def counting_write(uri: str, data: bytes) -> None:
        writes[uri] += 1
        written_bytes.append(len(data))
        real_write(uri, data)

    monkeypatch.setattr(storage, "write_bytes", counting_write)
    segments = f"{s3_root}/exp/tmp/ttl=14d/train/v1/metrics"
    final = f"{s3_root}/exp/train/v1/metrics.jsonl"
    writer = MetricsWriter(MetricsStream(segments, kept_until=-1, flush_seconds=math.inf), STEPS)
    for step in range(1, STEPS + 1):
        writer.log(step, _step_values(step), flush=step % CHECKPOINT_EVERY == 0)
    writer.close(final)

    assert max(writes.values()) == 1, "an object was written twice: the stream rewrote something"
    # One start marker, one segment per checkpoint, the merged file: O(checkpoints) objects, not O(steps) rewrites.
    assert len(writes) == 1 + STEPS // CHECKPOINT_EVERY + 1
    final_size = len(storage.read_text(final).encode())
    assert sum(written_bytes) < 2 * final_size + 100  # each line twice (segment, merged file), not 500 / 2 times

    storage.remove(f"{s3_root}/exp/tmp")  # the TTL folder expires with the checkpoints
    records, unreadable = read_run_metrics(final, segments)
    assert unreadable == 0 and [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert records[40]["health/zero_reward_steps"] == 0 and records[29]["health/zero_reward_steps"] == 30


def test_a_resumed_run_drops_the_lines_after_its_checkpoint(tmp_path: Path) -> None:
    root, final = str(tmp_path / "segments"), str(tmp_path / "metrics.jsonl")
    first = MetricsWriter(MetricsStream(root, kept_until=-1, flush_seconds=math.inf), 10)
    first.log(0, {"eval/accuracy": 0.1})
    for step in range(1, 8):  # checkpoint at 4; lines up to 6 reach storage; killed after 7
        first.log(step, {"reward/mean": 0.5, "reward/min": 0.0, "reward/max": 1.0, "attempt": 1}, flush=step in (4, 6))
    assert [r["step"] for r in read_stream(root)[0]] == [0, 1, 2, 3, 4, 5, 6]

    second = MetricsWriter(MetricsStream(root, kept_until=4, flush_seconds=math.inf), 10)
    assert [r["step"] for r in second.records()] == [0, 1, 2, 3, 4]
    assert [r["step"] for r in read_stream(root)[0]] == [0, 1, 2, 3, 4]  # a reader sees the resume at once
    for step in range(5, 11):
        second.log(step, {"reward/mean": 0.5, "reward/min": 0.0, "reward/max": 1.0, "attempt": 2})
    second.close(final)
    lines = [json.loads(line) for line in Path(final).read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(11))
    assert [r.get("attempt") for r in lines[5:]] == [2] * 6

    fresh = MetricsStream(root, kept_until=-1)  # --allow-retrain or resume_mode none: nothing earlier counts
    assert fresh.records() == [] and read_stream(root)[0] == []


def test_merge_applies_each_attempts_truncation_in_order() -> None:
    def lines(tag: str, steps: range) -> list[dict[str, object]]:
        return [{"step": s, "tag": tag} for s in steps]

    attempts = [(-1, lines("a", range(5))), (2, lines("b", range(3, 4))), (2, lines("c", range(3, 6)))]
    assert merge(attempts) == lines("a", range(3)) + lines("c", range(3, 6))
    assert merge([*attempts, (-1, lines("d", range(1)))]) == lines("d", range(1))


def test_progress_line_and_the_zero_reward_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    writer = MetricsWriter(MetricsStream(str(tmp_path), kept_until=-1), 40, zero_reward_warning_steps=3)
    zero = {"reward/mean": 0.0, "reward/min": 0.0, "reward/max": 0.0, "policy/kl": 0.01, "perf/step_time_s": 0.3}
    for step in range(1, 6):
        writer.log(step, dict(zero))
    err = capsys.readouterr().err
    assert err.count("WARNING: every reward was 0 for 3 consecutive steps (1-3): no learning signal") == 1
    progress = [line for line in err.splitlines() if line.startswith("[trainer] step 5/40")]
    assert len(progress) == 1
    for part in (" elapsed, ETA ", "reward 0 | kl 0.01 | s/step 0.3", "all rewards 0 for 5 steps"):
        assert part in progress[0]
    assert [r["health/zero_reward_steps"] for r in writer.records()] == [1, 2, 3, 4, 5]
    writer.log(6, {**zero, "reward/mean": 0.25, "reward/max": 1.0})
    assert writer.records()[-1]["health/zero_reward_steps"] == 0


def test_an_update_without_tokens_logs_no_per_token_statistics() -> None:
    # zero_variance_filter kept no group: the update saw no token, so KL and entropy are unknown, not 0.
    clock = Stopwatch()
    for phase in ("rollout", "train", "sync"):
        clock.lap(phase)
    samples = Samples([{}] * 4, [[1]] * 4, [Rollout([5, 2], [-0.1, -0.2], True)] * 4, torch.zeros(4))
    sampled = Step(samples, samples, cursor=4, batches=1)
    batch = UpdateBatch({"completion_mask": torch.zeros(2, 2)}, 2)
    stats = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "lr": 1e-3}
    values = step_metrics(sampled, 4, batch, {**stats, "train_tokens": 0.0}, 0.0, clock)
    assert "policy/kl" not in values and "policy/entropy" not in values and "policy/clip_frac" not in values
    assert values["policy/lr"] == 1e-3 and values["policy/trained_sequences"] == 0
    assert values["reward/zero_variance_groups"] == 1.0 and values["sampling/signal_groups"] == 0
    values = step_metrics(sampled, 4, batch, {**stats, "train_tokens": 8.0}, 0.0, clock)
    assert values["policy/kl"] == 0.0


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_holds_some_sixty_progress_lines_of_a_long_run_and_a_terminal_one_updated_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    step = {"reward/mean": 0.5, "reward/min": 0.0, "reward/max": 1.0, "perf/step_time_s": 0.1}
    writer = MetricsWriter(MetricsStream(str(tmp_path / "log"), kept_until=-1), 500)
    for n in range(1, 501):
        writer.log(n, dict(step), flush=n % 100 == 0)  # a checkpoint every 100 steps
    shown = [int(line.split("/")[0].rsplit(" ", 1)[1]) for line in capsys.readouterr().err.splitlines()]
    assert shown[:10] == list(range(1, 11)) and shown[-1] == 500  # the start, each checkpoint, the end
    assert {100, 200, 300, 400} <= set(shown) and len(shown) == 10 + 50 - 1  # 10 first, every 10th after step 10
    assert len(writer.records()) == 500  # the metrics stream keeps every step

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    writer = MetricsWriter(MetricsStream(str(tmp_path / "tty"), kept_until=-1), 20)
    for n in range(1, 21):
        writer.log(n, dict(step), flush=n == 10)
    text = terminal.getvalue()
    assert text.count("\r\033[K[trainer] step ") == 20  # every step redraws the one line
    assert [line.rsplit("\r\033[K", 1)[-1].split("/")[0] for line in text.split("\n") if line] == [
        "[trainer] step 10",
        "[trainer] step 20",
    ]  # only a checkpoint and the end stay in the scrollback
