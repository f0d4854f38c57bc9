"""The eval stage: results.json, the results table and the curves PNG from synthetic metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlbuild.contracts.artifacts import EXPORT_MODEL
from rlbuild.contracts.launch import LaunchDocument, load_launch
from rlbuild.contracts.manifest import ManifestError, ManifestMismatchError, write_manifest
from rlbuild.contracts.metricstream import MetricsStream, read_run_metrics
from rlbuild.contracts.rows import RowError
from rlbuild.dev.launches import base_model_dir, write_test_launch
from rlbuild.stages.evaluation import (
    EvalError,
    accuracy_line,
    axis_limits,
    example_trajectories,
    plot_curves,
    run_eval,
    table_html,
    table_rows,
    training_summary,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _metrics(path: Path) -> Path:
    lines = [json.dumps({"step": s, "reward/mean": s / 10, "policy/entropy": 1.0}) for s in range(1, 11)]
    lines[4] = json.dumps({"step": 5, "eval/accuracy": 0.4})  # an eval line without reward
    lines.append(json.dumps({"step": 10, "eval/accuracy": 0.7, "reward/mean": None}))
    lines.append('{"step": 11, "rew')  # torn by a killed writer
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _validation(staged: Path, n: int = 5) -> Path:
    """A staged data directory's validation file (with its manifest), as the eval rule receives it."""
    path = staged / "validation" / "0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(n)))
    write_manifest(staged)
    return path


def _export(tmp_path: Path) -> Path:
    """An export folder as the export rule writes it: an HF model folder (`model/`) with its manifest beside it."""
    export = tmp_path / "export"
    shutil.copytree(base_model_dir(0), export / EXPORT_MODEL)
    write_manifest(export)
    return export


@pytest.fixture
def launch(tmp_path: Path) -> LaunchDocument:
    return load_launch(str(write_test_launch(tmp_path / "run")))


def test_run_eval_writes_results_table_and_png(tmp_path: Path, launch: LaunchDocument) -> None:
    _metrics(Path(launch.artifacts.metrics_uri))
    validation = [Path(entry.uri) for entry in launch.inputs.validation_data]
    results = run_eval(_export(tmp_path), validation, launch, tmp_path / "eval", k=2)

    out = tmp_path / "eval"
    assert json.loads((out / "results.json").read_text()) == results
    assert results["k"] == 2 and results["n"] == 20 and results["seed"] == launch.run.seed
    assert 0.0 <= results["accuracy"] <= 1.0 and 0.0 <= results["pass_at_k"] <= 1.0
    assert results["samples"] == {"n": 20, "k": 2, "temperature": 1.0}
    training = results["training"]
    assert training["unreadable_lines"] == 1 and training["last_step"] == 10 and training["warnings"] == []
    assert training["reward_mean"] == {"first": 0.1, "last": 1.0, "max": 1.0}
    assert training["eval_accuracy"] == {"last": 0.7, "best": 0.7, "best_step": 10.0}
    assert "pass@2" in (out / "results.html").read_text()
    png = (out / "curves.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    import matplotlib.image

    assert matplotlib.image.imread(out / "curves.png").shape[2] in (3, 4)
    assert not list(out.glob(".*tmp*"))


def test_a_flipped_bit_in_the_export_is_corruption_never_a_score(tmp_path: Path, launch: LaunchDocument) -> None:
    export = _export(tmp_path)
    weights = export / EXPORT_MODEL / "model.safetensors"
    payload = bytearray(weights.read_bytes())
    payload[-1] ^= 0x80
    weights.write_bytes(bytes(payload))
    validation = [Path(entry.uri) for entry in launch.inputs.validation_data]
    with pytest.raises(ManifestMismatchError, match=r"model/model\.safetensors: sha256") as error:
        run_eval(export, validation, launch, tmp_path / "eval", k=2)
    assert len(error.value.problems) == 1
    assert not (tmp_path / "eval" / "results.json").exists()


def test_plot_without_metrics(tmp_path: Path) -> None:
    records, unreadable = read_run_metrics(str(tmp_path / "absent.jsonl"), str(tmp_path / "no-segments"))
    assert (records, unreadable) == ([], 0)
    plot_curves(records, None, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_SIGNATURE)


def test_flat_series_are_drawn_flat() -> None:
    # A reward of 0 with one lucky step must not autoscale into a spike filling the panel.
    low, high = axis_limits([0.0, 0.0, 0.004, 0.0], min_span=1.0)
    assert low < 0 < 0.004 < 0.01 * (high - low) and high > 1.0
    assert axis_limits([], min_span=1.0) == axis_limits([0.0], min_span=1.0)
    low, high = axis_limits([2.0, 3.5], min_span=0.1)  # entropy: from 0, to the highest value
    assert low <= 0 and 3.5 < high < 3.7
    low, high = axis_limits([-1.0, 0.5], min_span=1.0)  # negative rewards stay in view
    assert low < -1.0 and high > 0.5


def test_a_run_without_signal_says_so_and_a_killed_run_is_read_from_its_segments(
    tmp_path: Path, launch: LaunchDocument
) -> None:
    # No merged metrics.jsonl (the run was killed): the eval reads the stream's segments.
    stream = MetricsStream(launch.artifacts.metrics_segments_root, kept_until=-1)
    for step in range(1, 31):
        stream.append({"step": step, "reward/mean": 0.0, "health/zero_reward_steps": step})
    stream.flush()
    assert launch.recipe.trainer.zero_reward_warning_steps == 20
    validation = [Path(entry.uri) for entry in launch.inputs.validation_data]
    results = run_eval(_export(tmp_path), validation, launch, tmp_path / "eval", k=2)
    training = results["training"]
    assert training["last_step"] == 30 and training["longest_zero_reward_steps"] == 30
    assert len(training["warnings"]) == 1
    assert training["warnings"][0].startswith("every reward was 0 for 30 consecutive steps (warning after 20)")
    assert "every reward was 0 for 30 consecutive steps" in (tmp_path / "eval" / "results.html").read_text()


def test_a_run_that_memorises_its_train_prompts_is_flagged(tmp_path: Path, launch: LaunchDocument) -> None:
    # Train reward 0.81 and train-prompt accuracy 0.80 against 0.32 held-out: the case a user met (issue 18).
    lines = [{"step": s, "reward/mean": 0.81} for s in range(1, 11)]
    lines += [{"step": 10, "eval/accuracy": 0.32, "eval/train_accuracy": 0.80}]
    metrics = Path(launch.artifacts.metrics_uri)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    validation = [Path(entry.uri) for entry in launch.inputs.validation_data]
    results = run_eval(_export(tmp_path), validation, launch, tmp_path / "eval", k=2)
    training = results["training"]
    assert training["train_accuracy"] == {"last": 0.80}
    assert training["warnings"] == [
        "train accuracy 0.80 against held-out 0.32 at the last eval: the policy memorises its training prompts "
        "instead of learning the task; use more distinct train prompts than the model can memorise, or a smaller "
        'model (trainer/README.md, "Robust recipes")'
    ]
    table = (tmp_path / "eval" / "results.html").read_text()
    assert "train-prompt accuracy last" in table and "memorises its training prompts" in table
    # Within the gap: no warning.
    metrics.write_text("".join(json.dumps(line) + "\n" for line in [*lines[:-1], {**lines[-1], "eval/accuracy": 0.6}]))
    assert run_eval(_export(tmp_path / "b"), validation, launch, tmp_path / "eval2", k=2)["training"]["warnings"] == []


def test_validation_data_is_verified_and_checked(tmp_path: Path, launch: LaunchDocument) -> None:
    loose = tmp_path / "loose.jsonl"
    loose.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(ManifestError, match=r"no manifest\.json at or above"):
        run_eval(tmp_path, [loose], launch, tmp_path / "eval")

    path = _validation(tmp_path / "data")
    path.write_text('{"prompt": "1+1="}\n')
    with pytest.raises(ManifestMismatchError, match=r"validation/0\.jsonl: size"):
        run_eval(tmp_path, [path], launch, tmp_path / "eval")
    write_manifest(tmp_path / "data")  # staged like that: the row itself is refused
    with pytest.raises(RowError, match=r"0\.jsonl:1: missing column\(s\) \['answer'\]"):
        run_eval(tmp_path, [path], launch, tmp_path / "eval")
    with pytest.raises(EvalError, match="k >= 2"):
        run_eval(tmp_path, [path], launch, tmp_path / "eval", k=1)
    with pytest.raises(EvalError, match="no validation rows"):
        run_eval(tmp_path, [], launch, tmp_path / "eval")


def test_an_agent_runs_report_shows_turns_and_three_example_episodes(tmp_path: Path) -> None:
    def episode(prompt: str, reward: float, actions: list[str]) -> dict:
        turns = [{"action": a, "observation": f">{a}|", "reward": 0.0} for a in actions]
        return {"prompt": prompt, "turns": turns, "reward": reward, "ended": "done", "error": None}

    trajectories = [episode("find key:", 0.0, ["ls|", "cat d|"]), episode("find key:", 1.0, ["ls|", "cat k|"])]
    trajectories += [episode("find key:", 0.0, ["pwd|"]), episode("find key:", 1.0, ["ls|"])]
    chosen = example_trajectories(trajectories)
    assert chosen == [trajectories[1], trajectories[0], trajectories[2]]  # a solved one, a failed one, the next
    assert example_trajectories(trajectories[:1]) == trajectories[:1]
    results = {"accuracy": 0.5, "pass_at_k": 0.75, "k": 4, "n": 4, "seed": 1, "training": {"warnings": []}}
    results["episodes"] = {"turns_mean": 1.5, "turns_max": 2.0, "ended_done_frac": 0.75, "ended_error_frac": 0.25}
    page = table_html(results, trajectories)
    assert "<th>turns per episode mean / max</th><td>1.50 / 2</td>" in page
    assert "<th>episodes ended by</th><td>done 0.75, error 0.25</td>" in page
    assert page.count("<pre>") == 3 and "[2] $ cat k|\n    &gt;cat k|" in page
    records = [{"step": s, "reward/mean": s / 4, "episode/turns_mean": 1 + s / 4} for s in range(1, 5)]
    plot_curves(records, 0.5, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_SIGNATURE)


def test_the_base_models_score_before_training_is_the_step_0_eval_and_the_report_opens_on_it(tmp_path: Path) -> None:
    """The accuracy before training is a measurement (the trainer's step-0 eval with the eval stage's scorer),
    never a guess: without one the line says it was not measured. The report's first page carries the line,
    the curves, the eval table and the plan; the report step's last lines name the eval and the report."""
    from docutils.core import publish_parts

    from rlbuild.core import storage
    from rlbuild.ops.results import closing_lines, landing_text, read_outcome

    records = [
        {"step": 0, "eval/accuracy": 0.05},
        {"step": 2, "eval/accuracy": 0.3},
        {"step": 4, "eval/accuracy": 0.35},
    ]
    summary = training_summary(records, 0, 0)
    assert summary["eval_accuracy"] == {"last": 0.35, "best": 0.35, "best_step": 4.0, "before_training": 0.05}
    results = {"accuracy": 0.35, "pass_at_k": 0.6, "k": 4, "n": 20, "seed": 42, "training": summary}
    assert accuracy_line(results) == (
        "held-out greedy accuracy 0.050 before training -> 0.350 after, on 20 validation prompts (pass@4 0.600)"
    )
    assert ("accuracy before training (step 0)", "0.0500") in table_rows(results)
    unmeasured = results | {"training": training_summary(records[1:], 0, 0)}
    assert "before training not measured (recipe.trainer.eval_before_train is off)" in accuracy_line(unmeasured)

    root = str(tmp_path / "tiny")
    storage.write_text(f"{root}/eval/v1/results.json", json.dumps(results))
    storage.write_bytes(f"{root}/eval/v1/curves.png", PNG_SIGNATURE + bytes(range(256)) * 80)  # lines > 10,000
    storage.write_text(f"{root}/launch/v1/plan.txt", "rlbuild plan: tiny @ 1 (immutable)\n  terminal stage eval\n")
    outcomes = [read_outcome("tiny", root, "1"), read_outcome("tiny", root, "2")]
    page = publish_parts(landing_text(outcomes).split("\n", 1)[1].rsplit("{% endraw %}", 1)[0], writer="html")
    body = page["html_body"]
    assert body.index("0.050 before training -&gt; 0.350 after") < body.index("data:image/png;base64,")
    assert body.index("data:image/png;base64,") < body.index("accuracy before training (step 0)")
    assert "rlbuild plan: tiny &#64; 1 (immutable)" in body and "tiny v2: not evaluated (build eval/v2)" in body
    assert "System Message" not in body  # valid reStructuredText, every value escaped
    lines = closing_lines(outcomes, "/r/report.html", {"1": "/r/logs/eval/v1.log"})
    assert lines == [
        f"rlbuild: tiny v1: {accuracy_line(results)}",
        f"rlbuild:   eval    {root}/eval/v1/results.json (its log: /r/logs/eval/v1.log)",
        "rlbuild: tiny v2: not evaluated (build eval/v2)",
        "rlbuild:   report  /r/report.html",
    ]
