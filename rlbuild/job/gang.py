"""The gang bootstrap: every task of a gang runs `python -m rlbuild.schedulers.gangtask [options] -- <job step>`,
which finds the scheduler whose task it is and calls `main` here.

The job step is the Snakemake job where the scheduler runs Snakemake jobs as gangs, or the trainer where a train
job starts its gang itself (a chain of jobs across wall-clock limits). Rank, attempt, ports and address come from
the task's scheduler (`GangScheduler`, implemented under `rlbuild/schedulers/`).

Rank 0 clears earlier attempts' rendezvous state, starts the Ray head, publishes its address, waits until all
N nodes have joined (naming the missing ranks on timeout), runs the job step (the Snakemake job that runs the
trainer) with RAY_ADDRESS set, then writes `done` (or `failed`). Every other rank waits for the address,
joins Ray, materialises its own inputs and exits 0 on `done`. Any failing rank exits non-zero, and the scheduler
fails (or restarts) the whole gang.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rlbuild.contracts.progress import HEARTBEAT_S
from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError
from rlbuild.core.redact import redact_text
from rlbuild.core.wire import NOT_RETRYABLE_EXIT_CODE, RANK_RESOURCE
from rlbuild.job import interrupts
from rlbuild.job.rendezvous import Rendezvous, RendezvousError, TaskIdentity

if TYPE_CHECKING:
    from rlbuild.contracts.launch import LaunchDocument

WORKER_PORT_BASE = 20000  # outside the schedulers' own port ranges (a local cluster's: 12000-13999); one per rank
WORKER_PORTS_PER_RANK = 400
RAY_STOP_GRACE_S = 10.0
# Ray gives a starting node's raylet 30 s to register with the GCS (hard-coded in ray/_private/node.py) and `ray
# start` exits when it misses that; on a loaded host it does (seen: the second node of a gang on a busy 2-core box).
# A node whose `ray start` exits within the window died starting and is started again, up to RAY_START_ATTEMPTS.
RAY_START_WINDOW_S = 120.0
RAY_START_ATTEMPTS = 3
# The wall-clock warning a scheduler sends every process of a job before its limit (`--signal=USR1@<lead>`); only
# the trainer acts on it (trainer/continuation.py).
WARNING_SIGNAL = signal.SIGUSR1


class GangScheduler(Protocol):
    """What the bootstrap asks of the scheduler whose task it is (rlbuild/schedulers/base.py implements it)."""

    def task(self, environ: Mapping[str, str]) -> TaskIdentity: ...

    def gang_ports(self, environ: Mapping[str, str], rank: int) -> dict[str, int]: ...

    def advertise_host(self, environ: Mapping[str, str]) -> str: ...

    def refuse_retry(self, environ: Mapping[str, str], log: Callable[[str], None]) -> None: ...


def log(message: str) -> None:
    print(f"[gang {time.strftime('%H:%M:%S')}] {redact_text(message)}", file=sys.stderr, flush=True)


@dataclass
class RayNode:
    """One `ray start --block` process (head or worker) owned by this task; stopped by handle, never `ray stop`."""

    rank: int
    host: str
    ports: dict[str, int]
    num_cpus: int | None = None
    program: str = str(Path(sys.executable).with_name("ray"))
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    temp_dir: str = field(default="", init=False)
    head_address: str | None = field(default=None, init=False)
    starts: int = field(default=0, init=False)
    started_at: float = field(default=0.0, init=False)
    restarting: threading.Lock = field(default_factory=threading.Lock, init=False)

    @property
    def gcs_address(self) -> str:
        return f"{self.host}:{self.ports['ray_gcs']}"

    def start(self, head_address: str | None) -> None:
        self.head_address = head_address
        # Ray's unix sockets need a short path; the task's TMPDIR can be long.
        self.temp_dir = tempfile.mkdtemp(prefix=f"rlray{self.rank}-", dir="/tmp")
        low = WORKER_PORT_BASE + self.rank * WORKER_PORTS_PER_RANK
        argv = [
            self.program,
            "start",
            "--block",
            "--disable-usage-stats",
            f"--node-ip-address={self.host}",
            f"--node-manager-port={self.ports['ray_node_manager']}",
            f"--object-manager-port={self.ports['ray_object_manager']}",
            f"--metrics-export-port={self.ports['ray_metrics']}",
            f"--dashboard-agent-listen-port={self.ports['ray_agent_listen']}",
            f"--dashboard-agent-grpc-port={self.ports['ray_agent_grpc']}",
            f"--runtime-env-agent-port={self.ports['ray_runtime_env']}",
            f"--min-worker-port={low}",
            f"--max-worker-port={low + WORKER_PORTS_PER_RANK - 1}",
            f"--resources={json.dumps({RANK_RESOURCE.format(rank=self.rank): 1})}",
            f"--temp-dir={self.temp_dir}",
        ]
        if self.num_cpus is not None:
            argv.append(f"--num-cpus={self.num_cpus}")
        if head_address is None:
            argv += [
                "--head",
                f"--port={self.ports['ray_gcs']}",
                f"--ray-client-server-port={self.ports['ray_client']}",
                "--include-dashboard=false",
            ]
        else:
            argv.append(f"--address={head_address}")
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        preexec = _ray_node_child(os.getpid())
        self.process = subprocess.Popen(argv, env=env, stdout=sys.stderr, stderr=sys.stderr, preexec_fn=preexec)
        self.starts += 1
        self.started_at = time.monotonic()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def keep_running(self) -> bool:
        """Whether this node's Ray runs, after starting a worker node again if its `ray start` exited while
        starting (RAY_START_WINDOW_S). A head is never started again (the workers joined its GCS), nor a node that
        ran past the window: those are gone for good."""
        with self.restarting:  # the heartbeat thread asks too
            if self.process is None or self.running():
                return self.process is not None
            late = time.monotonic() - self.started_at > RAY_START_WINDOW_S
            if self.head_address is None or late or self.starts >= RAY_START_ATTEMPTS:
                return False
            log(f"rank {self.rank}: `ray start` exited with code {self.process.returncode} while starting; again")
            self.remove_temp_dir()
            self.start(self.head_address)
            return True

    def stop(self) -> None:
        with self.restarting:
            if self.process is None:
                return
            interrupts.stop(self.process, RAY_STOP_GRACE_S)  # after a SIGKILL its daemons share its fate (PDEATHSIG)
            self.process = None

    def logs_dir(self) -> Path | None:
        logs = Path(self.temp_dir, "session_latest", "logs") if self.temp_dir else None
        return logs if logs is not None and logs.is_dir() else None

    def remove_temp_dir(self) -> None:
        """Ray's daemons may still be writing for a moment after `ray start` exits: retry until it is gone."""
        deadline = time.monotonic() + RAY_STOP_GRACE_S
        while self.temp_dir and os.path.exists(self.temp_dir) and time.monotonic() < deadline:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            time.sleep(0.2)


def _ray_node_child(bootstrap: int) -> Callable[[], None]:
    """The `ray start` child dies with this bootstrap, so a killed rank never leaves its Ray node running (a
    scheduler would not see the task end while the node holds its output open), and ignores the wall-clock
    warning."""
    die = interrupts.die_with(bootstrap)

    def preexec() -> None:
        die()
        ignore_warning()

    return preexec


def ignore_warning() -> None:
    """In a child before exec: ignore the wall-clock warning (WARNING_SIGNAL), which the scheduler sends to every
    process of the step; only the trainer, which installs its own handler, acts on it (trainer/continuation.py)."""
    signal.signal(WARNING_SIGNAL, signal.SIG_IGN)


def _warned(signum: int, _frame: object) -> None:
    log(f"wall-clock warning ({signal.Signals(signum).name}): the trainer checkpoints after its current step")


def wait_for_port(host: str, port: int, timeout_s: float, node: RayNode) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not node.running():
            raise RendezvousError(f"the Ray head exited before it listened on {host}:{port}; see the log above")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RendezvousError(f"the Ray head did not listen on {host}:{port} within {timeout_s:.0f}s")


def wait_for_nodes(address: str, nodes: int, timeout_s: float, alive_ranks: Callable[[], set[int]]) -> float:
    """Rank 0: block until Ray reports `nodes` alive nodes; return the seconds it took."""
    import ray

    start = time.monotonic()
    ray.init(address=address, log_to_driver=False, logging_level="WARNING", configure_logging=False)
    try:
        while True:
            joined = set()
            for node in ray.nodes():
                if node.get("Alive"):
                    joined |= {
                        int(k.rsplit("_", 1)[-1]) for k in node.get("Resources", {}) if k.startswith("rlbuild_rank_")
                    }
            if len(joined) >= nodes:
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                missing = sorted(set(range(nodes)) - joined)
                raise RendezvousError(
                    f"only {len(joined)} of {nodes} nodes joined Ray at {address} within {timeout_s:.0f}s; "
                    f"missing ranks: {missing} (ranks that wrote an alive marker: {sorted(alive_ranks())}). "
                    "Check those tasks' logs; raise --join-timeout if nodes are slow to start."
                )
            time.sleep(0.2)
    finally:
        ray.shutdown()


def materialise(launch: str | None, cache_dir: Path) -> None:
    if not launch:
        return
    from rlbuild.contracts.launch import load_launch
    from rlbuild.contracts.manifest import materialise_inputs

    started = time.monotonic()
    paths = materialise_inputs(load_launch(launch), cache_dir)
    log(
        f"materialised inputs of {launch} into {cache_dir} in {time.monotonic() - started:.1f}s: model {paths['model']}"
    )


class NotRetryableError(RlbuildError):
    """A failure the same job would meet again on retry: the task exits NOT_RETRYABLE_EXIT_CODE and asks its
    scheduler not to restart it (`refuse_retry`: cancel the gang's job where its scheduler would retry it)."""


class RuntimeMismatchError(NotRetryableError):
    """This node's code is not the code the launch document was planned for."""


def check_runtime(launch: str | None, environ: Mapping[str, str]) -> None:
    """Before Ray starts: the node runs the runtime source digest the launch document names, and its tasks got the
    experiment's `execution.env` (the scheduler's environment hand-off took effect)."""
    if not launch:
        return
    from rlbuild.contracts.launch import load_launch
    from rlbuild.contracts.runtime import source_digest

    document = load_launch(launch)
    planned, running = document.runtime.source_digest, source_digest()
    if running != planned:
        raise RuntimeMismatchError(
            f"this node runs runtime source digest {running}, but {launch} was planned for {planned}: the job would "
            "train other code than the plan names (another checkout or image, or trainer/, the bootstrap or uv.lock "
            "edited since the plan). Run the job from the checkout the plan was made from, or re-plan it from this "
            "code (resolve_launch; a fixed version needs a new version)."
        )
    check_image(document)
    check_rollout_backend(document)
    absent = [name for name in document.credentials if not environ.get(name)]
    if absent:
        raise RuntimeMismatchError(
            f"this node lacks {', '.join(absent)}, which {launch} names for its sandbox provider "
            f"({document.recipe.environment.sandbox.backend if document.recipe.environment.sandbox else '-'}): the "
            "scheduler did not forward it. Export it in the shell that submits (rlbuild check names what a backend "
            "needs) and resubmit."
        )
    wrong = {name: environ.get(name) for name, value in document.env.items() if environ.get(name) != value}
    if wrong:
        found = ", ".join(f"{n}={v!r}" if v is not None else f"{n} unset" for n, v in wrong.items())
        raise RuntimeMismatchError(
            f"this node's environment lacks the experiment's execution.env ({found}; {launch} asks for "
            f"{', '.join(f'{n}={document.env[n]!r}' for n in wrong)}): the scheduler did not hand it to the task. Run "
            "the job through the Snakefile (which declares these variables to the executor), not a hand-made command."
        )


def check_image(document: LaunchDocument) -> None:
    """The node holds what its image declares (`runtime.image_provides`, torch first): preflight judged the rollout
    backend from that declaration, and a SIF rebuilt with other packages under the same name would break it."""
    from rlbuild.job.image import provides_mismatches

    wrong = provides_mismatches(document.runtime.image_provides)
    if wrong:
        raise RuntimeMismatchError(
            f"this node does not hold what runtime.image_provides declares for {document.runtime.image}: "
            f"{', '.join(wrong)}. Declare what the image holds (torch.__version__ inside it is the reliable probe), "
            "or pin the image that holds what is declared."
        )


def check_rollout_backend(document: LaunchDocument) -> None:
    """The node has the rollout engine its launch document needs (vLLM for `vllm`, and for `auto` on GPUs), and
    Harbor where its sandbox backend is one of Harbor's: preflight judged the declared runtime (an image it cannot
    look into, or uv.lock); this is the node itself."""
    from rlbuild.contracts.launch import CPU_VARIANT
    from rlbuild.contracts.recipe import SANDBOX_PROVIDERS

    sandbox = document.recipe.environment.sandbox
    extra = SANDBOX_PROVIDERS[sandbox.backend].extra if sandbox is not None else None
    if extra is not None and importlib.util.find_spec("harbor") is None:
        image = document.runtime.image
        raise RuntimeMismatchError(
            f"environment.sandbox.backend {sandbox.backend!r} starts its sandboxes through Harbor, and this node has "
            f"none ({'image ' + image if image else 'set up from uv.lock'}): every episode would fail after Ray "
            f"starts. Use an image with harbor (runtime.image), or the lock's {extra!r} extra."
        )

    backend, allocation = document.recipe.generator.backend, document.allocation
    needs_vllm = backend == "vllm" or (backend == "auto" and allocation.gpu_variant.lower() != CPU_VARIANT)
    if needs_vllm and importlib.util.find_spec("vllm") is None:
        image = document.runtime.image
        raise RuntimeMismatchError(
            f"generator.backend {backend!r} on {allocation.gpu_variant} needs vLLM, and this node has none "
            f"({'image ' + image if image else 'set up from uv.lock'}): rollouts would fail after Ray starts. Use "
            "an image with vLLM (runtime.image), the lock's gpu extra, or generator.backend: torch."
        )


def launch_rendezvous_dir(launch: str) -> str:
    from rlbuild.contracts.launch import load_launch

    return load_launch(launch).ray.rendezvous_dir


def run_rank0(args: argparse.Namespace, rdv: Rendezvous, node: RayNode, command: Sequence[str]) -> int:
    try:
        return _run_rank0(args, rdv, node, command)
    except RendezvousError as error:
        rdv.mark_failed(str(error))
        raise


def _run_rank0(args: argparse.Namespace, rdv: Rendezvous, node: RayNode, command: Sequence[str]) -> int:
    gang_start = time.monotonic()
    removed = rdv.clear_stale()
    if removed:
        log(f"cleared {len(removed)} stale rendezvous folder(s) of earlier attempts")
    node.start(head_address=None)
    wait_for_port(node.host, node.ports["ray_gcs"], args.join_timeout, node)
    rdv.publish_head(
        node.gcs_address, rank=0, nodes=args.nodes, job=args.job, scheduler=args.scheduler, time=time.time()
    )
    beat_while_running(rdv, node)
    log(f"Ray head at {node.gcs_address}; waiting for {args.nodes} node(s)")
    wait_for_nodes(node.gcs_address, args.nodes, args.join_timeout, rdv.alive_ranks)
    log(f"Ray nodes alive: {args.nodes}/{args.nodes} after {time.monotonic() - gang_start:.1f}s since gang start")
    if not command:
        rdv.mark_done()
        return 0
    env = {**os.environ, "RAY_ADDRESS": node.gcs_address}
    code = subprocess.call(list(command), env=env, preexec_fn=ignore_warning)
    if code == 0:
        rdv.mark_done()
    else:
        rdv.mark_failed(f"rank 0's job step exited with code {code}")
    return code


def run_worker(args: argparse.Namespace, rdv: Rendezvous, node: RayNode) -> int:
    head = rdv.wait_head(args.join_timeout)
    node.start(head_address=head["address"])
    beat_while_running(rdv, node)
    log(f"rank {node.rank} joining Ray at {head['address']}")
    materialise(args.launch, args.cache_dir)
    rdv.mark_inputs(node.rank)
    ok, reason = rdv.wait_outcome(node.keep_running)
    if ok:
        log(f"rank {node.rank}: rank 0 finished; leaving")
        return 0
    log(f"rank {node.rank}: {reason}")
    return 1


def beat_while_running(rdv: Rendezvous, node: RayNode, every_s: float = HEARTBEAT_S) -> None:
    """Mark this rank alive now, and again every `every_s` while its Ray node runs: `rlbuild status` counts the
    nodes whose heartbeat is fresh."""
    rdv.mark_alive(node.rank)

    def beat() -> None:
        while node.keep_running():
            time.sleep(every_s)
            try:
                rdv.mark_alive(node.rank)
            except (OSError, RlbuildError) as error:  # advisory: the next beat tries again
                log(f"heartbeat of rank {node.rank} failed: {error}")

    threading.Thread(target=beat, name=f"rlbuild-rank{node.rank}-heartbeat", daemon=True).start()


def archive_ray_logs(rdv: Rendezvous, node: RayNode) -> None:
    """Keep this node's Ray logs beside the rendezvous (the attempts root), for post-mortems of failed gangs."""
    logs = node.logs_dir()
    if logs is None:
        return
    target = storage.join(rdv.uri, "ray-logs", f"rank-{node.rank}")
    try:
        storage.put_dir(logs, target)
    except OSError as error:
        log(f"could not archive Ray logs to {target}: {error}")


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m rlbuild.schedulers.gangtask", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True, help="gang size (the job's tasks, one per node)")
    parser.add_argument(
        "--rendezvous-root",
        help="folder or s3:// URI holding per-job folders (default: the launch's ray.rendezvous_dir)",
    )
    parser.add_argument("--gang-id", required=True, help="fixed at submission; separates re-used job names")
    parser.add_argument("--launch", help="launch document (path or s3:// URI): workers materialise its inputs")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "rlbuild-inputs")
    parser.add_argument("--join-timeout", type=float, default=1800.0, help="seconds for head and nodes to come up")
    parser.add_argument("--num-cpus", type=int, help="CPUs each Ray node advertises (default: detected)")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between rendezvous polls")
    args = parser.parse_args(own)
    if args.nodes < 1:
        parser.error(f"--nodes must be >= 1, got {args.nodes}")
    if not args.rendezvous_root and not args.launch:
        parser.error("give --rendezvous-root, or --launch whose ray.rendezvous_dir says where to rendezvous")
    return args, command


def listen_for_warning() -> None:
    """First, before anything slow: a scheduler sends its wall-clock warning once, to every process of the step, and
    a link with a lead close to its limit gets it within seconds of starting. Its default action kills the task, so
    a rank still reading its launch document died of it under load instead of handing over (the chain then waited
    out the limit)."""
    signal.signal(WARNING_SIGNAL, _warned)


def main(argv: Sequence[str], scheduler: GangScheduler) -> int:
    args, command = parse_args(argv)
    try:
        check_runtime(args.launch, os.environ)
        task = scheduler.task(os.environ)
        root = args.rendezvous_root or launch_rendezvous_dir(args.launch)
        rdv = Rendezvous(root, task.job, args.gang_id, task.attempt, poll_s=args.poll)
        ports = scheduler.gang_ports(os.environ, task.rank)
        node = RayNode(rank=task.rank, host=scheduler.advertise_host(os.environ), ports=ports, num_cpus=args.num_cpus)
        args.job, args.scheduler = task.job, task.scheduler
        log(f"rank {task.rank}/{args.nodes} attempt {task.attempt} of {task.job}; rendezvous {rdv.uri}")
        signal.signal(signal.SIGTERM, _terminate)  # the scheduler stopping the task: still stop Ray and keep its logs
        try:
            if task.rank == 0:
                return run_rank0(args, rdv, node, command)
            return run_worker(args, rdv, node)
        finally:
            node.stop()
            archive_ray_logs(rdv, node)
            node.remove_temp_dir()
    except NotRetryableError as error:
        log(f"error (not retryable): {error}")
        scheduler.refuse_retry(os.environ, log)
        return NOT_RETRYABLE_EXIT_CODE
    except RlbuildError as error:
        log(f"error: {error}")
        return 2
