"""The plan names the rollout backend; `auto` is vLLM on GPUs and never falls back silently; `vllm` is refused at
preflight when the runtime the job will use (this checkout's venv) lacks it, naming the install command."""

from __future__ import annotations

import pytest

from rlbuild.plan.planview import format_plan
from rlbuild.plan.preflight import check_experiment, parse_experiment, vllm_version
from rlbuild.plan.resolve import resolve
from tests.spine.experiments import experiment

NO_VLLM = pytest.mark.skipif(vllm_version() is not None, reason="this runtime has vLLM (scripts/setup.sh --extra gpu)")
HAS_VLLM = pytest.mark.skipif(vllm_version() is None, reason="needs vLLM (scripts/setup.sh --extra gpu on a GPU node)")


def _backend_problems(backend: str, variant: str = "H100") -> list[str]:
    doc = experiment(recipe={"generator": {"backend": backend}}, topology__gpu_variant=variant)
    _, found = check_experiment(parse_experiment(doc, "t"))
    return [f"{v.field}: {v.message}; {v.fix}" for v in found]


@NO_VLLM
@pytest.mark.parametrize("backend", ["auto", "vllm"])
def test_vllm_on_gpus_without_vllm_in_the_runtime_is_refused_with_the_install_command(backend: str) -> None:
    (problem,) = _backend_problems(backend)
    assert problem.startswith("recipe.generator.backend: generator.backend ")
    assert "the runtime the job will use has no vllm: the nodes run this checkout and its .venv" in problem
    assert problem.endswith(
        "install it with `scripts/setup.sh --extra gpu` (Linux x86_64 GPU nodes), or set generator.backend: torch"
    )


@NO_VLLM
def test_vllm_on_cpu_ranks_is_refused_too_and_auto_there_is_torch() -> None:
    assert len(_backend_problems("vllm", variant="cpu")) == 1
    assert _backend_problems("auto", variant="cpu") == []


def test_the_plan_names_the_backend() -> None:
    plan = resolve(parse_experiment(experiment(), "t"), "2026.09.21", "/tmp/r")  # backend: torch on H100s
    assert "  rollout        torch: Hugging Face generate with a KV cache" in format_plan(plan)


@HAS_VLLM
def test_auto_on_gpus_is_vllm_where_the_runtime_has_it() -> None:
    doc = experiment(recipe={"generator": {"backend": "auto"}})
    plan = resolve(parse_experiment(doc, "t"), "2026.09.21", "/tmp/r")
    assert f"  rollout        vLLM {vllm_version()} (the nodes run this checkout's .venv)" in format_plan(plan)
