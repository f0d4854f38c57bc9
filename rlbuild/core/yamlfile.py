"""Reading the YAML files users write (experiments, the workflow config) strictly, every problem as one line.

Stricter than `yaml.safe_load` where YAML's defaults hide mistakes: a key given twice is an error (the later one
would silently win), `1e-3` is the number it looks like (YAML 1.1 reads it as a string), YAML 1.1 merge keys
(`<<: *base`) merge as their spec says, and a key YAML would read as something other than text (`2026-09-21:` a
date, `on:` true, `12:` a number, `null:` nothing) is refused as the user wrote it, with the quoting that fixes it.
Problems with the file itself (missing, a directory, a symlink loop, a link to nothing, a FIFO or device,
unreadable, not UTF-8, empty, not YAML) are errors naming the file and the fix.

Bounded whatever the file holds: at most MAX_BYTES read, MAX_DEPTH levels of nesting (PyYAML composes recursively,
so 10,000 `[` were a RecursionError), MAX_NODES values once aliases are expanded (an alias bomb: ten aliases of ten
aliases is a billion values in a few hundred bytes), each refused in one line before anything is built from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml._yaml import CParser
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from rlbuild.core.errors import PreflightError, Violation
from rlbuild.core.paths import path_problem

# YAML 1.2's float syntax (1e-3, 1E+5, .5, 5.) on top of PyYAML's YAML 1.1 resolver.
FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$", re.ASCII)


MERGE_TAG = "tag:yaml.org,2002:merge"
STR_TAG = "tag:yaml.org,2002:str"
# What YAML reads an unquoted key as, in the words of the person who wrote it.
READ_AS = {
    "tag:yaml.org,2002:bool": "true/false",
    "tag:yaml.org,2002:int": "a number",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:null": "null (no value)",
    "tag:yaml.org,2002:timestamp": "a date",
}

# The experiments and profiles of this checkout are a few kilobytes, nest 8 levels and hold a few hundred values;
# these bounds are far beyond them and keep a check within seconds (a 50 MB file took 60 s to read; 256 KiB of the
# densest YAML, a short key a line, takes PyYAML's composer about a second).
MAX_BYTES = 256 * 1024
MAX_DEPTH = 64
MAX_NODES = 100_000
# YAML reads an implicit key (one without `? `) of at most this many characters; a longer one is a syntax error.
MAX_PLAIN_KEY = 1024

FLAT = "flatten the structure: an experiment nests a few levels"
NOT_DATA = "an experiment describes a run in a few kilobytes: put data in a data source (local:<file>), not here"


class BoundError(yaml.MarkedYAMLError):
    """The document goes past one of the bounds above, or holds itself; its note is the fix."""


class TextKeyError(yaml.YAMLError):
    """Keys that YAML reads as something other than text: (where, as written, what YAML made of it), each."""

    def __init__(self, keys: list[tuple[str, str, str]]) -> None:
        super().__init__(f"{len(keys)} key(s) are not text")
        self.keys = keys


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping gives the same key twice."""


class StrictLoader(CParser, Composer, SafeConstructor, Resolver):
    """SafeLoader that refuses duplicate keys and reads YAML 1.2 floats. YAML 1.1 merge keys work as the merge-key
    spec says: `<<: *base` (or `<<: [*a, *b]`, earlier ones first) brings in the keys of those mappings, a key
    given beside it wins, also through merges of merges (PyYAML 6.0 lets the deepest one win there); a key given
    twice in one mapping is still refused.

    libyaml (in PyYAML's wheels) scans and parses, without recursion and about five times faster than PyYAML's
    Python scanner (which took 18 s for a 1 MiB file of short keys on a loaded machine); PyYAML's own composer
    builds the nodes from its events, so the bounds are checked node by node before any object is built."""

    def __init__(self, stream: str) -> None:
        CParser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._flattening: set[int] = set()  # the mappings whose merges are being resolved (a cycle is refused)
        self._depth = 0
        self._expanded: dict[int, int] = {}  # id of a composed node -> the values it stands for, aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Nodes as PyYAML composes them, refused as soon as the first node past a bound is read: MAX_DEPTH levels,
        MAX_NODES values written or MAX_NODES once aliases are expanded, or an alias inside its own anchor (a
        structure that contains itself; a merge of one is refused as a merge when flattened)."""
        event = self.peek_event()
        if self._depth >= MAX_DEPTH:
            raise BoundError(problem=f"nests deeper than {MAX_DEPTH} levels", problem_mark=event.start_mark, note=FLAT)
        merged = isinstance(index, yaml.ScalarNode) and index.tag == MERGE_TAG
        aliased = self.anchors.get(event.anchor) if isinstance(event, yaml.AliasEvent) else None
        if aliased is not None and id(aliased) not in self._expanded and not merged:
            problem = f"has an alias *{event.anchor} inside its own anchor, a value that contains itself"
            raise BoundError(problem=problem, problem_mark=event.start_mark, note="write the inner value out")
        self._depth += 1
        try:
            node = super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        finally:
            self._depth -= 1
        if id(node) not in self._expanded:  # a node of its own (an alias repeats one composed before)
            children = node.value if isinstance(node, yaml.SequenceNode) else []
            if isinstance(node, yaml.MappingNode):
                children = [child for pair in node.value for child in pair]
            size = 1 + sum(self._expanded.get(id(child), 1) for child in children)
            if len(self._expanded) >= MAX_NODES:  # values written out, each once
                problem = f"holds more than {MAX_NODES:,} values"
                raise BoundError(problem=problem, problem_mark=node.start_mark, note=NOT_DATA)
            if size > MAX_NODES:
                problem = f"expands to more than {MAX_NODES:,} values through its aliases (`*name`)"
                note = "write the values out instead of through aliases"
                raise BoundError(problem=problem, problem_mark=node.start_mark, note=note)
            self._expanded[id(node)] = size
        return node

    def get_single_node(self) -> yaml.Node | None:
        node = Composer.get_single_node(self)  # type: ignore[no-untyped-call]
        if node is not None:
            keys = _non_text_keys(node)
            if keys:
                raise TextKeyError(keys)
        return node

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


def _non_text_keys(root: yaml.Node) -> list[tuple[str, str, str]]:
    """Every scalar key of the document YAML reads as other than text (merge keys aside), as (the dotted path of
    its mapping as written, the key as written, what YAML reads it as); each node once, aliases not followed again."""
    found: list[tuple[int, str, str, str]] = []
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, where = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack += [(item, f"{where}{i}.") for i, item in reversed(list(enumerate(node.value)))]
        if not isinstance(node, yaml.MappingNode):
            continue
        for key, value in node.value:
            written = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
            if isinstance(key, yaml.ScalarNode) and key.tag not in (STR_TAG, MERGE_TAG):
                found.append((key.start_mark.index, where, written, READ_AS.get(key.tag, key.tag)))
            stack.append((value, f"{where}{written}."))
    return [(where, written, read) for _, where, written, read in sorted(found)]  # in the file's order


StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT, list("-+0123456789."))  # type: ignore[no-untyped-call]


def load_yaml(path: Path, what: str) -> Any:
    """The parsed document; PreflightError with one violation naming the problem with the file otherwise (one per
    key where keys are not text)."""
    path = Path(path)

    def refuse(message: str, fix: str) -> PreflightError:
        return PreflightError(str(path), [Violation(what, message, fix)])

    text = _read_text(path, refuse)
    try:
        return yaml.load(text, Loader=StrictLoader)
    except TextKeyError as exc:
        raise PreflightError(str(path), [_text_key_violation(*key) for key in exc.keys]) from None
    except yaml.YAMLError as exc:
        raise _yaml_problem(exc, text, refuse) from None


def _read_text(path: Path, refuse: Callable[[str, str], PreflightError]) -> str:
    """The file's text, read only once it is known to be a readable file of at most MAX_BYTES."""
    if path.is_dir():
        raise refuse(f"{path} is a directory", "point at the .yaml file inside it")
    problem = path_problem(path, "file")
    if problem == "does not exist":
        raise refuse("file not found", "create it, or check the name and the folder")
    if problem is not None:
        raise refuse(f"{path} {problem}", "point at a readable .yaml file")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)  # a file that grows after a stat is still read no further
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})", "check the file's permissions") from None
    if len(data) > MAX_BYTES:
        size = max(path.stat().st_size, len(data))
        raise refuse(
            f"is {size:,} bytes, over the {MAX_BYTES:,}-byte ({MAX_BYTES // 1024} KiB) bound on a YAML file "
            "rlbuild reads",
            NOT_DATA,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise refuse(f"is not UTF-8 text (byte {data[exc.start]:#04x} on line {line})", "save it as UTF-8") from None
    if not text.strip():
        raise refuse("is empty", "write the document, or pick another file")
    return text


def _yaml_problem(exc: yaml.YAMLError, text: str, refuse: Callable[[str, str], PreflightError]) -> PreflightError:
    """PyYAML's error as one violation, in the reader's words where PyYAML's mislead."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    if isinstance(exc, yaml.reader.ReaderError):  # a control character: libyaml gives its offset, not its line
        where = f" at line {text.count(chr(10), 0, exc.position) + 1}"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if isinstance(exc, DuplicateKeyError):
        return refuse(problem, "keep one of them")
    if isinstance(exc, BoundError):
        return refuse(f"{problem}{where}", exc.note or "")
    if "maximum nesting depth" in problem:  # libyaml's own bound (1,000 levels) met before ours
        return refuse(f"nests deeper than {MAX_DEPTH} levels{where}", FLAT)
    line = _line(text, mark.line) if mark else ""
    key = _long_key(line, mark.column) if mark else 0
    if key:  # only where there is a mark
        fix = "shorten it (an environment variable name or a setting is a word or a few)"
        return refuse(f"has a key of {key:,} characters{where}; YAML reads keys of at most {MAX_PLAIN_KEY}", fix)
    if mark and line[mark.column : mark.column + 1] == "\t":  # libyaml does not say which character
        problem += " (a tab: YAML indents with spaces)"
    if "merg" in problem:  # PyYAML's words for a `<<:` whose value is not an alias of a mapping
        fix = "`<<:` takes an alias of a mapping (`<<: *base`) or a list of them (`<<: [*a, *b]`)"
        return refuse(f"has a merge key (`<<`){where} that cannot be merged: {problem}", fix)
    return refuse(f"is not valid YAML{where}: {problem}", "fix the YAML syntax there")


def _line(text: str, number: int) -> str:
    lines = text.splitlines()
    return lines[number] if number < len(lines) else ""


def _long_key(line: str, column: int) -> int:
    """The length of the key before the `:` a syntax error points at, if it is longer than YAML reads (else 0):
    libyaml then calls the `:` after it a syntax error, at a column past the key's end."""
    key = line[:column].strip().removeprefix("- ").strip().strip("'\"")
    return len(key) if len(key) > MAX_PLAIN_KEY and line[column : column + 1] == ":" else 0


def _text_key_violation(where: str, written: str, read_as: str) -> Violation:
    shown = written if written else "(empty)"
    return Violation(
        f"{where}{shown}",
        f"the key {shown} is read by YAML as {read_as}, not as the text {written!r}",
        f"quote it: '{written}':",
    )
