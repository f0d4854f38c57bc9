"""Sandboxes as preflight sees them, all at once with the experiment's other problems: credentials named (never
their values), sandboxes at once as K per engine within the provider's cap, an episode's turns against the model's
positions, Harbor in the runtime the nodes will run, Harbor tasks the local backend cannot build, and the plan's
sandbox line."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlbuild.cli import main
from rlbuild.contracts.rows import LocalImage, local_image
from rlbuild.core.errors import Violation
from rlbuild.plan.environments import check_concurrency, check_harbor_runtime
from rlbuild.plan.noderuntime import NodeRuntime, locked_version, node_runtime
from rlbuild.plan.planview import format_plan
from rlbuild.plan.preflight import check_experiment, compose_recipe, parse_experiment
from rlbuild.plan.resolve import resolve
from rlbuild.workflow import Graph
from tests.conftest import EXPERIMENTS, REPO
from tests.spine.experiments import experiment
from tests.spine.test_job_sizes import _seen_by

AGENT: dict[str, Any] = yaml.safe_load((EXPERIMENTS / "tiny-agent.yaml").read_text())
CONCURRENT = "recipe.environment.sandbox.max_concurrent"
# Python started with this folder on PYTHONPATH cannot find harbor: its sitecustomize wraps every meta-path finder
# so that none finds `harbor` (find_spec answers None, `import harbor` raises), as on a laptop without the extra.
NO_HARBOR = """import sys


class _NoHarbor:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name == "harbor" or name.startswith("harbor."):
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attribute):
        return getattr(self.inner, attribute)


sys.meta_path[:] = [_NoHarbor(finder) if hasattr(finder, "find_spec") else finder for finder in sys.meta_path]
"""


def _agent(sandbox: dict[str, Any] | None, **environment: Any) -> dict[str, Any]:
    """The tiny agent experiment (one engine, 128 positions) with this sandbox and environment keys."""
    doc = copy.deepcopy(AGENT)
    doc["recipe"]["environment"] |= {"sandbox": sandbox, **environment}
    return doc


def _tasks(root: Path, *dockerfiles: str) -> Path:
    """Harbor task folders `task0`, `task1`, ... under `root`, each with the given Dockerfile."""
    for i, dockerfile in enumerate(dockerfiles):
        task = root / f"task{i}"
        (task / "tests").mkdir(parents=True)
        (task / "environment").mkdir()
        (task / "instruction.md").write_text("Print the key.\n")
        (task / "task.toml").write_text("[verifier]\ntimeout_sec = 10.0\n")
        (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    return root


def _concurrency(max_concurrent: int | None, caps: dict[str, int] | None = None) -> list[Violation]:
    """The 64-GPU seed (4 engines, 64 prompts x 8 samples a step) on daytona."""
    sandbox = {"backend": "daytona", "max_concurrent": max_concurrent}
    doc = experiment(recipe={"environment": {"max_turns": 4, "sandbox": sandbox}}, execution__sandbox_caps=caps or {})
    parsed = parse_experiment(doc, "t")
    recipe, _ = compose_recipe(parsed)
    assert recipe is not None
    return check_concurrency(parsed, recipe)


def test_sandboxes_at_once_are_k_per_engine_within_the_declared_cap() -> None:
    assert _concurrency(8) == [] and _concurrency(None) == []  # no cap declared: any multiple, or every episode
    assert _concurrency(8, {"daytona": 8}) == [] and _concurrency(None, {"daytona": 512}) == []
    assert _concurrency(None, {"modal": 2}) == []  # another backend's cap
    (odd,) = _concurrency(10)
    assert odd == Violation(
        CONCURRENT,
        "10 is not a multiple of role_plan.num_inference_engines=4: each engine drives K sandboxes (K x engines, "
        "seed 003's n_concurrent_trials)",
        "use 8 or 12",
    )
    assert _concurrency(6, {"daytona": 11})[0].fix == "use 4 or 8"
    (over,) = _concurrency(10, {"daytona": 6})
    assert over.message == "10 daytona sandboxes at once, more than execution.sandbox_caps.daytona=6"
    assert over.fix == f"set {CONCURRENT}: 4 (1 per engine x 4 engine(s))"
    (unbounded,) = _concurrency(None, {"daytona": 100})
    assert unbounded.message == (
        "null holds every episode of a step at once: train_batch_size 64 x n_samples_per_prompt 8 = 512 daytona "
        "sandboxes, more than execution.sandbox_caps.daytona=100"
    )
    assert unbounded.fix == f"set {CONCURRENT}: 100 (25 per engine x 4 engine(s))"
    (tiny_cap,) = _concurrency(None, {"daytona": 3})
    assert tiny_cap.fix.startswith("the cap holds fewer sandboxes than there are engines (4): raise execution.")


def test_a_backends_credentials_are_named_when_unset_and_never_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-value-that-must-not-print")
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    _, found = check_experiment(parse_experiment(_agent({"backend": "modal"}), "t"))
    (missing,) = [v for v in found if v.field == "recipe.environment.sandbox.backend"]
    assert missing.message.startswith("'modal' needs MODAL_TOKEN_SECRET in the submitting environment")
    assert missing.fix.startswith("export MODAL_TOKEN_SECRET in the shell that runs rlbuild or snakemake")
    assert "ak-value" not in str(found)
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-value")
    assert check_experiment(parse_experiment(_agent({"backend": "modal"}), "t"))[1] == []


def test_turns_that_outgrow_the_models_positions_are_refused_unless_the_context_is_stated() -> None:
    sandbox = {"backend": "local"}
    _, found = check_experiment(parse_experiment(_agent(sandbox, max_turns=20, max_context_tokens=None), "t"))
    assert [(v.field, v.fix) for v in found] == [
        (
            "recipe.environment.max_turns",
            "lower environment.max_turns to 9, or state environment.max_context_tokens: 128 to train on episodes "
            "that end truncated there",
        )
    ]
    assert found[0].message.startswith("max_prompt_length 16 + max_turns 20 x max_generate_length 12 = 256 tokens")
    assert check_experiment(parse_experiment(_agent(sandbox, max_turns=9, max_context_tokens=None), "t"))[1] == []
    assert check_experiment(parse_experiment(_agent(sandbox, max_turns=20, max_context_tokens=128), "t"))[1] == []


def test_harbor_tasks_the_local_backend_cannot_build_are_refused_each_by_name(tmp_path: Path) -> None:
    copies = "FROM ubuntu:24.04\nWORKDIR /app\nCOPY key.txt .\n"
    tasks = _tasks(tmp_path / "set", copies, "FROM ubuntu:24.04\nRUN apt-get -y install git\n")
    (tasks / "task0" / "environment" / "key.txt").write_text("42\n")
    doc = _agent({"backend": "local"})
    doc["data"]["validation"] = [{"source": f"harbor:{tasks}", "revision": "v1"}]
    _, found = check_experiment(parse_experiment(doc, "t"))
    assert [(v.field, v.message.split(", and ")[0]) for v in found] == [
        (
            "data.validation.0.source",
            f"task 'task1' of harbor:{tasks}: its Dockerfile needs building (environment/Dockerfile line 2: RUN "
            "apt-get -y install git)",
        )
    ]
    assert found[0].fix.startswith("set recipe.environment.sandbox.backend to one of daytona, modal, e2b, docker")
    doc["recipe"]["environment"]["sandbox"] = None
    doc["recipe"]["environment"]["max_turns"] = 1  # a reward environment's settings, so only the sandbox is wrong
    (no_sandbox,) = check_experiment(parse_experiment(doc, "t"))[1]
    assert "runs its commands and verifier in a sandbox, and recipe.environment.sandbox is null" in no_sandbox.message
    (tasks / "task0" / "tests" / "test.sh").unlink()
    broken, no_sandbox_still = check_experiment(parse_experiment(doc, "t"))[1]  # every problem at once
    assert broken.message == f"{tasks}/task0/tests/test.sh: missing" and no_sandbox_still == no_sandbox


def test_a_local_dockerfile_copies_from_its_build_context_only_each_refusal_a_line_with_its_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "host-secret"
    outside.write_text("the host's\n")
    dockerfile = (
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY key.txt /files/key.txt ./\nCOPY --chown=1:1 /key.txt sub/../key.txt "
        f"/opt/\nCOPY {outside} /app/\nCOPY ../../../../../..{outside} /app/\nCOPY files/../../x missing *.txt /a/\n"
    )
    tasks = _tasks(tmp_path / "set", dockerfile)
    context = tasks / "task0" / "environment"
    (context / "files").mkdir()
    for name in ("key.txt", "files/key.txt"):
        (context / name).write_text("42\n")
    image = local_image(tasks / "task0")
    assert isinstance(image, LocalImage)
    # Docker's resolution: an absolute source is from the context's root, `..` inside it stays inside.
    assert image.copies == [("key.txt", "/app/"), ("files/key.txt", "/app/")] + [("key.txt", "/opt/")] * 2
    where = f"{context}/Dockerfile line"
    assert [(p.where, p.why) for p in image.problems] == [
        (f"{where} 5", f"COPY source {str(outside)!r} names nothing in the build context (environment{outside})"),
        (f"{where} 6", f"COPY source '../../../../../..{outside}' leaves the build context (environment/), which "
         "an image build never does"),
        (f"{where} 7", "COPY source 'files/../../x' leaves the build context (environment/), which an image build "
         "never does"),
        (f"{where} 7", "COPY source 'missing' names nothing in the build context (environment/missing)"),
        (f"{where} 7", "COPY source '*.txt' names nothing in the build context (environment/*.txt)"),
    ]  # fmt: skip
    assert image.problems[1].fix == "put the file in the task's environment/ folder and name it relative to that folder"

    # `rlbuild check`: one line per problem, all at once, exit 2; a link in a task folder too (any backend).
    (tasks / "task1").mkdir()
    for name in ("instruction.md", "task.toml", "tests"):
        (tasks / "task1" / name).symlink_to(tasks / "task0" / name)
    lines = _refused_by_check(tasks, tmp_path, capsys)
    links, copies = lines[:3], lines[3:]
    assert all("is a symbolic link" in line and "`cp -L`" in line for line in links), lines
    names = ("instruction.md", "task.toml", "tests")
    assert [line.split(": ", 2)[1] for line in links] == [str(tasks / "task1" / name) for name in names]
    assert [line.split(": ", 2)[1] for line in copies] == [f"{where} {n}" for n in (5, 6, 7, 7, 7)]
    fixes = ["add it to environment/ or correct the name", "put the file in the task's environment/ folder"]
    assert [next(i for i, fix in enumerate(fixes) if f"; {fix}" in line) for line in copies] == [0, 1, 1, 0, 0]


def test_a_task_whose_test_script_is_a_link_is_refused_by_check_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "host-script.sh"
    outside.write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    tasks = _tasks(tmp_path / "set", "FROM ubuntu:24.04\nWORKDIR /app\n", "FROM ubuntu:24.04\nWORKDIR /app\n")
    script = tasks / "task1" / "tests" / "test.sh"
    script.unlink()
    script.symlink_to(outside)  # old code: passed check, and staging read the host's script into the row
    lines = _refused_by_check(tasks, tmp_path, capsys)
    assert len(lines) == 1 and f": {script}: is a symbolic link (to '{outside}')" in lines[0], lines
    assert "`cp -L`" in lines[0]


def test_harbor_is_judged_in_the_runtime_the_nodes_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", "dk-test")
    doc = _agent({"backend": "daytona", "max_concurrent": 4})
    parsed = parse_experiment(doc, "t")
    recipe, _ = compose_recipe(parsed)
    assert recipe is not None
    locked = node_runtime(parsed, shares_venv=False)
    assert (locked.extras, locked.harbor) == (("harbor",), locked_version("harbor", "harbor")) and locked.harbor
    gpus = node_runtime(parse_experiment(experiment(recipe=doc["recipe"]), "t"), shares_venv=False)
    assert gpus.extras == ("gpu", "harbor")
    assert check_harbor_runtime(parsed, recipe, NodeRuntime("image", None, image="rl@sha256:" + "0" * 64)) == []
    (venv,) = check_harbor_runtime(parsed, recipe, NodeRuntime("venv", None))
    assert venv.field == "recipe.environment.sandbox.backend"
    assert "harbor is not importable" in venv.message and "`scripts/setup.sh --extra harbor`" in venv.fix
    (lock,) = check_harbor_runtime(parsed, recipe, NodeRuntime("lock", None, extras=("harbor",)))
    assert "resolve no harbor for linux/x86_64" in lock.message
    assert "`rlbuild check` without --profile judges this machine's .venv" in lock.fix  # the other place
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(doc))
    graph = Graph(path, announce=False, on_cluster=True, shares_venv=False)
    assert _seen_by(graph, "iris", graph.gang_resources())["iris_extras"] == "harbor"
    assert _seen_by(graph, "iris", graph.job_resources("eval"))["iris_extras"] == "harbor"
    assert "iris_extras" not in _seen_by(graph, "iris", graph.job_resources("export"))


def test_the_plan_shows_the_sandbox_and_bounds_its_hours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", "dk-test")
    sandbox = {"backend": "daytona", "max_concurrent": 4, "episode_timeout_s": 600, "memory_mb": 2048}
    doc = _agent(sandbox) | {"execution": AGENT["execution"] | {"sandbox_caps": {"daytona": 6}}}
    text = format_plan(resolve(parse_experiment(doc, "t"), "2026.09.21", "/tmp/r"))
    assert (
        "  sandbox        daytona: 4 episodes at once (4 per engine x 1 engine(s)), cap 6 (execution.sandbox_caps); "
        "max_turns 3; per episode 600 s, per command 10 s, 2048 MiB\n"
        "  sandbox time   at most 640 sandbox-h (upper bound: 15 steps x 256 episodes x 600 s episode timeout; evals "
        "not counted)"
    ) in text
    assert "  sandbox " not in format_plan(resolve(parse_experiment(_agent(None, max_turns=1), "t"), "dev", "/tmp/r"))


def test_rlbuild_check_names_every_sandbox_problem_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    tasks = _tasks(tmp_path / "set", "FROM ubuntu:24.04\nRUN pip install numpy\n")
    doc = _agent({"backend": "local", "episode_timeout_s": 600}, max_turns=20, max_context_tokens=None)
    doc["data"]["validation"] = [{"source": f"harbor:{tasks}", "revision": "v1"}]
    doc["execution"]["sandbox_caps"] = {"daytona": 6}
    daytona = {"recipe": {"environment": {"sandbox": {"backend": "daytona", "max_concurrent": 8}}}}
    doc["arms"] = {"on-daytona": daytona, "on-local": {}}  # one check of both backends
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path), "--version", "2026.09.21", "--storage-root", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    for field, message, fix in [
        ("arms.on-daytona.recipe.environment.sandbox.backend", "'daytona' needs DAYTONA_API_KEY", "export DAYTONA"),
        (f"arms.on-daytona.{CONCURRENT}", "8 daytona sandboxes at once, more than execution.sandbox_caps.daytona=6",
         f"set {CONCURRENT}: 6"),
        ("arms.on-daytona.recipe.environment.max_turns", "max_turns 20 x max_generate_length 12 = 256 tokens",
         "lower environment.max_turns to 9"),
        ("arms.on-local.data.validation.0.source", "task 'task0' of harbor:", "RUN pip install numpy"),
    ]:  # fmt: skip
        (line,) = [line for line in err.splitlines() if line.startswith(f"  - {field}: ")]
        assert message in line and fix in line, line


def test_a_daytona_plan_checks_for_iris_where_harbor_cannot_be_imported(tmp_path: Path) -> None:
    blocker = tmp_path / "no-harbor"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(NO_HARBOR)
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path), "PYTHONPATH": str(blocker)}
    env |= {"DAYTONA_API_KEY": "dk-test"}
    probe = "import importlib.util; assert importlib.util.find_spec('harbor') is None; import harbor"
    blocked = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=30)
    assert "No module named 'harbor'" in blocked.stderr, blocked.stderr
    sandbox = {"backend": "daytona", "max_concurrent": 4, "episode_timeout_s": 600}
    path = tmp_path / "agent.yaml"
    capped = AGENT["execution"] | {"sandbox_caps": {"daytona": 6}}
    path.write_text(yaml.safe_dump(_agent(sandbox) | {"execution": capped}))
    argv = [sys.executable, "-m", "rlbuild", "check", str(path), "--version", "2026.09.21"]
    argv += ["--storage-root", str(tmp_path / "store")]
    iris = subprocess.run([*argv, "--profile", "iris"], cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
    assert iris.returncode == 0, iris.stderr
    assert "  nodes run      set up from uv.lock with extra harbor for linux/x86_64 (" in iris.stdout
    assert "  sandbox        daytona: 4 episodes at once (4 per engine x 1 engine(s)), cap 6" in iris.stdout


def _refused_by_check(tasks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """`rlbuild check` of a local-backend agent experiment validated on the Harbor task set `tasks`: it exits 2,
    and these are its lines about that source."""
    doc = _agent({"backend": "local"})
    doc["data"]["validation"] = [{"source": f"harbor:{tasks}", "revision": "v1"}]
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path), "--version", "2026.09.21", "--storage-root", str(tmp_path / "r")]) == 2
    return [line for line in capsys.readouterr().err.splitlines() if "data.validation.0.source" in line]
