"""Reading the YAML files users write (experiments, the workflow config) strictly, every problem as one line.

Stricter than `yaml.safe_load` where YAML's defaults hide mistakes: a key given twice is an error (the later one
would silently win), `1e-3` is the number it looks like (YAML 1.1 reads it as a string), and YAML 1.1 merge keys
(`<<: *base`) merge as their spec says. Problems with the file itself (missing, a directory, a symlink loop, a link
to nothing, a FIFO or device, unreadable, not UTF-8, empty, not YAML) are errors naming the file and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from rlbuild.core.errors import PreflightError, Violation
from rlbuild.core.paths import path_problem

# YAML 1.2's float syntax (1e-3, 1E+5, .5, 5.) on top of PyYAML's YAML 1.1 resolver.
FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$", re.ASCII)


MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping gives the same key twice."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads YAML 1.2 floats. YAML 1.1 merge keys work as the merge-key
    spec says: `<<: *base` (or `<<: [*a, *b]`, earlier ones first) brings in the keys of those mappings, a key
    given beside it wins, also through merges of merges (PyYAML 6.0 lets the deepest one win there); a key given
    twice in one mapping is still refused."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._flattening: set[int] = set()  # the mappings whose merges are being resolved (a cycle is refused)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        own = [(key, value) for key, value in node.value if key.tag != MERGE_TAG]
        self._refuse_duplicates(own)
        taken = {self._key(key) for key, _ in own}
        merged = []
        self._flattening.add(id(node))
        for source in self._merged_mappings(node):
            if id(source) in self._flattening:
                problem = "merges a mapping into itself (through its own alias)"
                raise yaml.constructor.ConstructorError("while merging", node.start_mark, problem, source.start_mark)
            self.flatten_mapping(source)
            for key, value in source.value:
                if self._key(key) not in taken:
                    taken.add(self._key(key))
                    merged.append((key, value))
        self._flattening.discard(id(node))
        node.value = merged + own

    def _merged_mappings(self, node: yaml.MappingNode) -> list[yaml.MappingNode]:
        """The mappings `node`'s merge keys name, in the order they take precedence."""
        found: list[yaml.MappingNode] = []
        for key, value in node.value:
            if key.tag != MERGE_TAG:
                continue
            for source in value.value if isinstance(value, yaml.SequenceNode) else [value]:
                if not isinstance(source, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"expected a mapping or list of mappings for merging, but found {source.id}",
                        source.start_mark,
                    )
                found.append(source)
        return found

    def _key(self, node: yaml.Node) -> Any:
        key = self.construct_object(node, deep=True)  # type: ignore[no-untyped-call]
        return key if isinstance(key, Hashable) else repr(key)  # an unhashable key is refused when constructed

    def _refuse_duplicates(self, pairs: list[tuple[yaml.Node, yaml.Node]]) -> None:
        seen: dict[Any, int] = {}
        for key_node, _ in pairs:
            key = self._key(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                problem = f"key {key!r} is given twice (lines {seen[key]} and {line}); the later one would silently win"
                raise DuplicateKeyError(problem=problem, problem_mark=key_node.start_mark)
            seen[key] = line


StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT, list("-+0123456789."))  # type: ignore[no-untyped-call]


def load_yaml(path: Path, what: str) -> Any:
    """The parsed document; PreflightError with one violation naming the problem with the file otherwise."""
    path = Path(path)

    def refuse(message: str, fix: str) -> PreflightError:
        return PreflightError(str(path), [Violation(what, message, fix)])

    if path.is_dir():
        raise refuse(f"{path} is a directory", "point at the .yaml file inside it")
    problem = path_problem(path, "file")
    if problem == "does not exist":
        raise refuse("file not found", "create it, or check the name and the folder")
    if problem is not None:
        raise refuse(f"{path} {problem}", "point at a readable .yaml file")
    try:
        data = path.read_bytes()
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
        if "merg" in problem:  # PyYAML's words for a `<<:` whose value is not an alias of a mapping
            fix = "`<<:` takes an alias of a mapping (`<<: *base`) or a list of them (`<<: [*a, *b]`)"
            raise refuse(f"has a merge key (`<<`){where} that cannot be merged: {problem}", fix) from None
        raise refuse(f"is not valid YAML{where}: {problem}", "fix the YAML syntax there") from None
