"""The command line's conventions: --version, what the help lists, Ctrl-C, exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from rlbuild.core import storage
from tests.conftest import REPO, run_snakemake


def rlbuild(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlbuild", *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def test_version_prints_the_package_version() -> None:
    result = rlbuild("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"rlbuild {version('rlbuild')}")
    # `--version` of a subcommand is still the experiment's version.
    assert "YYYY.MM.DD" in rlbuild("check", "--help").stdout


def test_help_lists_the_commands_people_run_and_not_the_rules_subcommands() -> None:
    text = rlbuild("--help").stdout
    assert "{check,status,compare,submit,cancel,lease}" in text and "Exit codes: 0 done, 2 bad input" in text
    listed = text.split("positional arguments:")[1].split("options:")[0]
    commands = [line.split()[0] for line in listed.splitlines() if line.startswith("    ") and line[4] != " "]
    assert commands == ["check", "compare", "status", "submit", "cancel", "lease"]
    assert rlbuild("export", "--help").returncode == 0  # still callable by the rules


def test_ctrl_c_on_status_watch_ends_by_sigint_without_a_traceback(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "rlbuild", "status", "--storage-root", str(tmp_path), "--watch", "30"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal delivers it: a test suite started in the background (no job control) ignores
        # SIGINT, and a child would inherit that and never see the interrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # the first refresh has been printed: it sleeps until the next
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert first and process.returncode == -signal.SIGINT  # a shell's 130
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr


def test_every_rule_explains_itself_and_the_lint_finds_only_the_documented_exemption(tmp_path: Path) -> None:
    config = ["--config", f"storage_root={tmp_path / 'results'}"]
    listed = run_snakemake(["--list-rules", *config], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    rules = [line for line in listed.stdout.splitlines() if line and not line.startswith(" ")]
    assert len(rules) == 11 and all(" (" in line for line in rules), rules  # `name (docstring)` for every rule
    lint = run_snakemake(["--lint", *config], cwd=tmp_path)
    findings = {line.strip() for line in (lint.stdout + lint.stderr).splitlines() if line.strip().startswith("* ")}
    # docs/design.md: the software of every rule is the one locked uv environment, not a per-rule conda env.
    assert findings == {"* Specify a conda environment or container for each rule.:"}


def test_missing_settings_of_a_command_are_bad_input_exit_2_all_named_at_once() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SNAKEMAKE_IRIS_CONTROLLER_URL", "RLBUILD_BUCKET")}
    result = subprocess.run(
        [sys.executable, "-m", "rlbuild", "cancel"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert (
        "--iris-controller-url: no Iris controller" in result.stderr
        and "--storage-root: no storage root" in result.stderr
    )


def test_an_experiment_name_selects_its_file_even_beside_a_folder_of_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlbuild.workflow import experiment_file

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "tiny-addition").mkdir()  # what a local storage root in the working directory holds
    monkeypatch.chdir(tmp_path)
    assert experiment_file(repo, "tiny-addition") == repo / "config" / "experiments" / "tiny-addition.yaml"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://...", "names no host"),
        ("...", "is not an http:// or https:// URL"),
        ("s3.example.com", "is not an http:// or https:// URL"),
        ("http://localhost:99999", "is not a URL"),
        ("http://127.0.0.1:9000", None),
        ("https://s3.us-east-1.amazonaws.com", None),
        ("http://[::1]:9000", None),
    ],
)
def test_an_endpoint_is_a_url_of_a_host(url: str, problem: str | None) -> None:
    found = storage.endpoint_problem(url)
    assert (found is None) if problem is None else (problem in str(found))


def test_the_readme_s_placeholders_are_refused_in_one_line_each(tmp_path: Path) -> None:
    """The README's Iris block typed with its `...`: bad input, exit 2, one line naming what to fix, no traceback."""
    env = {**os.environ, "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": "http://..."}
    status = subprocess.run(
        [sys.executable, "-m", "rlbuild", "status", "--storage-root", "s3://bucket/p"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert status.returncode == 2, status.stderr
    assert "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL: 'http://...' names no host" in status.stderr
    assert "Traceback" not in status.stderr
    env = {"SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": "http://127.0.0.1:9", "SNAKEMAKE_STORAGE_S3_ACCESS_KEY": "k"}
    env["SNAKEMAKE_STORAGE_S3_SECRET_KEY"] = "s"
    dry = run_snakemake(
        ["-n", "--default-storage-provider", "s3", "--default-storage-prefix", "s3://.../p"], cwd=tmp_path, env=env
    )
    assert dry.returncode != 0
    assert "the default storage prefix 's3://.../p' cannot be used: '...' is not a bucket name" in dry.stderr
    assert "Traceback" not in dry.stderr


# What a person mistypes at each command `rlbuild --help` lists: each is bad input (exit 2, README), in one line.
BAD_INPUT = {
    "check": ["check", "tiny-additon"],
    "compare": ["compare", "tiny-addition"],  # not a series
    "status": ["status", "export/2026.09.21"],  # no `v`
    "submit": ["submit"],  # no controller, no storage root
    "cancel": ["cancel", "--storage-root", "s3://"],
    "lease": ["lease", "break", "train/2026.09.21"],  # no `v`
}


def test_every_command_people_run_refuses_bad_input_with_exit_2_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlbuild.cli import PEOPLE_VERBS, main

    assert set(BAD_INPUT) == set(PEOPLE_VERBS.strip("{}").split(","))  # a new command needs its case here
    for name in ("SNAKEMAKE_IRIS_CONTROLLER_URL", "RLBUILD_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    for argv in [*BAD_INPUT.values(), ["status", "--watch", "soon"], ["check", "--storage-root", "README.md"]]:
        try:
            code = main(argv)
        except SystemExit as stop:  # argparse's own refusal of an option's value
            code = stop.code
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        problems = [line for line in err.splitlines() if line.startswith("  - ") or "error:" in line]
        assert len(problems) >= 1 and "Traceback" not in err, (argv, err)
        if argv == BAD_INPUT["check"]:  # a mistyped experiment: the closest name, and every one that exists
            known = ", ".join(sorted(p.stem for p in (REPO / "config" / "experiments").glob("*.yaml")))
            assert f"did you mean 'tiny-addition'? known experiments: {known}" in err


def test_a_storage_root_is_judged_without_being_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlbuild.cli import main

    new = tmp_path / "not" / "yet"
    assert main(["check", "--storage-root", str(new)]) == 0 and not (tmp_path / "not").exists()
    assert main(["check", "--storage-root", "/proc/nope"]) == 2
    assert "'/proc/nope' cannot be created: /proc is not writable" in capsys.readouterr().err
    dry = run_snakemake(["-n", "--config", "storage_root=/proc/nope"], cwd=tmp_path)
    assert dry.returncode == 2 and "Traceback" not in dry.stderr, dry.stderr[-2000:]
    assert "config.storage_root" in dry.stderr and "'/proc/nope' cannot be created" in dry.stderr
    from rlbuild.core.errors import PreflightError
    from rlbuild.workflow import workflow_config

    with pytest.raises(PreflightError, match="'s3://bucket/p' is a URL"):  # joined to the repository: a folder `s3:`
        workflow_config({"experiment": "tiny-addition", "versions": ["dev"], "storage_root": "s3://bucket/p"})


def test_a_local_plan_prints_only_what_is_true_of_a_local_run(capsys: pytest.CaptureFixture[str]) -> None:
    """tiny-addition declares execution.slurm: its lines belong to `--profile slurm`, Iris's placement to iris."""
    from rlbuild.cli import main

    plans = {}
    for profile in ([], ["--profile", "slurm"], ["--profile", "iris"]):
        assert main(["check", *profile]) == 0
        plans[" ".join(profile)] = capsys.readouterr().out
    local = plans[""]
    assert "  allocation     1 node x 1 CPU rank\n" in local  # gpu_variant: cpu holds no GPUs; no node sizes asked
    for foreign in ("  slurm ", "  chain ", "  shared disk ", "  iris "):
        assert foreign not in local
    assert "  slurm " in plans["--profile slurm"] and "  chain " in plans["--profile slurm"]
    assert "  iris " not in plans["--profile slurm"]
    iris = plans["--profile iris"]
    assert "  iris           cluster local, priority interactive, retries 1; per node cpu 4.0, memory 8GB" in iris
    assert "  slurm " not in iris
    # The dry run (tests/test_readme.py: `snakemake -n`) names the same terminal stage: one function decides it.
    assert all(text.rstrip().endswith("  terminal stage eval") for text in plans.values())


def test_the_terminal_stage_is_what_the_targets_ask_of_the_version() -> None:
    from rlbuild.contracts.artifacts import terminal_stage

    assert terminal_stage([], "2026.09.21") == terminal_stage(["all"], "2026.09.21") == "eval"
    assert terminal_stage(["export/v2026.09.21", "train/v2026.09.21/terminal.json"], "2026.09.21") == "export"


def test_an_s3_endpoint_that_refuses_at_once_is_not_reported_as_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": "http://127.0.0.1:9",  # the discard port: nothing listens
        "SNAKEMAKE_STORAGE_S3_ACCESS_KEY": "k",
        "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "s",
        "RLBUILD_S3_ATTEMPTS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(storage.StorageUnavailableError) as refused:
        storage.exists("s3://bucket/p/a.json")
    assert "refused each of 1 attempt(s) at once" in str(refused.value)
    assert "did not answer within" not in str(refused.value)


def test_status_asks_for_no_credential_that_only_the_jobs_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`logger: wandb` without WANDB_API_KEY: the jobs would need the key, so a run is refused naming it, but
    `rlbuild status` reads storage only and answers."""
    from rlbuild.cli import main
    from rlbuild.core.errors import PreflightError
    from rlbuild.plan.preflight import load_experiment
    from rlbuild.plan.resolve import resolve

    doc = yaml.safe_load((REPO / "config" / "experiments" / "tiny-addition.yaml").read_text())
    doc.setdefault("recipe", {}).setdefault("trainer", {})["logger"] = "wandb"
    path = tmp_path / "wandb.yaml"
    path.write_text(yaml.safe_dump(doc))
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(PreflightError, match="WANDB_API_KEY"):
        resolve(load_experiment(path), "2026.09.21", str(tmp_path))
    code = main(["status", "--experiment", str(path), "--storage-root", str(tmp_path), "--version", "2026.09.21"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "verdict: 7 of 7 artifacts not built" in out.out and "WANDB" not in out.out + out.err
