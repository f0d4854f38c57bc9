"""The trainer's start-up, in seconds since its process started: the milestones a user waits through before the
first step (its line in the log) and that `benchmarks/startup.py` measures. Light: imported before torch."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psutil

MILESTONES = {"ray": "Ray up", "actors": "actors alive", "rollout": "first rollout", "step": "first step"}
SUMMARY = re.compile(r"start-up: (.*) after the process started")
_reached: dict[str, float] = {}
_said: list[bool] = []  # one summary per process


def since_start() -> float:
    """Seconds since this process started: its start tick against the uptime, both on the kernel's clock (10 ms),
    so the interpreter's own start and imports count."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except OSError:  # no /proc (macOS): the wall clock against psutil's start time
        return time.time() - psutil.Process().create_time()


def reached(milestone: str) -> None:
    """The first time `milestone` (a key of MILESTONES) is reached; later calls keep the first."""
    _reached.setdefault(milestone, round(since_start(), 2))


def summary() -> str | None:
    """`start-up: Ray up 3.1 s, actors alive 7.9 s, ...` once the first step is done (once per process), else None."""
    if "step" not in _reached or _said:
        return None
    _said.append(True)
    parts = [f"{label} {_reached[key]:.1f} s" for key, label in MILESTONES.items() if key in _reached]
    return f"start-up: {', '.join(parts)} after the process started"


def read_summary(log: str) -> dict[str, float] | None:
    """{milestone key: seconds} from the summary line in a trainer's log; None when it has none."""
    match = SUMMARY.search(log)
    if match is None:
        return None
    by_label = {label: key for key, label in MILESTONES.items()}
    parts = (part.rsplit(" ", 2) for part in match.group(1).split(", "))
    return {by_label[label]: float(seconds) for label, seconds, _unit in parts}
