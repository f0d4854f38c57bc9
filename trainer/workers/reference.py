"""The reference role on GPUs of its own: a frozen copy of the initial policy that scores rollouts for the KL term.

Used when the role plan gives the reference its own nodes (`Recipe.reference_workers` > 0). Its workers form a
process group of their own and `fully_shard` the model over it, like the policy (trainer/workers/sharding.py); each
scores an equal share of the step's rows, all in step, and the driver hands the scores to the policy ranks as
`ref_logprobs`. Otherwise the policy workers keep the reference themselves (trainer/workers/policy.py).
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rlbuild.contracts.recipe import Recipe
from trainer.workers import sharding
from trainer.workers.policy import score


class ReferenceWorker(sharding.Rank):
    def __init__(
        self, rank: int, world_size: int, recipe: Recipe, model_uri: str, cache_dir: str, num_threads: int
    ) -> None:
        super().__init__(rank, world_size, model_uri, cache_dir, num_threads)
        self.temperature = recipe.generator.sampling_params.temperature
        self.chunk_rows = recipe.trainer.micro_forward_batch_size_per_gpu

    def setup(self, master_addr: str, master_port: int) -> str:
        """Join the reference's group, load and shard the frozen model; says how it is sharded."""
        self.join_group(master_addr, master_port)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model = model.to(self.device).eval().requires_grad_(False)
        return sharding.shard([self.model], self.device)

    def logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Reference logprobs [b, C] of this worker's rows (zeros at padding). Every worker must call this with the
        same number of rows: sharded workers run their forwards together."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        return score(self.model, batch, self.temperature, self.chunk_rows).cpu()
