"""The Iris controller's Connect-RPC JSON, without the client library (which costs about two seconds to import):
`GetJobState` answers for many jobs in one call (the plugin polls every active job in one round trip), and
`TerminateJob`; what Iris's job state words mean to rlbuild."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping

from rlbuild.schedulers.base import Phase, SchedulerUnavailableError

GET_JOB_STATE = "iris.cluster.ControllerService/GetJobState"
TERMINATE_JOB = "iris.cluster.ControllerService/TerminateJob"
RPC_TIMEOUT_S = 10.0
# Iris's job states (`iris.client.JobState`, the wire names GetJobState answers), lower-case.
PHASES = {
    "pending": Phase.PENDING,
    "building": Phase.PENDING,  # placed on a worker, its environment being built
    "running": Phase.RUNNING,
    "succeeded": Phase.SUCCEEDED,
    "failed": Phase.FAILED,
    "killed": Phase.FAILED,
    "worker_failed": Phase.FAILED,
    "unschedulable": Phase.FAILED,
}
NO_CONTROLLER = "no Iris controller given (--iris-controller-url)"
UNKNOWN_JOB = "Iris does not know this job"


def phase(word: str) -> Phase:
    """SUCCEEDED only for `succeeded`; every other terminal state is FAILED; a word a later Iris adds (or the
    proto's `unspecified`) is UNKNOWN."""
    return PHASES.get(word.lower(), Phase.UNKNOWN)


def state_words(answer: Mapping[str, object]) -> dict[str, str]:
    """`{job id: state}` from GetJobState's JSON answer (`{"states": {job: "JOB_STATE_RUNNING"}}`), lower-case."""
    found = answer.get("states") or {}
    if not isinstance(found, dict):
        raise SchedulerUnavailableError(f"the Iris controller answered {GET_JOB_STATE} with {answer!r}")
    return {job: str(state).removeprefix("JOB_STATE_").lower() for job, state in found.items()}


def post(url: str, method: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/{method}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=RPC_TIMEOUT_S) as response:
            return json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise SchedulerUnavailableError(
            f"the Iris controller at {url} did not answer {method} ({error}); check the controller URL "
            "(SNAKEMAKE_IRIS_CONTROLLER_URL) and that the controller or its tunnel is up"
        ) from error
