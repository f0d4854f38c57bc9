"""Every command the README prints works exactly as typed: the cheap ones run here, in a fresh copy of the
repository with the set-up's environment on PATH (what `source .venv/bin/activate` gives); each expensive one
names the test (or CI step) that runs it. A README command in neither table fails the guard."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlbuild.dev.s3 import S3Server
from tests.conftest import REPO, copy_of_the_code

VENV_BIN = Path(sys.executable).parent

# command -> a line its output must hold
RUN_HERE = {
    "snakemake -n export/v2026.09.21": "rlbuild plan: tiny-addition @ 2026.09.21 (immutable)",
    "snakemake -n": "terminal stage eval",
    "snakemake --unlock": "Unlocked working directory",
    "rlbuild check": "terminal stage eval",  # as `snakemake -n` says
    "rlbuild --version": "rlbuild 0.",
    "rlbuild --help": "{check,status,compare,submit,cancel,lease}",
    "rlbuild check config/experiments/tiny-addition.yaml --version 2026.09.21": "rlbuild plan: tiny-addition",
    "rlbuild check config/experiments/tiny-addition.yaml --json": '"ok": true',
    "rlbuild check config/experiments/tiny-addition.yaml --profile iris": "nodes run      set up from uv.lock",
    "snakemake --profile iris -n export/v2026.09.21": "/tiny-addition/export/v2026.09.21",
    "snakemake --help | grep -A1 -- --iris-": "--iris-controller-url",
    "snakemake --profile slurm -n export/v2026.09.21": "/tiny-addition/export/v2026.09.21",
    "snakemake --help | grep -A2 -- --slurm-": "--slurm-",
    "rlbuild status": "verdict: 7 of 7 artifacts not built",
    "rlbuild status --json": '"stage_model": {',
    "rlbuild status export/v2026.09.21": "  export       missing",
    "rlbuild status --verify train/v2026.09.21": "  train        missing",
    "rlbuild status --experiment tiny-series": "verdict: 28 of 28 artifacts not built",  # 4 arms x 7 kinds
    "rlbuild check --json": '"ok": true',
}
COVERED_ELSEWHERE = {
    "make main": "tests/e2e/test_first_hour.py: as typed (its set-up aside) on a small budget, Ctrl-C'd and run again",
    "make test": "CI runs it (.ci/run)",
    "rlbuild lease break train/v2026.09.21": (
        "tests/spine/test_lease.py::test_lease_break_refuses_a_live_holder_unless_forced_and_is_recorded_where_status_"
        "shows_it (a live holder refused, --force breaks it, status shows the break)"
    ),
    "make test-fast": "`make test` runs every test it runs (those not marked slow), with the same options",
    "source .venv/bin/activate": "these tests put the venv's bin first on PATH, as activating does",
    "snakemake --forcerun eval": "tests/e2e/test_first_hour.py::test_a_partial_rebuild_reruns_eval_only",
    "snakemake --forcerun export -- export/v2026.09.21": "test_forcerun_export_reexports_without_retraining",
    "snakemake --rerun-incomplete train/v2026.09.21/terminal.json": (
        "tests/e2e/test_pipeline.py::test_killed_training_resumes_from_the_latest_checkpoint"
    ),
    "snakemake --forcerun train --config allow_retrain=true -- train/v2026.09.21/terminal.json": (
        "tests/e2e/test_pipeline.py::test_allow_retrain_retrains_a_completed_fixed_version"
    ),
    "snakemake --profile iris export/v2026.09.21": "tests/iris/test_training.py (a 2-node gang through the profile)",
    "snakemake --profile slurm export/v2026.09.21": (
        "tests/slurm/test_pipeline.py (the default graph on a local Slurm, training chained across 2 jobs)"
    ),
    "make setup": "CI's `make test` runs it first; every test here runs in the environment it made",
    "python -m trainer run --launch launch.yaml": "tests/trainer/test_run.py runs it on launch documents it writes",
    "make bench": "tests/test_benchmarks.py runs every benchmark on a tiny budget",
    "python scripts/gpu_check.py": (
        "needs a GPU: tests/test_gpu_check.py runs all of it with --tiny on CPU, and without --tiny on a machine "
        "without a GPU (exit 2)"
    ),
    "snakemake --cores 2 --config experiment=tiny-reversal": (
        "tests/trainer/test_learning.py::test_the_shipped_experiment_learns_its_held_out_prompts[reversal] (its "
        "recipe, seed and split, held-out accuracy >= 0.7)"
    ),
    "snakemake --cores 2 --config experiment=tiny-agent": (
        "tests/trainer/test_learning.py::test_the_shipped_experiment_learns_its_held_out_prompts[agent] (its recipe, "
        "seed and split, held-out success >= 0.8)"
    ),
    "snakemake --cores 2 --config experiment=tiny-harbor": (
        "tests/trainer/test_harbor.py::test_the_tiny_agent_trains_on_harbor_tasks_and_its_export_is_evaluated_on_held_out_ones"
        " (its recipe and task set, on a budget of 3 steps)"
    ),
    "snakemake --cores 2 --config experiment=tiny-series": (
        "tests/e2e/test_first_hour.py (as typed, the shipped series on a budget: every arm, the smoke first)"
    ),
    "rlbuild compare tiny-series --version 2026.09.21": (
        "tests/e2e/test_first_hour.py::test_the_series_report_shows_every_arm (as typed, from storage)"
    ),
    "make iris-local": "tests/iris/test_iris_local.py runs its script from a fresh copy of the code",
    "python -m trainer episode --launch results/tiny-agent/launch/v2026.09.21/launch.yaml --split validation --row 0 "
    "--actions actions.txt": (
        "tests/trainer/test_episodes.py::test_the_replay_command_plays_a_file_of_actions_through_the_launch_environment"
    ),
    "rlbuild submit export/v2026.09.21": "tests/iris/test_coordinator.py (the default graph, detached, to the end)",
    "rlbuild cancel export/v2026.09.21": (
        "tests/iris/test_coordinator.py::test_cancel_stops_the_coordinator_and_its_jobs"
    ),
    "rlbuild status --storage-root s3://$RLBUILD_BUCKET/$RLBUILD_PREFIX": (
        "tests/iris/test_coordinator.py and tests/iris/test_training.py read status from S3 during the run"
    ),
}
COMMAND_WORDS = ("snakemake", "rlbuild", "make", "python", "source")


def readme_commands() -> list[str]:
    """The README's commands: the lines of its code blocks (without trailing comments and exports), and the
    inline code spans of its prose that start with a command."""
    text = (REPO / "README.md").read_text()
    # Shell blocks carry no language tag; a tagged block (```yaml) shows a file's content, not commands.
    blocks = [body for tag, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S) if not tag]
    commands = []
    for line in (line for block in blocks for line in block.splitlines()):
        command = re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()
        if command and not command.startswith(("#", "export ")):
            commands.append(command)
    prose = re.sub(r"^```\w*\n.*?^```", "", text, flags=re.M | re.S)
    spans = [span.split() for span in re.findall(r"`([^`]+)`", prose)]
    commands += [" ".join(words) for words in spans if len(words) > 1 and words[0] in COMMAND_WORDS]
    return list(dict.fromkeys(commands))


def test_every_readme_command_runs_here_or_names_the_test_that_runs_it() -> None:
    unaccounted = [c for c in readme_commands() if c not in RUN_HERE and c not in COVERED_ELSEWHERE]
    assert unaccounted == []
    stale = [c for c in [*RUN_HERE, *COVERED_ELSEWHERE] if c not in readme_commands()]
    assert stale == []


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_the_code(tmp_path_factory.mktemp("fresh") / "rlbuild")


@pytest.mark.parametrize("command", list(RUN_HERE))
def test_readme_command_works_as_typed(command: str, fresh_copy: Path, s3_server: S3Server, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLBUILD_", "SNAKEMAKE_"))}
    env |= {"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": str(fresh_copy)}
    if "--profile" in command:  # the README's exports, pointed at the tests' own servers
        env |= s3_server.env() | {"RLBUILD_BUCKET": s3_server.new_bucket(), "RLBUILD_PREFIX": "readme"}
        env |= {"SNAKEMAKE_IRIS_CONTROLLER_URL": "http://127.0.0.1:9"}  # a dry run never calls it
    result = subprocess.run(
        ["bash", "-c", command], cwd=fresh_copy, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert RUN_HERE[command] in result.stdout + result.stderr
    assert not (fresh_copy / "results").exists() or not any((fresh_copy / "results").rglob("identity.json"))
