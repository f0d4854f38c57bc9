"""The project's graph through `snakemake --profile slurm` on a real local Slurm cluster with S3 (moto), in one run:

- The train job is a gang of two nodes (n1, n2: two slurmd on this host, one task each) that bootstraps Ray
  across both and trains; its processes received the allow-listed environment only.
- Its wall-clock limit is shorter than the run: each link of the train job checkpoints before the limit, exits
  "to be continued" and requeues the job; the next link (the whole gang again) resumes from that checkpoint until
  the configured steps are done, and the graph goes on to export and eval. The test prints the measured timeline
  (hand-over, checkpoint, requeue, resume).
- Its runtime is an Apptainer image, a SIF file pinned by its sha256: every gang task runs through `apptainer exec
  --nv` (tests/slurm/standin/apptainer, a recording stand-in on PATH: no apptainer is installable here), each node
  checks the image's declared torch before Ray starts, and the train record names the image and its digest.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import EXPERIMENTS, S3
from tests.iris.conftest import REPO, start_snakemake, wait_for
from tests.slurm.conftest import fast_flags, snakemake_env
from tests.slurm.local_cluster import LocalSlurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
VERSION = "2026.09.21"
# The chain: a gang of two nodes (CPU ranks standing in for one GPU each), a 10-minute limit whose hand-over time
# (limit - lead) falls 1 s after the start, before any trainer can be ready: every link trains exactly one step past
# the hand-over time, checkpoints it and hands over, however fast or loaded the machine is (a link's start-up takes
# ~15 s on an idle 2-core box, over 5 minutes on a loaded one: a 5-minute limit ended a link in CI). Two steps are
# two links; the limit is only ever reached by a link that fails.
CHAIN_STEPS, LIMIT_S, LEAD_S = 2, 600, 599
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+/rule_train/\S+)\)")
LINK = re.compile(r"\[chain (\d\d:\d\d:\d\d)\] link (\d+) of at most \d+ of Slurm job \d+")
REQUEUE = re.compile(r"\[chain (\d\d:\d\d:\d\d)\] link (\d+) ended 'to be continued'; requeueing")
CONTINUED = re.compile(r"\[trainer\] to be continued: (.+); checkpoint of step (\d+) at (\S+)")
RESUMED = re.compile(r"\[trainer\] resumed from \S+ at step (\d+)")
STEP = re.compile(r"\[trainer\] step (\d+)/")
STANDIN = Path(__file__).parent / "standin"  # the recording `apptainer` put first on the jobs' PATH


def experiment_file(folder: Path, name: str, slurm: dict, trainer: dict, **changes: Any) -> Path:
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["name"] = name
    doc["recipe"]["trainer"].update({"eval_interval": -1, "eval_before_train": False, **trainer})
    doc["execution"]["slurm"] = {"account": "rlbuild", "max_links": 6, **slurm}
    # Every node checks that its srun task got the experiment's env (rlbuild/job/gang.py check_runtime).
    doc["execution"]["env"] = {"NCCL_P2P_DISABLE": "1"}
    doc |= changes
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_profile(
    slurm: LocalSlurm, s3: S3, tmp_path: Path, experiment: Path, target: str, path_first: Path | None = None
) -> tuple[Any, Path]:
    """`snakemake --profile slurm <target>` from the repository root, as a user types it; `path_first`: a folder
    put first on PATH (the submitter's, and so the jobs')."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    env = snakemake_env(slurm, tmp_path / "home", {**s3.env, "RLBUILD_BUCKET": s3.bucket, "RLBUILD_PREFIX": "p"})
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
    argv = [target, "--profile", "slurm", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    argv += [*fast_flags(), "--config", f"experiment={experiment}", f"versions=['{VERSION}']"]
    log = tmp_path / "snakemake.log"
    return start_snakemake(argv, REPO, env, log), log


def finish(process: Any, log: Path, timeout: float) -> None:
    try:
        assert process.wait(timeout) == 0, log.read_text()[-6000:]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(60)


def train_job(log: Path) -> tuple[str, str]:
    return wait_for(lambda: (m := SUBMITTED.search(log.read_text())) and m.groups(), 600, "the train job")


def test_a_two_node_gang_bootstraps_ray_and_chains_past_its_wall_clock_limit_to_export_and_eval(
    slurm: LocalSlurm, s3: S3, tmp_path: Path
) -> None:
    name = "slurm-chain"
    limit = time.strftime("%H:%M:%S", time.gmtime(LIMIT_S))
    settings = {"partition": "gpu", "time_limit": limit, "signal_lead_s": LEAD_S}
    experiment = experiment_file(
        tmp_path,
        name,
        settings,
        {"max_steps": CHAIN_STEPS, "ckpt_interval": 1000},
        topology={"num_nodes": 2, "gpus_per_node": 1, "gpu_variant": "H100"},
    )
    doc = yaml.safe_load(experiment.read_text())
    doc["role_plan"].update({"policy_num_nodes": 2, "policy_num_gpus_per_node": 1, "num_inference_engines": 2})
    doc["recipe"]["generator"] = {"backend": "torch"}  # CPU stand-ins for the H100s: no vLLM here
    sif = tmp_path / "images" / "rl.sif"  # the nodes share this host's files: the pinned file is found by path
    sif.parent.mkdir()
    sif.write_bytes(b"a SIF stand-in: the stand-in apptainer runs the command on this host")
    image = f"{sif}@sha256:{hashlib.sha256(sif.read_bytes()).hexdigest()}"
    torch_release = ".".join(version("torch").split(".")[:2])  # what the "image" (the stand-in's .venv) holds
    doc["runtime"] |= {"image": image, "image_provides": {"torch": torch_release}}
    experiment.write_text(yaml.safe_dump(doc, sort_keys=False))
    process, log = run_profile(slurm, s3, tmp_path, experiment, f"eval/v{VERSION}/results.json", STANDIN)
    try:
        job, slurm_log = train_job(log)
        wait_for(lambda: "rank 1/2" in _text(slurm_log, job), 300, "rank 1 of the gang")
        _assert_allow_listed_environment(slurm, job, s3)
        node_list = slurm.show_job(job)  # while it runs: a finished job's record may be gone by the end
    finally:
        finish(process, log, 1100)
    plan = log.read_text()  # the plan Snakemake prints before anything runs shows the Slurm placement
    assert "slurm          account rlbuild, partition gpu, qos -; whole nodes, exclusive" in plan
    assert f"chain          wall-clock limit {limit} per link, checkpoint and hand-over {LEAD_S} s before it" in plan
    assert f"nodes run      Apptainer image {image} (apptainer exec --nv on every node of the train gang" in plan
    prefix = f"p/{name}"
    # Every task of both links (2 x 2) ran inside the image; the train record names the image and its digest.
    runs = Path(f"{sif}.runs").read_text().splitlines()
    assert len(runs) == 2 * CHAIN_STEPS and all(
        f" {sif} python3 -m rlbuild.schedulers.gangtask " in run for run in runs
    ), runs
    record = json.loads(s3.read(f"{prefix}/train/v{VERSION}.identity.json"))
    assert record["fields"]["runtime"]["image"] == image
    assert json.loads(s3.read(f"{prefix}/train/v{VERSION}/terminal.json"))["global_step"] == CHAIN_STEPS
    assert "accuracy" in s3.read(f"{prefix}/eval/v{VERSION}/results.json")
    assert s3.read(f"{prefix}/export/v{VERSION}.identity.json")  # beside the folder (artifacts.record)
    text = _text(slurm_log, job)
    assert re.search(r"NodeList=n\[1-2\]", node_list), node_list
    links = _links(text)
    print(_timeline(links, s3, prefix))
    assert len(links) == CHAIN_STEPS, text[-4000:]
    trained = [step for link in links for step in link["steps"]]
    assert trained == list(range(1, CHAIN_STEPS + 1)), "a step trained twice, or one skipped"
    for before, after in itertools.pairwise(links):
        assert before["continued"] is not None and after["resumed"] == before["continued"][1]
    for link in links:  # every link is the whole gang again: Ray across both nodes, both ranks
        assert "Ray nodes alive: 2/2" in link["text"] and "rank 0/2" in link["text"], link["text"][-3000:]


def _text(slurm_log: str, job: str) -> str:
    path = Path(slurm_log.replace("%j", job))
    return path.read_text(errors="replace") if path.exists() else ""


def _links(text: str) -> list[dict]:
    starts = list(LINK.finditer(text))
    links = []
    for index, start in enumerate(starts):
        body = text[start.start() : starts[index + 1].start() if index + 1 < len(starts) else len(text)]
        continued, requeued, resumed = CONTINUED.search(body), REQUEUE.search(body), RESUMED.search(body)
        links.append(
            {
                "started": start.group(1),
                "text": body,
                "steps": [int(s) for s in STEP.findall(body)],
                "continued": (continued.group(1), int(continued.group(2)), continued.group(3)) if continued else None,
                "requeued": requeued.group(1) if requeued else None,
                "resumed": int(resumed.group(1)) if resumed else None,
            }
        )
    return links


def _timeline(links: list[dict], s3: S3, prefix: str) -> str:
    lines = ["chain timeline:"]
    for number, link in enumerate(links, 1):
        steps = link["steps"]
        lines.append(
            f"  link {number}: started {link['started']}, resumed at step {link['resumed']}, trained steps "
            f"{steps[0] if steps else '-'}..{steps[-1] if steps else '-'}"
        )
        if link["continued"]:
            reason, step, uri = link["continued"]
            key = uri.split(f"{s3.bucket}/", 1)[-1] + "/trainer_state.json"
            written = json.loads(s3.read(key))["created_at"] if _exists(s3, key) else "pruned"
            lines.append(f"    stop: {reason}; checkpoint of step {step} written {written}")
            lines.append(f"    requeued at {link['requeued']}")
    return "\n".join(lines)


def _exists(s3: S3, key: str) -> bool:
    try:
        s3.read(key)
    except Exception:
        return False
    return True


def _assert_allow_listed_environment(slurm: LocalSlurm, job: str, s3: S3) -> None:
    """The job's processes got the allow-list (S3 settings) and none of the submitter's AWS_* (inside the job only
    the S3 storage plugin's own checksum switches are AWS_*); the batch script holds no secret."""
    environs = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"rlbuild.schedulers.gangtask" in (proc / "cmdline").read_bytes():
                environs.append((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
    environs = [e for e in environs if f"SLURM_JOB_ID={job}".encode() in e]
    assert environs, "no gang process of the train job found"
    for environ in environs:
        names = {item.split(b"=", 1)[0].decode() for item in environ if b"=" in item}
        assert not names & {n for n in s3.env if n.startswith("AWS_")}, sorted(names)
        assert "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL" in names
    script = slurm.batch_script(job)
    assert "snakemake" in script and s3.env["SNAKEMAKE_STORAGE_S3_SECRET_KEY"] not in script
