"""What the scheduler says about jobs, without its client library: Iris's Connect-RPC JSON, Slurm's `squeue`.

One call answers for many jobs (`GetJobState` takes a list, as one `squeue -j a,b` does), so the executor plugin
polls every active job in one round trip and `rlbuild status` works from any checkout without the Iris client.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence

from rlbuild.core.errors import RlbuildError

GET_JOB_STATE = "iris.cluster.ControllerService/GetJobState"
TERMINATE_JOB = "iris.cluster.ControllerService/TerminateJob"
RUNNING = frozenset({"pending", "building", "running"})  # an Iris job in one of these has not ended


class SchedulerUnavailableError(RlbuildError):
    """The scheduler did not answer."""


def _post(url: str, method: str, body: dict[str, object], timeout_s: float) -> dict[str, object]:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/{method}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise SchedulerUnavailableError(
            f"the Iris controller at {url} did not answer {method} ({error}); check the controller URL "
            "(SNAKEMAKE_IRIS_CONTROLLER_URL) and that the controller or its tunnel is up"
        ) from error


def iris_states(url: str, job_ids: Sequence[str], timeout_s: float = 10.0) -> dict[str, str]:
    """`{job id: state}` (`running`, `succeeded`, `failed`, `killed`, ...) of every job Iris knows; one call.
    A job Iris does not know is absent."""
    if not job_ids:
        return {}
    found = _post(url, GET_JOB_STATE, {"jobIds": list(job_ids)}, timeout_s).get("states") or {}
    assert isinstance(found, dict)
    return {job: str(state).removeprefix("JOB_STATE_").lower() for job, state in found.items()}


def iris_terminate(url: str, job_id: str, timeout_s: float = 10.0) -> None:
    """Cancel an Iris job and its children (the jobs a coordinator submitted)."""
    _post(url, TERMINATE_JOB, {"jobId": job_id}, timeout_s)


def slurm_state(job_id: str) -> str | None:
    """The state `squeue` (then `sacct`) reports for a Slurm job, lower-case; None where Slurm is not installed
    or does not know the job."""
    for argv in (["squeue", "-h", "-j", job_id, "-o", "%T"], ["sacct", "-n", "-X", "-j", job_id, "-o", "State"]):
        if shutil.which(argv[0]) is None:
            continue
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = result.stdout.split()
        if result.returncode == 0 and lines:
            return lines[0].lower()
    return None
