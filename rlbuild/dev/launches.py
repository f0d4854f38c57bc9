"""Launch documents for the trainer's tests and the benchmarks, made the way the graph makes them.

`write_test_launch(tmp_path, ...)` writes a small experiment (the tiny default's shape), stages the tiny base
model and a built-in task's rows with rlbuild's own staging code, resolves the version with rlbuild's own
builder, and writes `launch.yaml` under tmp_path. Role-plan changes go into `role_plan`/`topology`, recipe
changes into `recipe`, as in an experiment file. The base model and the task rows come from the trainer's
command line (`python -m trainer base-model`, `make-data`), as in the graph: rlbuild never imports the trainer.
Both are cached in the temp folder, keyed by the trainer source that makes them.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rlbuild.contracts.launch import dump_launch
from rlbuild.contracts.sources import parse_source
from rlbuild.contracts.tinymodel import DEFAULT_VARIANT
from rlbuild.core import storage
from rlbuild.plan.preflight import parse_experiment
from rlbuild.plan.resolve import resolve
from rlbuild.plan.series import deep_merge
from rlbuild.stages.basemodel import build_or_copy, cache_folder, cache_key
from rlbuild.stages.staging import stage_data, stage_model

REPO = Path(__file__).resolve().parents[2]
SPLITS = ("train", "validation")
TEST_ROLE_PLAN: dict[str, Any] = {
    "train_batch_size": 4,
    "policy_mini_batch_size": 4,
    "micro_train_batch_size_per_gpu": 16,
    "n_samples_per_prompt": 8,
}
TEST_RECIPE: dict[str, Any] = {
    "trainer": {"max_steps": 2, "ckpt_interval": 1, "eval_interval": -1, "eval_before_train": False},
}


def _trainer(*argv: str) -> None:
    result = subprocess.run([sys.executable, "-m", "trainer", *argv], capture_output=True, text=True, check=False)
    if result.returncode:
        raise RuntimeError(f"python -m trainer {' '.join(argv)} failed:\n{result.stderr[-3000:]}")


def _cached(name: str, sources: tuple[Path, ...], make: Callable[[Path], None]) -> Path:
    """A file or folder made once per content of `sources`, in the temp folder (atomically: concurrent test
    processes keep one copy)."""
    key = hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"rlbuild-{name}-{key}"
    if not target.exists():
        partial = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=target.parent))
        make(partial)
        try:
            partial.rename(target)
        except OSError:  # another test process finished first; use its copy
            shutil.rmtree(partial, ignore_errors=True)
    return target


def base_model_dir(seed: int = 0, variant: str = DEFAULT_VARIANT) -> Path:
    """The tiny warm-started base model `variant` of `seed`, in the base_model stage's cache (the suite's folder,
    else the temp folder's): built once per digest of what builds it, the copy every graph of the session takes too."""
    folder = cache_folder() or Path(tempfile.gettempdir()) / "rlbuild-base-models"

    def build(out: Path) -> int:
        _trainer("base-model", "--out", str(out), "--seed", str(seed), "--variant", variant)
        return 0

    kept = folder / cache_key(seed, variant)
    if not kept.is_dir():
        with tempfile.TemporaryDirectory(prefix="rlbuild-base-model-") as scratch:
            build_or_copy(Path(scratch) / "model", seed, variant, build, folder)
    return kept


def experiment_document(
    sources: Path,
    *,
    task: str = "addition",
    seed: int = 0,
    data_seed: int | None = None,
    recipe: dict[str, Any] | None = None,
    role_plan: dict[str, Any] | None = None,
    topology: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
    retention: dict[str, Any] | None = None,
    execution: dict[str, Any] | None = None,
    model_dir: Path | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An experiment document: the tiny default's shape, local sources under `sources`, the test batch sizes.

    The task's split is revision `seed-<data_seed>` (default: the seed), the base model that of `seed` (or the HF
    folder `model_dir`); `data`, when given, is the experiment's data section as it stands (a Harbor task set).
    """
    doc = yaml.safe_load((REPO / "config" / "experiments" / "tiny-addition.yaml").read_text())
    model = f"local:{model_dir or base_model_dir(seed)}"
    data_seed = seed if data_seed is None else data_seed
    doc.update(name="test", seed=seed)
    doc["model"] = {"source": model, "revision": "tiny", "tokenizer": {"source": model, "revision": "tiny"}}
    doc["data"] = data or {
        split: [{"source": f"local:{_task_file(sources, task, split, data_seed)}", "revision": f"seed-{data_seed}"}]
        for split in SPLITS
    }
    doc["role_plan"] = {**doc["role_plan"], **TEST_ROLE_PLAN, **(role_plan or {})}
    doc["topology"] = {**doc["topology"], **(topology or {})}
    doc["runtime"] = {**doc["runtime"], **(runtime or {})}
    doc["retention"] = {**doc["retention"], **(retention or {})}
    doc["execution"] = {**doc["execution"], **(execution or {})}
    doc["recipe"] = deep_merge(TEST_RECIPE, recipe or {})
    return doc


def _task_file(folder: Path, task: str, split: str, seed: int) -> Path:
    """The task's rows of one split, generated by the trainer once per tasks.py source, copied under `folder`."""
    name = f"{task}-{split}-seed-{seed}"
    make = ["make-data", "--task", task, "--split", split, "--revision", f"seed-{seed}", "--out"]
    sources = (REPO / "trainer" / "tasks.py", REPO / "trainer" / "agents" / "find_key.py")
    rows = _cached(name, sources, lambda out: _trainer(*make, str(out / "rows.jsonl")))
    path = folder / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(rows / "rows.jsonl", path)
    return path


def write_test_launch(tmp_path: Path, *, version: str = "dev", storage_root: str | None = None, **changes: Any) -> Path:
    """Stage the tiny model and task data, resolve the launch document, write it under tmp_path; returns its path.

    Artifacts go under `storage_root` (a local folder or s3:// URI; default: tmp_path/storage)."""
    root = Path(tmp_path).resolve()
    experiment = parse_experiment(experiment_document(root / "sources", **changes), "test experiment")
    plan = resolve(experiment, version, storage_root or str(root / "storage"))
    model, data = experiment.model, experiment.data
    staged = root / "staged"
    stage_model(
        parse_source(model.source, model.revision),
        parse_source(model.tokenizer.source, model.tokenizer.revision),
        staged / "model",
    )
    stage_data(
        [parse_source(d.source, d.revision) for d in data.train],
        [parse_source(d.source, d.revision) for d in data.validation],
        staged / "data",
    )
    storage.put_dir(staged / "model", plan.launch.inputs.model.uri)
    storage.put_dir(staged / "data", plan.launch.inputs.train_data[0].uri.rsplit("/", 2)[0])
    path = root / "launch.yaml"
    path.write_text(dump_launch(plan.launch))
    return path


def write_shipped_launch(
    tmp_path: Path,
    name: str,
    *,
    seed: int | None = None,
    recipe: dict[str, Any] | None = None,
    role_plan: dict[str, Any] | None = None,
    model_dir: Path | None = None,
    **changes: Any,
) -> Path:
    """The shipped experiment `config/experiments/<name>.yaml` as a trainer's launch (write_test_launch): its seed
    (or `seed`), task and split, role plan (with `role_plan` over it) and recipe (with `recipe` merged over it), on
    the seed's base model of the variant its model revision names (or the HF folder `model_dir`); `changes` (a
    `topology`, a `runtime`) go over experiment_document's."""
    experiment = yaml.safe_load((REPO / "config" / "experiments" / f"{name}.yaml").read_text())
    train = experiment["data"]["train"][0]
    seed = experiment["seed"] if seed is None else seed
    generated = train["source"].startswith("task:")  # else the experiment's own data (a Harbor task set)
    return write_test_launch(
        tmp_path,
        task=train["source"].removeprefix("task:").split("/")[0],
        seed=seed,
        data_seed=int(train["revision"].removeprefix("seed-")) if generated else None,
        data=None if generated else experiment["data"],
        role_plan={**experiment["role_plan"], **(role_plan or {})},
        recipe=deep_merge(experiment["recipe"], recipe or {}),
        model_dir=model_dir or base_model_dir(seed, experiment["model"]["revision"]),
        **changes,
    )
