"""`rlbuild status` as a person reads it: one line per artifact, the ladder under a running or failed train."""

from __future__ import annotations

from typing import Any

from rlbuild.ops.status import errors_text, title

LADDER_TAIL = 8


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def format_status(document: dict[str, Any]) -> str:
    lines = [f"experiment {document['experiment']} in {document['storage_root']}"]
    for coordinator in document.get("coordinators", []):
        state = coordinator.get("job_state") or f"state unknown: {coordinator.get('job_state_note')}"
        lines.append(f"coordinator {title(coordinator.get('scheduler'))} job {coordinator['job']}: {state}")
    for version, kinds in document["versions"].items():
        lines.append(f"v{version}")
        if "error" in kinds:
            lines.append(f"  cannot resolve: {kinds['error']}")
            continue
        width = max([8, *(len(entry["state"]) for entry in kinds.values())])  # `interrupted` keeps the column
        for kind, entry in kinds.items():
            noted = ("running", "leased", "failed", "interrupted", "corrupt")
            note = entry.get("verdict") if entry["state"] in noted else None
            lines.append(f"  {kind:<12} {entry['state']:<{width}} {note or entry.get('stale_because') or entry['uri']}")
            if entry.get("changed"):
                lines.append(f"    configuration changed: {', '.join(entry['changed'])}")
            used = entry.get("gpu_hours", (entry.get("ladder") or {}).get("gpu_hours"))
            if kind == "train" and used is not None:
                lines.append(f"    GPU-hours  {used:.4g} used")
            if entry.get("holder_text"):
                lines.append(f"    held by {entry['holder_text']}")
            if entry.get("lease_broken"):
                lines.append(f"    {entry['lease_broken']}")
            if "ladder" in entry and entry["state"] in ("running", "failed", "interrupted"):
                lines += ladder_lines(entry["ladder"], entry["state"])
    lines.append(f"verdict: {document['verdict']}")
    return "\n".join(lines)


def ladder_lines(ladder: dict[str, Any], state: str = "running") -> list[str]:
    """Seed 003's ladder, top (the scheduler) to bottom (checkpoints), then the failure's tail; an interrupted
    training has no rate and no ETA (nothing runs)."""
    lines: list[str] = []
    gang = ladder.get("gang")
    if gang:
        state = gang.get("job_state") or f"unknown ({gang.get('job_state_note')})"
        lines.append(f"    job        {gang.get('scheduler')} {gang.get('job')}: {state}, attempt {gang['attempt']}")
        expected = gang["nodes_expected"]
        lines.append(f"    inputs     workers materialised: ranks {gang['ranks_with_inputs'] or 'none'}")
        lines.append(f"    ray        nodes alive {len(gang['nodes_alive'])}/{expected}")
    rate = ladder.get("rollout_tokens_per_s")
    lines.append(f"    engines    {f'{rate:g} tokens/s over the last steps' if rate else 'no rollout yet'}")
    if ladder.get("episodes"):
        lines.append(f"    episodes   {episode_line(ladder['episodes'])}")
    if ladder.get("resumed_from") is not None:
        lines.append(f"    resumed    from step {ladder['resumed_from']}")
    age = ladder.get("last_step_age_s")
    pace = (
        ""
        if state == "interrupted"
        else f", {ladder.get('steps_per_min') or '?'} steps/min, ETA {_clock(ladder.get('eta_s'))}"
    )
    lines.append(f"    steps      {ladder.get('last_step')}/{ladder['max_steps']}, last {_clock(age)} ago{pace}")
    lines.append(f"    checkpoint {ladder.get('last_checkpoint')}")
    attempt = ladder.get("attempt") or {}
    restarts = max(ladder.get("trainer_starts", 0) - 1, 0)
    lines.append(f"    restarts   {restarts} (trainer starts: {ladder.get('trainer_starts', 0)})")
    if attempt.get("exit_code") not in (None, 0) and state != "interrupted":
        lines.append(f"    last attempt {attempt['id']} exited with code {attempt['exit_code']}:")
        lines += [f"      {line}" for line in attempt["tail"][-LADDER_TAIL:]]
    return lines


def episode_line(episodes: dict[str, Any]) -> str:
    """An agent run's episodes since the batches in play (or the last ones) began, from its progress document."""
    errors = errors_text(episodes.get("errors") or {}) or "no sandbox errors"
    where = "playing" if episodes.get("playing") else "between batches"
    last = episodes.get("last_finished_age_s")
    finished = f"last finished {_clock(last)} ago" if last is not None else "none finished yet"
    return f"{where}: {episodes.get('finished', 0)} finished, {errors}; {finished}"
