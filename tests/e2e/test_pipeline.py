"""The whole graph on the embedded default, run for real by Snakemake on a small budget.

One module-scoped run builds every artifact kind; the tests then rebuild parts of it and assert, from
Snakemake's own job table, which jobs ran.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlbuild.core.streams import read_stream
from rlbuild.dev.s3 import S3Server
from tests.conftest import EXPERIMENTS, REPO, copy_of_the_code, run_snakemake
from tests.faults import Fault, s3_proxy, wait_until
from tests.spine.test_graph import job_counts

VERSION = "2026.09.21"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # every test here runs the real graph


def small_experiment(folder: Path, max_steps: int = 4, name: str = "tiny-addition") -> Path:
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["name"] = name
    trainer = doc.setdefault("recipe", {}).setdefault("trainer", {})
    trainer.update({"max_steps": max_steps, "ckpt_interval": 2, "eval_interval": 2})
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Pipeline:
    def __init__(
        self, folder: Path, experiment: Path, extra: list[str] | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.folder, self.experiment = folder, experiment
        self.extra, self.env = extra or [], env or {}
        self.storage = folder / "results"

    @property
    def root(self) -> Path:
        return self.storage / yaml.safe_load(self.experiment.read_text())["name"]

    def run(
        self,
        *options: str,
        targets: tuple[str, ...] = (),
        config: tuple[str, ...] = (),
        timeout: float = 600,
        snakefile: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Targets go after `--`, as they must after list-valued options such as --forcerun and --config."""
        settings = [f"experiment={self.experiment}", f"storage_root={self.storage}", f"versions=['{VERSION}']"]
        command = ["--cores", "2", *self.extra, *options, "--config", *settings, *config, "--", *targets]
        environment = {**self.env, **(env or {})}
        return run_snakemake(command, cwd=self.folder, env=environment, timeout=timeout, snakefile=snakefile)


def ran(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if "Nothing to be done" in result.stdout + result.stderr:
        return {}
    counts = job_counts(result.stdout + result.stderr)
    counts.pop("total", None)
    return counts


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    folder = tmp_path_factory.mktemp("pipeline")
    pipe = Pipeline(folder, small_experiment(folder))
    counts = ran(pipe.run())
    assert counts == {
        k: 1 for k in ("base_model", "stage_model", "stage_data", "resolve_launch", "train", "export", "eval", "all")
    }
    return pipe


def test_every_artifact_kind_is_complete_with_its_identity_record(pipeline: Pipeline) -> None:
    root = pipeline.root
    for folder in ("base_model", "stage/model", "stage/data", "launch", "train", "export", "eval"):
        record = json.loads((root / folder / f"v{VERSION}.identity.json").read_text())
        assert record["version"] == VERSION and record["identity"].startswith("tiny-addition/")
    terminal = json.loads((root / "train" / f"v{VERSION}" / "terminal.json").read_text())
    assert terminal["global_step"] == 4
    # The run's metrics stay with the train artifact, outside the TTL'd tmp/ folder.
    metrics = [json.loads(line) for line in (root / "train" / f"v{VERSION}" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == [0, 1, 2, 3, 4]
    assert {"reward/mean", "policy/kl", "policy/lr", "perf/step_time_s", "eval/accuracy"} <= metrics[2].keys()
    results = json.loads((root / "eval" / f"v{VERSION}" / "results.json").read_text())
    assert 0.0 <= results["accuracy"] <= 1.0 and results["n"] > 0
    assert results["training"]["last_step"] == 4
    assert (root / "eval" / f"v{VERSION}" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = root / "export" / f"v{VERSION}" / "model"
    AutoModelForCausalLM.from_pretrained(export, local_files_only=True)
    AutoTokenizer.from_pretrained(export, local_files_only=True)


def test_the_export_is_a_publishable_model_with_its_card(pipeline: Pipeline) -> None:
    from huggingface_hub import ModelCard

    root = pipeline.root
    export = root / "export" / f"v{VERSION}"
    # The model folder is exactly the model; the manifest and Snakemake's marker sit beside it.
    assert sorted(p.name for p in export.iterdir()) == [".snakemake_timestamp", "manifest.json", "model"]
    model = export / "model"
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md"} <= {
        p.name for p in model.iterdir()
    }
    assert not [p.name for p in model.iterdir() if p.name.startswith(".") or p.name == "manifest.json"]
    launch = yaml.safe_load((root / "launch" / f"v{VERSION}" / "launch.yaml").read_text())
    sampling = launch["recipe"]["generator"]["sampling_params"]
    generation = json.loads((model / "generation_config.json").read_text())
    assert generation["temperature"] == sampling["temperature"] and generation["top_p"] == sampling["top_p"]
    assert generation["max_new_tokens"] == sampling["max_generate_length"] and generation["do_sample"] is True

    card = ModelCard.load(model / "README.md")
    data = card.data
    # The default's base model and data are built in code (artifact:, task:): not Hub repos, so the metadata
    # names none and the body names them with their revisions.
    experiment = yaml.safe_load(pipeline.experiment.read_text())
    assert data.base_model is None and data.datasets is None
    assert f"`{experiment['model']['source']}` @ `{experiment['model']['revision']}`" in card.text
    for split in ("train", "validation"):
        source = experiment["data"][split][0]
        assert f"{split} data: `{source['source']}` @ `{source['revision']}`" in card.text
    assert data.tags == ["rlbuild", "grpo", "reinforcement-learning"]
    assert launch["run"]["fingerprint"] in card.text and launch["runtime"]["source_digest"] in card.text
    assert "- the training loop: synchronous (grpo): each step samples with the weights of the step before" in card.text
    record = json.loads((root / "export" / f"v{VERSION}.identity.json").read_text())
    assert f"identity: `{record['identity']}`" in card.text
    assert "steps: 4 of 4" in card.text and "AutoModelForCausalLM.from_pretrained" in card.text
    (result,) = data.eval_results
    metrics = [json.loads(line) for line in (root / "train" / f"v{VERSION}" / "metrics.jsonl").read_text().splitlines()]
    assert result.metric_type == "accuracy" and result.metric_value == metrics[-1]["eval/accuracy"]
    # The trainer's held-out score at the terminal step is the eval stage's greedy accuracy: the same scorer.
    results = json.loads((root / "eval" / f"v{VERSION}" / "results.json").read_text())
    assert result.metric_value == results["accuracy"]
    # `ref_num_nodes: 0` with colocate_all: the reference lives in the policy's workers; no `license:`: the default,
    # said so; the base model's accuracy is the step-0 eval; the quick start asks the first held-out prompt.
    assert "GPU(s), the reference in the policy's workers, on their GPUs, 1 engine(s)" in card.text
    assert data.license == "other" and "`other`: the default, as the experiment names no `license:`" in card.text
    assert f"the base model, before training: {metrics[0]['eval/accuracy']:.3f} (step 0)" in card.text
    first = json.loads((root / "stage" / "data" / f"v{VERSION}" / "validation" / "0.jsonl").open().readline())
    assert f"inputs = tokenizer({first['prompt']!r}, return_tensors=" in card.text


def test_report_lands_where_it_was_typed_with_the_plot_the_eval_table_and_the_plan(pipeline: Pipeline) -> None:
    """`make main`'s last step: the report opens on the results (its first page: the accuracy before and after
    training, the curves, the eval table, the plan), and the command ends saying them and where everything is."""
    result = pipeline.run("--report", "report.html")  # relative to where snakemake runs, not the experiment root
    assert result.returncode == 0, result.stderr[-3000:]
    html = (pipeline.folder / "report.html").read_text()
    for name in ("curves.png", "results.html", "plan.txt"):
        assert name in html
    assert not (pipeline.root / "report.html").exists()
    results = json.loads((pipeline.root / "eval" / f"v{VERSION}" / "results.json").read_text())
    metrics = [json.loads(line) for line in (pipeline.root / "train" / f"v{VERSION}" / "metrics.jsonl").open()]
    before = metrics[0]["eval/accuracy"]  # the trainer's step-0 eval: the base model, measured
    assert metrics[0]["step"] == 0 and results["training"]["eval_accuracy"]["before_training"] == before
    said = f"held-out greedy accuracy {before:.3f} before training -> {results['accuracy']:.3f} after, on "
    log = (pipeline.root / "logs" / "eval" / f"v{VERSION}.log").read_text()
    assert f"rlbuild eval: tiny-addition v{VERSION}: {said}" in log, log
    last = result.stderr.rstrip().splitlines()[-3:]
    assert last[0].startswith(f"rlbuild: tiny-addition v{VERSION}: {said}"), last
    eval_log = pipeline.root / "logs" / "eval" / f"v{VERSION}.log"
    assert last[1] == f"rlbuild:   eval    {pipeline.root}/eval/v{VERSION}/results.json (its log: {eval_log})", last
    assert last[2] == f"rlbuild:   report  {pipeline.folder / 'report.html'}", last
    first_page = json.loads(re.search(r"var workflow_desc = (\".*?\");\n", html).group(1))
    shown = [
        first_page.index(text)
        for text in (said.replace(">", "&gt;"), "data:image/png;base64,", "accuracy before training")
    ]
    assert shown == sorted(shown) and "rlbuild plan: tiny-addition" in first_page.replace("&#64;", "@"), first_page


def test_nothing_to_do_when_everything_is_built(pipeline: Pipeline) -> None:
    assert ran(pipeline.run()) == {}


def test_forcerun_export_reexports_without_retraining(pipeline: Pipeline) -> None:
    assert ran(pipeline.run("--forcerun", "export", targets=(f"export/v{VERSION}",))) == {"export": 1}


@pytest.mark.parametrize(
    "forcing",
    [("-R", "train"), ("--forcerun", "stage_data"), ("-n", "-R", "train"), ("--forceall",)],
    ids=["rerun-train", "rerun-upstream", "dry-run", "forceall"],
)
def test_forcing_a_completed_fixed_version_to_retrain_is_refused_before_anything_is_deleted(
    pipeline: Pipeline, forcing: tuple[str, ...]
) -> None:
    terminal = pipeline.root / f"train/v{VERSION}/terminal.json"
    before = terminal.read_bytes()
    started = time.monotonic()
    result = pipeline.run(*forcing, targets=(f"export/v{VERSION}",))
    assert result.returncode != 0
    assert time.monotonic() - started < 60
    assert "is a completed training of immutable version" in result.stderr
    assert "--config allow_retrain=true" in result.stderr
    assert "Traceback" not in result.stderr
    assert terminal.read_bytes() == before


def test_a_rerun_trigger_cannot_retrain_a_completed_fixed_version(pipeline: Pipeline) -> None:
    record = pipeline.root / f"launch/v{VERSION}.identity.json"
    terminal = pipeline.root / f"train/v{VERSION}/terminal.json"
    before, original = terminal.read_bytes(), record.read_bytes()
    # A newer input with other bytes: Snakemake's mtime trigger schedules train (the bytes are what it compares).
    record.write_bytes(original + b"\n")
    try:
        result = pipeline.run(targets=(f"export/v{VERSION}",))
        assert result.returncode != 0, result.stdout[-2000:]
        assert "a rerun this invocation scheduled would retrain it" in result.stderr
        assert terminal.read_bytes() == before
    finally:
        record.write_bytes(original)


def test_allow_retrain_retrains_a_completed_fixed_version(pipeline: Pipeline) -> None:
    retrained = pipeline.run(
        "-R", "train", targets=(f"train/v{VERSION}/terminal.json",), config=("allow_retrain=true",)
    )
    assert ran(retrained) == {"train": 1}
    logs = pipeline.root / "tmp" / "ttl=14d" / "train" / f"v{VERSION}" / "attempts" / "logs"
    assert len(list(logs.iterdir())) >= 2  # every attempt's log is kept: the first training and this one


def test_an_edited_file_in_storage_is_detected(pipeline: Pipeline) -> None:
    data = pipeline.root / "stage" / "data" / f"v{VERSION}" / "validation" / "0.jsonl"
    original = data.read_text()
    data.write_text(original + '{"prompt": "1+1=", "answer": "3"}\n')
    try:
        result = pipeline.run("--forcerun", "eval")
        log = (pipeline.root / "logs" / "eval" / f"v{VERSION}.log").read_text()
        assert result.returncode != 0, log
        assert "validation/0.jsonl" in log and "manifest" in log.lower(), result.stderr[-3000:] + log
    finally:
        data.write_text(original)


def test_code_edits_leave_completed_versions_usable(pipeline: Pipeline, tmp_path: Path) -> None:
    """A fresh copy of the code with a comment added to the trainer and the library, and a real change to the
    trainer: the completed version is still complete; dry run, --summary and --report all work."""
    clone = copy_of_the_code(tmp_path / "clone")
    for name in ("trainer/loop.py", "rlbuild/plan/resolve.py"):
        (clone / name).write_text((clone / name).read_text() + "# a comment appended by the test\n")
    grpo = clone / "trainer" / "workers" / "grpo.py"
    grpo.write_text(grpo.read_text() + "UNUSED_BY_TEST = 1\n")
    env = {"PYTHONPATH": str(clone)}
    dry = pipeline.run("-n", targets=(f"export/v{VERSION}",), snakefile=clone / "Snakefile", env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "Nothing to be done" in dry.stdout + dry.stderr
    summary = pipeline.run("--summary", snakefile=clone / "Snakefile", env=env)
    assert summary.returncode == 0 and f"train/v{VERSION}/terminal.json" in summary.stdout, summary.stderr[-3000:]
    report = pipeline.run(
        "--report", "edited.html", targets=(f"export/v{VERSION}",), snakefile=clone / "Snakefile", env=env
    )
    assert report.returncode == 0 and (pipeline.folder / "edited.html").is_file(), report.stderr[-3000:]


def test_delete_all_output_then_rebuild_writes_the_terminal_manifest_without_retraining(pipeline: Pipeline) -> None:
    deleted = pipeline.run("--delete-all-output")
    assert deleted.returncode == 0, deleted.stderr[-3000:]
    terminal = pipeline.root / f"train/v{VERSION}/terminal.json"
    assert not terminal.exists()
    rebuilt = pipeline.run()
    assert ran(rebuilt)["train"] == 1
    log = (pipeline.root / "logs" / "train" / f"v{VERSION}.log").read_text()
    assert "is the completed final step; writing its terminal manifest" in log
    assert "[trainer] step" not in log  # not one step trained again
    assert json.loads(terminal.read_text())["global_step"] == 4


def test_a_training_snakemake_saw_interrupted_is_rewritten_from_its_final_checkpoint(pipeline: Pipeline) -> None:
    """Snakemake killed while its training finished anyway: the job's outputs carry Snakemake's incomplete mark,
    and `--rerun-incomplete` must write the terminal manifest again from the final checkpoint, not be refused as
    a retrain of a completed version (nor retrain it)."""
    terminal = f"train/v{VERSION}/terminal.json"
    incomplete = pipeline.root / ".snakemake" / "incomplete"
    incomplete.mkdir(parents=True, exist_ok=True)
    (incomplete / base64.b64encode(terminal.encode()).decode()).write_text("")  # what a killed Snakemake leaves
    rerun = pipeline.run("--rerun-incomplete", targets=(terminal,))
    assert ran(rerun) == {"train": 1}
    log = (pipeline.root / "logs" / "train" / f"v{VERSION}.log").read_text()
    assert "is the completed final step; writing its terminal manifest" in log and "[trainer] step" not in log


def test_killed_training_resumes_from_the_latest_checkpoint(tmp_path: Path) -> None:
    experiment = small_experiment(tmp_path, max_steps=8, name="resume")
    pipe = Pipeline(tmp_path, experiment)
    target = f"train/v{VERSION}/terminal.json"
    config = ["--config", f"experiment={experiment}", f"storage_root={pipe.storage}"]
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        target,
        "--cores",
        "2",
        *config,
    ]
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    latest = pipe.root / "tmp" / "ttl=14d" / "train" / f"v{VERSION}" / "checkpoints" / "latest"
    deadline = time.monotonic() + 600
    while not latest.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert latest.exists(), "training never wrote a checkpoint"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (pipe.root / target).exists()

    assert pipe.run("--unlock").returncode == 0  # a killed Snakemake leaves its lock behind
    resumed = pipe.run("--rerun-incomplete", targets=(target,))
    assert ran(resumed) == {"train": 1}
    terminal = json.loads((pipe.root / target).read_text())
    assert terminal["global_step"] == 8
    log = (pipe.root / "logs" / "train" / f"v{VERSION}.log").read_text()
    assert "resum" in log.lower()
    # Snakemake's log holds the last attempt; storage keeps both, the killed one up to its last flush.
    attempts = pipe.root / "tmp" / "ttl=14d" / "train" / f"v{VERSION}" / "attempts" / "logs"
    logs = sorted(read_stream(str(folder)) or "" for folder in attempts.iterdir())
    assert len(logs) == 2 and any("resumed from" in text for text in logs)


def test_the_same_graph_on_s3_storage(tmp_path: Path, s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    experiment = small_experiment(tmp_path, max_steps=2)
    storage = ["--default-storage-provider", "s3", "--default-storage-prefix", f"s3://{bucket}/rlbuild"]
    pipe = Pipeline(tmp_path, experiment, extra=storage, env=s3_server.env())
    # The kill matrix's S3 row of the checkpoint: SIGKILL of the run's group while a checkpoint uploads, then the
    # README's recovery (`--unlock`, `--rerun-incomplete`) completes the graph without anything removed by hand.
    _killed_mid_upload(pipe, s3_server, "/checkpoints/global_step_2/")
    assert pipe.run("--unlock").returncode == 0
    counts = ran(pipe.run("--rerun-incomplete"))
    assert counts["train"] == 1 and counts["eval"] == 1
    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3_server.endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    )
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="rlbuild/tiny-addition/")["Contents"]}
    prefix = "rlbuild/tiny-addition"
    assert f"{prefix}/train/v{VERSION}/terminal.json" in keys
    assert f"{prefix}/train/v{VERSION}/metrics.jsonl" in keys
    assert any(k.startswith(f"{prefix}/tmp/ttl=14d/train/v{VERSION}/metrics/attempt-000001/") for k in keys)
    assert f"{prefix}/eval/v{VERSION}/results.json" in keys
    assert f"{prefix}/export/v{VERSION}/model/model.safetensors" in keys
    assert f"{prefix}/export/v{VERSION}/model/README.md" in keys
    assert any(k.startswith(f"{prefix}/tmp/ttl=14d/train/v{VERSION}/checkpoints/global_step_2/") for k in keys)
    assert ran(pipe.run("--forcerun", "eval")) == {"eval": 1, "all": 1}
    # The export's row: killed while Snakemake uploads the export's folder (its third file stalls).
    _killed_mid_upload(pipe, s3_server, f"/export/v{VERSION}/model/", "--forcerun", "export")
    assert pipe.run("--unlock").returncode == 0
    assert ran(pipe.run("--rerun-incomplete")) == {"export": 1, "eval": 1, "all": 1}
    leases = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/.leases/").get("Contents", [])
    assert not leases, "no lease outlives a run"


def _killed_mid_upload(pipe: Pipeline, s3_server: S3Server, fragment: str, *options: str) -> None:
    """Run the graph through a proxy that stalls PUTs under `fragment` from the third on, and SIGKILL the run's
    whole process group once one stalls."""
    settings = [f"experiment={pipe.experiment}", f"storage_root={pipe.storage}", f"versions=['{VERSION}']"]
    with s3_proxy(s3_server.endpoint) as proxy:
        proxy.fault = Fault("PUT", fragment, "stall", after=2)
        env = {**os.environ, **s3_server.env(), "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": proxy.url}
        command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "2"]
        command += [*pipe.extra, *options, "--config", *settings]
        process = subprocess.Popen(
            command,
            cwd=pipe.folder,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert wait_until(lambda: proxy.fault.hits >= 1 or process.poll() is not None, 600)
        assert process.poll() is None, f"the run ended before an upload under {fragment} stalled"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def test_a_hostile_experiment_path_runs_nothing_but_the_build(tmp_path: Path) -> None:
    """Every value reaches the shell quoted: `$(...)` in a file name and spaces in paths are just characters."""
    folder = tmp_path / "dir with spaces"
    folder.mkdir()
    hostile = folder / "inj$(touch${IFS}PWNED).yaml"
    hostile.write_text(small_experiment(tmp_path).read_text())
    storage = folder / "results here"
    target = f"stage/data/v{VERSION}"
    config = ["--config", f"experiment={hostile}", f"storage_root={storage}"]
    result = run_snakemake(["--cores", "2", *config, "--", target], cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (storage / "tiny-addition" / f"{target}.identity.json").is_file()
    assert not list(tmp_path.rglob("PWNED")) and not (REPO / "PWNED").exists()


def test_status_reports_every_artifact_of_a_completed_run_done(pipeline: Pipeline) -> None:
    argv = [sys.executable, "-m", "rlbuild", "status", "--experiment", str(pipeline.experiment)]
    argv += ["--storage-root", str(pipeline.storage), "--version", VERSION]
    result = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=120, check=True, cwd=REPO)
    document = json.loads(result.stdout)
    kinds = document["versions"][VERSION]
    assert list(kinds) == ["base_model", "stage_model", "stage_data", "launch", "train", "export", "eval"]
    assert {kind: entry["state"] for kind, entry in kinds.items()} == dict.fromkeys(kinds, "done")
    assert document["experiment"] == "tiny-addition" and document["verdict"] == "done"
    text = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True, cwd=REPO).stdout
    assert text.count(" done ") == 7 and text.rstrip().endswith("verdict: done"), text


def _edit_in_place(path: Path, old: str, new: str) -> bytes:
    """Replace `old` by `new` in `path` keeping its mtime (no rerun trigger sees it); return the original bytes."""
    original, stat = path.read_bytes(), path.stat()
    assert old.encode() in original, f"{old!r} not in {path}"
    path.write_bytes(original.replace(old.encode(), new.encode(), 1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return original


def _restore(path: Path, original: bytes) -> None:
    stat = path.stat()
    path.write_bytes(original)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _assert_status_shows_corrupt(pipeline: Pipeline, kind: str, name: str) -> None:
    argv = [sys.executable, "-m", "rlbuild", "status", "--experiment", str(pipeline.experiment), "--json"]
    argv += ["--storage-root", str(pipeline.storage), "--version", VERSION]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    document = json.loads(result.stdout)
    entry = document["versions"][VERSION][kind]
    assert entry["state"] == "corrupt" and name in entry["verdict"], entry
    assert document["verdict"].startswith("corrupt: ") and name in document["verdict"]


def test_every_edited_control_document_is_refused_by_the_next_reader_naming_it(pipeline: Pipeline) -> None:
    """Last in the module: the refused stages leave export and eval to be built again.

    Each edit keeps the file's mtime, as a hand edit with `touch -r` or a bit flip would. The dry run and
    `rlbuild check` of the completed fixed version refuse every one, naming the file and the way out, as status
    names it corrupt; the stage that reads the document refuses it too (eval the launch document and the run's
    metrics, export terminal.json)."""
    root = pipeline.root
    for kind in ("launch", "train", "export"):
        record = root / f"{kind}/v{VERSION}.identity.json"
        original = _edit_in_place(record, '"version": "2026.09.21"', '"version": "2026.09.22"')
        try:
            dry = pipeline.run("-n", targets=(f"eval/v{VERSION}/results.json",))
            assert dry.returncode != 0, dry.stdout[-2000:]
            assert f"{kind}/v{VERSION}.identity.json is corrupt: its content no longer matches its seal" in dry.stderr
            assert "Traceback" not in dry.stderr
            _assert_status_shows_corrupt(pipeline, kind, f"{kind}/v{VERSION}.identity.json")
        finally:
            _restore(record, original)
    edits = [
        ("eval", f"launch/v{VERSION}/launch.yaml", "max_steps: 4", "max_steps: 5"),
        ("eval", f"train/v{VERSION}/metrics.jsonl", '"step": 4', '"step": 5'),
        ("export", f"train/v{VERSION}/terminal.json", '"global_step": 4', '"global_step": 5'),
    ]
    for rule, name, old, new in edits:
        document = root / name
        original = _edit_in_place(document, old, new)
        try:
            _assert_status_shows_corrupt(pipeline, name.split("/")[0], name)
            dry = pipeline.run("-n", targets=(f"eval/v{VERSION}/results.json",))
            assert dry.returncode != 0, dry.stdout[-2000:]
            assert f"{name} is corrupt: its sha256 is" in dry.stderr and "its record says" in dry.stderr, dry.stderr
            assert "restore it, or delete the artifact's record" in dry.stderr and "Traceback" not in dry.stderr
            if rule == "eval":  # `rlbuild check` refuses as the dry run does: bad input, exit 2
                check = _rlbuild(
                    "check", str(pipeline.experiment), "--version", VERSION, "--storage-root", str(pipeline.storage)
                )
                assert check.returncode == 2 and f"{name} is corrupt: its sha256 is" in check.stderr, check.stderr
            refused = _next_reader(pipeline, rule)
            assert refused.returncode != 0 and f"{name} is corrupt: its sha256 is" in refused.stderr, refused.stderr
            assert "Traceback" not in refused.stderr
        finally:
            _restore(document, original)


def _rlbuild(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlbuild", *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO
    )


def _next_reader(pipeline: Pipeline, rule: str) -> subprocess.CompletedProcess[str]:
    """The rule's own command, as its shell runs it, writing into a scratch folder (the graph refuses earlier)."""
    root, scratch = pipeline.root, pipeline.folder / f"next-{rule}"
    launch = ["--launch", str(root / f"launch/v{VERSION}/launch.yaml")]
    launch += ["--launch-record", str(root / f"launch/v{VERSION}.identity.json")]
    if rule == "eval":
        inputs = ["--model", str(root / f"export/v{VERSION}"), "--data", str(root / f"stage/data/v{VERSION}")]
    else:
        inputs = ["--terminal", str(root / f"train/v{VERSION}/terminal.json")]
        inputs += ["--model-record", str(root / f"stage/model/v{VERSION}.identity.json")]
        inputs += ["--data-record", str(root / f"stage/data/v{VERSION}.identity.json"), "--license", "other"]
    return _rlbuild(rule, *launch, *inputs, "--out", str(scratch / "out"), "--record", str(scratch / "record.json"))
