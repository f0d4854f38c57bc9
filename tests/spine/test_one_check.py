"""`rlbuild check` and the dry run run the same checks (rlbuild/plan/versioning.py): an experiment whose only
problem is one of the last checks made, the Slurm chain against the step time an earlier run measured, is refused
by both, with the same field. And one path from the YAML to the recipe: each process that plans (the dry run,
`rlbuild check`, the launch job) enters preflight once per experiment and arm, and the trainer reads the recipe
composed then."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from rlbuild.cli import main
from rlbuild.contracts.launch import load_launch
from rlbuild.contracts.recipe import Recipe
from rlbuild.core import storage
from rlbuild.core.errors import Violation
from rlbuild.plan import preflight
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.resolve import resolve
from rlbuild.plan.spec import Experiment
from rlbuild.workflow import Graph
from tests.conftest import EXPERIMENTS, run_snakemake

VERSION = "2026.09.21"


def slow_earlier_run(tmp_path: Path) -> tuple[Path, Path]:
    """(experiment, storage root): the default experiment on Slurm without a configured step time, and the
    metrics of an earlier attempt of the version measuring 60 s per step (500 steps do not fit 3 links)."""
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    del doc["execution"]["slurm"]["step_time_s"]
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(doc))
    root = tmp_path / "results"
    artifacts = resolve(load_experiment(path), VERSION, str(root)).launch.artifacts
    lines = [{"step": step, "perf/step_time_s": 60.0} for step in (1, 2, 3)]
    storage.write_text(artifacts.metrics_uri, "".join(json.dumps(line) + "\n" for line in lines))
    return path, root


def test_check_and_the_dry_run_both_refuse_a_chain_the_measured_step_time_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, root = slow_earlier_run(tmp_path)
    code = main(["check", str(path), "--version", VERSION, "--storage-root", str(root), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 2 and report["ok"] is False
    fields = {error["field"] for error in report["errors"]}
    assert "execution.slurm.max_links" in fields, report["errors"]
    assert fields <= {"execution.slurm.max_links", "execution.slurm.time_limit"}, report["errors"]

    dry = run_snakemake(
        ["-n", f"export/v{VERSION}", "--config", f"experiment={path}", f"storage_root={root}"], cwd=tmp_path
    )
    assert dry.returncode == 2, dry.stderr[-3000:]
    assert "step time measured in an earlier run" in dry.stderr
    assert "execution.slurm.max_links" in dry.stderr
    assert "Job stats" not in dry.stdout + dry.stderr


def test_check_and_the_dry_run_both_name_a_path_problem_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `local:` model folder holding a link to nothing (as /etc may), and an experiment path that is a symlink
    loop: one line each, from `rlbuild check` and from `snakemake -n` alike, never a traceback."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "weights.safetensors").symlink_to(tmp_path / "gone")
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["model"] = {
        "source": f"local:{model}",
        "revision": "r1",
        "tokenizer": {"source": f"local:{model}", "revision": "r1"},
    }
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(doc))
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    line = f"in {model}, weights.safetensors is a link to {tmp_path / 'gone'}, which does not exist"
    for experiment, expected in ((path, line), (loop, f"{loop} is a symlink loop")):
        code = main(["check", str(experiment), "--version", VERSION, "--storage-root", str(tmp_path / "s"), "--json"])
        errors = json.loads(capsys.readouterr().out)["errors"]
        assert code == 2 and errors and all(expected in e["message"] for e in errors), errors
        config = ["--config", f"experiment={experiment}", f"storage_root={tmp_path / 's'}"]
        dry = run_snakemake(["-n", f"stage/model/v{VERSION}", *config], cwd=tmp_path)
        assert dry.returncode == 2 and expected in dry.stderr, dry.stderr[-3000:]
        assert "Traceback" not in dry.stderr


@dataclass
class Preflight:
    """Every experiment that entered the one check function, and every one whose recipe was composed, in order."""

    entered: list[Experiment] = field(default_factory=list)
    composed: list[Experiment] = field(default_factory=list)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Preflight:
    """Counts preflight's entries wherever check_experiment was imported, and the recipes compose_recipe makes
    (check_experiment reads it from its module as it runs)."""
    found = Preflight()
    check, compose = preflight.check_experiment, preflight.compose_recipe

    def entered(experiment: Experiment, *, shares_venv: bool = True) -> tuple[Recipe | None, list[Violation]]:
        found.entered.append(experiment)
        return check(experiment, shares_venv=shares_venv)

    def composed(experiment: Experiment) -> tuple[Recipe | None, list[Violation]]:
        found.composed.append(experiment)
        return compose(experiment)

    for module in [m for name, m in sys.modules.items() if name.split(".")[0] in ("rlbuild", "trainer")]:
        if getattr(module, "check_experiment", None) is check:
            monkeypatch.setattr(module, "check_experiment", entered)
    monkeypatch.setattr(preflight, "compose_recipe", composed)
    return found


def _graph(name: str, tmp_path: Path, versions: list[str]) -> Graph:
    """The Snakefile's graph of an experiment on local storage (as `bind_storage` is called without a profile)."""
    graph = Graph(EXPERIMENTS / f"{name}.yaml", announce=False, versions=versions)
    local = SimpleNamespace(default_storage_provider=None)
    graph.bind_storage(SimpleNamespace(storage_settings=local, dag_settings=None), tmp_path / "results")
    return graph


def test_the_dry_run_enters_preflight_once_however_many_versions_it_plans(tmp_path: Path, calls: Preflight) -> None:
    """The Snakefile's walk from the YAML to every version's plan: the graph checks the experiment it loaded, once,
    and each version's plan and launch document carry the recipe composed then."""
    graph = _graph("tiny-addition", tmp_path, [VERSION, "2026.09.22", "dev"])
    plans = [graph.plan(key) for key in graph.keys_asked()]
    assert [p.version for p in plans] == [VERSION, "2026.09.22", "dev"]
    assert calls.entered == calls.composed == [graph.experiment], f"preflight entered {len(calls.entered)} times"
    recipe = graph.checked_experiment.recipe
    assert recipe is not None and all(p.recipe is recipe and p.launch.recipe == recipe for p in plans)


def test_a_series_enters_preflight_once_per_arm_in_the_dry_run_and_in_rlbuild_check(
    tmp_path: Path, calls: Preflight, capsys: pytest.CaptureFixture[str]
) -> None:
    """The experiment and each of its four arms are checked once, however many arms' versions are planned, and each
    arm's launch carries its own arm's recipe (the kl-low arm's coefficient, not the experiment's)."""
    graph = _graph("tiny-series", tmp_path, [VERSION, "2026.09.22"])
    arms = graph.checked_experiment.arms
    plans = {key: graph.plan(key) for key in graph.keys_asked()}
    assert len(plans) == 2 * len(arms) == 8
    checked = [graph.experiment, *(arm.experiment for arm in arms.values())]
    assert calls.entered == calls.composed == checked, f"preflight entered {len(calls.entered)} times"
    for key, plan in plans.items():
        own = arms[key.split("@")[1]].checked
        assert own is not None and plan.launch.recipe == own.recipe
    assert plans[f"{VERSION}@kl-low"].launch.recipe.trainer.algorithm.kl_loss_coef == 0.001
    calls.entered.clear()
    calls.composed.clear()
    path, root = EXPERIMENTS / "tiny-series.yaml", tmp_path / "results"
    code = main(["check", str(path), "--version", VERSION, "--storage-root", str(root), "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["ok"] is True
    assert len(calls.entered) == len(calls.composed) == 1 + len(arms), f"entered {len(calls.entered)} times, 4 arms"


def test_the_launch_job_enters_preflight_once_and_hands_the_trainer_the_recipe_it_composed(
    tmp_path: Path, calls: Preflight
) -> None:
    """`rlbuild resolve-launch` (the launch rule's job) checks the experiment once and writes the launch document
    the trainer reads: its recipe is the one composed from the YAML, a key the YAML states included."""
    path, out = EXPERIMENTS / "tiny-addition.yaml", tmp_path / "launch.yaml"
    args = ["--experiment", str(path), "--version", VERSION, "--storage-root", str(tmp_path / "results")]
    files = ["--out", str(out), "--record", str(tmp_path / "launch.identity.json"), "--plan", str(tmp_path / "plan")]
    assert main(["resolve-launch", *args, *files]) == 0
    assert len(calls.entered) == len(calls.composed) == 1, f"preflight entered {len(calls.entered)} times"
    stated = yaml.safe_load(path.read_text())["recipe"]["trainer"]["max_steps"]
    recipe = load_launch(str(out)).recipe  # as trainer/__main__.py reads it
    assert recipe == preflight.compose_recipe(load_experiment(path))[0] and recipe.trainer.max_steps == stated
