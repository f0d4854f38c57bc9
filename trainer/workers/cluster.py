"""The Ray cluster a run uses: the gang's (or any `address`), joined, or a private local one started for the run.

Light on purpose (Ray and rlbuild's contracts, no torch): `python -m trainer run` starts its private Ray before it
imports the loop's torch and transformers, so Ray's services and workers start while those imports run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

import ray

from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.layout import Layout, pack, shape_of_recipe
from rlbuild.contracts.runtime import REPO_ROOT
from rlbuild.core import storage
from rlbuild.core.wire import RAY_TEMP_DIR_ENV

# What each worker of a private Ray imports as it starts, before it is given an actor: every actor class (the
# placement module's imports: torch, transformers), what loading any Hugging Face model imports (~600 modules,
# torch._dynamo to accelerate: 1-3 s) and torch.distributed.checkpoint (trainer/workers/sharding.py), none of
# which the driver needs.
ACTOR_IMPORTS = ["trainer.workers.placement", "transformers.modeling_utils", "torch.distributed.checkpoint"]

# Whether this process started the Ray it is connected to (a private one), however many times it connected.
_started_here = {"ray": False}


def layout_of(launch: LaunchDocument) -> Layout:
    """The launch document's layout: the same packing preflight ran on the experiment."""
    allocation = launch.iris.allocation
    return pack(shape_of_recipe(launch.recipe, allocation.num_nodes, allocation.gpus_per_node))


def bundles_needed(layout: Layout, reference_workers: int) -> int:
    shape = layout.shape
    engines = 0 if shape.colocated else shape.engines * shape.engine_gpus
    return len(layout.policy_nodes) * shape.gpus_per_node + reference_workers + engines


def connect_for(launch: LaunchDocument) -> bool:
    """`connect` as the launch document's roles need it (its `ray.address`, else RAY_ADDRESS, else a private Ray
    for its bundles and actors). Returns True when this process started the Ray it is connected to."""
    recipe, layout = launch.recipe, layout_of(launch)
    actors = recipe.trainer.placement.policy_world_size + recipe.reference_workers + layout.shape.engines
    address = launch.ray.address or os.environ.get("RAY_ADDRESS")
    return connect(address, bundles_needed(layout, recipe.reference_workers), actors)


def plain_worker_logs(environ: MutableMapping[str, str], tty: bool) -> None:
    """Ray colours the lines it forwards from the workers; in a log file (not a terminal) those are escape codes,
    so off there (RAY_COLOR_PREFIX=0, read by Ray per line) unless the environment already says otherwise."""
    if not tty:
        environ.setdefault("RAY_COLOR_PREFIX", "0")


def connect(address: str | None, num_bundles: int, num_actors: int = 0) -> bool:
    """Join `address` (or RAY_ADDRESS); else start a local Ray. Returns True when this process started the Ray it
    is connected to (also when an earlier call started it)."""
    plain_worker_logs(os.environ, sys.stdout.isatty() and sys.stderr.isatty())
    env_vars = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        # The lease this job builds under reaches the workers on every node (a gang's other ranks started
        # Ray before the job named it): their checkpoint shards are writes under it (storage.fence).
        **{name: os.environ[name] for name in (storage.LEASE_ENV, storage.LEASE_RUN_ENV) if name in os.environ},
    }
    if ray.is_initialized():
        return _started_here["ray"]
    if address:
        ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=True)
        return False
    # A private Ray's processes are this process's children and inherit its environment: the variables go there
    # instead of into a runtime_env. A job with a runtime_env cannot take the workers Ray starts with the cluster
    # (one per CPU): each actor would wait for a fresh worker, started through another Python (setup_worker.py).
    # With none, those workers take the actors, having imported the actors' modules meanwhile (ACTOR_IMPORTS).
    # CPUs: one per bundle, and one per actor beyond them. Ray keeps as many idle workers as CPUs its placement
    # groups leave free; with fewer, it ends a worker it started ahead and starts a fresh one for an actor (seen
    # with two actors in one bundle of two CPUs: the second actor waited for a new worker's imports).
    with _environment(env_vars):
        # "local" starts a private cluster: with no address, Ray would join whatever cluster last started here.
        ray.init(
            address="local",
            _temp_dir=session_folder(),
            num_cpus=num_bundles + num_actors,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
            _system_config={"preload_python_modules": ACTOR_IMPORTS},
        )
    _started_here["ray"] = True
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
    not exceed 107 bytes, and a scheduler's TMPDIR (an Iris task's) can be long."""
    given = os.environ.get(RAY_TEMP_DIR_ENV)
    if given:
        return given
    folder = tempfile.mkdtemp(prefix="rlray-", dir="/tmp")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # before ray.init: runs after Ray's own handler
    return folder
