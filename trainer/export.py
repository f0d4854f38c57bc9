"""Export: the terminal checkpoint's HF model folder (safetensors, config, tokenizer), copied to a target.

The trainer writes `global_step_N/policy/` as a complete HF folder, and terminal.json names it (`hf_path`),
so exporting never retrains or re-serialises: it copies the payload. The caller writes its record afterwards.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rlbuild import storage
from rlbuild.launch import LaunchDocument, load_launch
from trainer.errors import TrainerError

REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


class ExportError(TrainerError):
    """The terminal checkpoint cannot be exported."""


def export(launch: LaunchDocument, terminal_uri: str, out: str) -> Path | str:
    text = storage.read_text(terminal_uri)
    if text is None:
        raise ExportError(f"--terminal {terminal_uri} does not exist: train this version first (the train rule)")
    manifest = json.loads(text)
    hf_uri = manifest.get("hf_path")
    if not hf_uri:
        raise ExportError(f"{terminal_uri} has no hf_path; it was not written by this trainer. Retrain the version.")
    checkpoint_root = launch.artifacts.checkpoint_root
    if not hf_uri.startswith(checkpoint_root):
        raise ExportError(
            f"{terminal_uri} names hf_path {hf_uri}, outside this launch's checkpoint_root {checkpoint_root}; "
            "the terminal manifest and launch document belong to different runs"
        )
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        local = storage.get_dir(hf_uri, Path(tmp) / "policy")
        missing = [name for name in REQUIRED if not (Path(local) / name).exists()]
        if missing:
            raise ExportError(
                f"{hf_uri} lacks {missing}; the checkpoint may have expired (temporary storage TTL). Retrain with "
                "--allow-retrain or a new version."
            )
        storage.put_dir(Path(local), out)
    return out


def add_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export", help="write the terminal checkpoint's HF model folder to --out")
    parser.add_argument("--launch", required=True, type=Path)
    parser.add_argument("--terminal", required=True)
    parser.add_argument("--out", required=True)

    def run(args: argparse.Namespace) -> int:
        print(f"[trainer] exported to {export(load_launch(str(args.launch)), args.terminal, args.out)}")
        return 0

    parser.set_defaults(func=run)
