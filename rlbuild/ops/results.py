"""What a finished build shows the person who ran it, where they look first.

`snakemake --report` (the last step of `make main`) ends with each version's held-out accuracy before and after
training, where its eval's results and log are, and where the report is (`closing_lines`); the report opens on
the same results: the accuracy, the training curves, the eval table and the resolved plan, in the report's
global description, which Snakemake shows beside the job graph on its first page (`landing_text`). Everything is
read from storage (local or S3) under the experiment root, as the eval and launch stages wrote it.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlbuild.contracts.artifacts import artifact
from rlbuild.core import storage
from rlbuild.stages.evaluation import CURVES, accuracy_line, table_rows

PLAN = "plan.txt"  # the launch rule's human-readable plan (rules/launch.smk)
URI_LINE = 76


@dataclass(frozen=True)
class Outcome:
    """One version key's eval as storage holds it (`results` None: not evaluated)."""

    experiment: str
    key: str
    results_uri: str
    results: dict[str, Any] | None
    curves: bytes | None
    plan: str | None


def read_outcome(experiment: str, experiment_root: str, key: str) -> Outcome:
    eval_folder = storage.join(experiment_root, artifact("eval").version_folder(key))
    results_uri = storage.join(experiment_root, artifact("eval").path(key))
    text = storage.read_text(results_uri)
    plan = storage.read_text(storage.join(experiment_root, artifact("launch").file(key, PLAN)))
    curves = storage.read_bytes(storage.join(eval_folder, CURVES)) if text is not None else None
    return Outcome(experiment, key, results_uri, None if text is None else json.loads(text), curves, plan)


def headline(outcome: Outcome) -> str:
    if outcome.results is None:
        return f"{outcome.experiment} v{outcome.key}: not evaluated (build eval/v{outcome.key})"
    return f"{outcome.experiment} v{outcome.key}: {accuracy_line(outcome.results)}"


def closing_lines(outcomes: Sequence[Outcome], report: str, log_of: dict[str, str]) -> list[str]:
    """The last lines of the report step: per version its result, its eval's results and log; then the report
    (`log_of`: the eval log of each version key that has one)."""
    lines: list[str] = []
    for outcome in outcomes:
        lines.append(f"rlbuild: {headline(outcome)}")
        if outcome.results is not None:
            log = f" (its log: {log_of[outcome.key]})" if outcome.key in log_of else ""
            lines.append(f"rlbuild:   eval    {outcome.results_uri}{log}")
    return [*lines, f"rlbuild:   report  {report}"]


def landing_text(outcomes: Sequence[Outcome]) -> str:
    """The report's global description (reStructuredText; Snakemake renders it through Jinja, so it is kept raw):
    per version its result, curves, eval table and plan, then where the rest of the report is."""
    parts = ["Results", "=======", ""]
    for outcome in outcomes:
        parts += [_escape(headline(outcome)), ""]
        if outcome.curves:
            # A URI may span lines (they are joined): docutils refuses a line over 10,000 characters.
            image = base64.b64encode(outcome.curves).decode()
            lines = [image[at : at + URI_LINE] for at in range(0, len(image), URI_LINE)]
            parts += [".. image::", "   data:image/png;base64,", *(f"   {line}" for line in lines)]
            parts += [f"   :alt: training curves of v{outcome.key}", ""]
        if outcome.results is not None:
            parts += [".. list-table::", ""]
            for name, value in table_rows(outcome.results):
                parts += [f"   * - {_escape(name)}", f"     - {_escape(value)}"]
            parts.append("")
        if outcome.plan:
            parts += [f"The plan of v{outcome.key}::", "", *(f"   {line}" for line in outcome.plan.splitlines()), ""]
    parts.append("Every file of the run is in the menu: Eval (results.json, the table, the curves), Plan, Series.")
    return "{% raw %}\n" + "\n".join(parts) + "\n{% endraw %}\n"


def _escape(text: str) -> str:
    """Plain text in reStructuredText: markup characters as themselves."""
    return re.sub(r"([\\`*_|])", r"\\\1", text)
