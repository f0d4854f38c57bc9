"""The eval stage: score an exported policy on the validation set and draw its training curves.

Writes, into the eval directory: `results.json` (scores plus a summary of training), `results.html`
(the same scores as a table, for the Snakemake report) and `curves.png` (reward per step and held-out
accuracy per eval step). The scoring itself is the trainer's (`python -m trainer eval`).
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

from rlbuild import storage
from rlbuild.errors import RlbuildError
from rlbuild.launch import LaunchDocument
from rlbuild.manifest import verify_local
from rlbuild.rows import read_rows as read_jsonl_rows

RESULTS = "results.json"
TABLE = "results.html"
CURVES = "curves.png"
SCORES = ("accuracy", "pass_at_k")


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


def read_metrics(metrics_uri: str | None) -> tuple[list[dict[str, Any]], int]:
    """(metric lines, unreadable line count) from a metrics.jsonl; empty when there is none.

    A training run killed mid-write leaves a torn last line; it is counted, not fatal.
    """
    text = storage.read_text(metrics_uri) if metrics_uri else None
    if text is None:
        return [], 0
    lines = text.splitlines()
    records: list[dict[str, Any]] = []
    unreadable = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            unreadable += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int | float):
            records.append(record)
        else:
            unreadable += 1
    return records, unreadable


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


def training_summary(records: Sequence[Mapping[str, Any]], unreadable: int) -> dict[str, Any]:
    _, rewards = _series(records, "reward_mean")
    eval_steps, accuracies = _series(records, "eval_accuracy")
    summary: dict[str, Any] = {"metric_lines": len(records), "unreadable_lines": unreadable}
    if records:
        summary["last_step"] = max(r["step"] for r in records)
    if rewards:
        summary["reward_mean"] = {"first": rewards[0], "last": rewards[-1], "max": max(rewards)}
    if accuracies:
        best = max(range(len(accuracies)), key=accuracies.__getitem__)
        summary["eval_accuracy"] = {"last": accuracies[-1], "best": accuracies[best], "best_step": eval_steps[best]}
    return summary


def _score(result: Mapping[str, Any], key: str) -> float:
    value = result.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise EvalError(
            f"`python -m trainer eval` returned no numeric {key!r} (keys: {sorted(result)}); "
            f"it must return {' and '.join(SCORES)}"
        )
    return float(value)


def plot_curves(records: Sequence[Mapping[str, Any]], accuracy: float | None, path: Path, *, title: str = "") -> None:
    """Reward mean per step and held-out accuracy per eval step, as a PNG (atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reward_steps, rewards = _series(records, "reward_mean")
    eval_steps, accuracies = _series(records, "eval_accuracy")
    fig, (ax_reward, ax_acc) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    if rewards:
        ax_reward.plot(reward_steps, rewards, color="tab:blue", linewidth=1.2)
    else:
        ax_reward.text(
            0.5, 0.5, "no reward_mean in the metrics", ha="center", va="center", transform=ax_reward.transAxes
        )
    ax_reward.set(title="reward mean per step", xlabel="step", ylabel="reward mean")
    ax_reward.grid(alpha=0.3)
    if accuracies:
        ax_acc.plot(eval_steps, accuracies, marker="o", color="tab:green", label="held-out accuracy during training")
    if accuracy is not None:
        ax_acc.axhline(accuracy, color="tab:red", linestyle="--", label=f"export accuracy {accuracy:.3f}")
    if accuracies or accuracy is not None:
        ax_acc.legend(loc="lower right", fontsize="small")
    else:
        ax_acc.text(0.5, 0.5, "no eval_accuracy in the metrics", ha="center", va="center", transform=ax_acc.transAxes)
    ax_acc.set(title="held-out accuracy", xlabel="step", ylabel="accuracy", ylim=(-0.02, 1.02))
    ax_acc.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    storage.write_bytes(str(path), png.getvalue())


def _table_html(results: Mapping[str, Any]) -> str:
    rows = [
        ("accuracy (greedy)", f"{results['accuracy']:.4f}"),
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
    body = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>eval results</title>"
        "<style>table{border-collapse:collapse;font-family:sans-serif}"
        "th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}</style></head>\n"
        f"<body><table>\n{body}\n</table></body></html>\n"
    )


def score_with_trainer(
    model_dir: Path, validation_files: Sequence[Path], launch: LaunchDocument, k: int
) -> dict[str, Any]:
    """Greedy accuracy and pass@k from the trainer's own scorer (its command line: rlbuild never imports it)."""
    recipe = launch.recipe
    with tempfile.TemporaryDirectory(prefix="rlbuild-eval-") as tmp:
        out = Path(tmp) / "scores.json"
        command = [sys.executable, "-m", "trainer", "eval", "--model", str(model_dir), "--out", str(out)]
        command += ["--k", str(k), "--seed", str(launch.run.seed), "--env-class", recipe.environment.env_class]
        command += ["--max-tokens", str(recipe.generator.eval_sampling_params.max_generate_length)]
        command += ["--data", *map(str, validation_files)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode:
            raise EvalError(f"scoring {model_dir} failed:\n{result.stderr.strip()[-3000:]}")
        return json.loads(out.read_text())


def run_eval(
    model_dir: Path, validation_files: Sequence[Path], launch: LaunchDocument, out_dir: Path, *, k: int = 4
) -> dict[str, Any]:
    """Score `model_dir` on the validation rows; write results.json, results.html and curves.png.

    The training curves come from the run's metrics (the launch document's artifacts.metrics_uri); when there
    are none, the plot says so. Returns the results document.
    """
    if k < 2:
        # The scorer reports greedy accuracy, and pass@k from k sampled answers only for k > 1.
        raise EvalError(f"k={k}: pass@k needs k >= 2 sampled answers per prompt; pass --k 2 or more")
    rows = read_rows(validation_files)
    verify_local(Path(model_dir))  # the export's manifest: a changed file is corruption, never a score
    scored = score_with_trainer(Path(model_dir), validation_files, launch, k)
    seed = launch.run.seed
    records, unreadable = read_metrics(launch.artifacts.metrics_uri)
    results: dict[str, Any] = {
        "accuracy": _score(scored, "accuracy"),
        "pass_at_k": _score(scored, "pass_at_k"),
        "k": k,
        "n": len(rows),
        "seed": seed,
        "validation_files": [Path(p).name for p in validation_files],
        # How the scores were sampled (temperature, greedy/sampled counts, ...), as the scorer reports it.
        "samples": {key: value for key, value in scored.items() if key not in SCORES},
        "training": training_summary(records, unreadable),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    storage.write_text(str(out_dir / RESULTS), json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    storage.write_text(str(out_dir / TABLE), _table_html(results))
    title = f"accuracy {results['accuracy']:.3f}, pass@{k} {results['pass_at_k']:.3f} on {len(rows)} prompts"
    plot_curves(records, results["accuracy"], out_dir / CURVES, title=title)
    return results
