"""Guards on the project's shape: which folder may import which, no import circle, folders and functions that
stay readable, nothing outside tests/ importing tests/, the runtime digest covering the node-side folders, and the
contract page naming every module."""

from __future__ import annotations

import ast
import re
import shutil
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from rlbuild.contracts import runtime

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("rlbuild", "trainer", "plugins")
MAX_FUNCTION_LINES = 60
MAX_MODULES_PER_FOLDER = 12
PLUGIN = "snakemake_executor_plugin_iris"
# What each layer may import (besides itself and third-party packages); docs/design.md explains each folder.
# `rlbuild` is the front doors (cli.py, workflow.py), which may import every layer.
LAYERS: dict[str, set[str]] = {
    "rlbuild.core": set(),
    "rlbuild.contracts": {"rlbuild.core"},
    "rlbuild.job": {"rlbuild.core", "rlbuild.contracts"},
    "rlbuild.schedulers": {"rlbuild.core", "rlbuild.contracts", "rlbuild.job"},
    "rlbuild.stages": {"rlbuild.core", "rlbuild.contracts"},
    "rlbuild.plan": {"rlbuild.core", "rlbuild.contracts", "rlbuild.schedulers", "rlbuild.stages"},
    "rlbuild.ops": {
        "rlbuild.core",
        "rlbuild.contracts",
        "rlbuild.job",
        "rlbuild.schedulers",
        "rlbuild.plan",
        "rlbuild.stages",
    },
    "rlbuild.dev": {"rlbuild.core", "rlbuild.contracts", "rlbuild.schedulers", "rlbuild.stages", "rlbuild.plan"},
    "rlbuild": {"rlbuild.*"},
    "trainer": {"rlbuild.core", "rlbuild.contracts"},
    PLUGIN: {"rlbuild.core", "rlbuild.schedulers"},
}


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    if PLUGIN in parts:
        parts = parts[parts.index(PLUGIN) :]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """What a module imports, at run time (imports for type checkers only are left out)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _layer(module: str) -> str:
    """The LAYERS key a module belongs to: its rlbuild folder, or its top-level package."""
    parts = module.split(".")
    if parts[0] == "rlbuild" and len(parts) > 1 and (REPO / "rlbuild" / parts[1]).is_dir():
        return f"rlbuild.{parts[1]}"
    return parts[0]


def _local_modules() -> dict[str, Path]:
    return {_module(p): p for p in _python_files(*PACKAGES)}


def _local_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The local modules `path` imports (an imported name that is a module counts as that module)."""
    return {name for name in _imports(path) if name in modules} - {_module(path)}


def test_every_layer_imports_only_the_layers_below_it() -> None:
    modules = _local_modules()
    offenders = defaultdict(list)
    for module, path in modules.items():
        layer = _layer(module)
        allowed = LAYERS[layer] | {layer}
        for name in sorted(_local_imports(path, modules)):
            target = _layer(name)
            if target not in allowed and not ("rlbuild.*" in allowed and target.startswith("rlbuild")):
                offenders[module].append(name)
    assert dict(offenders) == {}


def test_the_import_graph_has_no_circle() -> None:
    modules = _local_modules()
    graph = {module: _local_imports(path, modules) for module, path in modules.items()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        pytest.fail(f"import circle: {' -> '.join(error.args[1])}")


def test_no_folder_holds_more_than_a_dozen_modules() -> None:
    crowded = {}
    for folder in {p.parent for p in _python_files(*PACKAGES)}:
        count = sum(1 for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
        if count > MAX_MODULES_PER_FOLDER:
            crowded[folder.relative_to(REPO).as_posix()] = count
    assert crowded == {}


def test_nothing_outside_tests_imports_tests() -> None:
    code = [p for p in _python_files(*PACKAGES, "scripts", "benchmarks")]
    code += [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
    offenders = {
        p.relative_to(REPO).as_posix(): sorted(n for n in _imports(p) if n.split(".")[0] == "tests")
        for p in code
        if p.suffix == ".py"
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert not [p for p in code if p.suffix != ".py" and "from tests" in p.read_text()]


def test_no_function_is_longer_than_60_lines() -> None:
    long = []
    for path in _python_files(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_the_runtime_is_the_node_side_folders() -> None:
    files = {p.relative_to(REPO).as_posix() for p in runtime.runtime_files(REPO)}
    assert {
        "trainer/loop.py",
        "rlbuild/job/gang.py",
        "rlbuild/contracts/launch.py",
        "rlbuild/contracts/recipe.py",
        "rlbuild/core/storage.py",
    } <= files
    # Plan printing, preflight messages and the command line are not part of what runs in a job.
    assert not {f for f in files if f.startswith(("rlbuild/plan/", "rlbuild/ops/", "rlbuild/stages/"))}
    assert not files & {"rlbuild/cli.py", "rlbuild/workflow.py"}


def test_comments_and_docstrings_do_not_change_the_runtime_digest(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    for folder in ("rlbuild", "trainer"):
        shutil.copytree(REPO / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "uv.lock", copy / "uv.lock")
    before = runtime.source_digest.__wrapped__(copy)  # type: ignore[attr-defined]
    loop = copy / "trainer" / "loop.py"
    text = loop.read_text()
    loop.write_text(text.replace('"""The GRPO training loop', '"""The GRPO training loop (edited)') + "# a comment\n")
    (copy / "rlbuild" / "plan" / "planview.py").write_text(
        (copy / "rlbuild" / "plan" / "planview.py").read_text() + "\nX = 1\n"
    )
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


# Where a scheduler may be named: its own package, the registry, and what is not code (docs, profiles, the
# executor plugins Snakemake loads for a scheduler, the tests).
SCHEDULER_CODE = ("rlbuild/schedulers/",)


def test_nothing_outside_the_schedulers_packages_names_a_scheduler() -> None:
    """A scheduler is one package: no module, docstring or comment of rlbuild (outside rlbuild/schedulers/), the
    trainer, the Snakefile or the rules names one, so adding a scheduler touches its package and the registry."""
    from rlbuild.schedulers.registry import SCHEDULERS

    names = [name for name in SCHEDULERS if name != "local"]  # `local` is also an ordinary word
    word = re.compile(rf"(?<![A-Za-z0-9])({'|'.join(names)})(?![a-z])", re.IGNORECASE)
    files = [*_python_files("rlbuild", "trainer"), REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        if not path.relative_to(REPO).as_posix().startswith(SCHEDULER_CODE)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if word.search(line)
    ]
    assert found == []
    assert word.search("SLURM_JOB_ID") and word.search("execution.iris") and not word.search("irises")


def _design_import_table() -> dict[str, set[str]]:
    """docs/design.md's table of folders and what each may import, as LAYERS spells it."""
    design = (REPO / "docs" / "design.md").read_text()
    table = design.split("| folder | may import |", 1)[1].split("\n\n", 1)[0]
    layers: dict[str, set[str]] = {}
    for row in table.strip().splitlines()[1:]:
        folder, imports = (cell.strip() for cell in row.strip("|").split("|"))
        if folder.startswith("`rlbuild/cli.py`"):
            key = "rlbuild"
        elif folder == "the Iris executor plugin":
            key = PLUGIN
        else:
            key = folder.strip("`/").replace("/", ".")
        if imports == "nothing of rlbuild":
            layers[key] = set()
        elif imports == "every folder of rlbuild":
            layers[key] = {"rlbuild.*"}
        else:
            layers[key] = {f"rlbuild.{name.strip()}" for name in imports.split(",")}
    return layers


def test_the_design_pages_import_table_is_the_one_the_code_is_held_to() -> None:
    assert _design_import_table() == LAYERS
