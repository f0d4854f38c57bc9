"""Guards on the project's shape: the dependency runs one way, functions stay readable, the runtime digest
follows what runs in a job, and the contract page names every module."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from rlbuild.contracts import runtime

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("rlbuild", "trainer", "plugins")
MAX_FUNCTION_LINES = 80


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_rlbuild_never_imports_the_trainer() -> None:
    offenders = {
        str(p.relative_to(REPO)): sorted(n for n in _imports(p) if n.split(".")[0] == "trainer")
        for p in _python_files("rlbuild")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for path in _python_files(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_the_runtime_is_the_trainer_the_bootstrap_and_what_they_import() -> None:
    files = {p.relative_to(REPO).as_posix() for p in runtime.runtime_files(REPO)}
    assert {
        "trainer/loop.py",
        "rlbuild/job/gang.py",
        "rlbuild/contracts/launch.py",
        "rlbuild/contracts/recipe.py",
        "rlbuild/core/storage.py",
    } <= files
    # Plan printing, preflight messages and the command line are not part of what runs in a job.
    assert not files & {
        "rlbuild/plan/planview.py",
        "rlbuild/plan/preflight.py",
        "rlbuild/cli.py",
        "rlbuild/workflow.py",
    }


def test_comments_and_docstrings_do_not_change_the_runtime_digest(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    for folder in ("rlbuild", "trainer"):
        shutil.copytree(REPO / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "uv.lock", copy / "uv.lock")
    before = runtime.source_digest.__wrapped__(copy)  # type: ignore[attr-defined]
    loop = copy / "trainer" / "loop.py"
    text = loop.read_text()
    loop.write_text(text.replace('"""The GRPO training loop', '"""The GRPO training loop (edited)') + "# a comment\n")
    (copy / "rlbuild" / "planview.py").write_text((copy / "rlbuild" / "planview.py").read_text() + "\nX = 1\n")
    assert runtime.source_digest.__wrapped__(copy) == before  # type: ignore[attr-defined]
    loop.write_text(text.replace("step += 1", "step += 1  # noqa\n        pass"))
    assert runtime.source_digest.__wrapped__(copy) != before  # type: ignore[attr-defined]


@pytest.mark.parametrize("folder", ["rlbuild", "trainer"])
def test_the_contract_page_names_every_module(folder: str) -> None:
    design = (REPO / "docs" / "design.md").read_text()
    missing = [
        p.relative_to(REPO).as_posix()
        for p in _python_files(folder)
        if p.name not in ("__init__.py", "__main__.py") and p.relative_to(REPO).as_posix() not in design
    ]
    assert missing == []


def test_the_contract_page_points_at_nothing_outside_the_repository() -> None:
    assert "../" not in (REPO / "docs" / "design.md").read_text()
