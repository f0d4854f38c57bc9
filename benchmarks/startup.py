"""A train job's start-up: seconds from the trainer's process start to Ray up, actors alive, the first rollout, the
first step done, and its exit, for a tiny-addition job of 2 steps, colocated (policy and engine share a bundle) and
on 2 ranks (policy | engine); beside them, measured in the same run, the floor: a bare Python importing torch,
transformers and ray. Medians of `--repeats` runs, taken in turns so that a slow minute of the machine lands on
every row alike.

    python benchmarks/startup.py [--repeats 3] [--layouts colocated separate] [--json]

The milestones are the trainer's own line (`[trainer] start-up: Ray up 3.1 s, ...`, trainer/workers/startup.py); exit is
timed here, from the process start to its end. `--json` prints one object: `imports_s` (the floor), per layout
its milestones, and `first_step_s` (colocated) with `first_step_vs_floor`.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlbuild.dev.launches import write_test_launch  # noqa: E402
from trainer.workers.startup import MILESTONES, read_summary  # noqa: E402

LAYOUTS = {
    "colocated": {},
    "separate": {"role_plan": {"colocate_all": False}, "topology": {"num_nodes": 2}},
}
FLOOR = "import torch, transformers, ray"


def floor_s() -> float:
    """Seconds for a bare interpreter to import what every train job imports."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR], check=True)
    return time.perf_counter() - started


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"--repeats {value}: a median needs at least 1 run; use --repeats 1 or more")
    return value


def train_once(launch: Path) -> dict[str, float]:
    """One fresh 2-step run of `launch` (its storage emptied of the last run's training): its milestones and exit."""
    storage = launch.parent / "storage"
    for trained in storage.glob("*/tmp"):
        shutil.rmtree(trained)
    for trained in storage.glob("*/train"):
        shutil.rmtree(trained)
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--launch", str(launch)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    exit_s = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(f"the train job failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    reached = read_summary(result.stdout + result.stderr)
    if reached is None:
        raise SystemExit(f"the trainer printed no start-up line:\n{result.stdout[-3000:]}")
    return {**reached, "exit": exit_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlbuild-startup-") as work:
        launches = {name: write_test_launch(Path(work) / name, **LAYOUTS[name]) for name in args.layouts}
        floors: list[float] = []
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.layouts}
        for _ in range(args.repeats):
            floors.append(floor_s())
            for name, launch in launches.items():
                runs[name].append(train_once(launch))
    floor = statistics.median(floors)
    columns = [*MILESTONES, "exit"]
    # A layout whose roles live in the trainer's own process starts no Ray: its "Ray up" is not reached (None).
    rows = {
        name: {key: statistics.median(r[key] for r in done) if key in done[0] else None for key in columns}
        for name, done in runs.items()
    }
    if args.json:
        out: dict[str, object] = {"imports_s": round(floor, 2), "repeats": args.repeats, "layouts": rows}
        if "colocated" in rows:
            out["first_step_s"] = round(rows["colocated"]["step"], 2)
            out["first_step_vs_floor"] = round(rows["colocated"]["step"] / floor, 2)
        print(json.dumps(out))
        return
    labels = [MILESTONES.get(key, key) for key in columns]
    print(f"seconds from the process start, median of {args.repeats}; floor: `{FLOOR}` {floor:.2f} s")
    print(f"{'layout':<10}" + "".join(f"{label:>15}" for label in labels) + f"{'first step / floor':>20}")
    for name, row in rows.items():
        cells = "".join(f"{'-' if row[key] is None else f'{row[key]:.2f}':>15}" for key in columns)
        print(f"{name:<10}{cells}{row['step'] / floor:>19.2f}x")


if __name__ == "__main__":
    main()
