"""End to end through Ray: train, checkpoints, metrics, terminal manifest, export, eval; kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlbuild.dev.launches import write_test_launch
from tests.launches import placeable
from trainer.workers import startup

METRIC_KEYS = {
    "reward/mean",
    "reward/frac_correct",
    "reward/zero_variance_groups",
    "response/length_mean",
    "policy/entropy",
    "policy/log_ratio_rollout",
    "policy/kl",
    "policy/clip_frac",
    "policy/grad_norm",
    "policy/lr",
    "perf/tokens_per_s",
    "perf/rollout_tokens_per_s",
    "perf/train_tokens_per_s",
    "perf/step_time_s",
    "sync/max_abs_logprob_diff",
    "health/zero_reward_steps",
}
LR = 3e-4


def trainer(*args: str, timeout: float = 300, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def _doc(launch: Path) -> dict:
    return yaml.safe_load(launch.read_text())


def _metrics(doc: dict) -> list[dict]:
    """The run's merged metrics.jsonl, kept with the train artifact (beside terminal.json)."""
    uri = doc["artifacts"]["metrics_uri"]
    assert Path(uri).parent == Path(doc["artifacts"]["terminal_manifest_uri"]).parent
    return [json.loads(line) for line in Path(uri).read_text().splitlines()]


@pytest.mark.slow  # a real Ray training run: out of the 3-minute inner loop
@pytest.mark.timeout(400)
def test_train_then_export_then_eval(tmp_path: Path) -> None:
    # Two optimizer steps (update epochs) per global step; warmup over the first two.
    optimizer = {"lr": LR, "num_warmup_steps": 2}
    recipe = {
        "trainer": {
            "max_steps": 3,
            "ckpt_interval": 2,
            "eval_before_train": True,
            "policy": {"optimizer_config": optimizer},
        }
    }
    launch = write_test_launch(tmp_path, recipe=recipe, retention={"resume_checkpoint_count": 1})
    doc = _doc(launch)
    result = trainer("run", "--launch", str(launch))
    assert result.returncode == 0, result.stderr[-3000:]
    # One rank with its engine: the roles live in the trainer's process, and no Ray starts.
    assert "in the trainer's process" in result.stdout
    started = startup.read_summary(result.stdout)  # the milestones, once, in the order they are reached
    assert started is not None and list(started) == [m for m in startup.MILESTONES if m != "ray"], result.stdout
    assert list(started.values()) == sorted(started.values()) and result.stdout.count("start-up:") == 1

    # The same job on a private Ray (its rank in a Ray worker): the same training, bit for bit.
    on_ray = write_test_launch(tmp_path / "on-ray", recipe=recipe, retention={"resume_checkpoint_count": 1})
    ray_result = trainer("run", "--launch", str(on_ray), RLBUILD_TRAINER_RAY="always")
    assert ray_result.returncode == 0, ray_result.stderr[-3000:]
    assert "\x1b[" not in ray_result.stdout + ray_result.stderr  # not a terminal: no colour codes (Ray's worker lines)
    assert list(startup.read_summary(ray_result.stdout) or {}) == list(startup.MILESTONES)
    assert "in the trainer's process" not in ray_result.stdout

    def trained(run: dict) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in _metrics(run)]

    assert trained(_doc(on_ray)) == trained(doc)
    final = [
        Path(d["artifacts"]["checkpoint_root"]) / "global_step_3/policy/model.safetensors" for d in (doc, _doc(on_ray))
    ]
    assert final[0].read_bytes() == final[1].read_bytes()
    terminal = json.loads(Path(doc["artifacts"]["terminal_manifest_uri"]).read_text())
    assert terminal["global_step"] == 3
    assert terminal["hf_path"] == f"{doc['artifacts']['checkpoint_root']}/global_step_3/policy"
    assert terminal["metrics"]["initial_eval_accuracy"] is not None
    assert terminal["metrics"]["final_eval_accuracy"] is not None
    checkpoints = Path(doc["artifacts"]["checkpoint_root"])
    assert sorted(p.name for p in checkpoints.glob("global_step_*")) == ["global_step_3"]  # keep 1
    assert (checkpoints / "latest").read_text() == "3"
    records = _metrics(doc)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r.keys() >= METRIC_KEYS for r in records[1:])
    assert all(r["sync/max_abs_logprob_diff"] < 1e-4 for r in records[1:])
    # The rate the step's optimizer steps used (warmup factors 1/2 and 1), not the next step's.
    assert [r["policy/lr"] for r in records[1:]] == pytest.approx([0.75 * LR, LR, LR])

    again = trainer("run", "--launch", str(launch))
    assert again.returncode != 0 and "already exists" in again.stderr

    out = tmp_path / "export"
    exported = trainer(
        "export", "--launch", str(launch), "--terminal", doc["artifacts"]["terminal_manifest_uri"], "--out", str(out)
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(out / "model", local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out / "model", local_files_only=True)
    assert model.config.vocab_size == len(tokenizer)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model"]  # the manifest beside the model
    files = {f"model/{p.name}" for p in (out / "model").iterdir()}
    assert set(json.loads((out / "manifest.json").read_text())["files"]) == files
    assert "model/model.safetensors" in files and "model/README.md" not in files  # no --card: no card
    sampling = json.loads((out / "model" / "generation_config.json").read_text())
    recipe = doc["recipe"]["generator"]["sampling_params"]
    assert sampling["temperature"] == recipe["temperature"]
    assert sampling["max_new_tokens"] == recipe["max_generate_length"]

    # One flipped bit in the terminal checkpoint's weights: export refuses, naming the file; nothing is written.
    weights = checkpoints / "global_step_3" / "policy" / "model.safetensors"
    payload = bytearray(weights.read_bytes())
    payload[len(payload) // 2] ^= 0x04
    weights.write_bytes(bytes(payload))
    corrupt = trainer(
        "export",
        "--launch",
        str(launch),
        "--terminal",
        doc["artifacts"]["terminal_manifest_uri"],
        "--out",
        str(tmp_path / "bad"),
    )
    assert corrupt.returncode == 2, corrupt.stderr[-3000:]
    assert "ManifestMismatchError" in corrupt.stderr and "model.safetensors: sha256" in corrupt.stderr
    assert "Traceback" not in corrupt.stderr and not (tmp_path / "bad").exists()

    results = tmp_path / "eval" / "results.json"
    data = doc["inputs"]["validation_data"][0]["uri"]
    evaluated = trainer("eval", "--model", str(out / "model"), "--data", data, "--out", str(results), "--k", "4")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    scores = json.loads(results.read_text())
    assert scores["n"] == 20  # the validation pairs
    # Greedy accuracy and pass@k (k samples at temperature 1) measure different things: neither bounds the other.
    assert 0.0 <= scores["accuracy"] <= 1.0 and 0.0 <= scores["pass_at_k"] <= 1.0


def kill_after_a_checkpoint(launch: Path, log: Path) -> int:
    """Start training, SIGKILL it (driver, its local Ray and the actors) once a checkpoint exists; its step."""
    latest = Path(_doc(launch)["artifacts"]["checkpoint_root"]) / "latest"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log.open("w") as out:
        first = subprocess.Popen(
            [sys.executable, "-m", "trainer", "run", "--launch", str(launch)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while not latest.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    # Kill the whole process group, as a preempted node would be.
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert latest.exists(), f"no checkpoint appeared before the deadline: {log.read_text()[-3000:]}"
    return int(latest.read_text())


def resume_to_the_end(launch: Path, killed_at: int, max_steps: int) -> subprocess.CompletedProcess[str]:
    doc = _doc(launch)
    assert killed_at < max_steps
    assert not Path(doc["artifacts"]["terminal_manifest_uri"]).exists()
    resumed = trainer("run", "--launch", str(launch), timeout=700)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logs = resumed.stdout + resumed.stderr
    assert f"resumed from {doc['artifacts']['checkpoint_root']}/global_step_{killed_at}" in logs
    terminal = json.loads(Path(doc["artifacts"]["terminal_manifest_uri"]).read_text())
    assert terminal["global_step"] == max_steps
    steps = [r["step"] for r in _metrics(doc) if r["step"]]  # (step 0: the eval before training, if any)
    assert steps == list(range(1, max_steps + 1))  # the killed steps replayed once
    assert len(list(Path(doc["artifacts"]["metrics_segments_root"]).glob("attempt-*"))) == 2
    return resumed


@pytest.mark.slow
@pytest.mark.timeout(800)
@placeable(2)
def test_fsdp2_on_two_ranks_shards_checkpoints_resumes_after_a_kill_and_exports(tmp_path: Path) -> None:
    # The test experiment on ONE node of two CPU "GPUs": the policy on both (FSDP2 over gloo), two colocated engines.
    launch = write_test_launch(
        tmp_path,
        topology={"num_nodes": 1, "gpus_per_node": 2},
        role_plan={"policy_num_gpus_per_node": 2, "num_inference_engines": 2},
        recipe={"trainer": {"max_steps": 4, "ckpt_interval": 1}},
    )
    doc = _doc(launch)
    killed_at = kill_after_a_checkpoint(launch, tmp_path / "first.log")
    first_log = (tmp_path / "first.log").read_text()
    assert "[trainer] policy: fsdp2 on 2 ranks (cpu, gloo): fully_shard" in first_log
    assert "engines (index@GPUs, 1 GPU(s) each) node 0: 0@0-0, 1@1-1" in first_log
    step = Path(doc["artifacts"]["checkpoint_root"]) / f"global_step_{killed_at}"
    assert {p.name for p in (step / "sharded").iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert not (step / "policy").exists(), "only the terminal checkpoint carries an HF folder"

    resume_to_the_end(launch, killed_at, 4)
    out = tmp_path / "export"
    terminal = doc["artifacts"]["terminal_manifest_uri"]
    exported = trainer("export", "--launch", str(launch), "--terminal", terminal, "--out", str(out))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert AutoModelForCausalLM.from_pretrained(out / "model", local_files_only=True).config.vocab_size > 0


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_two_data_parallel_ranks_with_separate_engines(tmp_path: Path) -> None:
    # Two optimizer steps per global step (mini 2 of train 4 prompts): the old-logprob pass runs separately.
    # Two nodes of two "GPUs": the policy takes one node, two single-rank engines the other. The environment is a
    # class written to skyrl-gym's convention (tests/trainer/skyrl_convention.py), trained unchanged: each sample is
    # an episode of up to two turns, played across both engines.
    environment = {"env_class": "tests.trainer.skyrl_convention:RetryAddition", "max_turns": 2, "turn_stop": "."}
    launch = write_test_launch(
        tmp_path,
        topology={"num_nodes": 2, "gpus_per_node": 2},
        role_plan={
            "colocate_all": False,
            "policy_num_gpus_per_node": 2,
            "num_inference_engines": 2,
            "policy_mini_batch_size": 2,
            "micro_train_batch_size_per_gpu": 8,
        },
        recipe={
            "trainer": {"algorithm": {"use_kl_loss": False}},
            "environment": environment | {"max_context_tokens": 32},
        },
    )
    result = trainer("run", "--launch", str(launch), timeout=450)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = _doc(launch)
    assert json.loads(Path(doc["artifacts"]["terminal_manifest_uri"]).read_text())["global_step"] == 2
    records = _metrics(doc)
    assert all(r["sync/max_abs_logprob_diff"] < 1e-4 for r in records)
    assert not any("policy/kl" in r for r in records), "no KL term: KL is absent, not 0.0"
    for record in records:  # 32 episodes a step, each one or two turns, none failed
        assert 1.0 <= record["episode/turns_mean"] <= 2.0 and record["episode/turns_max"] <= 2.0
        assert record["episode/error_frac"] == 0.0
        ended = sum(record[f"episode/ended_{how}_frac"] for how in ("done", "eos", "max_turns", "context", "error"))
        assert ended == pytest.approx(1.0)
        assert 0.0 <= record["reward/mean"] <= 1.0


@pytest.mark.slow  # a real Ray training run: out of the 3-minute inner loop
@pytest.mark.timeout(400)
def test_a_reference_on_its_own_workers_trains_exactly_like_a_colocated_one(tmp_path: Path) -> None:
    """Same seed, same steps: only where the reference model runs differs, so every training metric matches."""
    from rlbuild.contracts.launch import load_launch
    from trainer import loop

    runs = {}
    for name, ref_nodes in (("colocated", 0), ("separate", 1)):
        # Separate roles on single-"GPU" nodes: policy, (reference,) engine.
        role_plan = {"colocate_all": False, "ref_num_nodes": ref_nodes}
        path = write_test_launch(tmp_path / name, topology={"num_nodes": 2 + ref_nodes}, role_plan=role_plan)
        launch = load_launch(str(path))
        assert launch.recipe.reference_workers == ref_nodes
        loop.run(launch)
        runs[name] = _metrics(yaml.safe_load(path.read_text()))
    for colocated, separate in zip(runs["colocated"], runs["separate"], strict=True):
        assert colocated["policy/kl"] > 0, "the KL term must be live for the comparison to mean anything"
        for key in ("reward/mean", "policy/kl", "policy/pg_loss", "policy/grad_norm", "policy/entropy"):
            assert separate[key] == pytest.approx(colocated[key], rel=1e-4, abs=1e-6), (key, colocated["step"])
