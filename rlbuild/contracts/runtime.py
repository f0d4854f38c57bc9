"""What runs inside a job, and the digest that names it.

The runtime is the trainer package and the gang bootstrap, plus every rlbuild module they import (followed
through their imports), plus the data files it reads (DATA_FILES) and the lock file that pins the packages. Its
digest is what checkpoints are stamped with and what a fixed version's training is tied to. Plan printing,
preflight messages and the CLI are not part of it, and neither are comments or docstrings: each module
contributes the digest of its syntax tree.
"""

from __future__ import annotations

import ast
import hashlib
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ENTRY_PACKAGES = ("trainer",)
ENTRY_MODULES = ("rlbuild.job.gang",)
LOCK_FILE = "uv.lock"
# Files the runtime reads besides code: the tiny model's architecture (rlbuild/contracts/tinymodel.py).
DATA_FILES = ("rlbuild/contracts/tiny_model.json",)


def _module_path(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


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
    """The Python files of the runtime: the entry packages and modules, and every local module they import."""
    pending = [p for package in ENTRY_PACKAGES for p in sorted((root / package).rglob("*.py"))]
    pending += [p for m in ENTRY_MODULES if (p := _module_path(root, m)) is not None]
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in seen or "__pycache__" in path.parts:
            continue
        seen.add(path)
        for name in _imported_modules(ast.parse(path.read_text(), str(path))):
            if name.split(".")[0] in ("rlbuild", *ENTRY_PACKAGES):
                found = _module_path(root, name)
                if found is not None:
                    pending.append(found)
    return sorted(seen)


@cache
def source_digest(root: Path = REPO_ROOT) -> str:
    """sha256 over the runtime modules' syntax trees (comments and docstrings do not count), its data files and
    the lock file."""
    digest = hashlib.sha256()
    for path in runtime_files(root):
        tree = _without_docstrings(ast.parse(path.read_text(), str(path)))
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(ast.dump(tree, include_attributes=False).encode() + b"\0")
    for name in (*DATA_FILES, LOCK_FILE):
        if (root / name).is_file():
            digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    return digest.hexdigest()
