"""The reference role on GPUs of its own: a frozen copy of the initial policy that scores rollouts for the KL term.

Used when the role plan gives the reference its own nodes (`Recipe.reference_workers` > 0). Each worker
holds a full replica and scores a contiguous share of the step's batch; the driver hands the scores to the
policy ranks as `ref_logprobs`. Otherwise the policy workers keep the reference themselves (trainer/policy.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from rlbuild.manifest import materialise
from rlbuild.recipe import Recipe
from trainer.policy import score


class ReferenceWorker:
    def __init__(self, recipe: Recipe, model_uri: str, cache_dir: str, num_threads: int) -> None:
        torch.set_num_threads(num_threads)
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        model_dir = materialise(model_uri, Path(cache_dir))
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.temperature = recipe.generator.sampling_params.temperature
        self.chunk_rows = recipe.trainer.micro_forward_batch_size_per_gpu

    def logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Reference logprobs [b, C] of the batch's completions (zeros at padding)."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        return score(self.model, batch, self.temperature, self.chunk_rows).cpu()
