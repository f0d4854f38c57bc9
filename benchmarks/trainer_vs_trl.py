"""rlbuild's GRPO trainer vs TRL's GRPOTrainer, side by side, on CPU.

Same tiny warm-started model (trainer.tiny), same task (single-digit addition, train pairs; accuracy on the
disjoint held-out pairs), same group size, batch sizes, learning rate, KL coefficient, clip range, update
epochs and step count. Prints seconds per step (first step excluded: both warm up) and final held-out greedy
accuracy for both, and the ratio.

    .venv/bin/python benchmarks/trainer_vs_trl.py --steps 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from trainer import loop, tasks
from trainer.config import Launch, deep_merge
from trainer.evaluate import evaluate
from trainer.testing import base_model_dir, write_test_launch


def ours(work: Path, settings: dict[str, Any]) -> dict[str, Any]:
    base = yaml.safe_load((Path(__file__).resolve().parent.parent / "config/trainer/base.yaml").read_text())
    recipe = {
        "trainer": {
            "train_batch_size": settings["prompts"],
            "policy_mini_batch_size": settings["prompts"],
            "micro_train_batch_size_per_gpu": settings["micro"],
            "max_steps": settings["steps"],
            "ckpt_interval": settings["steps"],
            "eval_interval": -1,
            "eval_before_train": False,
            "update_epochs_per_batch": settings["epochs"],
            "num_threads": settings["threads"],
            "policy": {
                "optimizer_config": {
                    "lr": settings["lr"],
                    "scheduler": settings["scheduler"],
                    "min_lr_ratio": settings["min_lr_ratio"],
                }
            },
            "algorithm": {"kl_loss_coef": settings["beta"], "use_kl_loss": settings["beta"] > 0},
        },
        "generator": {"n_samples_per_prompt": settings["group"]},
    }
    assert base["generator"]["sampling_params"]["max_generate_length"] == settings["max_tokens"]
    launch = Launch.load(write_test_launch(work, seed=settings["seed"], trainer=recipe))
    started = time.perf_counter()
    manifest = loop.run(launch)
    wall = time.perf_counter() - started
    records = [json.loads(x) for x in Path(launch.metrics_uri).read_text().splitlines()]
    step_times = [r["step_time_s"] for r in records if r["step"] > 1]
    return {
        "seconds_per_step": statistics.mean(step_times),
        "wall_s": wall,
        "accuracy": evaluate(Path(manifest["hf_path"]), settings["validation"])["accuracy"],
    }


def trl(work: Path, settings: dict[str, Any]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(settings["threads"])
    model_dir = base_model_dir(settings["seed"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = tokenizer.eos_token_id

    def exact_match(
        completions: list[str], completion_ids: list[list[int]], answer: list[str], **_: Any
    ) -> list[float]:
        return [
            1.0 if eos in ids and text == a else 0.0
            for text, ids, a in zip(completions, completion_ids, answer, strict=True)
        ]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.began = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.began = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.times.append(time.perf_counter() - self.began)

    constant = settings["scheduler"] == "constant_with_warmup"
    # One optimizer step = prompts x group samples in micro-batches of `micro`, as in ours.
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        max_steps=settings["steps"] * settings["epochs"],
        per_device_train_batch_size=settings["micro"],
        gradient_accumulation_steps=settings["prompts"] * settings["group"] // settings["micro"],
        num_generations=settings["group"],
        num_iterations=settings["epochs"],
        max_completion_length=settings["max_tokens"],
        temperature=1.0,
        learning_rate=settings["lr"],
        # Ours: linear warmup (none here) then constant, or cosine down to min_lr_ratio x lr at the last step.
        lr_scheduler_type="constant" if constant else "cosine_with_min_lr",
        lr_scheduler_kwargs={} if constant else {"min_lr_rate": settings["min_lr_ratio"]},
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=settings["beta"],
        epsilon=0.2,
        loss_type="dapo",  # token-level normalisation over the batch, like our token_mean
        scale_rewards="group",
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=10,
        seed=settings["seed"],
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    rows = tasks.generate("addition", "train", f"seed-{settings['seed']}")
    timer = StepTimer()
    grpo = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=exact_match,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    started = time.perf_counter()
    grpo.train()
    wall = time.perf_counter() - started
    out = work / "trl-final"
    grpo.save_model(str(out))
    tokenizer.save_pretrained(out)
    # One of our global steps = one generation + `epochs` optimizer steps; TRL counts the optimizer steps.
    per_global = [sum(timer.times[i : i + settings["epochs"]]) for i in range(0, len(timer.times), settings["epochs"])]
    return {
        "seconds_per_step": statistics.mean(per_global[1:]),
        "wall_s": wall,
        "accuracy": evaluate(out, settings["validation"])["accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, help="default: the experiment's seed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=["ours", "trl"], help="run one side only")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    base = yaml.safe_load((root / "config/trainer/base.yaml").read_text())
    experiment = yaml.safe_load((root / "config/experiments/tiny-addition.yaml").read_text())
    args.seed = experiment["seed"] if args.seed is None else args.seed
    # The experiment's recipe over the base recipe: what the default job trains with.
    t = deep_merge(base, experiment.get("recipe") or {})["trainer"]
    optimizer = t["policy"]["optimizer_config"]
    assert int(optimizer["num_warmup_steps"]) == 0, "the TRL side assumes no warmup"
    settings = {
        "steps": args.steps,
        "seed": args.seed,
        "threads": args.threads,
        "prompts": experiment["role_plan"]["train_batch_size"],
        "micro": experiment["role_plan"]["micro_train_batch_size_per_gpu"],
        "group": experiment["role_plan"]["n_samples_per_prompt"],
        "epochs": t["update_epochs_per_batch"],
        "lr": float(optimizer["lr"]),
        "scheduler": optimizer["scheduler"],
        "min_lr_ratio": float(optimizer["min_lr_ratio"]),
        "beta": t["algorithm"]["kl_loss_coef"] if t["algorithm"]["use_kl_loss"] else 0.0,
        "max_tokens": base["generator"]["sampling_params"]["max_generate_length"],
        "validation": tasks.generate("addition", "validation", f"seed-{args.seed}"),
    }
    initial = evaluate(base_model_dir(args.seed), settings["validation"])["accuracy"]
    print(
        f"settings: { {k: v for k, v in settings.items() if k != 'validation'} }; held-out accuracy at start {initial}"
    )
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for name, fn in (("ours", ours), ("trl", trl)):
            if args.only in (None, name):
                work = Path(tmp) / name
                work.mkdir()
                results[name] = fn(work, settings)
                print(f"{name}: {results[name]}", flush=True)
    print(f"\n{'trainer':<8} {'s/step':>8} {'wall s':>8} {'held-out acc':>13}")
    for name, r in results.items():
        print(f"{name:<8} {r['seconds_per_step']:>8.3f} {r['wall_s']:>8.1f} {r['accuracy']:>13.2f}")
    if len(results) == 2:
        ratio = results["trl"]["seconds_per_step"] / results["ours"]["seconds_per_step"]
        print(f"speed-up (TRL s/step / ours s/step): {ratio:.2f}x")


if __name__ == "__main__":
    main()
