"""The data contract between staging and the trainer: JSONL files of `{prompt, answer}` rows.

`prompt` is a string; `answer` is whatever the reward environment compares against (a string for the built-in
tasks). Other columns are kept: an environment may read them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rlbuild.core.errors import RlbuildError

COLUMNS = ("prompt", "answer")


class RowError(RlbuildError):
    """A data row that breaks the contract; the message names the file, the line and the fix."""


def check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise RowError(f"{where}: a row is {type(row).__name__}, expected an object with {list(COLUMNS)}")
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise RowError(
            f"{where}: missing column(s) {missing}; every row needs {list(COLUMNS)} "
            f"(found {sorted(row)}). Rename the columns in the data set or point the source at one that has them."
        )
    if not isinstance(row["prompt"], str):
        raise RowError(f"{where}: 'prompt' is {type(row['prompt']).__name__}, expected a string")
    return row


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a JSONL file, each checked; blank lines are skipped."""
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RowError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            yield check_row(row, f"{path}:{lineno}")


def dump_rows(rows: Iterable[dict[str, Any]]) -> str:
    """Rows as JSONL text, one sorted-key object a line (byte-identical for the same rows)."""
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)
