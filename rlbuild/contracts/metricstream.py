"""A run's metrics as an append-only stream: one JSON line per step, never rewritten, O(steps) in storage.

Each start of the trainer (an *attempt*) appends to a stream of its own (`rlbuild/core/streams.py`: numbered
segments, never rewritten):

    <segments root>/attempt-000001/start.json      {"kept_until": k}: written first by each start of the trainer
    <segments root>/attempt-000001/part-000001     lines, in order
    <segments root>/attempt-000001/part-000002     ...
    <segments root>/attempt-000002/start.json      a resume from the checkpoint at step k ...

A resumed attempt replays the steps after its checkpoint, so the run is: each attempt's lines, after dropping
the lines of earlier attempts past its `kept_until` (-1 for a fresh start: nothing earlier counts). `merge`
is that rule; `read_stream` applies it to what is in storage. At the end the trainer writes the merged lines
once to the train artifact's `metrics.jsonl` (`artifacts.metrics_uri`), outside the TTL'd `tmp/` folder
where the segments live, so a finished run keeps its curves when its checkpoints expire. `read_run_metrics`
reads the merged file, or the segments while there is none (a run in progress or killed).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlbuild.core import storage, streams

# The trainer's count of consecutive steps whose rewards were all 0; the eval stage warns from it.
ZERO_REWARD_STEPS = "health/zero_reward_steps"
# Seconds a whole step took; a scheduler whose jobs end at a wall-clock limit sizes its chain from an earlier run's.
STEP_TIME = "perf/step_time_s"
# Seconds since the trainer process started, at a step's end: with the step time, what a run of the same geometry
# is expected to cost (the plan's training cost, `rlbuild status`'s GPU-hours used).
ELAPSED = "perf/elapsed_s"
ATTEMPT = re.compile(r"^attempt-(\d{6})$")
START = "start.json"
Record = dict[str, Any]


def merge(attempts: Iterable[tuple[int, list[Record]]]) -> list[Record]:
    """One consistent run from `(kept_until, lines)` per attempt, oldest first."""
    run: list[Record] = []
    for kept_until, lines in attempts:
        run = [r for r in run if r["step"] <= kept_until] + lines
    return run


def parse_lines(text: str) -> tuple[list[Record], int]:
    """(records, unreadable line count): a line that is not a JSON object with a numeric `step` is counted."""
    records: list[Record] = []
    unreadable = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            unreadable += 1
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int | float) and not isinstance(step, bool):
            records.append(record)
        else:
            unreadable += 1
    return records, unreadable


def _attempts(root: str) -> list[int]:
    return sorted(int(m[1]) for name in storage.list_names(root) if (m := ATTEMPT.match(name)))


def _attempt_uri(root: str, attempt: int) -> str:
    return storage.join(root, f"attempt-{attempt:06d}")


def _kept_until(folder: str) -> int:
    start = storage.read_json(storage.join(folder, START)) or {}
    return int(start.get("kept_until", -1))


def attempt_starts(root: str) -> list[int]:
    """Each attempt's `kept_until`, oldest first: how many times the trainer started, and where each resumed."""
    return [_kept_until(_attempt_uri(root, attempt)) for attempt in _attempts(root)]


def read_stream(root: str) -> tuple[list[Record], int]:
    """The run as the segments under `root` describe it: (records, unreadable line count)."""
    attempts: list[tuple[int, list[Record]]] = []
    unreadable = 0
    for attempt in _attempts(root):
        folder = _attempt_uri(root, attempt)
        lines, bad = parse_lines(streams.read_stream(folder) or "")
        unreadable += bad
        attempts.append((_kept_until(folder), lines))
    return merge(attempts), unreadable


def read_run_metrics(metrics_uri: str, segments_root: str) -> tuple[list[Record], int]:
    """A run's metric lines: the merged `metrics.jsonl` once the run finished, else its segments so far."""
    text = storage.read_text(metrics_uri)
    if text is not None:
        return parse_lines(text)
    return read_stream(segments_root)


class MetricsStream:
    """The writing side: this attempt's lines go to its stream, whose `flush` writes the buffered ones as a segment.

    A new attempt folder is taken at construction (after the ones in storage) and announces `kept_until`
    before any line. `flush` is called at checkpoints (lines after the last checkpoint are dropped on resume
    anyway) and at most every `flush_seconds` (so a reader of a run in progress sees recent steps).
    """

    def __init__(self, root: str, kept_until: int, flush_seconds: float = 10.0) -> None:
        self.root, self.kept_until = root, kept_until
        self.kept = [r for r in read_stream(root)[0] if r["step"] <= kept_until]
        attempts = _attempts(root)
        self.folder = _attempt_uri(root, (attempts[-1] + 1) if attempts else 1)
        storage.write_json(storage.join(self.folder, START), {"kept_until": kept_until})
        self.lines = streams.StreamWriter(self.folder, flush_s=flush_seconds)
        self.written: list[Record] = []

    def append(self, record: Record) -> None:
        self.written.append(record)
        self.lines.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        self.lines.flush()

    def records(self) -> list[Record]:
        """Every line of the run: the earlier attempts' kept lines, then this attempt's."""
        return self.kept + self.written

    def finish(self, metrics_uri: str) -> None:
        """Flush, then write the whole run once to `metrics_uri` (the train artifact's metrics.jsonl)."""
        self.flush()
        write_run_metrics(metrics_uri, self.records())


def write_run_metrics(metrics_uri: str, records: list[Record]) -> None:
    storage.write_text(metrics_uri, "".join(json.dumps(r) + "\n" for r in records))


@dataclass(frozen=True)
class Rate:
    """A run's start-up (process start to its first step's start) and seconds per step, evals and checkpoints
    averaged in."""

    startup_s: float
    per_step_s: float


def measured_rate(records: Sequence[Mapping[str, Any]]) -> Rate | None:
    """The rate of a run's last attempt (a resume restarts the clock) from its step lines; None without any."""
    lines = [r for r in records if _number(r.get(ELAPSED)) and _number(r.get(STEP_TIME))]
    lines.sort(key=lambda r: r["step"])
    attempt: list[Mapping[str, Any]] = []
    for line in lines:
        if attempt and line[ELAPSED] < attempt[-1][ELAPSED]:
            attempt = []  # the clock restarted: a later attempt resumed here
        attempt.append(line)
    if not attempt:
        return None
    first, last = attempt[0], attempt[-1]
    if last["step"] > first["step"]:
        per_step = (last[ELAPSED] - first[ELAPSED]) / (last["step"] - first["step"])
    else:
        per_step = statistics.median(float(r[STEP_TIME]) for r in attempt)
    return Rate(startup_s=max(float(first[ELAPSED]) - float(first[STEP_TIME]), 0.0), per_step_s=per_step)


def used_gpu_hours(records: Sequence[Mapping[str, Any]], gpus: int) -> float | None:
    """GPU-hours a run has used so far: every attempt's elapsed time at its last line, times its GPUs."""
    lines = sorted((r for r in records if _number(r.get(ELAPSED))), key=lambda r: r["step"])
    if not lines:
        return None
    seconds, previous = 0.0, 0.0
    for line in lines:
        if line[ELAPSED] < previous:
            seconds += previous  # an attempt ended here; the next one's clock starts again
        previous = float(line[ELAPSED])
    return gpus * (seconds + previous) / 3600


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def median_step_time(records: list[dict[str, Any]]) -> float | None:
    """The median `perf/step_time_s` of a run's metric lines (an earlier link or run of this version)."""
    times = [float(v) for r in records if isinstance(v := r.get(STEP_TIME), int | float) and v > 0]
    return statistics.median(times) if times else None
