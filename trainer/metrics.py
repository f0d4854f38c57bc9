"""Per-step metrics: `metrics.jsonl` beside the checkpoints, a console line, and W&B when configured.

The file is rewritten whole each step (S3 has no append); on resume, lines after the resumed step are dropped
so the file always describes one consistent run.

W&B (`trainer.logger: wandb`) reads its usual environment: online it needs WANDB_API_KEY; with WANDB_MODE=offline
it needs no account or network and writes `wandb/offline-run-*` under WANDB_DIR (default: the working directory),
which `wandb sync` uploads later.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rlbuild.redact import redact_text
from trainer import storage

CONSOLE_KEYS = ("reward_mean", "eval_accuracy", "kl", "entropy", "grad_norm", "step_time_s")


class MetricsWriter:
    def __init__(
        self, uri: str, resume_step: int, logger: str, project: str, run_id: str, config: dict[str, Any]
    ) -> None:
        self.uri = uri
        self.lines: list[str] = []
        existing = storage.read_text(uri) or ""
        for line in existing.splitlines():
            if line.strip() and json.loads(line).get("step", 0) <= resume_step:
                self.lines.append(line)
        self.wandb = _wandb_run(project, run_id, config) if logger == "wandb" else None

    def log(self, step: int, values: dict[str, Any], max_steps: int) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in values.items()}}
        self.lines.append(json.dumps(record))
        storage.write_text(self.uri, "\n".join(self.lines) + "\n")
        shown = " ".join(f"{k}={record[k]:.4g}" for k in CONSOLE_KEYS if isinstance(record.get(k), float | int))
        print(f"[trainer] step {step}/{max_steps} {shown}", file=sys.stderr, flush=True)
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_run(project: str, run_id: str, config: dict[str, Any]) -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise RuntimeError(
            "trainer.logger=wandb but the wandb package is not installed; run scripts/setup.sh "
            "or set trainer.logger: console"
        ) from exc
    root = os.environ.get("WANDB_DIR")
    if root:  # made here: wandb would quietly fall back to the system temp directory for one it cannot write
        try:
            os.makedirs(root, exist_ok=True)
            writable = os.access(root, os.W_OK | os.X_OK)
        except OSError:
            writable = False
        if not writable:
            raise RuntimeError(f"WANDB_DIR={root} is not a writable directory; point WANDB_DIR at one or unset it")
    try:
        return wandb.init(project=project, name=run_id, id=run_id, resume="allow", config=config)
    except wandb.Error as exc:
        lines = str(exc).strip().splitlines()
        reason = redact_text(lines[0]) if lines else type(exc).__name__
        raise RuntimeError(
            f"trainer.logger=wandb: wandb.init failed ({reason}); export WANDB_API_KEY, or set WANDB_MODE=offline "
            "(no account or network needed), or use trainer.logger: console"
        ) from exc


def _plain(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value
