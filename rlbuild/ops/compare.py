"""The series report: every arm of one version side by side (`rlbuild compare`, the rule `compare`).

What a team compares after a series of ablations, in one page: each arm's curves on shared axes (reward,
held-out accuracy, KL, entropy, grad norm, tokens/s), the eval table with deltas against the base arm, what each
arm changes in the experiment (a key the experiment leaves out shown as its default), and its wall time and
GPU-hours (from the trainer's own clock, `perf/elapsed_s`). Each arm is read from its launch document (where its
metrics are) and its eval's `results.json`.

An accuracy is a share of n validation prompts, so a difference of one prompt in twenty is sampling noise, not a
finding: each delta carries the 95% interval of the difference (Newcombe's score interval, built from each arm's
Wilson interval on its n prompts) and is marked within noise when that interval holds 0.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbuild.contracts.artifacts import arm_of
from rlbuild.contracts.launch import load_launch
from rlbuild.contracts.metricstream import ELAPSED, Record, read_run_metrics, used_gpu_hours
from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError
from rlbuild.plan import series
from rlbuild.plan.planview import clock
from rlbuild.plan.series import CheckedExperiment

# (metric, panel title): the curves every arm draws on one axis each.
PANELS = (
    ("reward/mean", "reward mean"),
    ("eval/accuracy", "held-out accuracy"),
    ("policy/kl", "KL(policy || reference)"),
    ("policy/entropy", "entropy (nats per token)"),
    ("policy/grad_norm", "grad norm"),
    ("perf/tokens_per_s", "tokens/s"),
)
SCORES = ("accuracy", "pass_at_k")
PAGE, CURVES, NUMBERS = "compare.html", "curves.png", "compare.json"  # in series/v{version}/
Z_95 = 1.959964  # the standard normal quantile of a two-sided 95% interval


class CompareError(RlbuildError):
    """The series report cannot be made: an arm's documents are missing or do not belong to the series."""


@dataclass(frozen=True)
class ArmRun:
    """One arm as the report shows it."""

    arm: str
    key: str  # its version key
    metrics: list[Record]
    results: dict[str, Any]
    gpus: int

    @property
    def wall_s(self) -> float | None:
        elapsed = [float(r[ELAPSED]) for r in self.metrics if isinstance(r.get(ELAPSED), int | float)]
        return max(elapsed) if elapsed else None


def read_arm(launch_uri: str, results_uri: str) -> ArmRun:
    """An arm's metrics (through its launch document) and eval results (local paths or s3:// URIs)."""
    launch = load_launch(launch_uri)
    arm = arm_of(launch.run.version)
    if arm is None:
        raise CompareError(f"{launch_uri} is the launch of {launch.run.version}, which is no arm of a series")
    records, _ = read_run_metrics(launch.artifacts.metrics_uri, launch.artifacts.metrics_segments_root)
    allocation = launch.allocation
    text = storage.read_text(results_uri)
    if text is None:
        raise CompareError(f"{results_uri} does not exist: {arm} is not evaluated (build eval/v{launch.run.version})")
    results = json.loads(text)
    return ArmRun(arm, launch.run.version, records, results, allocation.num_nodes * allocation.gpus_per_node)


def comparison(checked: CheckedExperiment, runs: Sequence[ArmRun]) -> dict[str, Any]:
    """The report's numbers: per arm its scores, deltas against the base arm, changes, wall time and GPU-hours."""
    experiment = checked.experiment
    base_name = series.base_arm(experiment)
    base = next((r for r in runs if r.arm == base_name), runs[0])
    arms: dict[str, Any] = {}
    for run in runs:
        scores = {name: float(run.results[name]) for name in SCORES if name in run.results}
        deltas = {
            name: round(value - float(base.results[name]), 6)
            for name, value in scores.items()
            if name in base.results and run is not base
        }
        gpu_hours = used_gpu_hours(run.metrics, run.gpus)
        noise = accuracy_noise(run.results, base.results) if run is not base else {}
        arms[run.arm] = {
            "key": run.key,
            "smoke": checked.arms[run.arm].smoke,
            "scores": scores,
            "delta_vs_base": deltas,
            **noise,
            "changes": {f: [old, new] for f, (old, new) in series.changes(checked, run.arm).items()},
            "steps": max((r["step"] for r in run.metrics), default=0),
            "gpus": run.gpus,
            "wall_s": None if run.wall_s is None else round(run.wall_s, 1),
            "gpu_hours": None if gpu_hours is None else round(gpu_hours, 6),
        }
    aliases = {a: alias for a in experiment.arms if (alias := series.alias_of(checked, a)) is not None}
    return {"experiment": experiment.name, "base": base.arm, "arms": arms, "aliases": aliases}


def wilson(share: float, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a share measured on n trials."""
    if n <= 0:
        return 0.0, 1.0
    z2 = Z_95 * Z_95
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_95 * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def difference_interval(a: float, n_a: int, b: float, n_b: int) -> tuple[float, float]:
    """The 95% interval of a - b, two shares on n_a and n_b trials: Newcombe's hybrid score interval (his method
    10), from the Wilson interval of each; it stays inside [-1, 1] and is sound at 0 and 1, where a normal
    approximation is not."""
    low_a, high_a = wilson(a, n_a)
    low_b, high_b = wilson(b, n_b)
    delta = a - b
    return delta - math.hypot(a - low_a, high_b - b), delta + math.hypot(high_a - a, b - low_b)


def accuracy_noise(results: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The accuracy delta's 95% interval and whether it is within the eval's sampling noise (the interval holds 0),
    from each eval's share and its number of prompts; {} where either lacks them."""
    if not all(isinstance(r.get(k), int | float) for r in (results, base) for k in ("accuracy", "n")):
        return {}
    low, high = difference_interval(
        float(results["accuracy"]), int(results["n"]), float(base["accuracy"]), int(base["n"])
    )
    interval = [round(low, 4), round(high, 4)]
    return {"accuracy_delta_95": interval, "prompts": int(results["n"]), "within_noise": low <= 0 <= high}


def noise_words(found: Mapping[str, Any], base: str) -> str:
    """An arm's accuracy delta in words: its size, and whether the eval can tell it from noise."""
    delta = found["delta_vs_base"].get("accuracy")
    if delta is None or "within_noise" not in found:
        return ""
    low, high = found["accuracy_delta_95"]
    verdict = "within the eval's sampling noise" if found["within_noise"] else "beyond the eval's sampling noise"
    return f"{delta:+.3f} vs {base}, {verdict} (95% interval {low:+.2f} to {high:+.2f} on {found['prompts']} prompts)"


def plot(runs: Sequence[ArmRun]) -> bytes:
    """Every arm's curves, one panel per metric, shared axes: a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharex=True, constrained_layout=True)
    for ax, (name, title) in zip(axes.flat, PANELS, strict=True):
        drawn = False
        for run in runs:
            points = [(r["step"], r[name]) for r in run.metrics if isinstance(r.get(name), int | float)]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, "o-" if len(points) < 20 else "-", linewidth=1.2, markersize=3, label=run.arm)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, f"no {name} in any arm's metrics", ha="center", va="center", transform=ax.transAxes)
        ax.set(title=title, xlabel="step")
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 6))
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=90)
    plt.close(fig)
    return png.getvalue()


def render_html(report: Mapping[str, Any], curves_png: bytes) -> str:
    """The report as one self-contained page (the curves inline)."""
    base = report["base"]
    head = ["arm", "accuracy", "pass@k", f"Δ accuracy vs {base}", "steps", "GPUs", "wall", "GPU-h", "changes"]
    rows = []
    for arm, found in report["arms"].items():
        scores = found["scores"]
        changes = "; ".join(f"{f}: {old!r} → {new!r}" for f, (old, new) in found["changes"].items()) or "—"
        cells = [
            arm + (" (smoke)" if found["smoke"] else ""),
            _number(scores.get("accuracy")),
            _number(scores.get("pass_at_k")),
            "base" if arm == base else _delta_cell(found),
            str(found["steps"]),
            str(found["gpus"]),
            "—" if found["wall_s"] is None else clock(found["wall_s"]),
            _number(found["gpu_hours"], 5),
            changes,
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    aliases = "".join(
        f"<p>{html.escape(a)} is the same experiment as {html.escape(b)}: one build.</p>"
        for a, b in report["aliases"].items()
    )
    aliases += (
        "<p>Accuracy is a share of the validation prompts. A delta marked <em>within noise</em> is smaller than the "
        "eval can tell apart: the 95% interval of the difference (Newcombe's, from each arm's Wilson interval on "
        "its prompts) holds 0, so it says nothing about which arm is better.</p>"
    )
    image = base64.b64encode(curves_png).decode()
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(report['experiment'])}: series</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}</style></head>\n<body>"
        f"<h1>{html.escape(report['experiment'])}: {len(report['arms'])} arms</h1>\n"
        "<table><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>\n"
        + "\n".join(rows)
        + f"\n</table>{aliases}\n<img alt='every arm' src='data:image/png;base64,{image}'>\n</body></html>\n"
    )


def write_report(checked: CheckedExperiment, runs: Sequence[ArmRun], out: Path) -> dict[str, Any]:
    """The series report in the folder `out`: its numbers (compare.json), the curves (curves.png) and the page
    (compare.html, last)."""
    if not runs:
        raise CompareError(f"{checked.experiment.name}: no arm to compare; declare arms: in the experiment file")
    report = comparison(checked, runs)
    curves = plot(runs)
    storage.write_text(str(out / NUMBERS), json.dumps(report, indent=2) + "\n")
    storage.write_bytes(str(out / CURVES), curves)
    storage.write_text(str(out / PAGE), render_html(report, curves))
    return report


def _number(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _delta_cell(found: Mapping[str, Any]) -> str:
    delta = found["delta_vs_base"].get("accuracy")
    if delta is None:
        return "—"
    if "within_noise" not in found:
        return f"{delta:+.3f}"
    low, high = found["accuracy_delta_95"]
    return f"{delta:+.3f} ({'within noise' if found['within_noise'] else 'beyond noise'}: {low:+.2f} to {high:+.2f})"
