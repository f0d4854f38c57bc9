"""What FSDP2 costs on CPU ranks: seconds per optimizer step of the policy model, FSDP2 vs DDP on 2 gloo ranks
and FSDP2 vs the bare model on 1 rank, measured in the same run.

    .venv/bin/python benchmarks/fsdp_cpu.py [--hidden 32] [--layers 2] [--steps 30]

Each step is what a policy rank does per optimizer step (trainer/workers/policy.py): 32 samples of 24 tokens split over
the ranks, micro-batches of 8, backward, gradient clipping, fused AdamW. FSDP2 is trainer/workers/sharding.py's
`shard`, forced onto one rank for the 1-rank comparison (the trainer keeps one rank unsharded). The last line
prints the ratios, and the largest difference of the final weights from the 1-rank bare run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, Qwen2Config

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainer.workers import sharding  # noqa: E402

SAMPLES, TOKENS, MICRO = 32, 24, 8
MODES = (("bare", 1), ("fsdp2", 1), ("ddp", 2), ("fsdp2", 2))


def _model(hidden: int, layers: int) -> torch.nn.Module:
    config = Qwen2Config(
        vocab_size=80,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _wrap(model: torch.nn.Module, mode: str, world: int) -> torch.nn.Module:
    if mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if world > 1:
            sharding.shard([model], torch.device("cpu"))
        else:  # what the trainer would do if it sharded one rank
            mesh = init_device_mesh("cpu", (1,))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
    return model


def _rank(rank: int, world: int, mode: str, args: argparse.Namespace, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = _wrap(_model(args.hidden, args.layers), mode, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(4, 80, (SAMPLES, TOKENS), generator=torch.Generator().manual_seed(1))
    mine = ids.chunk(world)[rank]
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for part in mine.split(MICRO):
            # The mean over this micro-batch, weighted to the whole batch; ranks' gradients are averaged.
            loss = model(input_ids=part, labels=part).loss * len(part) / SAMPLES * world
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        times.append(time.perf_counter() - started)
    state = sharding.full_state(model.module if mode == "ddp" else model)
    if rank == 0:
        torch.save((statistics.median(times[3:]), state), f"{out}/{mode}-{world}.pt")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="fsdp-bench-") as out:
        for port, (mode, world) in enumerate(MODES, start=29611):
            mp.spawn(_rank, args=(world, mode, args, out, port), nprocs=world)
            results[(mode, world)] = torch.load(f"{out}/{mode}-{world}.pt")
    base = results[("bare", 1)][1]
    for (mode, world), (seconds, state) in results.items():
        drift = max(float((state[k] - base[k]).abs().max()) for k in base)
        print(f"{mode:>5} on {world} rank(s): {seconds * 1000:7.1f} ms/step   max |w - bare| {drift:.1e}")
    fsdp_vs_ddp = results[("fsdp2", 2)][0] / results[("ddp", 2)][0]
    fsdp_vs_bare = results[("fsdp2", 1)][0] / results[("bare", 1)][0]
    print(f"hidden {args.hidden}, {args.layers} layers: FSDP2/DDP on 2 ranks {fsdp_vs_ddp:.2f}x; ", end="")
    print(f"FSDP2/bare on 1 rank {fsdp_vs_bare:.2f}x")


if __name__ == "__main__":
    main()
