"""Does a shipped recipe learn on any machine of this kind, or only under one bit pattern? Seeds x perturbations.

Each cell trains a shipped experiment (`config/experiments/tiny-<task>.yaml`: its role plan, recipe, steps and
data split) with one experiment seed (the base model's build and the sampling) under one perturbation that stands
in for another CPU, in a process of its own:

    none          as this machine runs it
    isa-avx2      ATEN_CPU_CAPABILITY=avx2: the vectorised kernels of an AVX2-only CPU (this box has AVX-512)
    isa-default   ATEN_CPU_CAPABILITY=default: torch's scalar kernels, another reduction order everywhere
    threads-2     two torch threads per trainer actor (sums split over another number of threads round differently)
    weights-1e-6  the base model's weights times (1 + 1e-6 * N(0, 1)) before training

and prints, per cell, held-out greedy accuracy (validation rows training never samples) at the start and the end,
train greedy accuracy on as many train rows, the mean training reward of the last 20 steps, the held-out curve
and the wall time; then the worst cell per task. `--set key=value` overrides a key of the experiment's recipe,
role plan, runtime or topology (`--set recipe.trainer.algorithm.kl_loss_coef=0.02`,
`--set role_plan.n_samples_per_prompt=16`, `--set runtime.entrypoint=fully_async`).

    .venv/bin/python benchmarks/learning_spread.py --task reversal --seeds 42 1 7 --perturb none isa-avx2 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PERTURBATIONS = ("none", "isa-avx2", "isa-default", "threads-2", "weights-1e-6")
RESULT_MARK = "[cell] "


def _overrides(pairs: list[str]) -> dict[str, Any]:
    """`recipe.trainer.max_steps=300`, `role_plan.n_samples_per_prompt=16`: an experiment overlay."""
    recipe: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        node = recipe
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return recipe


def _perturbed_base(seed: int, variant: str, scale: float) -> Path:
    """A copy of the seed's base model with every weight scaled by (1 + scale * N(0, 1)), cached like the base."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from rlbuild.dev.launches import base_model_dir

    base = base_model_dir(seed, variant)
    folder = base.with_name(f"{base.name}-perturbed-{scale:g}")
    if not (folder / "config.json").exists():
        partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=folder.parent))
        shutil.copytree(base, partial, dirs_exist_ok=True)
        weights = load_file(partial / "model.safetensors")
        noise = torch.Generator().manual_seed(seed)
        save_file(
            {k: v * (1 + scale * torch.randn(v.shape, generator=noise)) for k, v in weights.items()},
            partial / "model.safetensors",
            metadata={"format": "pt"},
        )
        partial.rename(folder)
    return folder


def run_cell(task: str, seed: int, perturbation: str, overrides: dict[str, Any], steps: int | None) -> dict[str, Any]:
    """One training run in this process; returns its summary."""
    from rlbuild.contracts.launch import load_launch
    from rlbuild.dev.launches import write_shipped_launch
    from rlbuild.plan.series import deep_merge
    from trainer import loop
    from trainer.commands import evaluate

    experiment = yaml.safe_load((REPO / "config" / "experiments" / f"tiny-{task}.yaml").read_text())
    trainer = overrides.setdefault("recipe", {}).setdefault("trainer", {})
    max_steps = steps or deep_merge(experiment["recipe"], overrides["recipe"])["trainer"].get("max_steps", 500)
    schedule = {"ckpt_interval": max_steps, "eval_interval": max(max_steps // 10, 1), "eval_before_train": True}
    trainer.update(schedule | trainer | {"max_steps": max_steps})  # a --set eval_interval wins
    if perturbation == "threads-2":
        trainer["num_threads"] = 2
    variant = experiment["model"]["revision"]
    model_dir = _perturbed_base(seed, variant, 1e-6) if perturbation == "weights-1e-6" else None
    rows = experiment["data"]["train"][0]["source"].removeprefix("task:").split("/")[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"rlbuild-spread-{task}-{seed}-") as tmp:
        path = write_shipped_launch(
            Path(tmp),
            f"tiny-{task}",
            seed=seed,
            recipe=overrides["recipe"],
            role_plan=overrides.get("role_plan"),
            model_dir=model_dir,
            **{part: overrides[part] for part in ("runtime", "topology") if part in overrides},
        )
        launch = load_launch(str(path))
        manifest = loop.run(launch)
        records = [json.loads(line) for line in Path(launch.artifacts.metrics_uri).read_text().splitlines()]
        final = Path(manifest["hf_path"])
        train_rows = [json.loads(x) for x in next((Path(tmp) / "sources").glob(f"{rows}-train-*.jsonl")).open()]
        validation = [json.loads(x) for x in next((Path(tmp) / "sources").glob(f"{rows}-validation-*.jsonl")).open()]
        turn, section = launch.recipe.generator.eval_sampling_params.max_generate_length, launch.recipe.environment
        scored = evaluate.evaluate(final, train_rows[: len(validation)], max_tokens=turn, environment=section)
        train_accuracy = scored["accuracy"]
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    return {
        "task": task,
        "seed": seed,
        "perturbation": perturbation,
        "steps": max_steps,
        "held_out_start": manifest["metrics"]["initial_eval_accuracy"],
        "held_out_end": manifest["metrics"]["final_eval_accuracy"],
        "train_accuracy_end": train_accuracy,
        "train_reward_last20": round(sum(rewards[-20:]) / max(len(rewards[-20:]), 1), 3),
        "curve": [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r],
        "wall_s": round(time.perf_counter() - started, 1),
        "records": records,
    }


def _spawn(task: str, seed: int, perturbation: str, sets: list[str], steps: int | None) -> dict[str, Any]:
    env = dict(os.environ)
    if perturbation.startswith("isa-"):
        env["ATEN_CPU_CAPABILITY"] = perturbation.removeprefix("isa-")
    argv = [sys.executable, __file__, "--cell", task, str(seed), perturbation, *(f"--set={s}" for s in sets)]
    if steps:
        argv.append(f"--steps={steps}")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line.removeprefix(RESULT_MARK))
    tail = (done.stdout + done.stderr)[-3000:]
    raise RuntimeError(f"cell {task}/{seed}/{perturbation} failed (exit {done.returncode}):\n{tail}")


def _print_cell(cell: dict[str, Any]) -> None:
    curve = " ".join(f"{step}:{acc:.2f}" for step, acc in cell["curve"])
    print(
        f"{cell['task']:<9} seed {cell['seed']:>3} {cell['perturbation']:<13} held-out {cell['held_out_start']:.2f} -> "
        f"{cell['held_out_end']:.2f} | train acc {cell['train_accuracy_end']:.2f} | reward(last 20) "
        f"{cell['train_reward_last20']:.2f} | {cell['wall_s']:.0f} s | curve {curve}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", action="append", choices=("addition", "reversal", "agent"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 7])
    parser.add_argument("--perturb", nargs="+", choices=PERTURBATIONS, default=["none", "isa-avx2", "weights-1e-6"])
    parser.add_argument("--steps", type=int, help="override max_steps (a smoke run)")
    parser.add_argument(
        "--set", action="append", default=[], help="experiment override, dotted: recipe.<key>=V or role_plan.<key>=V"
    )
    parser.add_argument("--jobs", type=int, default=2, help="cells trained at once")
    parser.add_argument("--json", type=Path, help="also write every cell to this file")
    parser.add_argument("--cell", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        task, seed, perturbation = args.cell
        result = run_cell(task, int(seed), perturbation, _overrides(args.set), args.steps)
        print(RESULT_MARK + json.dumps(result), flush=True)
        return 0
    results: list[dict[str, Any]] = []
    cells = [(t, s, p) for t in args.task or ["addition", "reversal"] for s in args.seeds for p in args.perturb]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(lambda c: _spawn(*c, args.set, args.steps), cells):
            _print_cell(result)
            results.append(result)
            if args.json:
                args.json.write_text(json.dumps(results))
    for task in sorted({r["task"] for r in results}):
        worst = min((r for r in results if r["task"] == task), key=lambda r: r["held_out_end"])
        print(f"worst {task}: {worst['held_out_end']:.2f} (seed {worst['seed']}, {worst['perturbation']})")
    for inert in _inert_perturbations(results):
        print(f"no effect here: {inert} trained bit for bit as 'none' (the same gradient norms every step)")
    return 0


def _inert_perturbations(results: list[dict[str, Any]]) -> list[str]:
    """The perturbations whose every cell repeats its seed's unperturbed gradient norms exactly: on this CPU they
    change no bit (ATEN_CPU_CAPABILITY=avx2 on a CPU without AVX-512 is the CPU's own choice), so they are no
    evidence. Rewards would not tell: a perturbation that moves every weight can still sample the same answers."""
    norms = {(r["task"], r["seed"], r["perturbation"]): _grad_norms(r) for r in results}
    inert = []
    for perturbation in sorted({p for _, _, p in norms} - {"none"}):
        pairs = [(v, norms.get((t, s, "none"))) for (t, s, p), v in norms.items() if p == perturbation]
        compared = [(v, base) for v, base in pairs if base is not None]
        if compared and all(v == base for v, base in compared):
            inert.append(perturbation)
    return inert


def _grad_norms(cell: dict[str, Any]) -> list[float]:
    return [r["policy/grad_norm"] for r in cell["records"] if "policy/grad_norm" in r]


if __name__ == "__main__":
    sys.exit(main())
