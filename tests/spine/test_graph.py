"""The Snakemake graph: dry runs print the checked plan; errors stop before any job; identity drift is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlbuild.dev.s3 import S3Server
from tests.conftest import EXPERIMENTS, REPO, run_snakemake
from trainer.tiny import build_tokenizer

VERSION = "2026.09.21"
STAGES = ["base_model", "stage_model", "stage_data", "resolve_launch", "train", "export"]


def job_counts(output: str) -> dict[str, int]:
    """Snakemake's own job table ("job  count" rows) from a dry run."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("job ") and "count" in line)
    counts: dict[str, int] = {}
    for line in lines[start + 2 :]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


def cheap_experiment(tmp_path: Path, **recipe: object) -> Path:
    """The default experiment, but staged from a small local model folder so real runs take seconds."""
    model = tmp_path / "model-src"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (model / "model.safetensors").write_bytes(b"not really weights")
    build_tokenizer().save_pretrained(model)  # resolve_launch counts the staged prompts with it
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["model"] = {
        "source": f"local:{model}",
        "revision": "r1",
        "tokenizer": {"source": f"local:{model}", "revision": "r1"},
    }
    doc["recipe"] = {"trainer": dict(recipe)} if recipe else {}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_dry_run_prints_the_plan_and_the_whole_graph(tmp_path: Path) -> None:
    storage = tmp_path / "results"
    result = run_snakemake(["-n", f"export/v{VERSION}", "--config", f"storage_root={storage}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert f"rlbuild plan: tiny-addition @ {VERSION} (immutable)" in output
    assert "role geometry  colocated: policy 1x1 = 1 GPUs" in output
    assert "terminal stage export" in output
    assert job_counts(output) == {**dict.fromkeys(STAGES, 1), "total": 6}
    # A storage root that does not exist is judged creatable, not created: no folder, not even `.snakemake/`.
    assert not storage.exists(), sorted(str(p) for p in storage.rglob("*"))[:5]


def test_default_target_builds_eval_for_configured_versions(tmp_path: Path) -> None:
    result = run_snakemake(["-n", "--config", f"storage_root={tmp_path / 'r'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    counts = job_counts(result.stdout + result.stderr)
    assert counts["eval"] == 1 and counts["all"] == 1


def test_invalid_experiment_stops_the_dry_run_before_any_job(tmp_path: Path) -> None:
    """Every problem at once, also those a job would only meet minutes later (NCCL on CPU ranks at train start,
    data without rows at staging)."""
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["role_plan"]["inference_engine_data_parallel_size"] = 2
    doc["role_plan"]["policy_mini_batch_size"] = 5
    doc["recipe"]["generator"] = {"weight_sync_backend": "nccl"}
    (tmp_path / "empty.jsonl").write_text("")
    doc["data"]["validation"] = [{"source": f"local:{tmp_path / 'empty.jsonl'}", "revision": "r1"}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    storage = tmp_path / "results"
    result = run_snakemake(
        ["-n", f"export/v{VERSION}", "--config", f"experiment={path}", f"storage_root={storage}"], cwd=tmp_path
    )
    assert result.returncode == 2
    assert "5 problem(s) found before anything ran" in result.stderr
    assert "role_plan.num_inference_engines: colocated policy GPUs (1*1=1) != rollout GPUs" in result.stderr
    assert "train_batch_size=32 is not a multiple of policy_mini_batch_size=5" in result.stderr
    assert "recipe.generator.weight_sync_backend: 'nccl' needs GPUs" in result.stderr
    assert f"data.validation.0.source: source local:{tmp_path / 'empty.jsonl'}: " in result.stderr
    assert "Job stats" not in result.stdout + result.stderr
    assert not storage.exists()


def test_a_file_nested_10000_deep_stops_the_dry_run_in_one_line(tmp_path: Path) -> None:
    """The Snakefile reads the experiment as `rlbuild check` does (rlbuild/core/yamlfile.py): bounded, one line."""
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 10_000 + "\n")
    result = run_snakemake(["-n", "--config", f"experiment={path}", f"storage_root={tmp_path}"], cwd=tmp_path)
    assert result.returncode == 2
    assert (
        f"{path}: 1 problem(s) found before anything ran:\n  - experiment: nests deeper than 64 levels" in result.stderr
    )
    assert "Traceback" not in result.stderr and len(result.stderr) < 1000


def test_bad_version_in_target_is_named(tmp_path: Path) -> None:
    result = run_snakemake(["-n", "export/v2026.9.21", "--config", f"storage_root={tmp_path}"], cwd=tmp_path)
    assert result.returncode == 2
    assert "version: '2026.9.21' is not a calendar version" in result.stderr


def test_a_mistyped_config_key_is_refused_naming_the_key(tmp_path: Path) -> None:
    result = run_snakemake(["-n", "--config", "verions=x", f"storage_root={tmp_path}"], cwd=tmp_path)
    assert result.returncode == 2
    assert "config.verions: unknown key; did you mean 'versions'?" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_iris_profile_with_nothing_set_names_what_to_set(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLBUILD_", "SNAKEMAKE_"))}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "--profile", "iris", "-n", f"export/v{VERSION}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "RLBUILD_BUCKET" in line]
    assert len(errors) == 1 and "RLBUILD_PREFIX" in errors[0] and "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL" in errors[0]
    assert "iris: no controller configured: set SNAKEMAKE_IRIS_CONTROLLER_URL" in result.stderr
    assert "Traceback" not in result.stderr and "Exception" not in result.stderr


def s3_args(bucket: str) -> list[str]:
    return ["--default-storage-provider", "s3", "--default-storage-prefix", f"s3://{bucket}/root"]


@pytest.mark.timeout(300)
def test_changed_recipe_under_a_fixed_version_is_refused_from_a_fresh_checkout(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    experiment = cheap_experiment(tmp_path, max_steps=200)
    first = tmp_path / "checkout-1"
    first.mkdir()
    target = f"launch/v{VERSION}/launch.yaml"
    built = run_snakemake(
        [target, "--cores", "2", *s3_args(bucket), "--config", f"experiment={experiment}"],
        cwd=first,
        env=s3_server.env(),
    )
    assert built.returncode == 0, built.stderr[-3000:]

    experiment.write_text(experiment.read_text().replace("max_steps: 200", "max_steps: 7"))
    fresh = tmp_path / "checkout-2"  # no .snakemake metadata: only the record in S3 can tell
    fresh.mkdir()
    refused = run_snakemake(
        ["-n", f"export/v{VERSION}", *s3_args(bucket), "--config", f"experiment={experiment}"],
        cwd=fresh,
        env=s3_server.env(),
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"version {VERSION} is immutable" in refused.stderr
    assert "recipe.trainer.max_steps: stored 200 -> now 7" in refused.stderr
    assert "Bump the version" in refused.stderr
    assert "SECRET" not in (refused.stdout + refused.stderr).upper().replace("<REDACTED>", "")
    # `rlbuild check` runs the dry run's checks, against the same storage.
    argv = ["check", str(experiment), "--version", VERSION, "--storage-root", f"s3://{bucket}/root"]
    check = subprocess.run(
        [sys.executable, "-m", "rlbuild", *argv],
        env={**os.environ, **s3_server.env()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 2, check.stdout + check.stderr
    assert "recipe.trainer.max_steps: stored 200 -> now 7" in check.stderr


@pytest.mark.timeout(300)
def test_dev_version_rebuilds_what_changed(tmp_path: Path, s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    experiment = cheap_experiment(tmp_path, max_steps=200)
    target = "launch/vdev/launch.yaml"
    args = [*s3_args(bucket), "--config", f"experiment={experiment}"]
    built = run_snakemake([target, "--cores", "2", *args], cwd=tmp_path, env=s3_server.env())
    assert built.returncode == 0, built.stderr[-3000:]
    unchanged = run_snakemake(["-n", target, *args], cwd=tmp_path, env=s3_server.env())
    assert "Nothing to be done" in unchanged.stdout + unchanged.stderr

    experiment.write_text(experiment.read_text().replace("max_steps: 200", "max_steps: 7"))
    changed = run_snakemake(["-n", target, *args], cwd=tmp_path, env=s3_server.env())
    assert changed.returncode == 0, changed.stderr
    counts = job_counts(changed.stdout + changed.stderr)
    assert counts["resolve_launch"] == 1
    # Snakemake's own reason names a fingerprint marker; the plan names the field.
    assert "  rebuilds       launch: recipe.trainer.max_steps 200 -> 7" in changed.stderr, changed.stderr[-3000:]
    assert "stage_model" not in counts and "stage_data" not in counts


def test_a_rule_param_reaches_the_command_as_given_braces_included() -> None:
    from snakemake.io import apply_wildcards

    from rlbuild.workflow import rule_param

    plain = ["/opt/venv/bin/python", "-m", "rlbuild"]
    assert rule_param(plain) is plain  # no function for Snakemake to call in each job
    assert [apply_wildcards(v, {}) for v in plain] == plain  # and Snakemake's formatting leaves it as it is
    braced = "/home/me/{project}/config/experiments/tiny.yaml"
    as_given = rule_param(braced)
    assert callable(as_given) and as_given(object()) == braced  # a function's result is not formatted


def test_the_dry_run_reads_ahead_the_versions_its_targets_name_else_every_configured_one() -> None:
    """Which versions' records the first plan reads at once (`Graph.keys_asked`): a series' version is each of its
    arms (the smoke first); a target names its version key; a target naming no artifact adds none."""
    from types import SimpleNamespace

    from rlbuild.workflow import Graph

    graph = Graph(EXPERIMENTS / "tiny-series.yaml", announce=False, versions=["2026.01.01", "2026.01.02"])

    def asked(*targets: str) -> list[str]:
        graph.workflow = SimpleNamespace(dag_settings=SimpleNamespace(targets=set(targets)))
        return graph.keys_asked()

    arms = ["smoke", "base", "kl-low", "seed-7"]
    assert asked() == asked("all") == [f"{v}@{arm}" for v in ("2026.01.01", "2026.01.02") for arm in arms]
    assert sorted(asked("export/v2026.03.01@kl-low", "launch/v2026.03.01@base.identity.json")) == [
        "2026.03.01@base",
        "2026.03.01@kl-low",
    ]
    assert asked("eval/v2026.03.01/results.json") == [f"2026.03.01@{arm}" for arm in arms]
    assert asked("publish/v2026.03.01.json") == []
