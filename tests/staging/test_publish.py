"""The export's model card and the optional publish stage, up to the Hub.

No Hub-compatible server installs from the registries, so the upload itself is not run: the tests cover the
card (built and read back with huggingface_hub), the preflight of `execution.publish`, the upload folder and
the calls the stage makes (a recording stand-in for `HfApi`, the one part not real here).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from huggingface_hub import ModelCard

from rlbuild.contracts.artifacts import EXPORT_MODEL
from rlbuild.contracts.launch import LaunchDocument, load_launch
from rlbuild.contracts.manifest import ManifestMismatchError, write_manifest
from rlbuild.contracts.recipe import EnvironmentSection, Recipe
from rlbuild.core.errors import PreflightError
from rlbuild.dev.launches import base_model_dir, experiment_document, write_test_launch
from rlbuild.plan.preflight import parse_experiment
from rlbuild.plan.series import check
from rlbuild.plan.spec import NodeLimits
from rlbuild.plan.versioning import experiment_problems
from rlbuild.stages import publish as stage
from rlbuild.stages.modelcard import TAGS, CardFacts, build_card, first_prompt, gpu_hours, reference_placement
from tests.conftest import EXPERIMENTS, run_snakemake
from tests.spine.test_graph import job_counts

HF_MODEL = {"source": "hf:Qwen/Qwen2.5-0.5B", "revision": "7ae557604adf67be50417f59c2c2f167def9a775"}
MODEL_RECORD = {"fields": {"model": {**HF_MODEL, "tokenizer": HF_MODEL}}}
DATA_RECORD = {
    "fields": {
        "data": {
            "train": [{"source": "hf:openai/gsm8k/main/train.jsonl", "revision": "e53f048"}],
            "validation": [{"source": "task:addition/validation", "revision": "seed-0"}],
        }
    }
}
METRICS = [
    {"step": 0, "eval/accuracy": 0.1},
    {"step": 1, "perf/step_time_s": 1800.0},
    {"step": 2, "perf/step_time_s": 1800.0, "eval/accuracy": 0.6},
]
RESULTS = {"accuracy": 0.75, "pass_at_k": 0.9, "k": 4, "validation_files": ["0.jsonl"]}


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> LaunchDocument:
    return load_launch(str(write_test_launch(tmp_path_factory.mktemp("launch"))))


def test_the_card_names_hub_sources_in_its_metadata_and_every_source_in_its_body(
    tmp_path: Path, launch: LaunchDocument
) -> None:
    build_card(launch, MODEL_RECORD, DATA_RECORD, METRICS, "test/export@vdev:0123").save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")
    assert "identity: `test/export@vdev:0123`" in card.text
    assert card.data.base_model == "Qwen/Qwen2.5-0.5B"
    assert card.data.datasets == ["openai/gsm8k"]  # the task: source is not a Hub dataset
    assert card.data.tags == TAGS
    (result,) = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("accuracy", 0.6, "validation")
    assert "step 2" in result.metric_name
    assert f"`{HF_MODEL['source']}` @ `{HF_MODEL['revision']}`" in card.text
    assert "validation data: `task:addition/validation` @ `seed-0`" in card.text
    assert launch.run.fingerprint in card.text and launch.runtime.source_digest in card.text
    assert "GPU-hours: not measured" in card.text  # the test launch runs on CPU ranks
    assert "- environment `exact_match`: one completion per prompt" in card.text
    assert "- success: it answers 0.600 of held-out prompts right (greedy, step 2)" in card.text
    sandbox = {"backend": "local"}
    environment = {"env_class": "find_key", "max_turns": 3, "turn_stop": "|", "sandbox": sandbox}
    agent = launch.model_copy(
        update={"recipe": launch.recipe.model_copy(update={"environment": EnvironmentSection(**environment)})}
    )
    text = build_card(agent, MODEL_RECORD, DATA_RECORD, METRICS).text
    assert (
        "- agent environment `find_key`: episodes of up to 3 turns, each action ending at '|', run in a `local`" in text
    )
    assert "- success: 0.600 of held-out episodes solved (greedy, step 2)" in text


def test_gpu_hours_count_every_gpu_of_the_gang(launch: LaunchDocument) -> None:
    allocation = launch.allocation.model_copy(update={"gpu_variant": "H100", "num_nodes": 2, "gpus_per_node": 8})
    on_gpus = launch.model_copy(update={"allocation": allocation})
    assert gpu_hours(on_gpus, METRICS) == pytest.approx(16.0)  # 3600 s x 16 GPUs
    assert gpu_hours(launch, METRICS) is None


def _experiment(tmp_path: Path, publish: dict[str, Any]) -> Any:
    return parse_experiment(experiment_document(tmp_path, execution={"publish": publish}), "test experiment")


def test_publish_settings_are_checked_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(PreflightError) as error:
        _experiment(tmp_path, {"repo_id": "not a repo", "revision_tag": "latest"})
    fields = {v.field: v.message for v in error.value.violations}
    assert "owner>/<name>" in fields["execution.publish.repo_id"]
    assert "{version}" in fields["execution.publish.revision_tag"]
    settings = _experiment(tmp_path, {"repo_id": "my-org/tiny-addition"}).execution.publish
    assert (settings.private, settings.tag("2026.09.21")) == (True, "v2026.09.21")


def test_a_configured_publish_stage_needs_a_token_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = _experiment(tmp_path, {"repo_id": "my-org/tiny-addition"})
    monkeypatch.delenv(stage.TOKEN_ENV, raising=False)
    problems = experiment_problems(check(experiment), NodeLimits(None, None, None), ask_scheduler=False)
    assert [p.field for p in problems] == ["execution.publish"] and "HF_TOKEN" in problems[0].message
    monkeypatch.setenv(stage.TOKEN_ENV, "hf_test")
    assert experiment_problems(check(experiment), NodeLimits(None, None, None), ask_scheduler=False) == []
    unset = parse_experiment(experiment_document(tmp_path), "test experiment")
    monkeypatch.delenv(stage.TOKEN_ENV)
    # Off by default: no token needed.
    assert experiment_problems(check(unset), NodeLimits(None, None, None), ask_scheduler=False) == []


def _export(tmp_path: Path, launch: LaunchDocument) -> Path:
    export = tmp_path / "export"
    shutil.copytree(base_model_dir(0), export / EXPORT_MODEL)
    build_card(launch, MODEL_RECORD, DATA_RECORD, METRICS).save(export / EXPORT_MODEL / "README.md")
    write_manifest(export)
    return export


def test_the_upload_is_the_model_with_the_eval_stage_results(tmp_path: Path, launch: LaunchDocument) -> None:
    upload = stage.prepare_upload(_export(tmp_path, launch), RESULTS, tmp_path / "upload")
    assert sorted(p.name for p in upload.iterdir()) == sorted(p.name for p in (tmp_path / "export/model").iterdir())
    card = ModelCard.load(upload / "README.md")
    scores = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert scores == {"accuracy": 0.75, "pass@k": 0.9}
    assert card.data.base_model == "Qwen/Qwen2.5-0.5B" and launch.run.fingerprint in card.text
    weights = tmp_path / "export" / EXPORT_MODEL / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(ManifestMismatchError, match=r"model/model\.safetensors"):
        stage.prepare_upload(tmp_path / "export", RESULTS, tmp_path / "again")


class RecordingHub:
    """Stands in for `huggingface_hub.HfApi`: records every call the stage makes."""

    calls: list[tuple[str, dict[str, Any]]] = []
    endpoint = "http://127.0.0.1:1"

    def __init__(self, token: str) -> None:
        self.calls.append(("init", {"token": token}))

    def create_repo(self, repo_id: str, **kwargs: Any) -> None:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs: Any) -> Any:
        self.calls.append(
            ("upload_folder", {**kwargs, "files": sorted(p.name for p in kwargs["folder_path"].iterdir())})
        )
        return type("CommitInfo", (), {"oid": "c0ffee"})()

    def create_tag(self, repo_id: str, **kwargs: Any) -> None:
        self.calls.append(("create_tag", {"repo_id": repo_id, **kwargs}))


def test_publish_uploads_then_tags_and_records_the_revision(
    tmp_path: Path, launch: LaunchDocument, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    monkeypatch.setattr(stage, "HfApi", RecordingHub)
    settings = {"repo_id": "my-org/tiny", "private": True, "tag": "v2026.09.21"}
    out = tmp_path / "publish" / "v2026.09.21.json"
    with pytest.raises(stage.PublishError, match="HF_TOKEN is not set"):
        stage.run_publish(_export(tmp_path, launch), tmp_path / "results.json", out, settings, {}, "2026.09.21")
    assert RecordingHub.calls == [] and not out.exists()
    published = stage.run_publish(
        tmp_path / "export", tmp_path / "results.json", out, settings, {"HF_TOKEN": "hf_x"}, "2026.09.21"
    )
    names = [name for name, _ in RecordingHub.calls]
    assert names == ["init", "create_repo", "upload_folder", "create_tag"]
    _, create = RecordingHub.calls[1]
    assert create == {"repo_id": "my-org/tiny", "repo_type": "model", "private": True, "exist_ok": True}
    _, upload = RecordingHub.calls[2]
    assert upload["repo_id"] == "my-org/tiny" and upload["repo_type"] == "model"
    assert "README.md" in upload["files"] and "manifest.json" not in upload["files"]
    _, tag = RecordingHub.calls[3]
    assert (tag["tag"], tag["revision"]) == ("v2026.09.21", "c0ffee")
    assert json.loads(out.read_text()) == published and published["revision"] == "c0ffee"


@pytest.mark.slow  # three dry runs of the graph
def test_the_graph_publishes_only_where_the_experiment_says_and_refuses_without_a_token(tmp_path: Path) -> None:
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["execution"]["publish"] = {"repo_id": "my-org/tiny-addition"}
    path = tmp_path / "publishing.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in os.environ.items() if k != stage.TOKEN_ENV}
    args = ["-n", "--config", f"experiment={path}", f"storage_root={tmp_path / 'results'}"]
    refused = run_snakemake(args, cwd=tmp_path, env=env | {stage.TOKEN_ENV: ""})
    assert refused.returncode == 2 and "execution.publish: publishing needs a Hugging Face token" in refused.stderr
    planned = run_snakemake(args, cwd=tmp_path, env={stage.TOKEN_ENV: "hf_test"})
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert job_counts(planned.stdout + planned.stderr)["publish"] == 1
    default = run_snakemake(["-n", "--config", f"storage_root={tmp_path / 'default'}"], cwd=tmp_path)
    assert "publish" not in job_counts(default.stdout + default.stderr)  # off by default


def test_the_card_says_where_the_reference_is_its_license_both_accuracies_and_asks_a_validation_prompt(
    tmp_path: Path, launch: LaunchDocument
) -> None:
    facts = CardFacts("apache-2.0", 'What is 3+4?\nAnswer: "')
    build_card(launch, MODEL_RECORD, DATA_RECORD, METRICS, facts=facts).save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.license == "apache-2.0" and "`apache-2.0`, as the experiment file's `license:` says" in card.text
    assert (
        "- success: it answers 0.600 of held-out prompts right (greedy, step 2); the base model, before training: "
        "0.100 (step 0)" in card.text
    )
    assert "held-out greedy accuracy of the base model (step 0, before training): 0.100" in card.text
    asked = next(line for line in card.text.splitlines() if line.startswith("inputs = tokenizer("))
    assert eval(asked.split("(", 1)[1].split(", return_tensors")[0]) == facts.prompt  # a valid Python literal
    unscored = build_card(launch, MODEL_RECORD, DATA_RECORD, METRICS[1:])
    assert unscored.data.license == "other" and "`other`: the default, as the experiment names no `license:`" in (
        unscored.text
    )
    assert "the base model was not scored before training (trainer.eval_before_train is off)" in unscored.text
    assert "the base model, before training" not in unscored.text and "<a prompt" not in unscored.text
    staged = [entry.uri for entry in launch.inputs.validation_data]
    assert first_prompt(staged) == json.loads(Path(staged[0]).read_text().splitlines()[0])["prompt"]

    def placed(trainer: dict[str, Any]) -> str:
        return reference_placement(Recipe.model_validate({"trainer": trainer}))

    assert placed({}) == "the reference in the policy's workers, on their GPUs"  # `ref_num_nodes: 0`, colocated
    assert placed({"algorithm": {"use_kl_loss": False}}) == "no reference model (no KL term)"
    apart = {"colocate_all": False, "colocate_policy_ref": False, "ref_num_nodes": 2, "ref_num_gpus_per_node": 8}
    assert placed({"placement": apart}) == "the reference on 2 node(s) x 8 GPU(s) of its own"
    assert reference_placement(launch.recipe) in card.text


def test_a_license_is_a_hub_license_id() -> None:
    shipped = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    with pytest.raises(PreflightError) as error:
        parse_experiment(shipped | {"license": "Apache 2"}, "test experiment")
    (violation,) = error.value.violations
    assert violation.field == "license" and "'Apache 2' is not a Hub license id (did you mean apache-2.0" in (
        violation.message
    )
    # A typo that has the shape of an id is not an id: the Hub would refuse the card after training.
    with pytest.raises(PreflightError) as error:
        parse_experiment(shipped | {"license": "mit-ish"}, "test experiment")
    (violation,) = error.value.violations
    assert "'mit-ish' is not a Hub license id (did you mean mit?" in violation.message
    assert "'other' (the default)" in violation.message
    assert parse_experiment(shipped | {"license": "llama3.1"}, "x").license == "llama3.1"
    assert parse_experiment(shipped | {"license": "mit"}, "x").license == "mit"
    assert parse_experiment(shipped, "x").license == "other"  # the default, which the card explains
