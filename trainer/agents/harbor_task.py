"""Harbor tasks as agent episodes (`environment.env_class: harbor`): the row's instruction is the prompt, each
action is a shell command run in the task's sandbox, and the task's own verifier gives the reward once the episode
is over (Harbor's, run by trainer/sandbox/task.py).

Rows come from a `harbor:` data source (rlbuild/contracts/rows.py): each carries its whole task folder, which
the episode writes out and hands to Harbor. The sandbox is the task's (its environment, in the recipe's
`environment.sandbox.backend`), so this environment opens it itself rather than taking one from the player's pool.

How an observation is shown to the model is the experiment's choice (`environment.env_config`, skyrl-gym's
env_config), since it is part of the model's language: a chat model reads the raw output; the tiny agent reads
`>output|` with whitespace collapsed (config/experiments/tiny-harbor.yaml).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pydantic import Field

from rlbuild.contracts.recipe import SandboxSection
from rlbuild.contracts.rows import write_task
from rlbuild.core.validation import StrictModel
from trainer.sandbox import compact_output
from trainer.sandbox.local.reachable import make_folder
from trainer.sandbox.task import HarborSandbox, open_task_sandbox
from trainer.tasks import TaskError


class ObservationFormat(StrictModel):
    """`environment.env_config` of Harbor episodes: how a command's output becomes the next observation."""

    template: str = Field("\n{output}\n", description="the observation; {output} is the command's output")
    max_chars: int = Field(8192, ge=1, le=10_000_000, description="characters of output shown at most")
    compact: bool = Field(False, description="collapse whitespace to single spaces, non-printables to '?'")
    action_suffix: str = Field("", max_length=16, description="text that ends an action and is not the command")


class HarborTask:
    """One episode of one Harbor task, built as `HarborTask(env_config, extras)` (skyrl-gym's convention)."""

    opens_sandbox = True  # the episode player passes the recipe's spec (extras["sandbox_spec"]), not a pooled one

    def __init__(self, env_config: dict[str, Any] | None = None, extras: dict[str, Any] | None = None) -> None:
        self.format = ObservationFormat.model_validate(env_config or {})
        self.extras = dict(extras or {})
        self.max_turns = int(self.extras.get("max_turns", 1))
        self.turns = 0
        self.sandbox: HarborSandbox | None = None
        self._folder: Path | None = None

    def init(self, prompt: str) -> tuple[str, dict[str, Any]]:
        spec = self.extras.get("sandbox_spec")
        if not isinstance(spec, SandboxSection) or "harbor_task" not in self.extras:
            raise TaskError(
                "a Harbor episode needs a row from a harbor: data source and recipe.environment.sandbox set; "
                "stage the task set with `source: harbor:<folder>` and name a sandbox backend"
            )
        self._folder = make_folder("rlbuild-task-")
        self.sandbox = open_task_sandbox(spec, write_task(self.extras, self._folder))
        return prompt, {"task": self.extras.get("task")}

    def step(self, action: str) -> dict[str, Any]:
        """Run the action as a command; its output is the observation. The verifier scores the episode after
        its last action (`verify`), so a step itself earns nothing."""
        self.turns += 1
        assert self.sandbox is not None, "init() opens the sandbox"
        result = self.sandbox.run(action.removesuffix(self.format.action_suffix))
        if result.ended:
            return {"observations": [], "reward": 0.0, "done": True, "metadata": {"note": result.note}}
        shown = result.output if result.output.strip() else result.note
        return {
            "observations": [{"role": "user", "content": self._observation(shown)}],
            "reward": 0.0,
            "done": False,
            "metadata": {"exit_code": result.exit_code},
        }

    def verify(self) -> float:
        """The task's verifier on the sandbox as the agent left it."""
        assert self.sandbox is not None, "init() opens the sandbox"
        return self.sandbox.verify()

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _observation(self, text: str) -> str:
        if self.format.compact:
            text = compact_output(text, self.format.action_suffix)
        return self.format.template.replace("{output}", text[: self.format.max_chars])
