"""The pure parts: names, placements, the environment hand-off, state mapping, task identity, rendezvous."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from iris.client import JobState

from rlbuild.contracts import runtime
from rlbuild.core.wire import NOT_RETRYABLE_EXIT_CODE
from rlbuild.dev.launches import SPLITS, write_test_launch
from rlbuild.job.gang import RuntimeMismatchError, check_runtime
from rlbuild.job.rendezvous import GangTaskError, Rendezvous, RendezvousError, TaskIdentity
from rlbuild.schedulers.base import Phase
from rlbuild.schedulers.iris.localcluster import REPO
from rlbuild.schedulers.iris.rpc import phase
from rlbuild.schedulers.iris.scheduler import IrisScheduler
from snakemake_executor_plugin_iris import ExecutorSettings
from snakemake_executor_plugin_iris.errors import IrisSettingError
from snakemake_executor_plugin_iris.names import MAX_NAME, job_name, sanitise
from snakemake_executor_plugin_iris.requests import Defaults, gang_command, placement, task_env
from tests.spine.test_sandbox_preflight import NO_HARBOR

DEFAULTS = Defaults(cpu=48, memory="512GB", disk="500GB", priority="interactive", max_retries=1, coschedule="leafgroup")
GANG = {"gpu_nodes": 2, "gpus_per_node": 8, "gpu_variant": "H100"}


def test_job_name_is_sanitised_deterministic_and_says_rule_version_attempt() -> None:
    name = job_name("train", {"version": "2026.09.21"}, 2, ["s3://b/p/train/v2026.09.21/terminal.json"])
    assert name.startswith("train-2026.09.21-a2-")
    assert name == job_name("train", {"version": "2026.09.21"}, 2, ["s3://b/p/train/v2026.09.21/terminal.json"])
    assert name != job_name("train", {"version": "2026.09.21"}, 2, ["s3://b/other/train/v2026.09.21/terminal.json"])
    long = job_name("Rule/With Spaces", {"v": "x" * 200}, 1, ["o"])
    assert len(long) <= MAX_NAME and "/" not in long and " " not in long
    assert sanitise("A/b c__d") == "a-b-c__d"


def test_gang_placement_is_whole_nodes_with_rule_overrides() -> None:
    place = placement({**GANG, "iris_memory": "256GB", "iris_priority": "production"}, 1, DEFAULTS)
    assert (place.replicas, place.gpu_variant, place.gpus_per_node) == (2, "H100", 8)
    assert (place.cpu, place.memory, place.disk) == (48, "256GB", "500GB")
    assert (place.priority, place.max_retries, place.coschedule, place.is_gang) == ("production", 1, "leafgroup", True)
    single = placement({**GANG, "gpu_nodes": 1}, 1, DEFAULTS)
    assert single.coschedule is None and single.is_gang
    cpu_gang = placement({**GANG, "gpu_variant": "cpu"}, 1, DEFAULTS)
    assert cpu_gang.gpu_variant is None and cpu_gang.replicas == 2 and cpu_gang.is_gang
    # The embedded default's train job: one CPU node is still a gang (the bootstrap starts its Ray).
    one_cpu_node = placement({"gpu_nodes": 1, "gpus_per_node": 1, "gpu_variant": "cpu"}, 1, DEFAULTS)
    assert one_cpu_node.is_gang and one_cpu_node.replicas == 1 and one_cpu_node.coschedule is None


def test_cpu_placement_uses_threads_and_snakemake_memory() -> None:
    place = placement({"mem_mb": 2000, "disk_mb": 5000}, 3, DEFAULTS)
    assert (place.replicas, place.cpu, place.memory, place.disk, place.is_gang) == (1, 3, "2000MB", "5000MB", False)


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({**GANG, "gpu_nodes": 0}, "gpu_nodes"),
        ({"gpu_nodes": 2, "gpus_per_node": 8}, "gpu_variant"),
        ({**GANG, "iris_priority": "urgent"}, "iris_priority"),
        ({**GANG, "iris_memory": "lots"}, "iris_memory"),
        ({**GANG, "iris_max_retries": -1}, "iris_max_retries"),
    ],
)
def test_bad_resources_name_the_field(resources: dict[str, object], field: str) -> None:
    with pytest.raises(IrisSettingError, match=field):
        placement(resources, 1, DEFAULTS)


def test_env_hand_off_is_an_allow_list_without_cloud_credentials() -> None:
    environ = {
        "HF_TOKEN": "hf_abcdefgh",
        "WANDB_API_KEY": "w" * 40,
        "AWS_SECRET_ACCESS_KEY": "nope",
        "R2_TOKEN": "nope",
        "HOME": "/root",
        "RLBUILD_BUCKET": "b",
        "MY_FLAG": "1",
    }
    declared = {"SNAKEMAKE_STORAGE_S3_SECRET_KEY": "s3secret"}
    env = task_env(environ, declared, ["MY_FLAG"])
    assert env == {
        "HF_TOKEN": "hf_abcdefgh",
        "WANDB_API_KEY": "w" * 40,
        "RLBUILD_BUCKET": "b",
        "MY_FLAG": "1",
        "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "s3secret",
    }
    with pytest.raises(IrisSettingError, match="AWS_ACCESS_KEY_ID"):
        task_env(environ, declared, ["AWS_ACCESS_KEY_ID"])


def test_gang_command_runs_the_step_on_rank_zero_only_through_the_bootstrap() -> None:
    command = gang_command("/venv/bin/python", 2, "g1", "python -m snakemake --x 'a b'", "s3://b/launch.yaml", None, 60)
    assert command.startswith(
        "/venv/bin/python -m rlbuild.schedulers.gangtask --nodes 2 --gang-id g1 --join-timeout 60"
    )
    assert "--launch s3://b/launch.yaml" in command
    assert command.endswith("-- bash -c 'python -m snakemake --x '\"'\"'a b'\"'\"''")


def test_every_terminal_state_but_success_is_a_failure() -> None:
    """Every state the Iris library names is mapped; the library's own terminal set agrees with ours."""
    from iris.resources.state import is_job_finished

    assert phase(JobState.SUCCEEDED.value) is Phase.SUCCEEDED
    for state in (JobState.FAILED, JobState.KILLED, JobState.WORKER_FAILED, JobState.UNSCHEDULABLE):
        assert phase(state.value) is Phase.FAILED
    assert phase(JobState.PENDING.value) is phase(JobState.BUILDING.value) is Phase.PENDING
    assert phase(JobState.RUNNING.value) is Phase.RUNNING
    assert phase(JobState.UNSPECIFIED.value) is Phase.UNKNOWN
    assert {s for s in JobState if is_job_finished(s)} == {s for s in JobState if phase(s.value).ended}


def test_task_identity_comes_from_iris_task_id() -> None:
    iris = IrisScheduler()
    assert iris.task({"IRIS_TASK_ID": "/root/train-x-a1-abc/3:2"}) == TaskIdentity("/root/train-x-a1-abc", 3, 2, "iris")
    assert iris.task({"IRIS_TASK_ID": "/root/job/0"}) == TaskIdentity("/root/job", 0, 0, "iris")
    with pytest.raises(GangTaskError, match="IRIS_TASK_ID"):
        iris.task({"IRIS_TASK_ID": "7"})


def test_rendezvous_clears_stale_attempts_and_reports_outcomes(tmp_path: Path) -> None:
    old = Rendezvous(str(tmp_path), "/root/job", "gang1", 0, poll_s=0.01)
    old.publish_head("10.0.0.1:1")
    earlier = Rendezvous(str(tmp_path), "/root/job", "gang0", 0)
    earlier.mark_done()
    rdv = Rendezvous(str(tmp_path), "/root/job", "gang1", 1, poll_s=0.01)
    rdv.mark_alive(1)
    removed = rdv.clear_stale()
    assert sorted(Path(p).name for p in removed) == ["attempt-0", "gang0"]
    assert rdv.alive_ranks() == {1}
    with pytest.raises(RendezvousError, match="rank 0 to publish"):
        rdv.wait_head(0.05)
    rdv.publish_head("10.0.0.2:6379", rank=0)
    assert rdv.wait_head(1)["address"] == "10.0.0.2:6379"
    assert rdv.wait_outcome(lambda: False) == (
        False,
        "this node's Ray process exited before rank 0 finished (the head is gone?)",
    )
    rdv.mark_failed("rank 0's job step exited with code 3")
    assert rdv.wait_outcome(lambda: True) == (False, "rank 0's job step exited with code 3")
    rdv.mark_done()
    assert rdv.outcome() == (True, "")


def test_a_waiting_worker_reads_the_outcome_ever_less_often_and_ends_well_when_success_ends_its_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rdv = Rendezvous(str(tmp_path), "/root/job", "gang1", 0, poll_s=0.01)
    read = rdv.outcome
    reads: list[float] = []
    monkeypatch.setattr(rdv, "outcome", lambda: reads.append(time.monotonic()) or read())
    polls = iter(range(300))  # ~3 s of 0.01 s polls of this node
    assert rdv.wait_outcome(lambda: next(polls, None) is not None)[0] is False
    assert len(reads) <= 12, len(reads)  # 0.01 s between reads, doubling to 5 s: not one read a poll
    assert max(b - a for a, b in itertools.pairwise(reads)) > 0.5
    # Rank 0 finished, and its head's end took this node down: a success, not "the head is gone".
    assert rdv.wait_outcome(lambda: rdv.mark_done() or False) == (True, "")


def test_an_unreachable_controller_fails_at_start_with_a_fix(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text("rule a:\n    output: 'x'\n    shell: 'touch {output}'\n")
    argv = ["--executor", "iris", "--iris-controller-url", "http://127.0.0.1:9", "--jobs", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "Iris controller at http://127.0.0.1:9 is unreachable" in result.stderr
    assert "check --iris-controller-url" in result.stderr


@pytest.mark.slow  # starts a real gang node process (~30 s)
def test_a_node_whose_code_is_not_the_planned_code_fails_before_starting_ray(tmp_path: Path) -> None:
    launch = write_test_launch(tmp_path)
    check_runtime(str(launch), os.environ)  # planned from this checkout: the node's code is the plan's
    planned = "feed" * 16
    text = launch.read_text()
    assert runtime.source_digest() in text
    launch.write_text(text.replace(runtime.source_digest(), planned))
    env = {"IRIS_TASK_ID": "/root/train-x-a1-abc/0:0", "PATH": "/usr/bin:/bin"}
    argv = ["--nodes", "1", "--gang-id", "g", "--launch", str(launch), "--rendezvous-root", str(tmp_path / "rdv")]
    result = subprocess.run(
        [sys.executable, "-m", "rlbuild.schedulers.gangtask", *argv, "--", "true"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == NOT_RETRYABLE_EXIT_CODE  # Iris must not retry it (test_gang: the job is cancelled)
    assert f"this node runs runtime source digest {runtime.source_digest()}" in result.stderr
    assert f"was planned for {planned}" in result.stderr and "Run the job from the checkout" in result.stderr
    assert not (tmp_path / "rdv").exists(), "nothing may start (no Ray head, no rendezvous) on a mismatched node"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this runtime has vLLM")
def test_a_node_without_the_vllm_its_launch_needs_fails_before_starting_ray(tmp_path: Path) -> None:
    launch = write_test_launch(tmp_path)  # CPU ranks, backend auto: torch, nothing to check
    check_runtime(str(launch), os.environ)
    launch.write_text(launch.read_text().replace("    backend: auto", "    backend: vllm"))
    with pytest.raises(RuntimeMismatchError, match=r"backend 'vllm' on cpu needs vLLM, and this node has none"):
        check_runtime(str(launch), os.environ)


def test_a_node_without_the_harbor_its_sandbox_needs_fails_before_starting_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = write_test_launch(tmp_path)
    text = launch.read_text()
    assert "\n    sandbox: null\n" in text
    launch.write_text(text.replace("\n    sandbox: null\n", "\n    sandbox:\n      backend: daytona\n"))
    if importlib.util.find_spec("harbor") is not None:  # the harbor extra (make setup) is installed here
        check_runtime(str(launch), os.environ)
    # A node without harbor: no finder on the import path finds it (the list is put back after the test).
    monkeypatch.delitem(sys.modules, "harbor", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    exec(NO_HARBOR, {})
    with pytest.raises(RuntimeMismatchError, match=r"backend 'daytona' starts its sandboxes through Harbor, and this"):
        check_runtime(str(launch), os.environ)


def test_the_launch_names_the_providers_credential_and_a_node_without_it_fails_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "dtn-" + os.urandom(8).hex()
    monkeypatch.setenv("DAYTONA_API_KEY", secret)
    harbor = {split: [{"source": f"harbor:config/harbor/find-key/{split}", "revision": "v1"}] for split in SPLITS}
    environment = {"env_class": "harbor", "sandbox": {"backend": "daytona", "max_concurrent": 1}}
    launch = write_test_launch(tmp_path, data=harbor, recipe={"environment": environment})
    text = launch.read_text()
    assert "credentials:\n- DAYTONA_API_KEY\n" in text and secret not in text
    check_runtime(str(launch), {"DAYTONA_API_KEY": secret})
    with pytest.raises(RuntimeMismatchError, match=r"this node lacks DAYTONA_API_KEY, which .* \(daytona\)"):
        check_runtime(str(launch), {})


def test_a_node_without_the_experiments_env_fails_naming_the_variable(tmp_path: Path) -> None:
    launch = write_test_launch(tmp_path, execution={"env": {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "WARN"}})
    check_runtime(str(launch), {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "WARN"})
    with pytest.raises(RuntimeMismatchError) as caught:
        check_runtime(str(launch), {"NCCL_P2P_DISABLE": "0"})
    message = str(caught.value)
    assert "NCCL_P2P_DISABLE='0'" in message and "NCCL_DEBUG unset" in message
    assert "asks for NCCL_DEBUG='WARN', NCCL_P2P_DISABLE='1'" in message


def test_executor_settings_are_checked_at_start_with_every_problem_named() -> None:
    ExecutorSettings(controller_url="http://127.0.0.1:1", rules="train,export", env="MY_VAR")  # valid: no error
    with pytest.raises(IrisSettingError) as raised:
        ExecutorSettings(
            controller_url="http://127.0.0.1:1",
            node_memory="lots",
            max_retries=-1,
            rules="train;eval",
            env="AWS_SECRET_ACCESS_KEY,OK_NAME,1BAD",
            on_interrupt="ignore",
        )
    text = str(raised.value)
    for named in ("--iris-node-memory='lots'", "--iris-max-retries=-1", "--iris-rules='train;eval'"):
        assert named in text
    assert "AWS_SECRET_ACCESS_KEY" in text and "1BAD" in text and "OK_NAME" not in text.split("--iris-env")[1]
    assert "--iris-on-interrupt='ignore': choose one of keep, cancel" in text


def test_a_placeholder_s3_endpoint_is_refused_with_the_settings_before_the_s3_plugin_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL", "...")
    with pytest.raises(IrisSettingError) as raised:
        ExecutorSettings(controller_url="http://127.0.0.1:1")
    assert "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL='...'" in str(raised.value)
    assert "http(s)://host[:port]" in str(raised.value)
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    ExecutorSettings(controller_url="http://127.0.0.1:1")


def test_submit_puts_the_experiment_into_the_one_config_snakemake_keeps() -> None:
    from rlbuild.cli import with_config

    assert with_config(["--cores", "2"], "experiment=x") == ["--cores", "2", "--config", "experiment=x"]
    merged = with_config(["--config", "a=1", "--jobs", "2", "--config", "versions=['v']"], "experiment=x")
    assert merged == ["--config", "a=1", "--jobs", "2", "--config", "experiment=x", "versions=['v']"]


def test_an_experiment_the_bundle_would_not_carry_is_refused_naming_why(tmp_path: Path) -> None:
    from rlbuild.core.errors import PreflightError
    from rlbuild.workflow import in_checkout

    assert in_checkout(REPO, REPO / "config" / "experiments" / "tiny-addition.yaml") == (
        "config/experiments/tiny-addition.yaml"
    )
    for path, why in ((tmp_path / "x.yaml", "is outside the checkout"), (REPO / "results" / "x.yaml", "git-ignored")):
        with pytest.raises(PreflightError, match=why):
            in_checkout(REPO, path)
