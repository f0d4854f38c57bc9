"""One link of a train chain on Slurm: the gang over srun, the hand-over before the limit, the next link.

`rlbuild train` calls `run_link` when it runs inside a Slurm job (the official plugin's job step runs the train
rule in the batch step, on the allocation's first node). A link:

1. asks Slurm (`scontrol show job`) which link this is (`Restarts`) and when the job ends;
2. starts the gang: `srun` one task per node running `python -m rlbuild.schedulers.gangtask`, rank 0 running the
   trainer;
   the trainer checkpoints and exits CONTINUE_EXIT_CODE at `end - lead` (RLBUILD_STOP_AT) or on Slurm's warning
   signal (`--signal=USR1@lead`), whichever comes first;
3. on that code, requeues the job (`scontrol requeue`): Slurm ends this link and starts the next as the same job
   (SLURM_RESTART_COUNT + 1), which resumes from the checkpoint. Snakemake keeps following the one job id.

A real failure (any other code) ends the chain; so does the last of `max_links` links.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlbuild.contracts.launch import CPU_VARIANT, load_launch
from rlbuild.core.errors import RlbuildError
from rlbuild.core.redact import redact_text
from rlbuild.core.wire import CONTINUE_EXIT_CODE, STOP_AT_ENV
from rlbuild.job.attempt import run_logged
from rlbuild.job.image import apptainer_prefix, python_for

REQUEUE_GRACE_S = 120.0  # Slurm stops the requeued job within KillWait; never outlive that silently


class ChainError(RlbuildError):
    """Slurm did not answer about the running job, or refused to requeue it."""


def log(message: str) -> None:
    print(f"[chain {time.strftime('%H:%M:%S')}] {redact_text(message)}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Job:
    """The running job as the controller sees it (the plugin's job step strips most SLURM_* variables)."""

    id: str
    restarts: int
    end_time: float | None

    @classmethod
    def query(cls, job_id: str) -> Job:
        result = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True)
        if result.returncode != 0:
            raise ChainError(f"`scontrol show job {job_id}` failed: {result.stderr.strip() or result.stdout.strip()}")
        fields = dict(item.split("=", 1) for item in result.stdout.split() if "=" in item)
        end = fields.get("EndTime", "")
        try:
            end_time = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
        except ValueError:  # Unknown / None: no limit
            end_time = None
        return cls(id=job_id, restarts=int(fields.get("Restarts", "0")), end_time=end_time)


def gang_argv(launch_path: str, trainer_argv: Sequence[str], job: Job) -> list[str]:
    """srun: one task per node, all of the node (CPUs, GPUs), each running the gang bootstrap; rank 0 the trainer.

    No --kill-on-bad-exit: srun's exit code is the highest of its tasks', and rank 0's "to be continued" (75) must
    reach the chain, not the SIGTERM code of workers srun would kill; workers leave on their own once rank 0 ends
    (the rendezvous outcome) or their Ray head goes. With an Apptainer image (rlbuild/job/image.py) each task runs
    inside it, the image's Python running this checkout's gang and trainer."""
    document = load_launch(launch_path)
    allocation, image = document.allocation, document.runtime.image
    srun = ["srun", f"--nodes={allocation.num_nodes}", "--ntasks-per-node=1", "--whole"]
    if allocation.gpu_variant.lower() != CPU_VARIANT:
        srun.append(f"--gres=gpu:{allocation.gpus_per_node}")
    python = python_for(image)
    gang = [python, "-m", "rlbuild.schedulers.gangtask", "--nodes", str(allocation.num_nodes)]
    gang += ["--gang-id", f"slurm-{job.id}", "--launch", launch_path]
    return [*srun, *apptainer_prefix(image), *gang, "--", python, "-m", "trainer", *trainer_argv]


def run_link(
    launch_path: str,
    trainer_argv: Sequence[str],
    max_links: int,
    lead_s: int,
    environ: Mapping[str, str],
    attempts_root: str,
) -> int:
    """Run this link's gang (its log kept in storage as an attempt); requeue the job when the trainer hands over
    and links remain. Returns the exit code."""
    job = Job.query(environ["SLURM_JOB_ID"])
    link = job.restarts + 1
    env = {**environ, "SLURM_RESTART_COUNT": str(job.restarts)}  # the gang's attempt (the job step drops it)
    hand_over = f"; hands over at {_clock(job.end_time - lead_s)}" if job.end_time else ""
    if job.end_time:
        env[STOP_AT_ENV] = str(job.end_time - lead_s)
    log(f"link {link} of at most {max_links} of Slurm job {job.id}; limit at {_clock(job.end_time)}{hand_over}")
    code = run_logged(gang_argv(launch_path, trainer_argv, job), attempts_root, env)
    if code != CONTINUE_EXIT_CODE:
        log(f"link {link}: training {'finished' if code == 0 else f'failed (exit {code})'}; the chain ends here")
        return code
    if link >= max_links:
        log(
            f"link {link} of {max_links} ended 'to be continued': no link left, the chain fails. The latest checkpoint "
            "is kept: raise execution.slurm.max_links (or the time limit) and run Snakemake again to resume from it"
        )
        return code
    log(f"link {link} ended 'to be continued'; requeueing job {job.id} for link {link + 1}")
    result = subprocess.run(["scontrol", "requeue", job.id], capture_output=True, text=True)
    if result.returncode != 0:
        raise ChainError(
            f"`scontrol requeue {job.id}` failed: {result.stderr.strip()}; was the job submitted with --requeue?"
        )
    time.sleep(REQUEUE_GRACE_S)  # Slurm stops this link now; still running after the grace means it did not
    raise ChainError(f"job {job.id} was requeued but not stopped within {REQUEUE_GRACE_S:.0f}s")


def _clock(epoch: float | None) -> str:
    return "no limit" if epoch is None else time.strftime("%H:%M:%S", time.localtime(epoch))
