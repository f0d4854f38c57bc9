"""find_key whose sandboxes stop answering after the first training step, for tests/e2e/test_starvation.py: an
environment in skyrl-gym's convention (`Env(env_config, extras)`, `step(action)`), played by the real trainer in
real local sandboxes. Each of its episodes after the first FIRST_STEP_EPISODES runs, at its first step, a command
that outlives any command_timeout_s the test sets: the sandbox is stopped at the limit and the episode ends with
reward 0, as one whose provider stopped answering."""

from __future__ import annotations

import itertools
from typing import Any

from trainer.agents.find_key import FindTheKey

# The test's first step: train_batch_size 4 x n_samples_per_prompt 8 episodes (no eval before training).
FIRST_STEP_EPISODES = 32
HANG = "sleep 600"
_BUILT = itertools.count(1)  # episodes built in this trainer process; next() is atomic under the GIL


class StarvingFindKey(FindTheKey):
    def __init__(self, env_config: dict[str, Any] | None = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__(env_config, extras)
        self.starving = next(_BUILT) > FIRST_STEP_EPISODES

    def step(self, action: str) -> dict[str, Any]:
        if self.starving and self._sandbox().run(HANG).ended:
            return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}
        return super().step(action)
