"""The plan names the rollout backend and the runtime the nodes run; `auto` is vLLM on GPUs and never falls back
silently; vLLM is refused at preflight where the nodes' runtime lacks it: this checkout's .venv where the jobs share
it (the local executor, Slurm), else the declared runtime (uv.lock's gpu extra for the nodes' platform, or a
pinned image), never the packages of the machine that plans (rlbuild/plan/noderuntime.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlbuild.core.errors import PreflightError, RuntimeDriftError
from rlbuild.plan.identity import check_training_runtime
from rlbuild.plan.noderuntime import installed_version, locked_version
from rlbuild.plan.planview import format_plan, plan_dict
from rlbuild.plan.preflight import check_experiment, parse_experiment
from rlbuild.plan.resolve import resolve
from tests.spine.experiments import experiment

REPO = Path(__file__).resolve().parents[2]
NO_VLLM = pytest.mark.skipif(
    installed_version("vllm") is not None, reason="this runtime has vLLM (scripts/setup.sh --extra gpu)"
)
HAS_VLLM = pytest.mark.skipif(
    installed_version("vllm") is None, reason="needs vLLM (scripts/setup.sh --extra gpu on a GPU node)"
)
IMAGE = "ghcr.io/acme/rl@sha256:" + "ab" * 32


def _backend_problems(backend: str, variant: str = "H100", *, shares_venv: bool = True, **changes: object) -> list[str]:
    doc = experiment(recipe={"generator": {"backend": backend}}, topology__gpu_variant=variant, **changes)
    _, found = check_experiment(parse_experiment(doc, "t"), shares_venv=shares_venv)
    return [f"{v.field}: {v.message}; {v.fix}" for v in found]


@NO_VLLM
@pytest.mark.parametrize("backend", ["auto", "vllm"])
def test_vllm_on_gpus_without_vllm_in_a_shared_venv_is_refused_with_the_install_command(backend: str) -> None:
    (problem,) = _backend_problems(backend)
    assert problem.startswith("recipe.generator.backend: generator.backend ")
    assert "the runtime the job will use has no vllm: the nodes run this checkout and its .venv" in problem
    assert problem.endswith(
        "install it with `scripts/setup.sh --extra gpu` (Linux GPU nodes, x86_64 or aarch64), or set "
        "generator.backend: torch (this judged the local executor's .venv: where the jobs run on a cluster, "
        "`rlbuild check --profile iris|slurm` judges the nodes' runtime)"
    )


@NO_VLLM
def test_vllm_on_cpu_ranks_is_refused_too_and_auto_there_is_torch() -> None:
    assert len(_backend_problems("vllm", variant="cpu")) == 1
    assert _backend_problems("auto", variant="cpu") == []


def test_the_seed_64_gpu_example_checks_on_a_machine_without_vllm_when_the_nodes_set_up_from_the_lock() -> None:
    assert locked_version("vllm", "gpu") is not None  # uv.lock resolves vLLM for Linux x86_64 in the gpu extra
    assert _backend_problems("auto", shares_venv=False) == []
    assert _backend_problems("vllm", shares_venv=False, runtime__image=IMAGE) == []  # each node checks its image
    (problem,) = _backend_problems("vllm", variant="cpu", shares_venv=False)
    assert "the nodes set up from uv.lock, which installs none on linux/x86_64 (a CPU topology" in problem


def test_a_lock_without_vllm_for_the_nodes_platform_is_refused(tmp_path: Path) -> None:
    lock = (REPO / "uv.lock").read_text()
    darwin_only = lock.replace(
        '{ name = "vllm", marker = "sys_platform == \'linux\'" }',
        '{ name = "vllm", marker = "sys_platform == \'darwin\'" }',
    )
    assert darwin_only != lock, "uv.lock's gpu extra no longer names vllm as this test expects"
    (tmp_path / "uv.lock").write_text(darwin_only)
    assert locked_version("vllm", "gpu", tmp_path / "uv.lock") is None
    assert locked_version("vllm", "no-such-extra") is None


FLOATING = [
    ("ghcr.io/acme/rl:latest", "ghcr.io/acme/rl"),
    ("ghcr.io/acme/rl:gpu-rl", "ghcr.io/acme/rl"),
    ("ghcr.io/acme/rl", "ghcr.io/acme/rl"),
    ("localhost:5000/rl:v1", "localhost:5000/rl"),
    ("rl@sha256:12", "rl"),
]


@pytest.mark.parametrize(("image", "base"), FLOATING)
def test_a_floating_or_malformed_image_is_refused_naming_the_digest_form(image: str, base: str) -> None:
    with pytest.raises(PreflightError) as caught:
        parse_experiment(experiment(runtime__image=image), "t")
    (violation,) = caught.value.violations
    assert violation.field == "runtime.image"
    assert "is not pinned by digest" in violation.message
    assert f"Pin it as {base}@sha256:<64 hex digits>" in violation.message


def test_the_plan_names_the_backend_and_what_the_nodes_run() -> None:
    plan = resolve(parse_experiment(experiment(), "t"), "2026.09.21", "/tmp/r")  # backend: torch on H100s
    text = format_plan(plan)
    assert "  rollout        torch: Hugging Face generate with a KV cache" in text
    assert "  nodes run      this checkout's .venv (shared with the jobs)" in text
    doc = experiment(recipe={"generator": {"backend": "auto"}})
    locked = resolve(parse_experiment(doc, "t"), "2026.09.21", "/tmp/r", shares_venv=False)
    text = format_plan(locked)
    assert "  nodes run      set up from uv.lock with extra gpu for linux/x86_64 (Snakemake shares no software " in text
    assert f"  rollout        vLLM {locked_version('vllm', 'gpu')} (locked for the nodes, uv.lock)" in text
    pinned = resolve(parse_experiment(experiment(runtime__image=IMAGE), "t"), "2026.09.21", "/tmp/r", shares_venv=False)
    assert f"  nodes run      image {IMAGE}" in format_plan(pinned)
    assert plan_dict(pinned)["nodes"]["image"] == IMAGE and pinned.launch.runtime.image == IMAGE


def test_the_plan_says_which_loop_trains() -> None:
    text = format_plan(resolve(parse_experiment(experiment(), "t"), "2026.09.21", "/tmp/r"))
    assert "  loop           synchronous (grpo): each step samples with the weights of the step before" in text
    tis = {
        "trainer": {"algorithm": {"use_tis": True, "tis_imp_ratio_cap": 2.0}, "fully_async": {"max_staleness_steps": 2}}
    }
    doc = experiment(runtime__entrypoint="fully_async", role_plan__train_batch_size=16, recipe=tis)
    text = format_plan(resolve(parse_experiment(doc, "t"), "2026.09.21", "/tmp/r"))
    assert (
        "  loop           asynchronous (fully_async): generation overlaps training; a sample trains at most 2 " in text
    )
    assert "corrected by TIS (cap 2)" in text


def test_an_image_is_provenance_that_a_training_under_way_refuses_to_change() -> None:
    plan = resolve(parse_experiment(experiment(), "t"), "2026.09.21", "/tmp/r")
    pinned = resolve(parse_experiment(experiment(runtime__image=IMAGE), "t"), "2026.09.21", "/tmp/r")
    assert "image" not in plan.records["launch"]["fields"]["runtime"]  # identities of versions built before stay
    assert pinned.records["launch"]["fields"]["runtime"]["image"] == IMAGE
    digest = plan.launch.runtime.source_digest
    check_training_runtime("2026.09.21", digest, pinned.records["launch"], None, IMAGE)
    with pytest.raises(RuntimeDriftError, match=r"resolved for the node image .*, but runtime.image now is \(none"):
        check_training_runtime("2026.09.21", digest, pinned.records["launch"], None, None)


def test_rlbuild_check_judges_the_nodes_as_the_profile_runs_them(tmp_path: Path) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(yaml.safe_dump(experiment(recipe={"generator": {"backend": "auto"}})))
    argv = [sys.executable, "-m", "rlbuild", "check", str(path), "--version", "2026.09.21"]
    argv += ["--storage-root", str(tmp_path / "store")]
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    iris = subprocess.run([*argv, "--profile", "iris"], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert iris.returncode == 0, iris.stderr
    assert "  nodes run      set up from uv.lock with extra gpu" in iris.stdout
    if installed_version("vllm") is None:
        local = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
        assert local.returncode == 2 and "the nodes run this checkout and its .venv" in local.stderr
        assert "`rlbuild check --profile iris|slurm` judges the nodes' runtime" in local.stderr  # the other place
    unknown = subprocess.run(
        [*argv, "--profile", "irsi"], cwd=REPO, capture_output=True, text=True, env=env, timeout=120
    )
    assert (
        unknown.returncode == 2
        and "'irsi': there is no" in unknown.stderr
        and "use one of default, iris, slurm" in unknown.stderr
    )


@HAS_VLLM
def test_auto_on_gpus_is_vllm_where_the_runtime_has_it() -> None:
    doc = experiment(recipe={"generator": {"backend": "auto"}})
    plan = resolve(parse_experiment(doc, "t"), "2026.09.21", "/tmp/r")
    installed = installed_version("vllm")
    assert f"  rollout        vLLM {installed} (the nodes run this checkout's .venv)" in format_plan(plan)
