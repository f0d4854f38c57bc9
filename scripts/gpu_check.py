"""The first thing to run on a new GPU node: the trainer's own GPU path on a Qwen2-0.5B-shaped model, in minutes.

    python scripts/gpu_check.py          # one GPU: CUDA torch and transformers, from the checkout's root
    python scripts/gpu_check.py --tiny   # the same code on a tiny model, on CPU, in seconds (CI runs it)

It needs nothing a bare GPU image lacks: no Ray, no vLLM, no network, no install (the checkout's `trainer` and
`rlbuild.core`/`rlbuild.contracts` modules import only torch, transformers and the standard library; the recipe's
pydantic schema is not imported). A model of Qwen2-0.5B's shape is built from its config with random weights,
stored in bf16 as the published checkpoint is, and the trainer's code runs on it:

1. the torch engine (trainer/workers/engines.py) samples a GRPO batch with its KV cache;
2. the policy worker (trainer/workers/policy.py, its process group on NCCL) recomputes those logprobs without a
   cache: they must equal the rollout's within KV_CACHE_TOLERANCE;
3. one GRPO step: reference and old-policy scoring, two AdamW steps of micro-batched forward/backward
   (PolicyWorker.train_step, with the KL term and truncated importance sampling);
4. the weight sync to the engine (trainer/workers/weight_sync.py, the default gloo group): every tensor must arrive
   bit for bit, and the engine's logprobs must equal the policy's within the recipe's
   weight_sync_check_tolerance, as the trainer checks after every step; then the engine samples again with the
   new weights and its KV-cache logprobs must equal the policy's recomputation.

Both sides compute in float32, as the trainer does (it loads every model in float32, whatever the stored dtype).
It prints tokens/s of generation and training and the peak memory, and exits 1 naming every mismatch (2: no GPU
without --tiny).
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM

# Run as `python scripts/gpu_check.py` from a checkout that is not installed: the repository root holds the packages.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbuild.contracts.manifest import write_manifest
from trainer.workers import grpo, sharding
from trainer.workers.batch import build_batch, update_batch
from trainer.workers.engines import Rollout, SamplingParams, TorchEngine, max_abs_difference
from trainer.workers.policy import PolicyWorker, forward_logprobs

QWEN2_0_5B = {  # Qwen/Qwen2-0.5B's config.json: 494M parameters, the input embedding tied to the output head
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}
LOOPBACK = "127.0.0.1"
# A cached decoding step runs other kernels than one forward over the whole sequence: in float32 the logprobs agree
# to ~1e-6 on CPU; a wrong position or mask moves them by far more than this. (The trainer's own check, after the
# sync, compares two whole-sequence forwards: it keeps the recipe's weight_sync_check_tolerance.)
KV_CACHE_TOLERANCE = 1.0e-3
TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "bos_token_id": 127,
    "eos_token_id": 127,
}


@dataclass(frozen=True)
class Size:
    """The model and the batch: `prompts` x `group` samples of prompts `prompt_tokens` long at most."""

    config: dict[str, Any]
    prompts: int
    group: int
    prompt_tokens: int
    max_tokens: int
    micro: int  # samples per forward/backward
    forward_micro: int  # samples per no-grad scoring forward (its logits: rows x tokens x vocab floats)
    threads: int


FULL = Size(QWEN2_0_5B, prompts=16, group=8, prompt_tokens=128, max_tokens=256, micro=16, forward_micro=32, threads=4)
SMALL = Size(TINY, prompts=4, group=4, prompt_tokens=8, max_tokens=8, micro=4, forward_micro=8, threads=1)


def recipe(size: Size) -> dict[str, Any]:
    """The recipe keys the policy worker and the batch read, as an experiment's `recipe:` states them (a test
    validates them against rlbuild/contracts/recipe.py, whose pydantic schema a bare node cannot import)."""
    return {
        "trainer": {
            "seed": 0,
            "train_batch_size": size.prompts,
            "policy_mini_batch_size": size.prompts // 2,  # two optimizer steps: old logprobs scored apart
            "micro_train_batch_size_per_gpu": size.micro,
            "micro_forward_batch_size_per_gpu": size.forward_micro,
            "update_epochs_per_batch": 1,
            "max_steps": 1,
            "policy": {
                "optimizer_config": {
                    # Large enough that one step moves the logprobs past the tolerance: the sync check can then tell.
                    "lr": 1.0e-4,
                    "adam_betas": [0.9, 0.99],
                    "weight_decay": 0.0,
                    "max_grad_norm": 1.0,
                    "num_warmup_steps": 0,
                    "scheduler": "constant_with_warmup",
                    "min_lr_ratio": 0.1,
                }
            },
            "algorithm": {
                "use_kl_loss": True,
                "kl_loss_coef": 0.04,
                "use_entropy_loss": True,
                "entropy_loss_coef": 0.01,
                "loss_reduction": "seq_mean_token_mean",
                "policy_loss_type": "regular",
                "eps_clip_low": 0.2,
                "eps_clip_high": 0.2,
                "clip_ratio_c": 3.0,
                "use_tis": True,
                "tis_imp_ratio_cap": 2.0,
                "zero_variance_filter": False,
                "grpo_norm_by_std": True,
                "advantage_eps": 1.0e-6,
            },
        },
        "generator": {
            "backend": "torch",
            "n_samples_per_prompt": size.group,
            "weight_sync_backend": "gloo",
            "weight_sync_check_tolerance": 1.0e-4,  # the recipe's default: what the trainer checks after each sync
            "max_prompt_length": size.prompt_tokens,
            "sampling_params": {"max_generate_length": size.max_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": -1},
        },
    }


def recipe_object(size: Size) -> Any:
    """`recipe(size)` read as the trainer reads a Recipe: attributes, with the two properties it uses."""

    def attributes(tree: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(**{k: attributes(v) if isinstance(v, dict) else v for k, v in tree.items()})

    out = attributes(recipe(size))
    out.trainer.placement = SimpleNamespace(policy_world_size=1)  # Recipe's property: one policy rank
    out.reference_workers = 0  # Recipe's property: colocated, the reference lives in the policy worker
    return out


class Problems(list[str]):
    """Mismatches found so far; the check reports them all, then exits 1."""

    def within(self, what: str, difference: float, tolerance: float) -> None:
        print(f"[gpu-check] {what}: max |difference| {difference:.3g} (tolerance {tolerance:g})", flush=True)
        if not difference <= tolerance:  # NaN fails too
            self.append(f"{what}: max |difference| {difference:.3g} > {tolerance:g}")


def build_model(size: Size, device: torch.device, out: Path) -> Path:
    """A randomly initialised model of the size's shape, saved in bf16 with a manifest (what the worker stages)."""
    torch.manual_seed(0)
    with device:
        model = Qwen2ForCausalLM(Qwen2Config(**size.config)).to(torch.bfloat16)
    model.save_pretrained(out)
    write_manifest(out)
    return out


def prompts_of(size: Size) -> list[list[int]]:
    """Random prompt tokens (never <eos>) of varied lengths, so the engine left-pads; each repeated `group` times."""
    generator = torch.Generator().manual_seed(1)
    eos = size.config["eos_token_id"]
    out = []
    for _ in range(size.prompts):
        length = int(torch.randint(size.prompt_tokens // 2, size.prompt_tokens + 1, (1,), generator=generator))
        out += [torch.randint(0, eos, (length,), generator=generator).tolist()] * size.group
    return out


def timed(what: str, count: float, unit: str, fn: Callable[[], Any]) -> Any:
    """Run fn, synchronised on the GPU, and print `count` `unit` per second."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(f"[gpu-check] {what}: {count:,.6g} {unit} in {seconds:.2f} s = {count / seconds:,.0f} {unit}/s", flush=True)
    return result


def generate(engine: TorchEngine, prompts: list[list[int]], size: Size, seed: int, when: str) -> list[Rollout]:
    params = SamplingParams(max_tokens=size.max_tokens, temperature=1.0)
    started = time.perf_counter()
    rollouts = engine.generate(prompts, params, seed)
    tokens = sum(len(r.token_ids) for r in rollouts)
    seconds = time.perf_counter() - started  # generate returns Python lists: the GPU is done
    print(
        f"[gpu-check] generation (torch engine, KV cache, {len(prompts)} samples, {when}): {tokens} tokens in "
        f"{seconds:.2f} s = {tokens / seconds:,.0f} tokens/s",
        flush=True,
    )
    return rollouts


@torch.no_grad()
def cache_free_difference(model: torch.nn.Module, batch: dict[str, torch.Tensor], rows: int) -> float:
    """Max |rollout logprob - the model's logprob recomputed in one forward without a KV cache| over real tokens."""
    model.eval()
    worst = 0.0
    device = next(model.parameters()).device
    for start in range(0, batch["input_ids"].shape[0], rows):
        part = {k: v[start : start + rows].to(device) for k, v in batch.items()}
        logp, _ = forward_logprobs(model, part, 1.0, False)
        chunk = float(((logp - part["rollout_logprobs"]).abs() * part["completion_mask"]).max())
        worst = chunk if math.isnan(chunk) or chunk > worst else worst  # a NaN stays: it is a mismatch
    return worst


def train(worker: PolicyWorker, prompts: list[list[int]], rollouts: list[Rollout], pad_id: int, size: Size) -> Problems:
    """One GRPO step through the policy worker on random rewards; the rollouts checked against a cache-free forward."""
    problems = Problems()
    t = worker.recipe.trainer
    rewards = torch.randint(0, 2, (len(rollouts),), generator=torch.Generator().manual_seed(2)).float()
    advantages = grpo.group_advantages(rewards, size.group, t.algorithm.grpo_norm_by_std, t.algorithm.advantage_eps)
    update = update_batch(prompts, rollouts, rewards, advantages, worker.recipe, pad_id)
    problems.within(
        "rollout logprobs (KV cache) vs the policy's recomputation without a cache",
        cache_free_difference(worker.model, update.tensors, size.forward_micro),
        KV_CACHE_TOLERANCE,
    )
    minis = t.train_batch_size // t.policy_mini_batch_size
    tokens = int(update.tensors["attention_mask"].sum())
    stats = timed(
        f"training (one GRPO step: reference and old scoring, {minis} AdamW steps of micro-batches of {size.micro}; "
        "prompt and completion tokens)",
        tokens,
        "tokens",
        lambda: worker.train_step(update.shards(1)[0], minis, size.micro),
    )
    print("[gpu-check] step: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(stats.items())), flush=True)
    if not all(math.isfinite(v) for v in stats.values()):
        problems.append(f"GRPO step: non-finite statistics {stats}")
    if not stats["grad_norm"] > 0:
        problems.append("GRPO step: gradient norm 0: the loss does not reach the weights")
    return problems


def weight_differences(policy: dict[str, torch.Tensor], engine: dict[str, torch.Tensor]) -> list[str]:
    """What differs between the policy's full weights and the engine's after a sync: names, then values (bits)."""
    problems = []
    one_side = sorted(set(policy) ^ set(engine))
    if one_side:
        problems.append(f"weight sync: {len(one_side)} tensor names on one side only: {one_side[:5]}")
    differ = [
        name
        for name in sorted(set(policy) & set(engine))
        if not torch.equal(policy[name].cpu(), engine[name].detach().cpu())
    ]
    if differ:
        problems.append(f"weight sync: {len(differ)} tensors differ from the policy's: {differ[:5]}")
    return problems


def in_thread(fn: Callable[[], None]) -> Callable[[], None]:
    """Start fn in a thread; the returned join re-raises what it raised (a sync's sender and receiver run at once)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the joining thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> None:
        thread.join(timeout=600)
        if errors:
            raise errors[0]
        if thread.is_alive():
            raise TimeoutError("the weight-sync sender did not finish within 600 s")

    return join


def sync(worker: PolicyWorker, engine: TorchEngine, probe: list[int], start: int) -> Problems:
    """The trainer's weight sync, policy rank 0 to the engine over gloo, and its check, then bit-for-bit weights."""
    problems = Problems()
    tolerance = worker.recipe.generator.weight_sync_check_tolerance
    moved = max_abs_difference(worker.sequence_logprobs(probe, start), engine.sequence_logprobs(probe, start))
    print(f"[gpu-check] the step moved the policy's probe logprobs by up to {moved:.3g} (engine not synced)")
    if not moved > tolerance:
        problems.append(
            f"GRPO step: the policy's logprobs moved by {moved:.3g} <= {tolerance:g}: no sync check can tell"
        )
    specs = worker.weight_specs()
    assert specs is not None  # rank 0
    port = sharding.free_port()
    joined = in_thread(lambda: (worker.open_weight_sync("gloo", LOOPBACK, port, 2), worker.broadcast_weights()))
    engine.open_weight_sync("gloo", LOOPBACK, port, first_rank=1, world_size=2)
    mib = sum(math.prod(s.shape) * s.dtype.itemsize for s in specs) / 2**20
    timed("weight sync (gloo broadcast of the full weights)", mib, "MiB", lambda: engine.receive_weights(specs))
    joined()
    problems += weight_differences(sharding.full_state(worker.model), engine.model.state_dict())
    problems.within(
        "engine vs policy logprobs after the sync (the trainer's weight-sync check)",
        max_abs_difference(worker.sequence_logprobs(probe, start), engine.sequence_logprobs(probe, start)),
        tolerance,
    )
    return problems


def memory() -> str:
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    line = f"peak host memory (RSS) {host:.2f} GiB"
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
        allocated, reserved = torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30
        line = f"peak GPU memory {allocated:.2f} GiB allocated, {reserved:.2f} GiB reserved of {total:.1f} GiB; {line}"
    return line


def check(size: Size, device: torch.device, tmp: Path) -> Problems:
    """Everything above, in the order a training step takes it; returns every mismatch."""
    model_dir = build_model(size, device, tmp / "model")
    engine = TorchEngine(model_dir, device.type, size.threads)
    worker = PolicyWorker(0, 1, recipe_object(size), str(model_dir), str(tmp / "cache"), size.threads)
    print(f"[gpu-check] policy: {worker.setup(LOOPBACK, sharding.free_port())}", flush=True)
    problems = Problems()
    try:
        prompts = prompts_of(size)
        rollouts = generate(engine, prompts, size, 0, "the first, warm-up included")
        problems += train(worker, prompts, rollouts, engine.pad_id, size)
        probe = prompts[0] + rollouts[0].token_ids
        problems += sync(worker, engine, probe, len(prompts[0]))
        after = generate(engine, prompts, size, 1, "after the sync")
        problems.within(
            "rollout logprobs with the synced weights (KV cache) vs the policy's recomputation without a cache",
            cache_free_difference(worker.model, build_batch(prompts, after, engine.pad_id), size.forward_micro),
            KV_CACHE_TOLERANCE,
        )
    finally:
        worker.shutdown()
    print(f"[gpu-check] {memory()}", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model, on CPU where there is no GPU (seconds)")
    args = parser.parse_args(argv)
    transformers.utils.logging.disable_progress_bar()  # the loading bars would bury the figures
    cuda = torch.cuda.is_available()
    if not args.tiny and not cuda:
        print(
            f"gpu-check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device: run it on a GPU "
            "node (CUDA_VISIBLE_DEVICES set?), or with --tiny to check the code on CPU",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    shape = "tiny" if args.tiny else "Qwen2-0.5B-shaped"
    print(f"[gpu-check] {shape} model on {name}: torch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory(prefix="rlbuild-gpu-check-") as tmp:
        problems = check(SMALL if args.tiny else FULL, device, Path(tmp))
    for problem in problems:
        print(f"[gpu-check] MISMATCH {problem}", file=sys.stderr)
    print(f"[gpu-check] {'FAILED: ' + str(len(problems)) + ' mismatch(es)' if problems else 'passed'}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
