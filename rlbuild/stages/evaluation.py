"""The eval stage: score an exported policy on the validation set and draw its training curves.

Writes, into the eval directory: `results.json` (scores plus a summary of training, with its warnings),
`results.html` (the same as a table, for the Snakemake report), `curves.png` (reward, held-out accuracy,
KL, entropy, response length and groups without signal, per step) and, where the environment is an agent's,
`trajectories.jsonl` (each greedy episode's turns, actions, observations, reward and timings). The scoring
itself is the trainer's (`python -m trainer eval`); the training curves are the run's metrics stream
(rlbuild/contracts/metricstream.py).
"""

from __future__ import annotations

import html
import io
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlbuild.contracts.artifacts import EXPORT_MODEL
from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.manifest import verify_local
from rlbuild.contracts.metricstream import ZERO_REWARD_STEPS, read_run_metrics
from rlbuild.contracts.rows import read_rows as read_jsonl_rows
from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError

RESULTS = "results.json"
TABLE = "results.html"
CURVES = "curves.png"
TRAJECTORIES = "trajectories.jsonl"
SCORES = ("accuracy", "pass_at_k")
# Train accuracy this far above held-out accuracy is memorisation, not learning (the eval results warn).
MEMORISATION_GAP = 0.3


class EvalError(RlbuildError):
    """The eval stage cannot score the export: bad validation data or an incomplete score from the trainer."""


def read_rows(files: Sequence[Path]) -> list[dict[str, Any]]:
    """The {prompt, answer} rows of staged validation files, in file order, verified against the manifest."""
    verified: set[Path] = set()
    for path in files:
        # Each staged directory once: its manifest covers all its files.
        if not any(Path(path).resolve().is_relative_to(root) for root in verified):
            verified.add(verify_local(path))
    rows: list[dict[str, Any]] = []
    for path in files:
        rows.extend(read_jsonl_rows(Path(path)))
    if not rows:
        raise EvalError(
            f"no validation rows in {[str(p) for p in files]}; list a data.validation source in the experiment"
        )
    return rows


def _series(records: Iterable[Mapping[str, Any]], field: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the lines that carry a finite number in `field`."""
    steps: list[float] = []
    values: list[float] = []
    for record in records:
        value = record.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(float(record["step"]))
            values.append(float(value))
    return steps, values


def base_accuracy(records: Iterable[Mapping[str, Any]]) -> float | None:
    """The base model's held-out accuracy: the trainer's eval at step 0, before the first update, with the eval
    stage's scorer (`trainer.eval_before_train`); None where it was not measured."""
    steps, values = _series(records, "eval/accuracy")
    return values[0] if steps and steps[0] == 0 else None


def training_summary(records: Sequence[Mapping[str, Any]], unreadable: int, warn_after: int) -> dict[str, Any]:
    """First/last/max reward, last/best held-out accuracy, the last train accuracy, and warnings a reader must not
    miss.

    `warn_after` is the recipe's `trainer.zero_reward_warning_steps`: a run whose rewards were all zero for that
    many consecutive steps (the trainer's `health/zero_reward_steps`) had no learning signal there. A last train
    accuracy MEMORISATION_GAP or more above the held-out one is memorisation.
    """
    _, rewards = _series(records, "reward/mean")
    eval_steps, accuracies = _series(records, "eval/accuracy")
    _, train_accuracies = _series(records, "eval/train_accuracy")
    _, zero_streaks = _series(records, ZERO_REWARD_STEPS)
    summary: dict[str, Any] = {"metric_lines": len(records), "unreadable_lines": unreadable, "warnings": []}
    if records:
        summary["last_step"] = max(r["step"] for r in records)
    if rewards:
        summary["reward_mean"] = {"first": rewards[0], "last": rewards[-1], "max": max(rewards)}
    if accuracies:
        best = max(range(len(accuracies)), key=accuracies.__getitem__)
        summary["eval_accuracy"] = {"last": accuracies[-1], "best": accuracies[best], "best_step": eval_steps[best]}
        if (before := base_accuracy(records)) is not None:
            summary["eval_accuracy"]["before_training"] = before
    if train_accuracies:
        summary["train_accuracy"] = {"last": train_accuracies[-1]}
    if accuracies and train_accuracies and train_accuracies[-1] - accuracies[-1] >= MEMORISATION_GAP:
        summary["warnings"].append(
            f"train accuracy {train_accuracies[-1]:.2f} against held-out {accuracies[-1]:.2f} at the last eval: the "
            "policy memorises its training prompts instead of learning the task; use more distinct train prompts "
            'than the model can memorise, or a smaller model (trainer/README.md, "Robust recipes")'
        )
    longest = int(max(zero_streaks, default=0))
    summary["longest_zero_reward_steps"] = longest
    if warn_after and longest >= warn_after:
        summary["warnings"].append(
            f"every reward was 0 for {longest} consecutive steps (warning after {warn_after}): no learning signal "
            "there; check that the base model answers in the reward's format before training longer"
        )
    return summary


def _score(result: Mapping[str, Any], key: str) -> float:
    value = result.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise EvalError(
            f"`python -m trainer eval` returned no numeric {key!r} (keys: {sorted(result)}); "
            f"it must return {' and '.join(SCORES)}"
        )
    return float(value)


def axis_limits(values: Sequence[float], min_span: float) -> tuple[float, float]:
    """y limits from 0 (or the lowest value, if negative) to the highest, at least `min_span` tall.

    Autoscaling a flat series magnifies noise: a reward of 0 with one 0.004 step would fill the panel as a
    spike. Anchoring at 0 with a floor on the span draws flat series flat (rewards and accuracies use span 1).
    """
    low = min(0.0, *values) if values else 0.0
    high = max(values, default=low)
    span = max(high - low, min_span)
    return low - 0.02 * span, low + 1.04 * span


# (metric, panel title, minimum y span): the curves the eval stage draws, row by row.
PANELS = (
    ("reward/mean", "reward mean per step", 1.0),
    ("eval/accuracy", "accuracy: held-out and train prompts", 1.0),
    ("reward/zero_variance_groups", "groups without signal (all rewards equal)", 1.0),
    ("policy/kl", "KL(policy || reference)", 1e-3),
    ("policy/entropy", "entropy (nats per token)", 0.1),
    ("response/length_mean", "response length (tokens)", 1.0),
)
# An agent run's episodes: turns per episode in place of the response length (which counts observations too).
TURNS_PANEL = ("episode/turns_mean", "turns per training episode", 1.0)
EXAMPLE_TRAJECTORIES = 3


def plot_curves(records: Sequence[Mapping[str, Any]], accuracy: float | None, path: Path, *, title: str = "") -> None:
    """The training curves (PANELS) and the export's accuracy, as a PNG (atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7), constrained_layout=True)
    panels = (*PANELS[:-1], TURNS_PANEL) if _series(records, TURNS_PANEL[0])[1] else PANELS
    for ax, (name, panel, min_span) in zip(axes.flat, panels, strict=True):
        steps, values = _series(records, name)
        if name == "eval/accuracy":
            shown = _accuracy_panel(ax, records, accuracy)
        else:
            shown = values
            if values:
                ax.plot(steps, values, linewidth=1.2)
        if not shown:
            ax.text(0.5, 0.5, f"no {name} in the metrics", ha="center", va="center", transform=ax.transAxes)
        ax.set(title=panel, xlabel="step", ylim=axis_limits(shown, min_span))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    storage.write_bytes(str(path), png.getvalue())


def _accuracy_panel(ax: Any, records: Sequence[Mapping[str, Any]], accuracy: float | None) -> list[float]:
    """Held-out accuracy beside the accuracy on train prompts (the gap is memorisation), and the export's score;
    returns every value drawn."""
    shown: list[float] = []
    for field, label, style in (("eval/accuracy", "held-out", "o-"), ("eval/train_accuracy", "train prompts", "x:")):
        steps, values = _series(records, field)
        if values:
            ax.plot(steps, values, style, linewidth=1.2, label=label)
            shown += values
    if accuracy is not None:
        ax.axhline(accuracy, color="tab:red", linestyle="--", label=f"export accuracy {accuracy:.3f}")
        shown.append(accuracy)
    if shown:
        ax.legend(loc="lower right", fontsize="small")
    return shown


def before_training(results: Mapping[str, Any]) -> float | None:
    """The base model's held-out accuracy, scored by the trainer before its first step with the eval stage's scorer
    (None where `trainer.eval_before_train` was off)."""
    return (results["training"].get("eval_accuracy") or {}).get("before_training")


def accuracy_line(results: Mapping[str, Any]) -> str:
    """The result in one line: held-out greedy accuracy before and after training, on how many prompts."""
    before = before_training(results)
    after = f"{results['accuracy']:.3f}"
    scored = f"on {results['n']} validation prompts (pass@{results['k']} {results['pass_at_k']:.3f})"
    if before is None:
        return (
            f"held-out greedy accuracy {after} after training {scored}; before training not measured "
            "(recipe.trainer.eval_before_train is off)"
        )
    return f"held-out greedy accuracy {before:.3f} before training -> {after} after, {scored}"


def table_rows(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The eval table, row by row (results.html, and the report's first page)."""
    before = before_training(results)
    rows = [
        ("accuracy (greedy)", f"{results['accuracy']:.4f}"),
        *([("accuracy before training (step 0)", f"{before:.4f}")] if before is not None else []),
        (f"pass@{results['k']}", f"{results['pass_at_k']:.4f}"),
        ("validation prompts", str(results["n"])),
        ("seed", str(results["seed"])),
    ]
    training = results["training"]
    if "last_step" in training:
        rows.append(("training steps (last)", str(training["last_step"])))
    if "reward_mean" in training:
        reward = training["reward_mean"]
        rows.append(
            ("reward mean first / last / max", f"{reward['first']:.4f} / {reward['last']:.4f} / {reward['max']:.4f}")
        )
    if "eval_accuracy" in training:
        acc = training["eval_accuracy"]
        rows.append(
            ("held-out accuracy last / best (step)", f"{acc['last']:.4f} / {acc['best']:.4f} ({acc['best_step']:g})")
        )
    if "train_accuracy" in training:
        rows.append(("train-prompt accuracy last", f"{training['train_accuracy']['last']:.4f}"))
    episodes = results.get("episodes") or {}
    if episodes:
        rows.append(("turns per episode mean / max", f"{episodes['turns_mean']:.2f} / {episodes['turns_max']:g}"))
        ended = {
            k.removeprefix("ended_").removesuffix("_frac"): v for k, v in episodes.items() if k.startswith("ended_")
        }
        rows.append(("episodes ended by", ", ".join(f"{how} {share:.2f}" for how, share in ended.items() if share)))
    return rows + [("warning", warning) for warning in training["warnings"]]


def table_html(results: Mapping[str, Any], trajectories: Sequence[Mapping[str, Any]] = ()) -> str:
    rows = table_rows(results)
    body = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>eval results</title>"
        "<style>table{border-collapse:collapse;font-family:sans-serif}"
        "th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}</style></head>\n"
        f"<body><table>\n{body}\n</table>{_examples_html(trajectories)}</body></html>\n"
    )


def example_trajectories(trajectories: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Three greedy episodes to read: the first solved, the first failed, then the next one not yet shown."""
    solved = [t for t in trajectories if float(t.get("reward") or 0) >= 1.0]
    failed = [t for t in trajectories if float(t.get("reward") or 0) < 1.0]
    chosen = [group[0] for group in (solved, failed) if group]
    rest = [t for t in trajectories if all(t is not c for c in chosen)]
    return chosen + rest[: EXAMPLE_TRAJECTORIES - len(chosen)]


def _examples_html(trajectories: Sequence[Mapping[str, Any]]) -> str:
    blocks = []
    for trajectory in example_trajectories(trajectories):
        lines = [f"prompt: {trajectory.get('prompt')}"]
        for number, turn in enumerate(trajectory.get("turns") or [], 1):
            lines += [f"[{number}] $ {turn.get('action')}", f"    {turn.get('observation')}"]
        lines.append(f"reward {trajectory.get('reward')}; ended: {trajectory.get('ended')}")
        if trajectory.get("error"):
            lines.append(f"error: {trajectory['error']}")
        blocks.append(f"<pre>{html.escape(chr(10).join(lines))}</pre>")
    return f"<h3>example episodes (greedy)</h3>{''.join(blocks)}" if blocks else ""


def score_with_trainer(
    model_dir: Path, validation_files: Sequence[Path], launch: LaunchDocument, k: int
) -> tuple[dict[str, Any], str]:
    """Greedy accuracy and pass@k from the trainer's own scorer (its command line: rlbuild never imports it), and
    the greedy episodes' trajectories as JSONL where the environment is an agent's (else "")."""
    recipe = launch.recipe
    with tempfile.TemporaryDirectory(prefix="rlbuild-eval-") as tmp:
        out, trajectories = Path(tmp) / "scores.json", Path(tmp) / TRAJECTORIES
        command = [sys.executable, "-m", "trainer", "eval", "--model", str(model_dir), "--out", str(out)]
        command += ["--k", str(k), "--seed", str(launch.run.seed)]
        command += ["--environment", recipe.environment.model_dump_json(), "--trajectories", str(trajectories)]
        command += ["--max-tokens", str(recipe.generator.eval_sampling_params.max_generate_length)]
        command += ["--data", *map(str, validation_files)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode:
            raise EvalError(f"scoring {model_dir} failed:\n{result.stderr.strip()[-3000:]}")
        return json.loads(out.read_text()), trajectories.read_text() if trajectories.exists() else ""


def run_eval(
    model_dir: Path, validation_files: Sequence[Path], launch: LaunchDocument, out_dir: Path, *, k: int = 4
) -> dict[str, Any]:
    """Score the export `model_dir` (its `model/`) on the validation rows; write results.json, results.html and
    curves.png.

    The training curves come from the run's metrics (the launch document's artifacts.metrics_uri); when there
    are none, the plot says so. Returns the results document.
    """
    if k < 2:
        # The scorer reports greedy accuracy, and pass@k from k sampled answers only for k > 1.
        raise EvalError(f"k={k}: pass@k needs k >= 2 sampled answers per prompt; pass --k 2 or more")
    rows = read_rows(validation_files)
    verify_local(Path(model_dir))  # the export's manifest: a changed file is corruption, never a score
    scored, trajectories = score_with_trainer(Path(model_dir) / EXPORT_MODEL, validation_files, launch, k)
    seed = launch.run.seed
    artifacts = launch.artifacts
    records, unreadable = read_run_metrics(artifacts.metrics_uri, artifacts.metrics_segments_root)
    results: dict[str, Any] = {
        "accuracy": _score(scored, "accuracy"),
        "pass_at_k": _score(scored, "pass_at_k"),
        "k": k,
        "n": len(rows),
        "seed": seed,
        "validation_files": [Path(p).name for p in validation_files],
        # How the scores were sampled (temperature, greedy/sampled counts, ...), as the scorer reports it.
        "samples": {key: value for key, value in scored.items() if key not in (*SCORES, "episodes")},
        "training": training_summary(records, unreadable, launch.recipe.trainer.zero_reward_warning_steps),
    }
    if "episodes" in scored:  # an agent's: how the greedy episodes went (turns, endings, environment time)
        results["episodes"] = scored["episodes"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if trajectories:
        storage.write_text(str(out_dir / TRAJECTORIES), trajectories)
    storage.write_text(str(out_dir / RESULTS), json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    examples = [json.loads(line) for line in trajectories.splitlines() if line.strip()]
    storage.write_text(str(out_dir / TABLE), table_html(results, examples))
    title = f"accuracy {results['accuracy']:.3f}, pass@{k} {results['pass_at_k']:.3f} on {len(rows)} prompts"
    plot_curves(records, results["accuracy"], out_dir / CURVES, title=title)
    return results
