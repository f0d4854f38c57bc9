"""Export: the terminal checkpoint's HF model folder (safetensors, config, tokenizer), verified and copied.

The trainer writes `global_step_N/policy/` as a complete HF folder and hashes it into the checkpoint's manifest;
terminal.json names the folder (`hf_path`) and the manifest's digest. Exporting never retrains or re-serialises:
it copies the payload, checking every file against the manifest on the way (a flipped bit is a corruption error
naming the file, never an export), sets `generation_config.json` to the run's rollout sampling, adds the model
card the caller built (`--card`), and writes the export's own manifest for the stages that read it.

The export folder holds the model in `model/` (exactly what a person loads or publishes) and the manifest beside
it (`manifest.json`, covering `model/`), where Snakemake's `.snakemake_timestamp` of the directory output also
lands. The caller writes its record afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rlbuild.contracts.artifacts import EXPORT_MODEL
from rlbuild.contracts.checkpoints import HF_FOLDER
from rlbuild.contracts.launch import LaunchDocument, load_launch
from rlbuild.contracts.manifest import (
    ManifestError,
    fetch_verified,
    manifest_digest,
    read_manifest,
    subtree,
    write_manifest,
)
from rlbuild.core import storage
from trainer.errors import TrainerError

REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
GENERATION_CONFIG = "generation_config.json"
CARD = "README.md"


class ExportError(TrainerError):
    """The terminal checkpoint cannot be exported."""


def generation_config(launch: LaunchDocument, base: dict[str, Any]) -> dict[str, Any]:
    """`generation_config.json`: the model's own (`base`: bos/eos/pad ids) with the run's rollout sampling."""
    sampling = launch.recipe.generator.sampling_params
    return base | {
        "do_sample": sampling.temperature > 0,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": max(sampling.top_k, 0),  # the recipe's -1 (disabled) is transformers' 0
        "max_new_tokens": sampling.max_generate_length,
    }


def _publishable(launch: LaunchDocument, model: Path, card: Path | None) -> None:
    """The verified copy made a model to publish: the run's sampling settings and the model card."""
    path = model / GENERATION_CONFIG
    base = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(generation_config(launch, base), indent=2, sort_keys=True) + "\n")
    if card is not None:
        shutil.copyfile(card, model / CARD)


def export(launch: LaunchDocument, terminal_uri: str, out: str, card: Path | None = None) -> Path | str:
    text = storage.read_text(terminal_uri)
    if text is None:
        raise ExportError(f"--terminal {terminal_uri} does not exist: train this version first (the train rule)")
    terminal = json.loads(text)
    hf_uri, checkpoint = terminal.get("hf_path"), terminal.get("checkpoint_path")
    if not hf_uri or not checkpoint or hf_uri != storage.join(checkpoint, HF_FOLDER):
        raise ExportError(
            f"{terminal_uri} names no checkpoint with an HF folder (checkpoint_path, hf_path); it was not written by "
            "this trainer. Retrain the version."
        )
    checkpoint_root = launch.artifacts.checkpoint_root
    if not hf_uri.startswith(checkpoint_root):
        raise ExportError(
            f"{terminal_uri} names hf_path {hf_uri}, outside this launch's checkpoint_root {checkpoint_root}; "
            "the terminal manifest and launch document belong to different runs"
        )
    try:
        manifest = read_manifest(checkpoint)
    except ManifestError as error:
        raise ExportError(
            f"{error} If the checkpoint expired (temporary storage TTL), retrain (a new version, or --allow-retrain)."
        ) from None
    if manifest_digest(manifest) != terminal.get("checkpoint_manifest_sha256"):
        raise ExportError(
            f"the manifest of {checkpoint} is not the one {terminal_uri} recorded when training finished: the "
            "checkpoint was replaced or altered since. Retrain the version (a new version, or --allow-retrain)."
        )
    files = subtree(manifest["files"], HF_FOLDER)
    missing = [name for name in REQUIRED if name not in files]
    if missing:
        raise ExportError(f"{hf_uri} lacks {missing}; it is not a Hugging Face model folder. Retrain the version.")
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        local = Path(tmp) / "export"
        _publishable(launch, fetch_verified(hf_uri, files, local / EXPORT_MODEL), card)
        write_manifest(local)
        storage.put_dir(local, out)
    return out


def add_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export", help="write the terminal checkpoint's HF model folder to --out")
    parser.add_argument("--launch", required=True, type=Path)
    parser.add_argument("--terminal", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--card", type=Path, help="the model card (README.md) to put in the model folder")

    def run(args: argparse.Namespace) -> int:
        exported = export(load_launch(str(args.launch)), args.terminal, args.out, args.card)
        print(f"[trainer] exported to {exported}")
        return 0

    parser.set_defaults(func=run)
