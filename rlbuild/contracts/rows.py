"""The data contract between staging and the trainer: JSONL files of `{prompt, answer}` rows, and Harbor task
folders as rows.

`prompt` is a string; `answer` is whatever the reward environment compares against (a string for the built-in
tasks). Other columns are kept: an environment may read them.

Harbor task sets (terminal_bench's format): a task folder (Harbor 0.25, `harbor init` shows one) holds
`instruction.md` (what the agent is asked: the row's prompt), `task.toml` (limits, the verifier's settings),
`environment/` (how the sandbox is built: a Dockerfile and its context) and `tests/test.sh` (the verifier: it writes
`/logs/verifier/reward.txt` or `reward.json`, the row's reward). A source `harbor:<folder>` names one task folder
or a folder of them.

Staging reads them without Harbor (tomllib and the files): each row carries the whole task folder, so the trainer
rebuilds it byte for byte where the episode runs, and Harbor's own task loader and verifier run it there.

A task folder is data: a symbolic link in it (a file or a folder) is refused, never followed (`task_problems`),
since staging would read whatever it names on the staging machine into the rows, and from there into storage and
a provider's sandbox.

A sandbox backend that builds no image (recipe.py `IMAGELESS_BACKENDS`) runs a task whose Dockerfile only names a
base image and copies files from its context (FROM, WORKDIR, COPY, ENV, ARG, LABEL, USER, CMD, ENTRYPOINT), on the
node's own programs.
`local_image` says what such a Dockerfile sets up, or why a task needs a real build (a RUN line, a compose file,
a prebuilt image), for preflight to refuse before a GPU is allocated. A COPY source resolves inside the build
context (environment/) as an image build resolves it: an absolute source is relative to the context's root; one
that leaves the context (`..`), names nothing there or passes through a link is one of the image's `problems`,
with its line, since on a backend that builds no image the host itself would copy it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
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


# The files a local data source may hold, and how far the plan reads a JSONL file looking for its first row.
DATA_SUFFIXES = (".jsonl", ".parquet")
ROW_PROBE_BYTES = 1024 * 1024


def data_files(path: Path) -> list[Path]:
    """The files of a local data source: the file itself, or a folder's .jsonl and .parquet files in name order (a
    folder is one data set split over files)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES)


def no_rows_problem(path: Path) -> str | None:
    """Why the local data source at `path` would stage no rows, known without reading it all (None: it has rows,
    or it cannot be told cheaply and staging reads it): a file of another kind, a folder without data files, or
    data files that are all empty (a JSONL file read up to its first non-blank byte, at most ROW_PROBE_BYTES; a
    parquet file's footer)."""
    files = data_files(path)
    if path.is_file() and path.suffix not in DATA_SUFFIXES:
        return f"{path}: data files must be .jsonl or .parquet"
    if not files:
        return f"{path} holds no .jsonl or .parquet files"
    if any(_may_hold_rows(file) for file in files):
        return None
    what = "the file is" if path.is_file() else f"its {len(files)} data file(s) are"
    return f"{path} holds 0 rows ({what} empty or blank lines)"


def _may_hold_rows(file: Path) -> bool:
    try:
        if file.suffix == ".parquet":
            import pyarrow.parquet as pq  # only where a parquet file is named: its import takes most of a second

            return bool(pq.read_metadata(file).num_rows)
        with file.open("rb") as f:
            return bool(f.read(ROW_PROBE_BYTES).strip()) or bool(f.read(1))
    except (OSError, ValueError):  # a file that does not read (pyarrow's ArrowInvalid is a ValueError) is staging's
        return True  # to report, with its reason


def dump_rows(rows: Iterable[dict[str, Any]]) -> str:
    """Rows as JSONL text, one sorted-key object a line (byte-identical for the same rows)."""
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)


TASK_FILE = "task.toml"
INSTRUCTION = "instruction.md"
VERIFIER = "tests/test.sh"
DOCKERFILE = "environment/Dockerfile"
COMPOSE_FILES = ("environment/docker-compose.yaml", "environment/docker-compose.yml")
# Dockerfile instructions a backend can honour without building: they describe files and settings.
LOCAL_INSTRUCTIONS = frozenset({"FROM", "WORKDIR", "COPY", "ENV", "ARG", "LABEL", "USER", "CMD", "ENTRYPOINT"})


class HarborTaskError(RowError):
    """A Harbor task folder that cannot be a row: a file missing, a task.toml that does not parse, a link."""


@dataclass(frozen=True)
class TaskProblem:
    """One thing wrong in a task folder: where (a path, and its line where there is one), why, and the fix."""

    where: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: {self.why}; {self.fix}"


@dataclass
class LocalImage:
    """What a Dockerfile honoured without building sets up: the working folder, variables, copied files; and the
    COPY lines refused (`problems`): an image with any must not be laid out."""

    workdir: str = "/app"
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[str, str]] = field(default_factory=list)  # (path in environment/, absolute destination)
    problems: list[TaskProblem] = field(default_factory=list)


def task_folders(root: Path) -> list[Path]:
    """The task folders of a `harbor:` source: the folder itself if it is a task, else its task subfolders."""
    if (root / TASK_FILE).is_file():
        return [root]
    found = sorted(p for p in root.iterdir() if p.is_dir() and (p / TASK_FILE).is_file()) if root.is_dir() else []
    if not found:
        raise HarborTaskError(
            f"{root} is neither a Harbor task (no {TASK_FILE}) nor a folder of tasks; point the harbor: source at a "
            f"task folder or at the folder that holds them (`harbor init` makes one)"
        )
    return found


def task_problems(task: Path) -> list[TaskProblem]:
    """What keeps a task folder from being a row, each with its path and fix."""
    needed = "each task folder needs instruction.md, task.toml and tests/test.sh (`harbor init` writes them)"
    problems = [
        TaskProblem(str(task / name), "missing", needed)
        for name in (INSTRUCTION, VERIFIER)
        if not (task / name).is_file()
    ]
    try:
        tomllib.loads((task / TASK_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        problems.append(TaskProblem(str(task / TASK_FILE), f"does not parse ({error})", "write it as TOML"))
    _, strange = _task_files(task)
    return problems + strange


def _task_files(task: Path) -> tuple[list[Path], list[TaskProblem]]:
    """A task folder's files, walked without following a link (os.walk descends into no linked folder); and each
    entry that is neither a file nor a folder (a link, a FIFO, a device), as a problem."""
    files, problems = [], []
    if task.is_symlink():
        return [], [_link_problem(task)]
    for parent, folders, names in os.walk(task):
        for name in sorted(folders + names):
            path = Path(parent) / name
            if path.is_symlink():
                problems.append(_link_problem(path))
            elif path.is_file():
                files.append(path)
            elif not path.is_dir():
                why = "is neither a file nor a folder (a FIFO, socket or device)"
                problems.append(TaskProblem(str(path), why, "take it out of the task folder"))
    return sorted(files), problems


def _link_problem(path: Path) -> TaskProblem:
    why = f"is a symbolic link (to {os.readlink(path)!r}): a task folder is data, and staging never follows a link"
    return TaskProblem(str(path), why, "replace the link with a copy of what it names (`cp -L`), or take it out")


def task_row(task: Path) -> dict[str, Any]:
    """One task as a row: its instruction is the prompt, its verifier the reward (no answer column to compare)."""
    paths, problems = _task_files(task)
    if problems:
        raise HarborTaskError("; ".join(map(str, problems)))
    files = {path.relative_to(task).as_posix(): path.read_bytes() for path in paths}
    return {
        "prompt": files[INSTRUCTION].decode("utf-8").rstrip(),  # the file's last newline is not the instruction's
        "answer": None,
        "task": task.name,
        "harbor_task": {
            "files": {name: _encode(content) for name, content in files.items()},
            "sha256": {name: hashlib.sha256(content).hexdigest() for name, content in files.items()},
            # A program the image runs keeps its mode, as an image build's COPY keeps it from the build context.
            "executable": sorted(name for name in files if (task / name).stat().st_mode & 0o111),
        },
    }


def task_rows(root: Path) -> list[dict[str, Any]]:
    """Every task of a `harbor:` source as a row; every problem of every task at once."""
    tasks = task_folders(root)
    problems = [problem for task in tasks for problem in task_problems(task)]
    if problems:
        raise HarborTaskError(f"harbor:{root}: " + "; ".join(map(str, problems)))
    return [task_row(task) for task in tasks]


def write_task(row: dict[str, Any], folder: Path) -> Path:
    """Rebuild a row's task folder under `folder` (checked against the sha256 staging recorded); returns it."""
    task = row["harbor_task"]
    out = folder / PurePosixPath(row["task"]).name
    for name, encoded in task["files"].items():
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts:
            raise HarborTaskError(f"task {row['task']!r}: file {name!r} is outside the task folder")
        content = _decode(encoded)
        if hashlib.sha256(content).hexdigest() != task["sha256"][name]:
            raise HarborTaskError(f"task {row['task']!r}: {name} does not match the sha256 staging recorded")
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if name in task.get("executable", ()):
            path.chmod(0o755)
    return out


def local_image(task: Path) -> LocalImage | str:
    """What the task's Dockerfile sets up for a backend that builds no image, or why the task needs it built."""
    compose = [name for name in COMPOSE_FILES if (task / name).is_file()]
    if compose:
        return f"it is a multi-container task ({compose[0]})"
    config = tomllib.loads((task / TASK_FILE).read_text(encoding="utf-8"))
    prebuilt = (config.get("environment") or {}).get("docker_image")
    if prebuilt:
        return f"it runs in the prebuilt image {prebuilt!r}"
    dockerfile = task / DOCKERFILE
    image = LocalImage()
    if not dockerfile.is_file():
        return image
    for number, instruction, argument in _instructions(dockerfile.read_text(encoding="utf-8")):
        if instruction not in LOCAL_INSTRUCTIONS:
            return f"its Dockerfile needs building ({DOCKERFILE} line {number}: {instruction} {argument[:60]})"
        if instruction == "WORKDIR":
            image.workdir = str(PurePosixPath(image.workdir) / argument.strip())
        elif instruction == "ENV":
            image.env.update(_env_pairs(argument))
        elif instruction == "COPY":
            words = shlex.split(argument)
            paths = [word for word in words if not word.startswith("--")]  # --chown, --chmod: settings
            if any(word.startswith("--from") for word in words) or len(paths) < 2:
                return f"its Dockerfile copies from another image ({DOCKERFILE} line {number})"
            # A trailing slash says "into this folder", as in an image build: PurePosixPath would drop it.
            destination = str(PurePosixPath(image.workdir) / paths[-1]) + "/" * paths[-1].endswith("/")
            for source in paths[:-1]:
                inside = _in_context(dockerfile.parent, source)
                if isinstance(inside, str):
                    image.copies.append((inside, destination))
                else:
                    image.problems.append(TaskProblem(f"{dockerfile} line {number}", *inside))
    return image


def _in_context(context: Path, source: str) -> str | tuple[str, str]:
    """A COPY source as a path in the build context, as an image build resolves it (an absolute one from the context's
    root), or (why, fix) when it leaves the context, passes through a link, or names nothing there."""
    kept: list[str] = []
    for part in PurePosixPath(source).parts:
        if part == "..":
            if not kept:
                why = f"COPY source {source!r} leaves the build context (environment/), which an image build never does"
                return why, "put the file in the task's environment/ folder and name it relative to that folder"
            kept.pop()
        elif part not in ("/", "."):
            kept.append(part)
    path = context
    for part in kept:
        path /= part
        if path.is_symlink():
            why = f"COPY source {source!r} passes through the link {path.relative_to(context.parent)}"
            return why, "replace the link with a copy of what it names"
    if not path.exists():
        why = f"COPY source {source!r} names nothing in the build context (environment/{'/'.join(kept)})"
        return why, "add it to environment/ or correct the name (wildcards are not expanded without an image build)"
    return "/".join(kept) or "."


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, argument) of a Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        start = start or number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        instruction, _, argument = (pending + stripped).partition(" ")
        out.append((start, instruction.upper(), argument.strip()))
        pending, start = "", 0
    return out


def _env_pairs(argument: str) -> dict[str, str]:
    words = shlex.split(argument)
    if len(words) >= 2 and "=" not in words[0]:  # the old form: ENV NAME value with spaces
        return {words[0]: " ".join(words[1:])}
    return dict(word.split("=", 1) for word in words if "=" in word)


def _encode(content: bytes) -> str | dict[str, str]:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(content).decode()}


def _decode(encoded: str | dict[str, str]) -> bytes:
    return encoded.encode("utf-8") if isinstance(encoded, str) else base64.b64decode(encoded["base64"])
