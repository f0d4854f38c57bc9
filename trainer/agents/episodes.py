"""Agent episodes: a policy and an environment take turns, and the whole exchange is one sample for GRPO.

An episode (skyrl-gym's text convention, trainer/env.py `EpisodeEnvironment`):

    env = Env(env_config, extras)        extras: the data row, `max_turns`, and `sandbox` (trainer/sandbox/)
    prompt, _ = env.init(row["prompt"])
    repeat: action <- the policy, until `environment.turn_stop` or <eos>
            out = env.step(action)       {observations: [{role, content}], reward, done, metadata}
            the observations' tokens are appended after the action, and the policy goes on from there

The sample is exact tokens: the prompt's ids, then each action's sampled ids and each observation's ids, never
re-tokenised; the observation tokens carry loss mask 0 (trainer/workers/batch.py), so no policy loss, KL, entropy or
TIS term counts a token the policy did not sample. The reward is the sum of the steps' rewards.

An episode ends when the environment says `done`, when the policy ends its action with <eos>, after `max_turns`
actions, when the next turn has no room left in `max_context_tokens` (truncated), or when the environment raises
(an error: reward 0, counted, never a crashed step). Every turn of every live episode is generated in one batch;
the environment steps of a turn run `max_concurrency` at a time in threads (a sandbox command is a subprocess, so
they overlap); a slow step holds its turn's batch for at most the sandbox's command timeout. Sandboxes come from
the player's pool (trainer/sandbox/pool.py): an episode's sandbox is reset and lent to a later episode.

Whatever failed on an episode's way is its `sandbox_error`, one of SANDBOX_ERRORS: its sandbox could not be lent,
its environment could not set up or step, or a command met a time limit or found the sandbox gone (read from the
command's result: the limit it ran into). An episode without one finished. While a batch plays, the player
publishes how many finished and the errors so far (`Liveness`, into the trainer's progress document), so
`rlbuild status` sees a step that starves before it ends.

A reward environment (`reward(row, completion, finished)`) is not played here: the trainer scores its single
completions as it always has (trainer/sampling.py), bit for bit.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from rlbuild.contracts.recipe import EnvironmentSection, SandboxSection
from trainer import env as environments
from trainer.errors import TrainerError
from trainer.sandbox import ClosedOnExit, CommandResult, SandboxTimings
from trainer.workers.engines import Rollout, SamplingParams

if TYPE_CHECKING:  # the pool's module is loaded only where a recipe asks for a sandbox
    from trainer.sandbox.pool import SandboxPool

Generate = Callable[[list[list[int]], SamplingParams, int], list[Rollout]]
# Where the player's liveness goes (rlbuild/contracts/progress.py `Progress.episodes`): the document, and whether
# it must be written now (a batch began or ended) rather than when the writer's interval allows.
Publish = Callable[[dict[str, Any], bool], None]
# Turn t of a batch samples with seed + t * TURN_SEED_STRIDE: apart from the per-engine and per-batch offsets.
TURN_SEED_STRIDE = 1 << 20
WAVE_SEED = 1 << 30  # wave w of a capped batch samples with seed + w * WAVE_SEED: apart from every turn's seeds
ENDINGS = ("done", "eos", "max_turns", "context", "error")
# What kept an episode from finishing (docs/design.md, metrics `sandbox/errors_*`): no sandbox could be started or
# lent, the environment's init raised, its step or verifier raised, a command ran past command_timeout_s or the
# episode's episode_timeout_s, or the sandbox was gone (its shell exited or was killed).
SANDBOX_ERRORS = ("start_error", "setup_error", "step_error", "command_timeout", "episode_timeout", "sandbox_ended")
# A command's seconds this close to its limit ran into it (the backends stop it at the deadline, a hair after).
LIMIT_SLACK = 0.98


class EpisodeSetupError(TrainerError):
    """Settings that no episode can be played with (a turn stop the tokenizer cannot stop at, no context)."""


@dataclass
class Turn:
    """One action and what the environment answered: the trajectory's unit (written beside eval results)."""

    action: str
    observation: str
    reward: float
    action_tokens: int
    observation_tokens: int
    seconds: float  # the environment's step, sandbox command included


@dataclass
class Episode:
    """A played episode: its sample (prompt ids + rollout with loss mask), reward, turns and how it ended."""

    row: dict[str, Any]
    prompt_ids: list[int]
    rollout: Rollout
    reward: float
    ended: str  # one of ENDINGS
    turns: list[Turn] = field(default_factory=list)
    error: str | None = None
    sandbox: dict[str, float] = field(default_factory=dict)
    sandbox_error: str | None = None  # one of SANDBOX_ERRORS: the first failure on the way, None if it finished

    @property
    def truncated(self) -> bool:
        return self.ended in ("max_turns", "context")

    def record(self) -> dict[str, Any]:
        """The trajectory as JSON: what a person reads to see what the policy did."""
        return {
            "task": self.row.get("task"),
            "prompt": self.row.get("prompt"),
            "answer": self.row.get("answer"),
            "turns": [vars(turn) for turn in self.turns],
            "reward": self.reward,
            "ended": self.ended,
            "error": self.error,
            "sandbox_error": self.sandbox_error,
            "tokens": {"prompt": len(self.prompt_ids), "completion": len(self.rollout.token_ids)},
            "sandbox": self.sandbox,
        }


def turn_stop_ids(tokenizer: PreTrainedTokenizerBase, turn_stop: str) -> tuple[int, ...]:
    """Every token whose text contains `turn_stop`: a BPE vocabulary spells a newline inside many tokens."""
    vocab = tokenizer.get_vocab()
    ids = tuple(sorted(i for i in vocab.values() if turn_stop in tokenizer.decode([i], skip_special_tokens=True)))
    if not ids:
        raise EpisodeSetupError(
            f"environment.turn_stop={turn_stop!r} is in no token of the model's tokenizer, so no turn could end; "
            "set it to text the tokenizer has (e.g. a newline, or the closing tag the environment parses)"
        )
    return ids


def context_limit(section: EnvironmentSection, tokenizer: PreTrainedTokenizerBase) -> int:
    """`environment.max_context_tokens`, or the model's own context (its tokenizer's model_max_length)."""
    if section.max_context_tokens is not None:
        return section.max_context_tokens
    limit = getattr(tokenizer, "model_max_length", None)
    if not isinstance(limit, int) or limit > 10_000_000:  # transformers' "no limit" sentinel is ~1e30
        raise EpisodeSetupError(
            "environment.max_context_tokens is null and the tokenizer states no model_max_length; set "
            "environment.max_context_tokens to the model's context length"
        )
    return limit


class EpisodePlayer:
    """Plays batches of episodes of one environment class with one tokenizer (a run's, or an eval's)."""

    def __init__(self, env_class: str, section: EnvironmentSection, tokenizer: PreTrainedTokenizerBase) -> None:
        self.env_class = env_class
        self.environment = environments.load_class(env_class)
        self.section = section
        self.tokenizer = tokenizer
        self.stop_ids = turn_stop_ids(tokenizer, section.turn_stop)
        self.context = context_limit(section, tokenizer)
        self.pool = ThreadPoolExecutor(section.max_concurrency, thread_name_prefix="episode")
        self.environment_seconds = 0.0
        self._started_before = 0
        self.liveness = Liveness()
        self.sandboxes: SandboxPool | None = None
        # An environment that opens its own sandbox (a Harbor task builds it from the task's environment) gets the
        # recipe's spec instead of a pooled one.
        if section.sandbox is not None and not getattr(self.environment, "opens_sandbox", False):
            from trainer.sandbox.pool import SandboxPool

            # Every episode of a batch holds its sandbox through all its turns, so the pool keeps as many as a
            # batch used (no cap): fewer would start the rest afresh each step, and the idle ones never outnumber
            # what the largest batch already held at once.
            self.sandboxes = SandboxPool(section.sandbox)

    def close(self) -> None:
        """Kill the pooled sandboxes while the threads that started them live (bwrap dies with its thread)."""
        if self.sandboxes is not None:
            self.sandboxes.close()
        self.pool.shutdown(wait=True)

    def play(self, generate: Generate, rows: list[dict[str, Any]], params: SamplingParams, seed: int) -> list[Episode]:
        """One episode per row, all turns, at most `sandbox.max_concurrent` of them holding a sandbox at once (a
        provider's cap: the rows are played in waves of that many); every resource an episode opened is released
        before this returns."""
        params = SamplingParams(params.max_tokens, params.temperature, params.top_p, params.top_k, self.stop_ids)
        cap = self.section.sandbox.max_concurrent if self.section.sandbox is not None else None
        size = min(cap or len(rows), len(rows)) or 1
        waves = [rows[i : i + size] for i in range(0, len(rows), size)]
        self.liveness.begin()  # the whole batch, not each wave: a provider's cap of 6 must not mean 2 writes per 6
        try:
            played = [self._play_wave(generate, wave, params, seed + i * WAVE_SEED) for i, wave in enumerate(waves)]
        finally:
            self.liveness.end()
        return [episode for wave in played for episode in wave]

    def _play_wave(
        self, generate: Generate, rows: list[dict[str, Any]], params: SamplingParams, seed: int
    ) -> list[Episode]:
        started = time.perf_counter()
        live = list(self.pool.map(self._start, rows))
        try:
            self.liveness.count(live)
            for turn in range(self.section.max_turns):
                playing = [e for e in live if e.ended is None]
                if not playing:
                    break
                self.environment_seconds += time.perf_counter() - started
                rollouts = generate([e.ids for e in playing], params, seed + turn * TURN_SEED_STRIDE)
                started = time.perf_counter()
                act = partial(_LiveEpisode.act, last_turn=turn + 1 == self.section.max_turns)
                list(self.pool.map(act, playing, rollouts))
                self.liveness.count(playing)
        finally:
            list(self.pool.map(_LiveEpisode.close, live))
            self.environment_seconds += time.perf_counter() - started
        return [e.result() for e in live]

    def spent(self) -> tuple[float, int]:
        """Since the last call: wall seconds spent on the environment side (sandboxes started, reset and closed,
        steps taken: the share of a step the policy's engines were not the bottleneck), and sandboxes started
        afresh rather than reused (a warm pool starts none once its first batch has run)."""
        seconds, self.environment_seconds = self.environment_seconds, 0.0
        started = self.sandboxes.started if self.sandboxes is not None else 0
        fresh, self._started_before = started - self._started_before, started
        return seconds, fresh

    def _start(self, row: dict[str, Any]) -> _LiveEpisode:
        return _LiveEpisode.start(self, row)


class Liveness:
    """How the batches in play are going, for `rlbuild status` between steps: a step that never ends writes no
    metrics, so the player publishes, as episodes end, how many finished and failed (by SANDBOX_ERRORS kind) since
    `since`, and when an episode last finished. `since` is when the batches in play began, or, after batches that
    finished no episode, when the first of those began. Batches may play at once (an eval beside fully_async's
    generator): their counts add up.

    `publish` (None: nothing is published) is called outside the lock: a slow write holds no episode thread."""

    def __init__(self) -> None:
        self.publish: Publish | None = None
        self._lock = threading.Lock()
        self._plays = 0
        self._since: float | None = None
        self._finished = 0
        self._errors: Counter[str] = Counter()
        self._last_finished: float | None = None

    def begin(self) -> None:
        with self._lock:
            # A fresh count when the last batches finished an episode (what they did is in their step's metrics);
            # after batches that finished none, the count goes on from when the first of them began, so status
            # sees the whole time nothing finished, not the current batch's share of it.
            if self._plays == 0 and (self._since is None or self._finished > 0):
                self._since, self._finished, self._errors = time.time(), 0, Counter()
            self._plays += 1
            state = self._state()
        self._send(state, now=True)

    def count(self, episodes: list[_LiveEpisode]) -> None:
        """Count the episodes of `episodes` that ended since they were last counted."""
        ended = [e for e in episodes if e.ended is not None and not e.counted]
        for episode in ended:
            episode.counted = True
        if not ended:
            return
        with self._lock:
            for episode in ended:
                if (kind := episode.failure()) is not None:
                    self._errors[kind] += 1
                else:
                    self._finished += 1
                    self._last_finished = time.time()
            state = self._state()
        self._send(state, now=False)

    def end(self) -> None:
        with self._lock:
            self._plays -= 1
            state = self._state()
        self._send(state, now=True)

    def _state(self) -> dict[str, Any]:
        return {
            "playing": self._plays > 0,
            "since": self._since,
            "finished": self._finished,
            "errors": dict(self._errors),
            "last_finished": self._last_finished,
        }

    def _send(self, state: dict[str, Any], now: bool) -> None:
        if self.publish is not None:
            self.publish(state, now)


class _Watched(ClosedOnExit):
    """The sandbox an episode's environment is lent, as the player sees it: each command's latency, and the limit a
    command that ended the sandbox ran into (the environment sees only the observation's sentence)."""

    def __init__(self, sandbox: Any, spec: SandboxSection) -> None:
        self.sandbox, self.spec = sandbox, spec
        self.error: str | None = None
        self.command_max_s = 0.0

    @property
    def timings(self) -> SandboxTimings:
        return self.sandbox.timings

    def run(self, command: str) -> CommandResult:
        left = self.spec.episode_timeout_s - self.sandbox.timings.command_s
        result: CommandResult = self.sandbox.run(command)
        self.command_max_s = max(self.command_max_s, result.seconds)
        if result.ended and self.error is None:
            self.error = ended_kind(result, left, self.spec.command_timeout_s)
        return result

    def close(self) -> None:
        self.sandbox.close()


def ended_kind(result: CommandResult, left_s: float, limit_s: float) -> str:
    """Which limit a command that ended its sandbox ran into, from its seconds: the episode's sandbox time left
    (`left_s`, when less than the command's own limit), the command's limit, or none (the shell exited or was
    killed, or the sandbox was gone before the command)."""
    if left_s < limit_s and result.seconds >= LIMIT_SLACK * left_s:
        return "episode_timeout"
    if result.seconds >= LIMIT_SLACK * limit_s:
        return "command_timeout"
    return "sandbox_ended"


class _LiveEpisode:
    """An episode in play: its environment, sandbox and the tokens so far."""

    def __init__(self, player: EpisodePlayer, row: dict[str, Any]) -> None:
        self.player, self.row = player, row
        self.prompt_ids: list[int] = []
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.turns: list[Turn] = []
        self.reward = 0.0
        self.ended: str | None = None
        self.error: str | None = None
        self.sandbox: Any = None
        self.env: Any = None
        self.finished = False
        self.failed: str | None = None  # a SANDBOX_ERRORS kind the player saw raised (a command's: the sandbox's)
        self.counted = False  # by the player's liveness

    @classmethod
    def start(cls, player: EpisodePlayer, row: dict[str, Any]) -> _LiveEpisode:
        episode = cls(player, row)
        prompt = str(row["prompt"])
        try:
            if player.sandboxes is not None:
                assert player.section.sandbox is not None  # the pool exists for the sandbox section
                lent = player.sandboxes.acquire(row.get("files") or {})
                episode.sandbox = _Watched(lent, player.section.sandbox)
            episode.env = _build(player.environment, row, player.section, episode.sandbox)
            prompt, _ = episode.env.init(prompt)
        except Exception as error:  # an environment that cannot start is an errored episode, not a dead step
            pooled = player.sandboxes is not None and episode.sandbox is None
            # An environment that opens its own sandbox (a Harbor task) and raised before it had one: its start.
            own = episode.env is not None and getattr(player.environment, "opens_sandbox", False)
            lacking = pooled or (own and getattr(episode.env, "sandbox", None) is None)
            episode._fail("init", error, "start_error" if lacking else "setup_error")
        episode.prompt_ids = list(player.tokenizer(prompt)["input_ids"])
        if episode.ended is None and len(episode.prompt_ids) >= player.context:
            episode.ended = "context"
        return episode

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.tokens

    def act(self, rollout: Rollout, last_turn: bool) -> None:
        """Take the policy's action, step the environment, append its observation (or end the episode)."""
        room = self.player.context - len(self.ids)
        action_ids = rollout.token_ids[:room]
        self._append(action_ids, rollout.logprobs[: len(action_ids)], 1)
        self.finished = rollout.finished and len(action_ids) == len(rollout.token_ids)
        action = self.player.tokenizer.decode(action_ids, skip_special_tokens=True)
        started = time.perf_counter()
        try:
            out = self.env.step(action)
            observation = "".join(str(m.get("content", "")) for m in out.get("observations") or [])
            reward, done = float(out.get("reward") or 0.0), bool(out.get("done"))
        except Exception as error:
            self.turns.append(Turn(action, "", 0.0, len(action_ids), 0, time.perf_counter() - started))
            self._fail("step", error)
            return
        seconds = time.perf_counter() - started
        self._own_sandbox_ended(seconds)
        self.reward += reward
        if done or self.finished or last_turn or len(action_ids) < len(rollout.token_ids):
            self.ended = "done" if done else "eos" if self.finished else "max_turns" if last_turn else "context"
            self.turns.append(Turn(action, observation, reward, len(action_ids), 0, seconds))
            self._verify()
            return
        observed = list(self.player.tokenizer(observation, add_special_tokens=False)["input_ids"])
        room = self.player.context - len(self.ids)
        self._append(observed[:room], [0.0] * min(room, len(observed)), 0)
        self.turns.append(Turn(action, observation, reward, len(action_ids), min(room, len(observed)), seconds))
        if room <= len(observed):  # no room for another action
            self.ended = "context"
            self._verify()

    def _verify(self) -> None:
        """An environment judged once the episode is over (`verify()`: a Harbor task's verifier) adds its reward;
        a verifier that fails makes the episode an error (reward 0), as a failed step does."""
        verify = getattr(self.env, "verify", None)
        if not callable(verify):
            return
        try:
            self.reward += float(verify())
        except Exception as error:
            self._fail("verify", error)

    def _own_sandbox_ended(self, seconds: float) -> None:
        """Whether the step's command ended a sandbox the environment opened itself (a Harbor task's: the player
        lent none, so it watches no lease) and which limit it met, from the sandbox the environment exposes as
        `sandbox`: its command time against the episode's, the step's seconds against the command's limit."""
        own, spec = getattr(self.env, "sandbox", None), self.player.section.sandbox
        if self.failure() is not None or self.sandbox is not None or spec is None or not getattr(own, "ended", False):
            return
        used = float(getattr(getattr(own, "timings", None), "command_s", 0.0))
        if used >= LIMIT_SLACK * spec.episode_timeout_s:
            self.failed = "episode_timeout"
        else:
            self.failed = "command_timeout" if seconds >= LIMIT_SLACK * spec.command_timeout_s else "sandbox_ended"

    def _append(self, ids: list[int], logprobs: list[float], sampled: int) -> None:
        self.tokens += ids
        self.logprobs += logprobs
        self.mask += [sampled] * len(ids)

    def _fail(self, where: str, error: Exception, kind: str = "step_error") -> None:
        self.ended, self.reward = "error", 0.0
        self.failed = self.failed or kind
        last = traceback.extract_tb(error.__traceback__)[-1:] or [None]
        place = f" at {last[0].filename}:{last[0].lineno}" if last[0] is not None else ""
        self.error = f"{where}: {type(error).__name__}: {error}{place}"

    def failure(self) -> str | None:
        """The first SANDBOX_ERRORS kind on the episode's way, or None: it finished."""
        return self.failed or (self.sandbox.error if isinstance(self.sandbox, _Watched) else None)

    def close(self) -> None:
        for resource in (self.env, self.sandbox):
            closer = getattr(resource, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception as error:  # a failed close must not hide the episode's result
                    self.error = self.error or f"close: {type(error).__name__}: {error}"

    def result(self) -> Episode:
        if not self.tokens:  # it never acted (its environment failed to start): one masked token keeps the batch
            self._append([self.player.tokenizer.eos_token_id], [0.0], 0)  # well formed when every episode failed
        rollout = Rollout(self.tokens, self.logprobs, self.finished, loss_mask=self.mask)
        return Episode(
            row=self.row,
            prompt_ids=self.prompt_ids,
            rollout=rollout,
            reward=self.reward,
            ended=self.ended or "max_turns",
            turns=self.turns,
            error=self.error,
            sandbox=_timings(self.sandbox if self.sandbox is not None else getattr(self.env, "sandbox", None)),
            sandbox_error=self.failure(),
        )


def _timings(sandbox: Any) -> dict[str, Any]:
    timings = getattr(sandbox, "timings", None)
    if timings is None:
        return {}
    found = dataclasses.asdict(timings) if dataclasses.is_dataclass(timings) else dict(timings)
    return found | ({"command_max_s": sandbox.command_max_s} if isinstance(sandbox, _Watched) else {})


def _build(environment: type, row: Mapping[str, Any], section: EnvironmentSection, sandbox: Any) -> Any:
    """An episode's environment, as skyrl-gym builds one: `Env(env_config, extras)`."""
    extras = {**row, "max_turns": section.max_turns, "sandbox": sandbox, "sandbox_spec": section.sandbox}
    env = environment(dict(section.env_config), extras)
    if getattr(env, "max_turns", None) is None:
        env.max_turns = section.max_turns
    return env


def is_played(env_class: str, section: EnvironmentSection) -> bool:
    """Whether the trainer plays episodes of `env_class` (this module) rather than scoring single completions.

    A reward environment is one turn without a sandbox: settings that ask for more are an error, not ignored."""
    if environments.is_episode_class(environments.load_class(env_class)):
        return True
    asked = [f"max_turns={section.max_turns}"] if section.max_turns > 1 else []
    asked += ["a sandbox"] if section.sandbox is not None else []
    if asked:
        raise EpisodeSetupError(
            f"environment.env_class={env_class!r} scores one completion (reward()), but the recipe asks for "
            f"{' and '.join(asked)}; set environment.max_turns: 1 and sandbox: null, or name an agent environment "
            "(init/step, skyrl-gym's convention)"
        )
    return False


def episode_statistics(episodes: list[Episode]) -> dict[str, float]:
    """What a step's or an eval's episodes looked like: turns, how they ended, where their time went."""
    n = max(len(episodes), 1)
    stats = {
        "finished": float(sum(e.sandbox_error is None for e in episodes)),
        "turns_mean": sum(len(e.turns) for e in episodes) / n,
        "turns_max": float(max((len(e.turns) for e in episodes), default=0)),
        "truncated_frac": sum(e.truncated for e in episodes) / n,
        "error_frac": sum(e.ended == "error" for e in episodes) / n,
        "env_seconds_mean": sum(t.seconds for e in episodes for t in e.turns) / n,
        "observation_tokens_mean": sum(t.observation_tokens for e in episodes for t in e.turns) / n,
    }
    return stats | {f"ended_{how}_frac": sum(e.ended == how for e in episodes) / n for how in ENDINGS}


def sandbox_statistics(episodes: list[Episode]) -> dict[str, float]:
    """Where a step's episodes failed (`errors_<kind>`: episodes by their first failure, SANDBOX_ERRORS) and how
    fast their sandboxes answered: start (started, or reset and loaded, until the shell answered) and command
    latency, mean and max; the latencies are absent where no episode had a sandbox."""
    errors = Counter(e.sandbox_error for e in episodes if e.sandbox_error is not None)
    stats = {f"errors_{kind}": float(errors[kind]) for kind in SANDBOX_ERRORS}
    stats["errors"] = float(sum(errors.values()))
    timed = [e.sandbox for e in episodes if e.sandbox]
    if not timed:
        return stats
    starts = [float(t.get("start_s", 0.0)) for t in timed]
    commands = sum(int(t.get("commands", 0)) for t in timed)
    return stats | {
        "start_s_mean": sum(starts) / len(starts),
        "start_s_max": max(starts),
        "command_s_mean": sum(float(t.get("command_s", 0.0)) for t in timed) / max(commands, 1),
        "command_s_max": max(float(t.get("command_max_s", 0.0)) for t in timed),
    }
