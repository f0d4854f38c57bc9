"""Does `fully_async` pay? The same training both ways, on the same two CPU ranks, steps per second of each.

For each task (the shipped `config/experiments/tiny-<task>.yaml`): one run with `runtime.entrypoint: grpo` and one
with `fully_async` (staleness bound 1), both on two single-rank nodes, the policy on one and its engine on the
other (the geometry fully_async needs: generation and training on separate ranks), with TIS on in both so the
objective is the same. Before anything is timed, the two launch documents must be the same work: the same model,
data, seed, batch sizes, steps and geometry, differing only in the loop (and in the names and paths of the runs).
Each run is a `python -m trainer run` of its own; a run's seconds a step are the median of `perf/step_time_s` over
its steps after the first two (start-up: actors warming, the first weight sync). Printed per task: s/step and
steps/s of each loop, the asynchronous run's staleness and busy fractions, and the speed-up (goal: 1.3x).
Generation overlaps training, so the speed-up is bounded by 1 / (1 - generation's share of a synchronous step):
a task whose generation is a small part of its step (tiny-addition) cannot gain much.

    uv run python benchmarks/async_vs_sync.py [--tasks addition agent] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlbuild.dev.launches import write_shipped_launch  # noqa: E402
from rlbuild.plan.identity import flatten  # noqa: E402

LOOPS = ("grpo", "fully_async")
SEPARATE = {"role_plan": {"colocate_all": False}, "topology": {"num_nodes": 2}}
# What may differ between the two launch documents: the loop, and what names and places each run.
LOOP_KEYS = ("runtime.entrypoint", "recipe.trainer.entrypoint")
RUN_KEYS = ("run.", "artifacts.", "inputs.", "iris.", "ray.rendezvous_dir")
WARM_UP_STEPS = 2


def launch_for(folder: Path, task: str, loop: str, steps: int) -> Path:
    trainer = {
        "max_steps": steps,
        "ckpt_interval": steps,
        "eval_interval": -1,
        "eval_before_train": False,
        "algorithm": {"use_tis": True, "tis_imp_ratio_cap": 2.0},
    }
    return write_shipped_launch(
        folder, f"tiny-{task}", recipe={"trainer": trainer}, runtime={"entrypoint": loop}, **SEPARATE
    )


def assert_same_work(launches: dict[str, Path]) -> None:
    """The two launch documents differ only in the loop and in what names and places each run."""
    sync, asynchronous = (flatten(yaml.safe_load(launches[loop].read_text())) for loop in LOOPS)
    differing = {k for k in sync.keys() | asynchronous.keys() if sync.get(k) != asynchronous.get(k)}
    unexpected = sorted(k for k in differing if k not in LOOP_KEYS and not k.startswith(RUN_KEYS))
    assert not unexpected, f"not the same work: {[(k, sync.get(k), asynchronous.get(k)) for k in unexpected]}"
    assert set(LOOP_KEYS) <= differing, "the two runs do not differ in their loop"


def run(launch: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--launch", str(launch)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = Path(yaml.safe_load(launch.read_text())["artifacts"]["metrics_uri"]).read_text().splitlines()
    return [r for r in map(json.loads, metrics) if "perf/step_time_s" in r]


def measure(task: str, steps: int) -> dict[str, float]:
    """Both loops on `task`; seconds a step of each (median after warm-up), and the asynchronous run's metrics."""
    with tempfile.TemporaryDirectory(prefix=f"rlbuild-async-{task}-") as tmp:
        launches = {loop: launch_for(Path(tmp) / loop, task, loop, steps) for loop in LOOPS}
        assert_same_work(launches)
        records = {loop: run(launches[loop]) for loop in LOOPS}
    for loop in LOOPS:
        assert [r["step"] for r in records[loop]] == list(range(1, steps + 1)), (loop, records[loop])
    # Each run ran the loop it names: staleness only where generation runs ahead, and within its bound.
    assert not any("async/staleness_max" in r for r in records["grpo"]), records["grpo"]
    assert all(0 <= r["async/staleness_max"] <= 1 for r in records["fully_async"]), records["fully_async"]
    timed = {loop: records[loop][WARM_UP_STEPS:] for loop in LOOPS}
    row = {f"{loop}_s": statistics.median(r["perf/step_time_s"] for r in timed[loop]) for loop in LOOPS}
    asynchronous = timed["fully_async"]
    row |= {
        "speed_up": row["grpo_s"] / row["fully_async_s"],
        "staleness_max": max(r["async/staleness_max"] for r in asynchronous),
        "generation_busy": statistics.median(r["async/generation_busy_frac"] for r in asynchronous),
        "training_busy": statistics.median(r["async/training_busy_frac"] for r in asynchronous),
        "generation_share_sync": statistics.median(
            r["perf/rollout_time_s"] / r["perf/step_time_s"] for r in timed["grpo"]
        ),
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["addition", "agent"], choices=["addition", "reversal", "agent"])
    parser.add_argument(
        "--steps", type=int, default=20, help=f"steps a run (default 20; the first {WARM_UP_STEPS} untimed)"
    )
    args = parser.parse_args()
    assert args.steps > WARM_UP_STEPS, f"--steps must exceed the {WARM_UP_STEPS} warm-up steps"
    for task in args.tasks:
        row = measure(task, args.steps)
        print(f"tiny-{task}, {args.steps} steps, policy and engine on separate CPU ranks, same work (checked):")
        for loop in LOOPS:
            print(f"  {loop:<12} {row[f'{loop}_s']:.3f} s/step  {1 / row[f'{loop}_s']:.2f} steps/s")
        print(
            f"  speed-up {row['speed_up']:.2f}x (goal 1.3x; generation was {row['generation_share_sync']:.0%} of a "
            f"synchronous step); fully_async staleness max {row['staleness_max']:.0f}, generation busy "
            f"{row['generation_busy']:.0%}, training busy {row['training_busy']:.0%}"
        )


if __name__ == "__main__":
    main()
