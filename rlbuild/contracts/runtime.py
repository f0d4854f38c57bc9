"""What runs inside a job, and the digest that names it.

The runtime is the node-side code, named as folders: the trainer package and the rlbuild layers a job runs
(core, contracts, job, schedulers), plus the data files they read (DATA_FILES) and the lock file that pins the
packages. Its digest is what checkpoints are stamped with and what a fixed version's training is tied to. The
submit-side folders (plan, stages, ops) and the front doors (cli, workflow) are not part of it, and neither are
comments or docstrings: each module contributes the digest of its syntax tree.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import sys
from functools import cache
from pathlib import Path

from rlbuild.core.inventory import cache_dir
from rlbuild.core.storage import write_text

REPO_ROOT = Path(__file__).resolve().parents[2]
# tests/test_structure.py holds these folders to importing only each other (and third-party packages).
RUNTIME_FOLDERS = ("trainer", "rlbuild/core", "rlbuild/contracts", "rlbuild/job", "rlbuild/schedulers")
LOCK_FILE = "uv.lock"
# Files the runtime reads besides code: the tiny models' architectures (rlbuild/contracts/tinymodel.py).
DATA_FILES = ("rlbuild/contracts/tiny_model.json", "rlbuild/contracts/tiny_agent_model.json")


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def runtime_files(root: Path = REPO_ROOT) -> list[Path]:
    """The Python files of the runtime: every module under RUNTIME_FOLDERS."""
    return sorted(
        path for folder in RUNTIME_FOLDERS for path in (root / folder).rglob("*.py") if "__pycache__" not in path.parts
    )


@cache
def source_digest(root: Path = REPO_ROOT) -> str:
    """sha256 over the runtime modules' syntax trees (comments and docstrings do not count), its data files and
    the lock file. Parsing every module costs about a second, on every dry run: the digest is kept on this
    machine under the sha256 of the exact bytes it is computed from (and the Python version, whose syntax trees
    it dumps), so the same files give the same digest without parsing them again."""
    files = runtime_files(root)
    raw = hashlib.sha256(sys.version.encode())
    for path in [*files, *(root / name for name in (*DATA_FILES, LOCK_FILE))]:
        if path.is_file():
            raw.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    kept = cache_dir() / "runtime-digest" / raw.hexdigest()
    with contextlib.suppress(OSError):
        found = kept.read_text().strip()
        if len(found) == 64 and all(c in "0123456789abcdef" for c in found):  # a torn write is recomputed
            return found
    digest = _digest(root, files)
    with contextlib.suppress(OSError):
        write_text(str(kept), digest)
    return digest


def _digest(root: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        tree = _without_docstrings(ast.parse(path.read_text(), str(path)))
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(ast.dump(tree, include_attributes=False).encode() + b"\0")
    for name in (*DATA_FILES, LOCK_FILE):
        if (root / name).is_file():
            digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    return digest.hexdigest()
