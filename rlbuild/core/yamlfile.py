"""Reading the YAML files users write (experiments, the workflow config) strictly, every problem as one line.

Stricter than `yaml.safe_load` where YAML's defaults hide mistakes: a key given twice is an error (the later one
would silently win), and `1e-3` is the number it looks like (YAML 1.1 reads it as a string). Problems with the
file itself (missing, a directory, unreadable, not UTF-8, empty, not YAML) are errors naming the file and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from rlbuild.core.errors import PreflightError, Violation

# YAML 1.2's float syntax (1e-3, 1E+5, .5, 5.) on top of PyYAML's YAML 1.1 resolver.
FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping gives the same key twice."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads YAML 1.2 floats."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                problem = f"key {key!r} is given twice (lines {seen[key]} and {line}); the later one would silently win"
                raise DuplicateKeyError(problem=problem, problem_mark=key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT, list("-+0123456789."))  # type: ignore[no-untyped-call]


def load_yaml(path: Path, what: str) -> Any:
    """The parsed document; PreflightError with one violation naming the problem with the file otherwise."""
    path = Path(path)

    def refuse(message: str, fix: str) -> PreflightError:
        return PreflightError(str(path), [Violation(what, message, fix)])

    if path.is_dir():
        raise refuse(f"{path} is a directory", "point at the .yaml file inside it")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise refuse("file not found", "create it, or check the name and the folder") from None
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})", "check the file's permissions") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise refuse(f"is not UTF-8 text (byte {data[exc.start]:#04x} on line {line})", "save it as UTF-8") from None
    if not text.strip():
        raise refuse("is empty", "write the document, or pick another file")
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, DuplicateKeyError):
            raise refuse(problem, "keep one of them") from None
        raise refuse(f"is not valid YAML{where}: {problem}", "fix the YAML syntax there") from None
