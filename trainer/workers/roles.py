"""The roles of a run as the driver sees them: policy ranks, reference workers and rollout engines on Ray.

Each method is one thing a GRPO step does with them; trainer/workers/placement.py starts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.util.placement_group import PlacementGroup, remove_placement_group

from rlbuild.contracts import checkpoints as layout
from trainer.errors import TrainerError
from trainer.workers import cluster
from trainer.workers.batch import Batch, UpdateBatch
from trainer.workers.engines import Rollout, SamplingParams, max_abs_difference
from trainer.workers.weight_sync import TensorSpec


class WeightSyncError(TrainerError):
    """After a weight sync the engine's logprobs differ from the policy's beyond the tolerance."""


@dataclass(frozen=True)
class Finished:
    """A call of an InProcessActor: already run; `collect` returns its value."""

    value: Any


@dataclass(frozen=True)
class _Method:
    call: Callable[..., Any]

    def remote(self, *args: Any, **kwargs: Any) -> Finished:
        return Finished(self.call(*args, **kwargs))


@dataclass(frozen=True)
class InProcessActor:
    """A role's worker object in the driver's own process, called as a Ray actor is (`actor.method.remote(...)`,
    results through `collect`), in the order of the calls as an actor runs them: a layout of one process needs no
    Ray (cluster.in_process says when)."""

    worker: Any

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("__"):  # copy, pickle and friends probe for these: not worker methods
            raise AttributeError(method)
        return _Method(getattr(self.worker, method))


def collect(calls: Any) -> Any:
    """`ray.get` for calls of Ray actors and of InProcessActors alike (one call, or a list of them)."""
    if isinstance(calls, list):
        if not any(isinstance(call, Finished) for call in calls):
            return ray.get(calls)
        return [collect(call) for call in calls]
    return calls.value if isinstance(calls, Finished) else ray.get(calls)


def rendezvous(host: Any, nodes: list[str]) -> tuple[str, int]:
    """Where a process group of actors on `nodes` meets: a free port on `host` (a policy worker)."""
    master_addr, port = collect(host.address.remote())
    # All members on one node: keep gloo/NCCL on loopback (Ray may report the primary interface address).
    return ("127.0.0.1" if len(set(nodes)) == 1 else master_addr), port


@dataclass(frozen=True)
class SharedEngine:
    """The driver's handle on an engine that lives in a policy rank's actor (placement.SharedEngineWorker): an
    engine actor's methods, by that actor's `engine_*` names."""

    actor: Any

    def __getattr__(self, method: str) -> Any:
        if method.startswith("__"):  # copy, pickle and friends probe for these: not engine methods
            raise AttributeError(method)
        return getattr(self.actor, f"engine_{method}")


@dataclass
class Roles:
    policy: list[Any]
    engines: list[Any]
    reference: list[Any]
    groups: list[PlacementGroup]
    started_ray: bool = False
    weight_specs: list[TensorSpec] = field(default_factory=list)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[Rollout]:
        """Split the prompts over the engines in contiguous chunks (groups stay on one engine when they fit)."""
        size = -(-len(prompts) // len(self.engines))
        futures = [
            e.generate.remote(prompts[i * size : (i + 1) * size], params, seed + i) for i, e in enumerate(self.engines)
        ]
        return [r for part in collect(futures) for r in part]

    def reference_logprobs(self, batch: Batch) -> torch.Tensor:
        """Score the batch on the reference workers, an equal contiguous share of rows each.

        Sharded workers run their forwards together, so every share has the same rows: the last one is topped up
        with copies of the final row, whose scores are dropped.
        """
        rows = batch["input_ids"].shape[0]
        size = -(-rows // len(self.reference))
        index = torch.arange(size * len(self.reference)).clamp(max=rows - 1)
        parts = [{k: v[index[i * size : (i + 1) * size]] for k, v in batch.items()} for i in range(len(self.reference))]
        scores = collect([w.logprobs.remote(p) for w, p in zip(self.reference, parts, strict=True)])
        return torch.cat(scores)[:rows]

    def update(self, batch: UpdateBatch, minis: int, micro: int) -> dict[str, float]:
        """One global step of optimisation on every policy rank, each on its shard; rank 0's statistics."""
        if self.reference:
            batch.tensors["ref_logprobs"] = self.reference_logprobs(batch.tensors)
        shards = batch.shards(len(self.policy))
        stats = collect([w.train_step.remote(s, minis, micro) for w, s in zip(self.policy, shards, strict=True)])
        return stats[0]

    def open_weight_sync(self, backend: str) -> None:
        """Open the policy -> engines broadcast group (trainer/workers/weight_sync.py) and learn what it will carry."""
        cluster_gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
        if backend == "nccl" and not torch.cuda.is_available() and cluster_gpus == 0:
            raise TrainerError(
                "generator.weight_sync_backend=nccl needs GPUs on the policy and the engines; this cluster has "
                "none. Use weight_sync_backend: gloo on CPU."
            )
        ranks = collect([e.sync_ranks.remote() for e in self.engines])
        first_ranks = [1 + sum(ranks[:i]) for i in range(len(self.engines))]
        nodes = collect([self.policy[0].node.remote(), *[e.node.remote() for e in self.engines]])
        master_addr, port = rendezvous(self.policy[0], nodes)
        world = 1 + sum(ranks)
        collect(
            [
                self.policy[0].open_weight_sync.remote(backend, master_addr, port, world),
                *[
                    e.open_weight_sync.remote(backend, master_addr, port, r, world)
                    for e, r in zip(self.engines, first_ranks, strict=True)
                ],
            ]
        )
        self.weight_specs = collect([w.weight_specs.remote() for w in self.policy])[0]

    def sync_weights(self, probe: list[int], probe_start: int, tolerance: float) -> float:
        """Broadcast the policy's full weights to every engine, then check engine logprobs == policy logprobs.

        All calls go out at once: an actor runs one caller's calls in order, so each probe runs after its actor's
        side of the broadcast, and the step waits for one round trip instead of three.
        """
        transfer = [w.broadcast_weights.remote() for w in self.policy]
        transfer += [e.receive_weights.remote(self.weight_specs) for e in self.engines]
        expected_calls = [w.sequence_logprobs.remote(probe, probe_start) for w in self.policy]
        observed_calls = [e.sequence_logprobs.remote(probe, probe_start) for e in self.engines]
        collect(transfer)
        expected, observed = collect(expected_calls)[0], collect(observed_calls)
        worst = max((max_abs_difference(expected, got) for got in observed), default=0.0)
        if worst > tolerance:
            raise WeightSyncError(
                f"after the weight sync, engine logprobs differ from the policy's by {worst:.3g} > "
                f"generator.weight_sync_check_tolerance={tolerance}: the engine is not running the policy's weights "
                "(tied embeddings or a renamed parameter?)"
            )
        return worst

    def save_checkpoint(self, uri: str, with_hf_folder: bool) -> dict[str, Any]:
        """Every policy rank writes its shards under `uri` (and rank 0 the HF folder when asked); returns the
        manifest entries of every file written."""
        written = collect([w.save_checkpoint.remote(uri, with_hf_folder) for w in self.policy])
        return {rel: entry for files in written for rel, entry in files.items()}

    def load_checkpoint(self, uri: str, files: dict[str, Any]) -> None:
        """Verify the checkpoint's sharded files against its manifest (each rank reads a share, all before any
        rank loads: a rank failing inside the collective load would leave the others waiting), then load it."""
        sharded = sorted(rel for rel in files if rel.startswith(f"{layout.SHARDED}/"))
        world = len(self.policy)
        collect(
            [
                w.verify_checkpoint.remote(uri, {rel: files[rel] for rel in sharded[rank::world]})
                for rank, w in enumerate(self.policy)
            ]
        )
        collect([w.load_checkpoint.remote(uri) for w in self.policy])

    def shutdown(self) -> None:
        collect([w.shutdown.remote() for w in [*self.policy, *self.reference]])
        actors = [*self.policy, *self.reference, *(e for e in self.engines if not isinstance(e, SharedEngine))]
        for actor in actors:
            if not isinstance(actor, InProcessActor):
                ray.kill(actor)
        for group in self.groups:
            remove_placement_group(group)
        cluster.disconnect(self.started_ray)
