"""`fully_async` end to end (trainer/sampling.py): on two CPU ranks (policy and engine separate) it generates
ahead within its staleness bound, learns tiny-addition to the synchronous learning test's threshold, and resumes
after a kill with every step trained once. (Every entrypoint the schema accepts also trains a few steps as its
loop in tests/test_benchmarks.py, through benchmarks/async_vs_sync.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlbuild.dev.launches import write_shipped_launch
from tests.launches import placeable
from tests.trainer.test_learning import HEADROOM_SHARE, THRESHOLDS, TOLERANCE
from tests.trainer.test_run import _doc, _metrics, kill_after_a_checkpoint, resume_to_the_end

# Two single-"GPU" nodes: the policy on one, its engine on the other, so generation and training overlap.
SEPARATE = {"role_plan": {"colocate_all": False}, "topology": {"num_nodes": 2}}
TIS = {"use_tis": True, "tis_imp_ratio_cap": 2.0}


def _step_records(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in _metrics(doc) if "perf/step_time_s" in r]


@pytest.mark.slow
@pytest.mark.timeout(900)
@placeable(2)
def test_fully_async_learns_resumes_after_a_kill_and_never_trains_a_stale_sample(tmp_path: Path) -> None:
    """The shipped tiny-addition as fully_async (bound 1), killed at its first checkpoint and run again: it resumes
    there, trains every step once, never a sample more than one version old, and reaches the synchronous learning
    test's held-out threshold."""
    schedule = {"ckpt_interval": 25, "eval_interval": 25, "eval_before_train": True, "algorithm": TIS}
    launch = write_shipped_launch(
        tmp_path, "tiny-addition", recipe={"trainer": schedule}, runtime={"entrypoint": "fully_async"}, **SEPARATE
    )
    doc = _doc(launch)
    steps = doc["recipe"]["trainer"]["max_steps"]
    killed_at = kill_after_a_checkpoint(launch, tmp_path / "first.log")
    resume_to_the_end(launch, killed_at, steps)  # steps 1..max_steps in metrics.jsonl, each once
    records = _step_records(doc)
    staleness = [r["async/staleness_max"] for r in records]
    assert max(staleness) <= 1 and staleness.count(1) >= steps // 2, staleness  # it did generate ahead
    summary = json.loads(Path(doc["artifacts"]["terminal_manifest_uri"]).read_text())["metrics"]
    held_out, gain = next((h, g) for task, h, g in THRESHOLDS if task == "addition")
    initial, final = summary["initial_eval_accuracy"], summary["final_eval_accuracy"]
    curve = [(r["step"], r["eval/accuracy"]) for r in _metrics(doc) if "eval/accuracy" in r]
    assert final >= held_out - TOLERANCE, curve
    assert final - initial >= min(gain, HEADROOM_SHARE * (1 - initial)) - TOLERANCE, curve
