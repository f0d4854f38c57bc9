"""A user's package adds environments without editing trainer/: found by its entry points at preflight, its
version in the identity of what it generates and scores, and a reward that trains end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlbuild.contracts.sources import parse_source
from rlbuild.dev.launches import experiment_document, write_test_launch
from rlbuild.plan import environments
from rlbuild.plan.preflight import check_experiment, parse_experiment
from rlbuild.plan.resolve import resolve
from rlbuild.stages.staging import stage_data

PACKAGE = '''
class Quarter:
    """Every completion scores 0.25: a reward no built-in gives, so the metrics show it was used."""

    def reward(self, row, completion, finished):
        return 0.25


class Doubling:
    """"d3:" -> "6" for 0..9, exact match; a task: it generates rows."""

    def reward(self, row, completion, finished):
        return 1.0 if finished and completion == row["answer"] else 0.0

    def rows(self, split, revision):
        numbers = range(0, 8) if split == "train" else range(8, 10)
        return [{"prompt": f"d{n}:", "answer": str(2 * n)} for n in numbers]
'''


def install_user_package(site: Path, version: str) -> Path:
    """`my-rewards` as pip would leave it: the module and a dist-info declaring two environments."""
    (site / "my_rewards").mkdir(parents=True, exist_ok=True)
    (site / "my_rewards" / "__init__.py").write_text(PACKAGE)
    for old in site.glob("my_rewards-*.dist-info"):
        for file in old.iterdir():
            file.unlink()
        old.rmdir()
    info = site / f"my_rewards-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: my-rewards\nVersion: {version}\n")
    (info / "top_level.txt").write_text("my_rewards\n")
    (info / "entry_points.txt").write_text(
        "[rlbuild.environments]\nquarter = my_rewards:Quarter\ndoubling = my_rewards:Doubling\n"
    )
    return site


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = install_user_package(tmp_path / "site", "1.2.3")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    return site


def _experiment(tmp_path: Path, env_class: str, **data: str) -> dict:
    doc = experiment_document(tmp_path / "sources", recipe={"environment": {"env_class": env_class}})
    for split, task in data.items():
        doc["data"][split] = [{"source": f"task:{task}/{split}", "revision": "seed-0"}]
    return doc


def test_unknown_environments_and_tasks_are_refused_at_preflight(tmp_path: Path, site: Path) -> None:
    doc = _experiment(tmp_path, "quartr", train="doublin")
    doc["data"]["validation"] = [{"source": "task:doubling/validation", "revision": "seed-0"}]
    _, found = check_experiment(parse_experiment(doc, "t"))
    messages = {v.field: (v.message, v.fix) for v in found}
    assert set(messages) == {"recipe.environment.env_class", "data.train.0.source"}
    message, fix = messages["recipe.environment.env_class"]
    assert message.startswith("environment 'quartr' is not installed (installed: addition, doubling, exact_match")
    assert fix.startswith("did you mean 'quarter'?")
    assert "did you mean 'doubling'?" in messages["data.train.0.source"][1]
    _, found = check_experiment(parse_experiment(_experiment(tmp_path, "my_rewards:Quarter"), "t"))
    assert found == []
    _, found = check_experiment(parse_experiment(_experiment(tmp_path, "my_rewards:Nope.x"), "t"))
    assert [v.field for v in found] == ["recipe.environment.env_class"]


def test_the_packages_version_enters_the_identity_of_what_it_generates_and_scores(tmp_path: Path, site: Path) -> None:
    def records(version: str) -> dict:
        install_user_package(site, version)
        doc = _experiment(tmp_path, "quarter", train="doubling", validation="doubling")
        return resolve(parse_experiment(doc, "t"), "2026.09.21", str(tmp_path / "r")).records

    first, second = records("1.2.3"), records("1.3.0")
    assert first["stage_data"]["fields"]["environments"] == {"doubling": "my-rewards==1.2.3"}
    assert first["launch"]["fields"]["environments"] == {"quarter": "my-rewards==1.2.3"}
    for kind in ("stage_data", "launch", "train", "export", "eval"):
        assert first[kind]["fingerprint"] != second[kind]["fingerprint"], kind
    assert first["stage_model"]["fingerprint"] == second["stage_model"]["fingerprint"]
    builtin = resolve(parse_experiment(_experiment(tmp_path, "exact_match"), "t"), "2026.09.21", str(tmp_path / "r"))
    assert "environments" not in builtin.records["launch"]["fields"]  # rlbuild's own: the runtime digest covers it


def test_a_plug_in_task_generates_rows_at_staging(tmp_path: Path, site: Path) -> None:
    stage_data([parse_source("task:doubling/train", "seed-0")], [], tmp_path / "staged")
    rows = [json.loads(line) for line in (tmp_path / "staged" / "train" / "0.jsonl").read_text().splitlines()]
    assert rows[:2] == [{"answer": "0", "prompt": "d0:"}, {"answer": "2", "prompt": "d1:"}] and len(rows) == 8


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_reward_from_a_user_package_trains_end_to_end(tmp_path: Path, site: Path) -> None:
    launch = write_test_launch(tmp_path, recipe={"environment": {"env_class": "quarter"}})
    doc = yaml.safe_load(launch.read_text())
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--launch", str(launch)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in Path(doc["artifacts"]["metrics_uri"]).read_text().splitlines()]
    assert [m["reward/mean"] for m in metrics if "reward/mean" in m] == [0.25, 0.25]


def test_entry_points_are_read_again_for_a_new_distribution_not_for_a_folder_of_modules(
    tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snakemake puts each included rule file's folder on the Python path: the entry points read at preflight
    still answer for the plan of every version. A folder holding a distribution is read."""
    before = environments._path_state()
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "helpers.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(rules))
    assert environments._path_state() == before
    monkeypatch.syspath_prepend(str(install_user_package(tmp_path / "other-site", "2.0.0")))
    assert environments._path_state() != before
    egg = tmp_path / "old_rewards-1.0.egg"  # an egg on the path is a distribution of its own (EGG-INFO inside)
    (egg / "EGG-INFO").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(egg))
    assert str(egg) in dict(environments._path_state())
