"""The seeds' GPU clusters as they are (issue 43): ARM (GH200) nodes and Apptainer images on Slurm.

- uv.lock's `gpu` extra resolves vLLM and a CUDA torch for linux/aarch64 as for linux/x86_64, read from the lock
  (nothing installed); the nodes' platform is the topology's (GH200 implies aarch64; `node_platform` overrides it),
  never the submitting machine's.
- `runtime.image` on Slurm is a SIF file pinned by its sha256 (hashed on this host, which shares the nodes' files) or
  a docker:// reference pinned by digest; a floating one is refused; what the image holds is declared beside it
  (`runtime.image_provides`), which preflight judges the backend from and each node checks (torch first).
- Seed 004's 30B MoE arm (4 policy nodes + 4 TP2 engines on 6 four-GPU GH200 nodes, a SIF runtime) passes
  `rlbuild check --profile slurm` with its SIF declared and fails with a floating one.

The Slurm job through the image path is tests/slurm/test_pipeline.py's chain (a stand-in `apptainer` on PATH).
"""

from __future__ import annotations

import hashlib
import tomllib
from functools import cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.markers import Marker, default_environment

from rlbuild.cli import main
from rlbuild.contracts.launch import apptainer_target
from rlbuild.core.errors import PreflightError
from rlbuild.job.image import apptainer_prefix, found_version, matches, provides_mismatches, python_for, torch_version
from rlbuild.plan.noderuntime import GPU_EXTRA, locked_version, node_markers
from rlbuild.plan.planview import format_plan
from rlbuild.plan.preflight import check_experiment, parse_experiment
from rlbuild.plan.resolve import resolve
from rlbuild.schedulers.slurm import plan as slurm
from tests.spine.experiments import experiment

REPO = Path(__file__).resolve().parents[2]
DIGEST = "ab" * 32
# Seed 004's Qwen3-Coder-30B-A3B arm (24GPU_qwen3_coder_30b_a3b.yaml: 24 GPUs -> 6 nodes) on JSC Jupiter: policy
# 16 GPUs on 4 nodes, 4 vLLM engines of TP 2 on the other 2, the SIF runtime. rlbuild trains it with fsdp2 (the
# seed's Megatron EP=4 x FSDP=4 sizing has no rlbuild strategy yet) from the built-in task's rows.
SEED_004_30B = """
name: seed004-coder-30b
seed: 42
runtime:
  entrypoint: grpo
  strategy: fsdp2
  image: {image}
  image_provides: {{torch: "2.11", vllm: "0.20.2rc0"}}
model:
  source: hf:Qwen/Qwen3-Coder-30B-A3B-Instruct
  revision: 0123456789abcdef0123456789abcdef01234567
  tokenizer: {{source: hf:Qwen/Qwen3-Coder-30B-A3B-Instruct, revision: 0123456789abcdef0123456789abcdef01234567}}
data:
  train: [{{source: task:addition/train, revision: seed-0}}]
  validation: [{{source: task:addition/validation, revision: seed-0}}]
topology: {{num_nodes: 6, gpus_per_node: 4, gpu_variant: GH200}}
role_plan:
  colocate_all: false
  policy_num_nodes: 4
  policy_num_gpus_per_node: 4
  ref_num_nodes: 0
  num_inference_engines: 4
  inference_engine_tensor_parallel_size: 2
  inference_engine_pipeline_parallel_size: 1
  inference_engine_data_parallel_size: 1
  inference_engine_expert_parallel_size: 1
  train_batch_size: 64
  policy_mini_batch_size: 16
  micro_train_batch_size_per_gpu: 1
  n_samples_per_prompt: 8
retention: {{resume_checkpoint_count: 2, temporary_storage_ttl_days: 14}}
recipe:
  generator: {{backend: auto}}
execution:
  slurm: {{account: jureap59, partition: booster, time_limit: "12:00:00", max_links: 6, signal_lead_s: 600}}
"""


@cache
def _locked_packages() -> dict[str, list[dict[str, Any]]]:
    packages: dict[str, list[dict[str, Any]]] = {}
    for package in tomllib.loads((REPO / "uv.lock").read_text())["package"]:
        packages.setdefault(package["name"], []).append(package)
    return packages


def _closure(extra: str, platform: str) -> dict[str, str]:
    """Every package (name -> version) uv.lock installs for rlbuild with `extra` on Linux `platform`: the lock's
    dependency graph walked with its markers evaluated for that node, as `uv sync --extra` would install it."""
    packages = _locked_packages()
    environment = default_environment() | node_markers(platform) | {"extra": f"extra-7-rlbuild-{extra}"}  # type: ignore[arg-type]
    (project,) = packages["rlbuild"]
    found: dict[str, str] = {}
    wanted = [*project["dependencies"], *project["optional-dependencies"][extra]]
    while wanted:
        dep = wanted.pop()
        if "marker" in dep and not Marker(dep["marker"]).evaluate(environment):
            continue
        candidates = packages[dep["name"]]
        (package,) = [p for p in candidates if p["version"] == dep["version"]] if "version" in dep else candidates
        if found.get(package["name"]) == package["version"] and not dep.get("extra"):
            continue
        found[package["name"]] = package["version"]
        wanted += package.get("dependencies", [])
        for named in dep.get("extra", []):
            wanted += package.get("optional-dependencies", {}).get(named, [])
    return found


@pytest.mark.parametrize("platform", ["x86_64", "aarch64"])
def test_the_gpu_extra_resolves_vllm_and_a_cuda_torch_for_both_linux_platforms(platform: str) -> None:
    installed = _closure(GPU_EXTRA, platform)
    assert installed["vllm"] == locked_version("vllm", GPU_EXTRA, platform=platform) == "0.33.0"  # type: ignore[arg-type]
    assert installed["torch"] == "2.14.0"  # the torch vLLM pins, with its CUDA libraries for this platform
    assert {"nvidia-nccl-cu13", "nvidia-cudnn-cu13", "triton"} <= installed.keys(), sorted(installed)


def test_gh200_nodes_are_aarch64_unless_declared_and_the_plan_judges_the_lock_for_them() -> None:
    parsed = parse_experiment(experiment(topology__gpu_variant="GH200", recipe={"generator": {"backend": "auto"}}), "t")
    assert parsed.topology.platform == "aarch64"
    assert parse_experiment(experiment(topology__gpu_variant="H100"), "t").topology.platform == "x86_64"
    declared = experiment(topology__gpu_variant="GH200", topology__node_platform="x86_64")
    assert parse_experiment(declared, "t").topology.platform == "x86_64"
    with pytest.raises(PreflightError, match=r"topology\.node_platform"):
        parse_experiment(experiment(topology__node_platform="arm64"), "t")
    assert check_experiment(parsed, shares_venv=False)[1] == []  # vLLM locked for linux/aarch64
    plan = resolve(parsed, "2026.09.21", "/tmp/r", shares_venv=False)
    assert "  nodes run      set up from uv.lock with extra gpu for linux/aarch64 " in format_plan(plan)
    # A topology without node_platform keeps the launch identity it had before the field existed.
    assert "node_platform" not in plan.records["launch"]["fields"]["topology"]


def test_an_image_declaration_is_checked_on_the_node_torch_first() -> None:
    found = {"torch": "2.9.0+cu128", "vllm": "0.16.0"}.get
    assert provides_mismatches({"vllm": "0.16.0", "torch": "2.11"}, found) == ["torch 2.11 (found 2.9.0+cu128)"]
    assert provides_mismatches({"vllm": "0.20.2rc0", "torch": "2.9"}, found) == ["vllm 0.20.2rc0 (found 0.16.0)"]
    assert provides_mismatches({"harbor": "0.25"}, found) == ["harbor 0.25 (found none)"]
    assert provides_mismatches(None, found) == []
    assert matches("2.11", "2.11.0+cu128") and matches("0.20.2rc0", "0.20.2rc0") and not matches("2.1", "2.11.0")


def test_the_node_reads_torch_version_as_torch_assigns_it_without_importing_torch(tmp_path: Path) -> None:
    (tmp_path / "version.py").write_text("from typing import Optional\n__version__ = '2.11.0+cu128'\ncuda = '12.8'\n")
    assert torch_version(tmp_path / "version.py") == "2.11.0+cu128"
    assert torch_version(tmp_path / "absent.py") is None
    assert (found_version("torch") or "").split("+")[0] == version("torch").split("+")[0]  # this .venv's own
    assert found_version("no-such-package") is None


def test_an_apptainer_image_wraps_each_gang_task_and_an_iris_image_does_not(tmp_path: Path) -> None:
    sif = f"/scratch/images/skyrl.sif@sha256:{DIGEST}"
    assert apptainer_target(sif) == "/scratch/images/skyrl.sif"
    assert apptainer_target(f"docker://ghcr.io/acme/rl@sha256:{DIGEST}") == f"docker://ghcr.io/acme/rl@sha256:{DIGEST}"
    assert apptainer_target(f"ghcr.io/acme/rl@sha256:{DIGEST}") is None  # Iris's task image
    prefix = apptainer_prefix(sif, tmp_path)
    assert prefix[:3] == ["apptainer", "exec", "--nv"] and prefix[-1] == "/scratch/images/skyrl.sif"
    assert ["--bind", str(REPO)] == prefix[3:5] and ["--pwd", str(tmp_path)] == prefix[7:9]
    assert f"PYTHONPATH={REPO}" in prefix and "--cleanenv" not in prefix  # credentials pass as without an image
    assert python_for(sif) == "python3" and apptainer_prefix(None) == [] and python_for(None).endswith("python")


def _seed_004(tmp_path: Path, image: str) -> Path:
    path = tmp_path / f"seed004-{hashlib.sha256(image.encode()).hexdigest()[:8]}.yaml"
    path.write_text(SEED_004_30B.format(image=image))
    return path


def _check(path: Path, profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check", str(path), "--profile", profile, "--version", "2026.09.21", "--storage-root", str(tmp_path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_seed_004s_30b_arm_checks_under_slurm_with_its_sif_declared_and_not_with_a_floating_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the 30B model's config is not fetched: no network here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # Jupiter's booster partition as sinfo answers there: 4 GH200 per node (seed 004's node-count rule holds).
    monkeypatch.setattr(slurm, "query_partition", lambda name: slurm.Partition(name, [4] * 48))
    sif = tmp_path / "skyrl_megatron_vllm0202rc0_r3.sif"
    sif.write_bytes(b"SIF stand-in: Apptainer is given the file; rlbuild pins its bytes")
    digest = hashlib.sha256(sif.read_bytes()).hexdigest()
    pinned = _seed_004(tmp_path, f"{sif}@sha256:{digest}")

    code, out, err = _check(pinned, "slurm", tmp_path, capsys)
    assert code == 0, err
    assert f"  nodes run      Apptainer image {sif}@sha256:{digest} (apptainer exec --nv on every node" in out
    assert "  rollout        vLLM 0.20.2rc0 declared by the image (each node checks" in out
    assert "6 nodes x 4 GH200 = 24 GPUs" in out

    code, _, err = _check(_seed_004(tmp_path, str(sif)), "slurm", tmp_path, capsys)
    assert code == 2 and "runtime.image: " in err and f"'{sif}' is not pinned by digest" in err
    assert f"Pin it as {sif}@sha256:<64 hex digits>" in err

    sif.write_bytes(b"rebuilt under the same name")
    code, _, err = _check(pinned, "slurm", tmp_path, capsys)
    assert code == 2 and f"{sif} has sha256 {hashlib.sha256(sif.read_bytes()).hexdigest()}, not the {digest}" in err
    sif.unlink()
    code, _, err = _check(pinned, "slurm", tmp_path, capsys)
    assert code == 2 and f"runtime.image: {sif} does not exist on this host" in err, err

    code, _, err = _check(_seed_004(tmp_path, f"docker://ghcr.io/acme/skyrl@sha256:{DIGEST}"), "iris", tmp_path, capsys)
    assert (
        code == 2
        and "Apptainer images (a SIF file, a docker:// reference) run where the jobs share this checkout" in err
    )


def test_an_image_declared_without_vllm_is_refused_where_the_plan_needs_vllm() -> None:
    doc = yaml.safe_load(SEED_004_30B.format(image=f"docker://ghcr.io/acme/skyrl@sha256:{DIGEST}"))
    doc["runtime"]["image_provides"] = {"torch": "2.11"}
    (problem,) = check_experiment(parse_experiment(doc, "t"), shares_venv=True)[1]
    assert problem.field == "recipe.generator.backend"
    assert "runtime.image_provides declares torch 2.11 for docker://ghcr.io/acme/skyrl@sha256:" in problem.message
    del doc["runtime"]["image_provides"]  # nothing declared: each node checks its own vLLM before Ray starts
    assert check_experiment(parse_experiment(doc, "t"), shares_venv=True)[1] == []
