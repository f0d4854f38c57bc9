"""The Ray cluster a run uses: the gang's (or any `address`), joined, or a private local one started for the run.

Light on purpose (Ray and rlbuild's contracts, no torch): `python -m trainer run` starts its private Ray before it
imports the loop's torch and transformers, so Ray's services start, and its workers import what the actors need,
while the driver imports its own modules.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path

import ray

from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.layout import Layout, pack, shape_of_recipe
from rlbuild.contracts.recipe import Recipe
from rlbuild.contracts.runtime import REPO_ROOT
from rlbuild.core import storage
from rlbuild.core.wire import RAY_TEMP_DIR_ENV
from trainer.errors import TrainerError
from trainer.workers import startup

# What each worker of a private Ray imports as it starts, before it is given an actor: every actor class (the
# placement module: torch, transformers), what loading a Hugging Face model imports (transformers.modeling_utils:
# ~5 s, torch._dynamo and DTensor among it) and torch.distributed.checkpoint (trainer/workers/sharding.py). The
# driver needs none of the last two.
ACTOR_IMPORTS = ["trainer.workers.placement", "transformers.modeling_utils", "torch.distributed.checkpoint"]

# `always`: a layout of one process runs on a private Ray too (in_process), to compare the two or to watch it there.
FORCE_RAY_ENV = "RLBUILD_TRAINER_RAY"

# Whether this process started the Ray it is connected to (a private one), however many times it connected.
_started_here = {"ray": False}


def layout_of(launch: LaunchDocument) -> Layout:
    """The launch document's layout: the same packing preflight ran on the experiment."""
    allocation = launch.allocation
    return pack(shape_of_recipe(launch.recipe, allocation.num_nodes, allocation.gpus_per_node))


def bundles_needed(layout: Layout, reference_workers: int) -> int:
    shape = layout.shape
    engines = 0 if shape.colocated else shape.engines * shape.engine_gpus
    return len(layout.policy_nodes) * shape.gpus_per_node + reference_workers + engines


def shares_process(recipe: Recipe, layout: Layout, backend: str) -> bool:
    """Whether the engine of a colocated layout runs in its policy rank's process (placement.SharedEngineWorker):
    one torch engine of one bundle beside a single policy rank, in the synchronous loop (fully_async generates while
    the policy trains, which takes two processes). A process of its own would import torch and transformers again
    (~6 CPU-s of every train job's start) to hold what already shares the rank's bundle."""
    shape = layout.shape
    single = shape.engines == 1 and shape.engine_gpus == 1 and recipe.trainer.placement.policy_world_size == 1
    return shape.colocated and backend == "torch" and single and recipe.trainer.entrypoint == "grpo"


def _backend(recipe: Recipe) -> str:
    """The generator backend, resolved without torch as engines.resolve_backend resolves `auto`: vLLM on a GPU."""
    backend = recipe.generator.backend
    if backend == "auto":
        backend = "vllm" if Path("/dev/nvidiactl").exists() else "torch"
    return backend


def actors_needed(launch: LaunchDocument) -> int:
    """One Ray actor per policy rank, reference worker and engine of a process of its own."""
    recipe, layout = launch.recipe, layout_of(launch)
    engines = 0 if shares_process(recipe, layout, _backend(recipe)) else layout.shape.engines
    return recipe.trainer.placement.policy_world_size + recipe.reference_workers + engines


def forced_onto_ray() -> bool:
    """Whether RLBUILD_TRAINER_RAY asks for a private Ray for a layout of one process; a value it does not know is
    refused, not read as "no"."""
    value = os.environ.get(FORCE_RAY_ENV, "")
    if value not in ("", "always"):
        raise TrainerError(
            f"{FORCE_RAY_ENV}={value!r} is not a value it takes: `always` runs a layout of one process on a private "
            f"Ray; unset it to let the trainer run such a layout in its own process"
        )
    return value == "always"


def in_process(launch: LaunchDocument) -> bool:
    """Whether the run's roles live in the trainer's own process, with no Ray: a layout of one process (a single
    policy rank with its engine, no reference workers) and no cluster to join. Ray would add its services and a
    worker that imports torch and transformers again (~10 s and ~20 CPU-s of every such job's start) to hold what
    this process already holds. RLBUILD_TRAINER_RAY=always starts a private Ray for it anyway (the same results)."""
    if forced_onto_ray() or launch.ray.address or os.environ.get("RAY_ADDRESS"):
        return False
    recipe = launch.recipe
    return shares_process(recipe, layout_of(launch), _backend(recipe)) and recipe.reference_workers == 0


def connect_for(launch: LaunchDocument) -> bool:
    """`connect` as the launch document's roles need it (its `ray.address`, else RAY_ADDRESS, else a private Ray
    for its bundles and actors). Returns True when this process started the Ray it is connected to."""
    address = launch.ray.address or os.environ.get("RAY_ADDRESS")
    bundles = bundles_needed(layout_of(launch), launch.recipe.reference_workers)
    return connect(address, bundles, actors_needed(launch))


def plain_worker_logs(environ: MutableMapping[str, str], tty: bool) -> None:
    """Ray colours the lines it forwards from the workers; in a log file (not a terminal) those are escape codes,
    so off there (RAY_COLOR_PREFIX=0, read by Ray per line) unless the environment already says otherwise."""
    if not tty:
        environ.setdefault("RAY_COLOR_PREFIX", "0")


def worker_environment() -> dict[str, str]:
    """What every worker of the run needs in its environment, on every node."""
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        # The lease this job builds under reaches the workers on every node (a gang's other ranks started
        # Ray before the job named it): their checkpoint shards are writes under it (storage.fence).
        **{name: os.environ[name] for name in (storage.LEASE_ENV, storage.LEASE_RUN_ENV) if name in os.environ},
    }


def connect(address: str | None, num_bundles: int, num_actors: int = 0) -> bool:
    """Join `address` (or RAY_ADDRESS); else start a local Ray for `num_bundles` placement bundles and `num_actors`
    actors. Returns True when this process started the Ray it is connected to (also when an earlier call did)."""
    plain_worker_logs(os.environ, sys.stdout.isatty() and sys.stderr.isatty())
    if ray.is_initialized():
        return _started_here["ray"]
    if address:
        ray.init(address=address, runtime_env={"env_vars": worker_environment()}, log_to_driver=True)
        startup.reached("ray")
        return False
    # A private Ray's processes are this process's children and inherit its environment: the variables go there
    # instead of into a runtime_env, because a job with a runtime_env cannot take the workers Ray starts with the
    # cluster (each actor would wait for a fresh worker, started through another Python). Ray starts one worker
    # per CPU and keeps as many idle: CPUs for the actors (at least the bundles' count), so exactly the actors'
    # workers start, each importing the actors' modules (ACTOR_IMPORTS) while the driver imports its own; a worker
    # started for nothing costs an import of torch and transformers (~6 CPU-s).
    cpus = max(num_bundles, num_actors, 1)
    with _environment(worker_environment()):
        # "local" starts a private cluster: with no address, Ray would join whatever cluster last started here.
        ray.init(
            address="local",
            _temp_dir=session_folder(),
            num_cpus=cpus,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
            _system_config={"preload_python_modules": ACTOR_IMPORTS, "num_workers_soft_limit": cpus},
        )
    _started_here["ray"] = True
    startup.reached("ray")
    return True


def disconnect(started: bool) -> None:
    """Shut down the Ray this process started (a joined cluster is left as it is)."""
    if started:
        ray.shutdown()
        _started_here["ray"] = False


@contextmanager
def _environment(env_vars: dict[str, str]) -> Iterator[None]:
    """`env_vars` in this process's environment while it starts Ray's processes (they keep a copy), then as before:
    the driver's own libraries never see them."""
    before = {name: os.environ.get(name) for name in env_vars}
    os.environ.update(env_vars)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def session_folder() -> str:
    """Where the local Ray keeps its session: the folder `rlbuild train` made for this run (it removes it, and
    ends what Ray left, however the trainer ends), else a fresh one of this process's, removed at its exit (Ray's
    own shutdown at exit runs first). Under /tmp, not TMPDIR: Ray's unix sockets live in it, a socket path may
    not exceed 107 bytes, and a scheduler's TMPDIR (a task's own folder) can be long."""
    given = os.environ.get(RAY_TEMP_DIR_ENV)
    if given:
        return given
    folder = tempfile.mkdtemp(prefix="rlray-", dir="/tmp")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # before ray.init: runs after Ray's own handler
    return folder
