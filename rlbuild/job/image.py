"""A gang inside an Apptainer image (where the jobs share this checkout's file system), and the image's
declaration checked on the node.

Where `runtime.image` is a SIF file (`/path/x.sif@sha256:...`) or a `docker://...@sha256:...` reference, every srun
task of the train gang runs `apptainer exec --nv` of it: the checkout bound at its own path and first on PYTHONPATH
(the gang and the trainer are this checkout's code, the image's packages run them), the working folder bound and
kept, the host's environment passed through as Apptainer does by default (no --cleanenv), so the storage
credentials and the experiment's `execution.env` reach the tasks exactly as without an image. The SIF's digest was
checked by preflight on the submitting host; Apptainer is given the file.

What the image holds is declared beside it (`runtime.image_provides`); each node compares that declaration with
what it finds before Ray starts, torch first and by `torch.__version__`: a SIF's `vllm.__version__` can name
another build than the one baked in, the torch it was built against does not.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from rlbuild.contracts.launch import apptainer_target
from rlbuild.contracts.runtime import REPO_ROOT

APPTAINER = "apptainer"
PYTHON_IN_IMAGE = "python3"  # the image's interpreter: its packages, not this host's .venv


def apptainer_prefix(image: str | None, workdir: Path | None = None) -> list[str]:
    """`apptainer exec --nv ... <image>` for an image Apptainer runs, else nothing (the task runs this .venv)."""
    target = apptainer_target(image)
    if target is None:
        return []
    workdir = workdir or Path.cwd()
    binds = dict.fromkeys([str(REPO_ROOT), str(workdir)])  # one bind each, in order, when they coincide
    argv = [APPTAINER, "exec", "--nv"]
    for bound in binds:
        argv += ["--bind", bound]
    return [*argv, "--pwd", str(workdir), "--env", f"PYTHONPATH={REPO_ROOT}", target]


def python_for(image: str | None) -> str:
    """The interpreter a gang task starts: the image's inside an Apptainer image, else this one's."""
    return PYTHON_IN_IMAGE if apptainer_target(image) is not None else sys.executable


def found_version(package: str) -> str | None:
    """The version of `package` on this node, or None; torch by `torch.__version__` (see the module's note)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        return None
    if package == "torch" and spec.origin is not None:
        return torch_version(Path(spec.origin).parent / "version.py")
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def torch_version(version_file: Path) -> str | None:
    """`torch.__version__` as torch/version.py assigns it (torch re-exports it), read without importing torch: an
    import takes seconds on every node of every link, before Ray starts."""
    try:
        tree = ast.parse(version_file.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return str(node.value.value) if isinstance(node.value, ast.Constant) else None
    return None


def matches(declared: str, found: str) -> bool:
    """`found` is the declared version, or a release under a declared prefix: "2.11" holds "2.11.0+cu128"."""
    release = found.split("+", 1)[0]
    return release == declared or release.startswith(declared + ".")


def provides_mismatches(
    provides: Mapping[str, str] | None, find: Callable[[str], str | None] = found_version
) -> list[str]:
    """Each declared package this node does not hold as declared, torch first, as "torch 2.11 (found 2.9.0)"."""
    declared = dict(provides or {})
    out = []
    for package in sorted(declared, key=lambda name: name != "torch"):
        found = find(package)
        if found is None or not matches(declared[package], found):
            out.append(f"{package} {declared[package]} (found {found or 'none'})")
    return out
