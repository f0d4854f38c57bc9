"""Series: arms of one experiment checked as whole experiments, shared stages staged once, the smoke's bounds, the
plan's training cost. Pure logic, no Snakemake (tests/e2e/test_series.py builds a series)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlbuild.contracts.metricstream import Rate, measured_rate, used_gpu_hours
from rlbuild.core.errors import PreflightError
from rlbuild.core.inventory import Inventory
from rlbuild.plan import series
from rlbuild.plan.preflight import parse_experiment
from rlbuild.plan.resolve import resolve_checked
from rlbuild.plan.spec import NodeLimits
from rlbuild.plan.versioning import check_all, experiment_problems, plan_cost
from tests.spine.experiments import experiment

VERSION = "2026.09.21"
KL_LOW = {"recipe": {"trainer": {"algorithm": {"kl_loss_coef": 0.01}}}}


def _series(arms: dict[str, Any], **changes: Any) -> series.CheckedExperiment:
    return series.check(parse_experiment(experiment(arms=arms, **changes), "test"))


def _fields(problems: list[Any]) -> list[str]:
    return [p.field for p in problems]


def test_arms_are_keyed_smoke_first_and_an_identical_arm_is_its_twin() -> None:
    exp = _series({"base": {}, "kl-low": KL_LOW, "seed-7": {"seed": 7}, "smoke": {"smoke": True}, "twin": {}})
    assert series.series_keys(exp, VERSION) == [f"{VERSION}@{a}" for a in ("smoke", "base", "kl-low", "seed-7")]
    assert series.alias_of(exp, "twin") == "base"
    assert series.alias_of(exp, "smoke") is None  # a smoke is never the full run's build, whatever it changes
    # A key the experiment leaves out holds the schema's default: a value, not None; writing the default is no change.
    assert series.changes(exp, "kl-low") == {"recipe.trainer.algorithm.kl_loss_coef": (0.04, 0.01)}
    assert series.changes(exp, "seed-7") == {"seed": (42, 7)}
    spelled = _series({"base": {}, "same": {"recipe": {"trainer": {"algorithm": {"kl_loss_coef": 0.04}}}}})
    assert series.changes(spelled, "same") == {}
    assert "kl-low: changes recipe.trainer.algorithm.kl_loss_coef 0.04 -> 0.01" in "\n".join(
        series.plan_lines(exp, f"{VERSION}@kl-low")
    )
    problems = series.key_problems(exp, f"{VERSION}@twin")
    assert _fields(problems) == ["version"] and f"{VERSION}@base" in problems[0].fix
    unknown = series.key_problems(exp, f"{VERSION}@kl-hi")
    assert "does not declare" in unknown[0].message and f"{VERSION}@kl-low" in unknown[0].fix
    # An experiment without arms builds the plain version, as before.
    assert series.series_keys(series.check(parse_experiment(experiment(), "test")), VERSION) == [VERSION]


def test_every_problem_of_every_arm_is_reported_at_once_naming_its_arm() -> None:
    exp = _series(
        {
            "ok": {},
            "bad-recipe": {"recipe": {"trainer": {"algorithm": {"kl_loss_coef": -1}}}},
            "bad-plan": {"role_plan": {"policy_num_nodes": 7}},
            "smoke": {"smoke": True, "topology": {"num_nodes": 4}},
            "smoke2": {"smoke": True},
        }
    )
    fields = _fields(experiment_problems(exp, NodeLimits(None, None, None), ask_scheduler=False))
    assert any(f.startswith("arms.bad-recipe.recipe.trainer.algorithm.kl_loss_coef") for f in fields), fields
    assert any(f.startswith("arms.bad-plan.role_plan") for f in fields), fields
    assert "arms.smoke.topology.num_nodes" in fields
    assert "arms" in fields  # two smoke arms
    assert not any(f.startswith("arms.ok") for f in fields)
    plans, problems, _ = check_all(exp, [VERSION], "s3://b/p", "test", NodeLimits(None, None, None))
    assert not plans and any(p.field.startswith("arms.bad-plan") for p in problems)


@pytest.mark.parametrize(
    ("overlay", "field"),
    [
        ({"topology": {"gpu_variant": "A100"}}, "topology.gpu_variant"),
        ({"role_plan": {"n_samples_per_prompt": 4}}, "role_plan.n_samples_per_prompt"),
        ({"runtime": {"strategy": "megatron"}}, "runtime.strategy"),
        ({"recipe": {"trainer": {"algorithm": {"kl_loss_coef": 0.01}}}}, "recipe.trainer.algorithm.kl_loss_coef"),
        ({"data": {"train": [{"source": "task:addition/train", "revision": "seed-1"}]}}, "data.train"),
    ],
)
def test_a_smoke_may_change_only_how_much_is_done(overlay: dict[str, Any], field: str) -> None:
    exp = _series({"base": {}, "smoke": {"smoke": True, **overlay}})
    found = [
        p for p in series.series_problems(exp) if p.field.startswith(f"arms.smoke.{field}") and "smoke" in p.message
    ]
    assert found, series.series_problems(exp)
    assert "make it an arm of its own" in found[0].fix


def test_a_smoke_of_fewer_steps_is_accepted() -> None:
    exp = _series({"base": {}, "smoke": {"smoke": True, "recipe": {"trainer": {"max_steps": 5, "eval_interval": 5}}}})
    assert series.series_problems(exp) == []


def test_arm_names_and_overlays_are_checked_at_parse_time() -> None:
    with pytest.raises(PreflightError) as info:
        _series({"Kl Low": {}, "ok": {"name": "other"}, "s": {"smoke": "yes"}})
    text = str(info.value)
    assert "'Kl Low' is not an arm name" in text and "2026.09.21@kl-low" in text
    assert "sets 'name'" in text and "smoke is 'yes'" in text


def test_shared_stages_are_staged_once_under_the_plain_version() -> None:
    other_data = {"data": {"train": [{"source": "task:addition/train", "revision": "seed-1"}]}}
    exp = _series({"base": {}, "seed-7": {"seed": 7}, "data-1": other_data, "data-1b": {**other_data, "seed": 3}})
    keys = {arm: series.stage_keys(exp, f"{VERSION}@{arm}") for arm in exp.experiment.arms}
    assert keys["base"] == keys["seed-7"] == {"base_model": VERSION, "stage_model": VERSION, "stage_data": VERSION}
    # The changed data is staged once, under the first arm that has it; the model is still the shared one.
    assert keys["data-1"]["stage_data"] == keys["data-1b"]["stage_data"] == f"{VERSION}@data-1"
    assert keys["data-1b"]["stage_model"] == VERSION
    plans = {arm: resolve_checked(exp, f"{VERSION}@{arm}", "s3://b/p") for arm in exp.experiment.arms}
    assert plans["seed-7"].records["stage_data"] == plans["base"].records["stage_data"]
    assert plans["seed-7"].launch.inputs.model.uri == "s3://b/p/seed-64/stage/model/v2026.09.21"
    # A W&B run per configuration: two arms (and two configurations of one version) never share a run id.
    assert len({p.launch.run.id for p in plans.values()}) == len(plans)


def test_adding_or_reordering_arms_changes_no_other_arms_identity() -> None:
    before = _series({"base": {}, "kl-low": KL_LOW})
    after = _series({"seed-7": {"seed": 7}, "kl-low": KL_LOW, "base": {}, "smoke": {"smoke": True}})
    for arm in ("base", "kl-low"):
        key = f"{VERSION}@{arm}"
        assert _identities(resolve_checked(before, key, "s3://b/p").records) == _identities(
            resolve_checked(after, key, "s3://b/p").records
        )


def _identities(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Records less the moment they were made (two resolves a second apart differ only there)."""
    return {kind: {k: v for k, v in record.items() if k != "created_at"} for kind, record in records.items()}


def test_the_plain_version_of_a_series_names_stages_only() -> None:
    exp = _series({"base": {}, "kl-low": KL_LOW})
    assert series.plain_in_series(exp, VERSION, "stage_data") is None
    problem = series.plain_in_series(exp, VERSION, "export")
    assert problem is not None and f"{VERSION}@base" in problem.fix
    assert series.plain_in_series(exp, f"{VERSION}@base", "export") is None
    # `rlbuild status` / `check` of a plain version is every arm; a named arm is itself.
    assert series.expand(exp, [VERSION]) == [f"{VERSION}@base", f"{VERSION}@kl-low"]
    assert series.expand(exp, [f"{VERSION}@kl-low"]) == [f"{VERSION}@kl-low"]


def _lines(*rows: tuple[int, float, float]) -> list[dict[str, Any]]:
    return [{"step": s, "perf/elapsed_s": e, "perf/step_time_s": t} for s, e, t in rows]


def test_measured_rate_is_start_up_plus_steps_of_the_last_attempt() -> None:
    rate = measured_rate(_lines((1, 12.0, 2.0), (2, 14.0, 2.0), (3, 16.5, 2.5), (4, 18.0, 1.5)))
    assert rate == Rate(startup_s=10.0, per_step_s=2.0)
    # A resume restarts the trainer's clock: the rate is the last attempt's, GPU-hours count every attempt.
    resumed = _lines((1, 12.0, 2.0), (2, 14.0, 2.0), (3, 9.0, 3.0), (4, 12.0, 3.0))
    assert measured_rate(resumed) == Rate(startup_s=6.0, per_step_s=3.0)
    assert used_gpu_hours(resumed, gpus=8) == pytest.approx(8 * (14.0 + 12.0) / 3600)
    assert measured_rate([{"step": 1}]) is None and used_gpu_hours([], 8) is None


def _write_metrics(root: Path, key: str, rows: list[dict[str, Any]]) -> None:
    path = root / "seed-64" / "train" / f"v{key}" / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_plans_cost_comes_from_the_arms_own_run_else_the_smoke_else_a_declared_step_time(tmp_path: Path) -> None:
    exp = _series({"base": {}, "smoke": {"smoke": True, "recipe": {"trainer": {"max_steps": 2}}}})
    key = f"{VERSION}@base"
    plan = resolve_checked(exp, key, str(tmp_path))
    unknown = plan_cost(exp.experiment, plan, Inventory(str(tmp_path / "seed-64")))
    assert unknown.gpu_hours is None and "execution.step_time_s" in unknown.line()
    _write_metrics(tmp_path, f"{VERSION}@smoke", _lines((1, 30.0, 5.0), (2, 35.0, 5.0)))
    from_smoke = plan_cost(exp.experiment, plan, Inventory(str(tmp_path / "seed-64")))
    steps = plan.recipe.trainer.max_steps
    assert from_smoke.gpus == 64 and from_smoke.wall_s == pytest.approx(25.0 + steps * 5.0)
    assert from_smoke.gpu_hours == pytest.approx(64 * (25.0 + steps * 5.0) / 3600)
    assert f"train/v{VERSION}@smoke" in from_smoke.source
    _write_metrics(tmp_path, key, _lines((1, 20.0, 4.0), (2, 24.0, 4.0)))
    own = plan_cost(exp.experiment, plan, Inventory(str(tmp_path / "seed-64")))
    assert own.wall_s == pytest.approx(16.0 + steps * 4.0) and f"train/v{key}" in own.source
    declared = _series({"base": {}}, execution__step_time_s=3.0)
    cost = plan_cost(
        declared.experiment, resolve_checked(declared, key, str(tmp_path / "x")), Inventory(str(tmp_path / "x"))
    )
    assert cost.wall_s == pytest.approx(steps * 3.0) and "execution.step_time_s" in cost.source


def test_a_comparison_marks_a_delta_within_the_evals_sampling_noise_and_says_so() -> None:
    """One prompt in twenty (-0.05) is noise; 0.9 against 0.3 on 200 prompts is not. The interval is Newcombe's
    from each arm's Wilson interval (published value for 0.30 vs 0.35 on 20 each: about -0.32 to +0.23)."""
    from rlbuild.ops.compare import ArmRun, comparison, difference_interval, noise_words, render_html, wilson

    assert wilson(0.0, 20)[0] == 0.0 and 0.0 < wilson(0.0, 20)[1] < 0.17  # sound at 0, where p(1-p)/n is 0
    low, high = difference_interval(0.30, 20, 0.35, 20)
    assert (round(low, 2), round(high, 2)) == (-0.32, 0.23)
    exp = _series({"base": {}, "kl-low": KL_LOW, "seed-7": {"seed": 7}})

    def run(arm: str, accuracy: float, n: int) -> ArmRun:
        results = {"accuracy": accuracy, "pass_at_k": 0.5, "n": n}
        return ArmRun(arm, f"{VERSION}@{arm}", [{"step": 1, "perf/elapsed_s": 3.0}], results, 1)

    report = comparison(exp, [run("base", 0.35, 20), run("kl-low", 0.30, 20), run("seed-7", 0.9, 200)])
    kl, seed = report["arms"]["kl-low"], report["arms"]["seed-7"]
    assert kl["within_noise"] is True and kl["prompts"] == 20 and kl["accuracy_delta_95"] == [-0.3165, 0.2265]
    assert kl["changes"] == {"recipe.trainer.algorithm.kl_loss_coef": [0.04, 0.01]}  # the default, as a value
    assert noise_words(kl, "base") == (
        "-0.050 vs base, within the eval's sampling noise (95% interval -0.32 to +0.23 on 20 prompts)"
    )
    assert seed["within_noise"] is False and "beyond the eval's sampling noise" in noise_words(seed, "base")
    assert "within_noise" not in report["arms"]["base"] and noise_words(report["arms"]["base"], "base") == ""
    page = render_html(report, b"")
    assert "<td>-0.050 (within noise: -0.32 to +0.23)</td>" in page and "says nothing about which arm" in page
