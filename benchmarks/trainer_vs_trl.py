"""rlbuild's GRPO trainer vs TRL's GRPOTrainer on the same objective, side by side, on CPU.

Two rows, each the same objective on both sides:

    grpo   ours: loss_reduction seq_mean_token_mean + k3 KL     TRL: loss_type='grpo', use_bias_correction_kl=False
    dapo   ours: loss_reduction token_mean, no KL               TRL: loss_type='dapo', beta=0

Everything else is the default experiment's (config/experiments/tiny-addition.yaml): the tiny warm-started model,
addition's train split (held-out accuracy on its disjoint validation split), 32 prompts x 8 samples, micro-batches
of 16, 2 update epochs (TRL: num_iterations=2), lr 1e-3 cosine to 1e-4 over the run, KL 0.04, clip 0.2, grad norm
1, AdamW (0.9, 0.99). The advantage eps is TRL's (1e-4, fixed in its code): ours is configured to it
(`trainer.algorithm.advantage_eps`). Before timing a row, both sides compute the loss and gradients of one
optimizer step on one fixed batch (same completions, the policy moved off the reference so the KL and the clip
are live, but no token past the bounds our trainer puts on log-ratios and KL and TRL does not) and the benchmark
asserts they agree. Then each side trains `--steps` steps; it prints seconds per
step (the first step excluded: both warm up; ours: the loop's own step time, TRL: from one step's end to the
next, so everything its loop does counts), held-out greedy accuracy, and the ratio. TRL runs without activation
checkpointing (its default recomputes every forward in the backward; ours does not, and the model is tiny).
`--profile N` also prints where a step's time goes on each side (cProfile over N steps).

    .venv/bin/python benchmarks/trainer_vs_trl.py --steps 200 --threads 1     # needs: scripts/setup.sh --group bench
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlbuild.contracts.launch import LaunchDocument, load_launch  # noqa: E402
from rlbuild.contracts.metricstream import parse_lines  # noqa: E402
from rlbuild.contracts.recipe import Recipe  # noqa: E402
from rlbuild.core.storage import read_text  # noqa: E402
from rlbuild.dev.launches import base_model_dir, write_test_launch  # noqa: E402
from rlbuild.plan.resolve import resolve_file  # noqa: E402
from rlbuild.plan.series import deep_merge  # noqa: E402
from trainer import loop, tasks  # noqa: E402
from trainer.commands.evaluate import evaluate  # noqa: E402

EXPERIMENT = REPO / "config" / "experiments" / "tiny-addition.yaml"
TRL_ADVANTAGE_EPS = 1e-4  # TRL divides by (std + 1e-4), a literal in GRPOTrainer._generate_and_score_completions
AGREEMENT = 1e-5  # relative; float32 sums in another order differ by ~1e-7
# How far the agreement check moves the policy, in each weight's std, largest first: far enough that the clip and
# the KL are live, not so far that a token's log-ratio passes LOG_RATIO_CLAMP or its k3 KL passes KL_CLAMP
# (trainer/workers/grpo.py): SkyRL bounds both and so do we, TRL bounds neither, so past them the two objectives
# differ by design. One base model's batch put tokens past KL_CLAMP at 0.3 and the losses 42 % apart.
PERTURBATION_SCALES = (0.3, 0.2, 0.1, 0.05)


@dataclass(frozen=True)
class Row:
    name: str
    ours: dict[str, Any]  # recipe.trainer.algorithm
    trl: dict[str, Any]  # GRPOConfig


def rows(kl: float) -> list[Row]:
    return [
        Row(
            "grpo",
            {"loss_reduction": "seq_mean_token_mean", "use_kl_loss": True, "kl_loss_coef": kl},
            {"loss_type": "grpo", "beta": kl, "use_bias_correction_kl": False},
        ),
        Row("dapo", {"loss_reduction": "token_mean", "use_kl_loss": False}, {"loss_type": "dapo", "beta": 0.0}),
    ]


@dataclass(frozen=True)
class Bench:
    """The default experiment, as both sides run it."""

    experiment: dict[str, Any]
    recipe: Recipe
    task: str
    data_seed: int
    steps: int
    threads: int

    @property
    def seed(self) -> int:
        return int(self.experiment["seed"])

    def rows(self, split: str) -> list[dict[str, str]]:
        return tasks.generate(self.task, split, f"seed-{self.data_seed}")

    def launch(self, work: Path, row: Row) -> LaunchDocument:
        """Our launch document: the experiment's recipe, the row's objective, TRL's advantage eps."""
        algorithm = {**row.ours, "advantage_eps": TRL_ADVANTAGE_EPS}
        trainer = {"max_steps": self.steps, "ckpt_interval": self.steps, "eval_interval": -1}
        trainer |= {"eval_before_train": False, "num_threads": self.threads, "algorithm": algorithm}
        recipe = deep_merge(self.experiment.get("recipe") or {}, {"trainer": trainer})
        path = write_test_launch(
            work, seed=self.seed, data_seed=self.data_seed, role_plan=self.experiment["role_plan"], recipe=recipe
        )
        return load_launch(str(path))

    def trl_config(self, work: Path, row: Row) -> Any:
        from trl import GRPOConfig

        t, g = self.recipe.trainer, self.recipe.generator
        optimizer = t.policy.optimizer_config
        assert optimizer.num_warmup_steps == 0, "the TRL side assumes no warmup"
        cosine = optimizer.scheduler == "cosine_with_warmup"
        samples = t.train_batch_size * g.n_samples_per_prompt
        return GRPOConfig(
            output_dir=str(work / "trl"),
            # One of our steps: one generation, update_epochs optimizer steps; TRL counts optimizer steps.
            max_steps=self.steps * t.update_epochs_per_batch,
            per_device_train_batch_size=t.micro_train_batch_size_per_gpu,
            gradient_accumulation_steps=samples // t.micro_train_batch_size_per_gpu,
            num_generations=g.n_samples_per_prompt,
            num_iterations=t.update_epochs_per_batch,
            max_completion_length=g.sampling_params.max_generate_length,
            temperature=g.sampling_params.temperature,
            top_p=g.sampling_params.top_p,
            learning_rate=optimizer.lr,
            lr_scheduler_type="cosine_with_min_lr" if cosine else "constant",
            lr_scheduler_kwargs={"min_lr_rate": optimizer.min_lr_ratio} if cosine else {},
            adam_beta1=optimizer.adam_betas[0],
            adam_beta2=optimizer.adam_betas[1],
            weight_decay=optimizer.weight_decay,
            max_grad_norm=optimizer.max_grad_norm,
            epsilon=t.algorithm.eps_clip_low,
            epsilon_high=t.algorithm.eps_clip_high,
            scale_rewards="group",
            # TRL checkpoints activations by default (recomputing every forward in the backward); ours does not, and
            # a 36 K-parameter model needs no memory saved: off, for TRL's fastest setting.
            gradient_checkpointing=False,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=50,
            seed=self.seed,
            remove_unused_columns=False,
            disable_tqdm=True,
            **row.trl,
        )


def exact_match_for_trl(eos: int) -> Any:
    """Our `exact_match` environment as a TRL reward function: the answer, and generation stopped at <eos>."""

    def exact_match(
        completions: list[str], completion_ids: list[list[int]], answer: list[str], **_: Any
    ) -> list[float]:
        scored = zip(completions, completion_ids, answer, strict=True)
        return [1.0 if eos in ids and text == a else 0.0 for text, ids, a in scored]

    return exact_match


def trl_trainer(bench: Bench, work: Path, row: Row, rollout_func: Any = None) -> Any:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    model_dir = base_model_dir(bench.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return GRPOTrainer(
        model=str(model_dir),
        reward_funcs=exact_match_for_trl(tokenizer.eos_token_id),
        args=bench.trl_config(work, row),
        train_dataset=Dataset.from_list(bench.rows("train")),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


# ---------------------------------------------------------------------------------------------- agreement


def _perturb(model: torch.nn.Module, scale: float) -> None:
    """Move the policy off the reference (and off the old policy), the same way on both sides."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, parameter in sorted(model.named_parameters()):
            parameter.add_(scale * parameter.std().nan_to_num() * torch.randn(parameter.shape, generator=generator))


def _perturb_within_bounds(
    model: torch.nn.Module, shard: dict[str, torch.Tensor], old: torch.Tensor, ref: torch.Tensor | None, recipe: Recipe
) -> dict[str, float]:
    """Perturb our policy by the largest of PERTURBATION_SCALES that leaves every token inside our clamps, and say
    how far that went: tokens clipped (the clip is live), and tokens past each clamp (none, or it raises)."""
    from trainer.workers import grpo, policy

    algorithm, temperature = recipe.trainer.algorithm, recipe.generator.sampling_params.temperature
    mask = shard["completion_mask"].bool()
    saved = [p.detach().clone() for _, p in sorted(model.named_parameters())]
    for scale in PERTURBATION_SCALES:
        with torch.no_grad():
            for (_, parameter), value in zip(sorted(model.named_parameters()), saved, strict=True):
                parameter.copy_(value)
        _perturb(model, scale)
        new = policy.score(model, shard, temperature, mask.shape[0])
        log_ratio = (new - old)[mask]
        to_ref = torch.zeros_like(log_ratio) if ref is None else (ref - new)[mask]
        regime = {
            "perturbation": scale,
            "clipped_tokens": int(
                ((log_ratio.exp() < 1 - algorithm.eps_clip_low) | (log_ratio.exp() > 1 + algorithm.eps_clip_high)).sum()
            ),
            "tokens_past_log_ratio_clamp": int((log_ratio.abs() > grpo.LOG_RATIO_CLAMP).sum()),
            "tokens_past_kl_clamp": int((to_ref.exp() - to_ref - 1 > grpo.KL_CLAMP).sum()),
        }
        if not regime["tokens_past_log_ratio_clamp"] and not regime["tokens_past_kl_clamp"]:
            return regime
    raise AssertionError(f"every perturbation put tokens past our clamps, where TRL's objective differs: {regime}")


def _gradient(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for _, p in sorted(model.named_parameters())])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def fixed_batch(bench: Bench, launch: LaunchDocument) -> tuple[list[dict[str, str]], list[list[int]], list[Any]]:
    """One step's rows (each prompt x group, contiguous), prompt ids and completions sampled from the base model."""
    from transformers import AutoTokenizer

    from trainer import data
    from trainer.workers.engines import SamplingParams, TorchEngine

    g, t = bench.recipe.generator, bench.recipe.trainer
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir(bench.seed))
    rows = data.group(data.draw(bench.rows("train"), 0, t.train_batch_size, bench.seed), g.n_samples_per_prompt)
    prompts = data.encode_prompts(tokenizer, rows)
    rollouts = TorchEngine(base_model_dir(bench.seed)).generate(
        prompts, SamplingParams.from_recipe(g.sampling_params), 7
    )
    return rows, prompts, rollouts


def ours_on_batch(launch: LaunchDocument, prompts: list[list[int]], rollouts: list[Any], rewards: torch.Tensor) -> Any:
    """Our loss and gradient of the first optimizer step: the policy worker's own loss code, accumulated by micro;
    and the perturbation it took (`_perturb_within_bounds`)."""
    from trainer.workers import grpo, policy, sharding
    from trainer.workers.batch import update_batch

    recipe = launch.recipe
    t, g = recipe.trainer, recipe.generator
    advantages = grpo.group_advantages(
        rewards, g.n_samples_per_prompt, t.algorithm.grpo_norm_by_std, t.algorithm.advantage_eps
    )
    shard = update_batch(prompts, rollouts, rewards, advantages, recipe, pad_id=0).shards(1)[0]
    with tempfile.TemporaryDirectory() as cache:
        worker = policy.PolicyWorker(0, 1, recipe, launch.inputs.model.uri, cache, t.num_threads)
        worker.setup("127.0.0.1", sharding.free_port())
        try:
            temperature = g.sampling_params.temperature
            rows = shard["input_ids"].shape[0]
            old = policy.score(worker.model, shard, temperature, rows)
            ref = policy.score(worker.ref, shard, temperature, rows) if worker.ref is not None else None
            regime = _perturb_within_bounds(worker.model, shard, old, ref, recipe)
            worker.model.train()
            sums = {name: torch.zeros(()) for name in policy._SUMMED}
            total = torch.zeros(())
            for start in range(0, rows, t.micro_train_batch_size_per_gpu):
                part = slice(start, start + t.micro_train_batch_size_per_gpu)
                batch, width = policy._take(shard, part)
                loss, _ = worker._micro_loss(batch, old[part, :width], None if ref is None else ref[part, :width], sums)
                loss.backward()
                total += loss.detach()
            return advantages, float(total), _gradient(worker.model), regime
        finally:
            worker.shutdown()


def trl_on_batch(
    bench: Bench,
    work: Path,
    row: Row,
    batch: tuple[list[dict[str, str]], list[list[int]], list[Any]],
    perturbation: float,
) -> Any:
    """TRL's loss and gradient of the first optimizer step, its own scoring (rewards, advantages, ref and old
    logprobs) run on our completions through `rollout_func`."""
    from trl.trainer.utils import split_tensor_dict

    rows, prompts, rollouts = batch

    def fixed(batch_prompts: list[str], _: Any) -> dict[str, Any]:
        assert batch_prompts == [r["prompt"] for r in rows]
        return {
            "prompt_ids": prompts,
            "completion_ids": [r.token_ids for r in rollouts],
            "logprobs": [r.logprobs for r in rollouts],
        }

    trainer = trl_trainer(bench, work, row, rollout_func=fixed)
    trainer.model.train()
    scored = trainer._generate_and_score_completions(rows)
    _perturb(trainer.model, perturbation)
    micro = bench.recipe.trainer.micro_train_batch_size_per_gpu
    trainer.current_gradient_accumulation_steps = len(rows) // micro
    total = torch.zeros(())
    for part in split_tensor_dict(scored, len(rows) // micro):  # in order: each micro-batch as TRL trains it
        loss = trainer.compute_loss(trainer.model, part)
        loss.backward()
        total += loss.detach()
    return scored["advantages"], float(total), _gradient(trainer.model)


def check_agreement(bench: Bench, work: Path, row: Row) -> dict[str, float]:
    """Assert that both sides compute the same objective on one fixed batch: advantages, loss and gradient."""
    from transformers import AutoTokenizer

    from trainer import env
    from trainer.rewards import rewards as score_rollouts

    launch = bench.launch(work / "check", row)
    rows, prompts, rollouts = batch = fixed_batch(bench, launch)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir(bench.seed))
    rewards = torch.tensor(score_rollouts(tokenizer, env.make("exact_match"), rows, rollouts))
    our_adv, our_loss, our_grad, regime = ours_on_batch(launch, prompts, rollouts, rewards)
    trl_adv, trl_loss, trl_grad = trl_on_batch(bench, work / "check-trl", row, batch, regime["perturbation"])
    agreement = {
        **regime,
        "reward_mean": float(rewards.mean()),
        "advantages_max_abs_diff": float((our_adv - trl_adv).abs().max()),
        "loss_ours": our_loss,
        "loss_trl": trl_loss,
        "loss_relative_diff": abs(our_loss - trl_loss) / max(abs(trl_loss), 1e-30),
        "gradient_relative_diff": _relative(our_grad, trl_grad),
        "gradient_norm": float(trl_grad.norm()),
    }
    print(f"[{row.name}] agreement on a fixed batch: {agreement}", flush=True)
    assert rewards.sum() > 0 and agreement["gradient_norm"] > 0, "the fixed batch has no learning signal"
    assert agreement["clipped_tokens"] > 0, "the perturbation left the clip idle: the check would not compare it"
    assert agreement["advantages_max_abs_diff"] < 1e-6, agreement
    assert agreement["loss_relative_diff"] < AGREEMENT, agreement
    assert agreement["gradient_relative_diff"] < AGREEMENT, agreement
    return agreement


# ---------------------------------------------------------------------------------------------- timing


def run_ours(bench: Bench, work: Path, row: Row) -> dict[str, Any]:
    launch = bench.launch(work, row)
    started = time.perf_counter()
    manifest = loop.run(launch)
    wall = time.perf_counter() - started
    records, _ = parse_lines(read_text(launch.artifacts.metrics_uri) or "")
    steps = [r for r in records if r["step"] > 1 and "perf/step_time_s" in r]

    def mean(name: str) -> float:
        return statistics.mean(r[name] for r in steps)

    return {
        "seconds_per_step": mean("perf/step_time_s"),
        "wall_s": wall,
        "accuracy": evaluate(Path(manifest["hf_path"]), bench.rows("validation"))["accuracy"],
        "phases_s": {phase: round(mean(f"perf/{phase}_time_s"), 4) for phase in ("rollout", "train", "sync")},
    }


def run_trl(bench: Bench, work: Path, row: Row) -> dict[str, Any]:
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """When each optimizer step ends: from one end to the next is everything the loop does for a step
        (fetching rows, generating, scoring, the update, logging), as our step time is."""

        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.ends.append(time.perf_counter())

    torch.set_num_threads(bench.threads)
    trainer = trl_trainer(bench, work, row)
    timer = StepTimer()
    trainer.add_callback(timer)
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    out = work / "trl-final"
    trainer.save_model(str(out))
    trainer.processing_class.save_pretrained(out)
    epochs = bench.recipe.trainer.update_epochs_per_batch
    # One of our steps is `epochs` optimizer steps of TRL; the first step (from no end to its end) is left out.
    ends = timer.ends[epochs - 1 :: epochs]
    per_step = [later - earlier for earlier, later in itertools.pairwise(ends)]
    return {
        "seconds_per_step": statistics.mean(per_step),
        "wall_s": wall,
        "accuracy": evaluate(out, bench.rows("validation"))["accuracy"],
    }


# ---------------------------------------------------------------------------------------------- profile


def _cumulative(stats: Any, name: str, file_part: str, caller: str | None = None) -> float:
    """Seconds spent in (and under) the functions `name` defined in files containing `file_part`."""
    total = 0.0
    for (file, _, func), (_, _, _, cumulative, callers) in stats.stats.items():
        if func == name and file_part in file:
            if caller is None:
                total += cumulative
            else:
                total += sum(v[3] for (_, _, caller_func), v in callers.items() if caller_func == caller)
    return total


def _profiled(fn: Any, times: int) -> tuple[Any, float]:
    """(cProfile statistics, wall seconds) of `times` calls of `fn`."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for _ in range(times):
        fn()
    profiler.disable()
    return pstats.Stats(profiler), time.perf_counter() - started


def profile_ours(bench: Bench, work: Path, row: Row, steps: int) -> dict[str, float]:
    """Milliseconds per step by phase: the engine's sampling and a policy worker's `train_step` (the actors' code),
    in this process on the fixed batch, under cProfile."""
    from transformers import AutoTokenizer

    from trainer import env
    from trainer.rewards import rewards as score_rollouts
    from trainer.workers import grpo, policy, sharding
    from trainer.workers.batch import update_batch
    from trainer.workers.engines import SamplingParams, TorchEngine

    launch = bench.launch(work, row)
    rows_, prompts, rollouts = fixed_batch(bench, launch)
    tokenizer, environment = AutoTokenizer.from_pretrained(base_model_dir(bench.seed)), env.make("exact_match")
    _, rewards_s = _profiled(lambda: score_rollouts(tokenizer, environment, rows_, rollouts), steps)
    recipe = launch.recipe
    t, g = recipe.trainer, recipe.generator
    engine = TorchEngine(base_model_dir(bench.seed), num_threads=bench.threads)
    params = SamplingParams.from_recipe(g.sampling_params)
    _, rollout_s = _profiled(lambda: engine.generate(prompts, params, 7), steps)
    rewards = torch.tensor([float(r.finished) for r in rollouts])  # any signal: the work does not depend on it
    advantages = grpo.group_advantages(rewards, g.n_samples_per_prompt, eps=t.algorithm.advantage_eps)
    shard = update_batch(prompts, rollouts, rewards, advantages, recipe, pad_id=0).shards(1)[0]
    with tempfile.TemporaryDirectory() as cache:
        worker = policy.PolicyWorker(0, 1, recipe, launch.inputs.model.uri, cache, bench.threads)
        worker.setup("127.0.0.1", sharding.free_port())
        try:
            worker.train_step(shard, 1, t.micro_train_batch_size_per_gpu)  # warm-up
            train, train_s = _profiled(lambda: worker.train_step(shard, 1, t.micro_train_batch_size_per_gpu), steps)
        finally:
            worker.shutdown()
    phases = {
        "no-grad scoring (reference, old)": _cumulative(train, "score", "trainer/workers/policy.py"),
        "forward with grad (loss)": _cumulative(train, "_micro_loss", "trainer/workers/policy.py"),
        "backward": _cumulative(train, "backward", "torch/_tensor.py"),
        "clip + optimizer step": _cumulative(train, "clip_grad_norm_", "torch/nn/utils")
        + _cumulative(train, "step", "torch/optim/adam"),
    }
    phases = {"rollout (sampling)": rollout_s, "rewards": rewards_s, **phases, "rest": train_s - sum(phases.values())}
    return {k: 1000 * v / steps for k, v in phases.items()}


def profile_trl(bench: Bench, work: Path, row: Row, steps: int) -> dict[str, float]:
    """Milliseconds per step (one generation, update-epochs optimizer steps) of TRL's `train`, under cProfile."""
    torch.set_num_threads(bench.threads)
    trainer = trl_trainer(bench, work, row)
    trainer.args.max_steps = steps * bench.recipe.trainer.update_epochs_per_batch
    stats, train_s = _profiled(trainer.train, 1)
    rollout = _cumulative(stats, "_generate", "trl/")
    rewards = _cumulative(stats, "_calculate_rewards", "trl/")
    # TRL's forwards go through one recursive profiling decorator, which cProfile cannot split by caller: its
    # no-grad scoring is what `_generate_and_score_completions` spends besides sampling and rewards.
    phases = {
        "rollout (sampling)": rollout,
        "rewards": rewards,
        "no-grad scoring (reference, old)": _cumulative(stats, "_generate_and_score_completions", "trl/")
        - rollout
        - rewards,
        "forward with grad (loss)": _cumulative(stats, "_compute_loss", "trl/"),
        "backward": _cumulative(stats, "backward", "accelerate/accelerator.py"),
        "clip + optimizer step": _cumulative(stats, "clip_grad_norm_", "accelerate/accelerator.py")
        + _cumulative(stats, "step", "accelerate/optimizer.py"),
    }
    phases["rest"] = train_s - sum(phases.values())
    return {k: 1000 * v / steps for k, v in phases.items()}


def print_profile(name: str, ours: dict[str, float], trl: dict[str, float]) -> None:
    print(f"\n[{name}] where a step's time goes (ms per step, under cProfile; its overhead inflates Python-heavy code)")
    print(f"{'phase':<36} {'ours':>8} {'TRL':>8}")
    for phase in dict.fromkeys([*ours, *trl]):
        print(f"{phase:<36} {ours.get(phase, 0.0):>8.1f} {trl.get(phase, 0.0):>8.1f}")
    print(f"{'total':<36} {sum(ours.values()):>8.1f} {sum(trl.values()):>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (ours: per actor)")
    parser.add_argument("--rows", nargs="+", choices=["grpo", "dapo"], default=["grpo", "dapo"])
    parser.add_argument("--check-only", action="store_true", help="assert the agreement, time nothing")
    parser.add_argument("--profile", type=int, metavar="STEPS", help="also profile both sides over STEPS steps")
    args = parser.parse_args()
    plan = resolve_file(EXPERIMENT, "dev", str(REPO / "results"))
    train_source = plan.experiment.data.train[0]
    bench = Bench(
        experiment=yaml.safe_load(EXPERIMENT.read_text()),
        recipe=plan.recipe,
        task=train_source.source.removeprefix("task:").split("/")[0],
        data_seed=int(train_source.revision.removeprefix("seed-")),
        steps=args.steps,
        threads=args.threads,
    )
    torch.set_num_threads(args.threads)
    initial = evaluate(base_model_dir(bench.seed), bench.rows("validation"))["accuracy"]
    print(
        f"{EXPERIMENT.name}: seed {bench.seed}, {bench.task} split seed-{bench.data_seed}, {args.steps} steps; "
        f"held-out accuracy at the start {initial:.2f}",
        flush=True,
    )
    table = []
    kl = plan.recipe.trainer.algorithm.kl_loss_coef
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for row in [r for r in rows(kl) if r.name in args.rows]:
            check_agreement(bench, Path(tmp) / row.name, row)
            if args.profile:
                work = Path(tmp) / row.name / "profile"
                ours = profile_ours(bench, work / "ours", row, args.profile)
                print_profile(row.name, ours, profile_trl(bench, work / "trl", row, args.profile))
            if args.check_only:
                continue
            results = {}
            for side, run in (("ours", run_ours), ("trl", run_trl)):
                work = Path(tmp) / row.name / side
                work.mkdir(parents=True)
                results[side] = run(bench, work, row)
                print(f"[{row.name}] {side}: {results[side]}", flush=True)
            table.append((row.name, results))
    if not table:
        return
    print(f"\n{'objective':<10} {'trainer':<8} {'s/step':>8} {'wall s':>8} {'held-out acc':>13} {'speed-up':>9}")
    for name, results in table:
        ratio = results["trl"]["seconds_per_step"] / results["ours"]["seconds_per_step"]
        for side, r in results.items():
            shown = f"{ratio:.2f}x" if side == "ours" else ""
            timing = f"{r['seconds_per_step']:>8.3f} {r['wall_s']:>8.1f}"
            print(f"{name:<10} {side:<8} {timing} {r['accuracy']:>13.2f} {shown:>9}")


if __name__ == "__main__":
    main()
