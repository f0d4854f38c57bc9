"""Error types. Each one carries every problem found, so a user fixes them all in one pass."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass

# An error never grows with the input: a field name (it holds the user's keys) and a message or fix (they quote
# the user's values) are cut at these lengths, and an error lists at most MAX_LISTED problems (then a count).
MAX_FIELD = 200
MAX_TEXT = 1000
MAX_LISTED = 50
CUT = "... [cut]"
# repr that stops early: the repr of an aliased YAML structure (a thousand-fold list of lists) is built whole by
# repr() before any cut, hundreds of megabytes; this one writes a few items of a few levels and `...` for the rest.
_BOUNDED = reprlib.Repr(maxlevel=3, maxlist=8, maxtuple=8, maxdict=8, maxset=8, maxstring=400, maxother=400)


def quote(value: object, limit: int = 80) -> str:
    """`value` as Python writes it (`'text'`, `[1, 2]`), at most about `limit` characters however large it is."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value)} characters)"
    text = _BOUNDED.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(CUT)] + CUT


@dataclass(frozen=True)
class Violation:
    """One problem with an experiment: which field, what is wrong, what would fix it. Each part is cut to a bound
    (MAX_FIELD, MAX_TEXT): whatever a check quotes from the input, the line stays a line."""

    field: str
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        for name, limit in (("field", MAX_FIELD), ("message", MAX_TEXT), ("fix", MAX_TEXT)):
            object.__setattr__(self, name, _cut(getattr(self, name), limit))

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}"
        return f"{text}; {self.fix}" if self.fix else text

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class MissingCredential(Violation):
    """A credential a job will need is not in the environment it is forwarded from. Only a command that starts
    jobs needs it: one that reads storage (`rlbuild status`) resolves the plan without it."""


class RlbuildError(Exception):
    """Base class of every error rlbuild raises on purpose."""

    def as_violations(self) -> list[Violation]:
        """The error as field/message/fix entries (for `rlbuild check --json`)."""
        return [Violation(type(self).__name__, str(self))]


class PreflightError(RlbuildError):
    """The experiment cannot run as described. Raised during DAG construction, before any job starts."""

    def __init__(self, source: str, violations: list[Violation]) -> None:
        self.source = source
        self.violations = violations
        lines = [f"{source}: {len(violations)} problem(s) found before anything ran:"]
        lines += [f"  - {v}" for v in self.as_violations()]
        super().__init__("\n".join(lines))

    def as_violations(self) -> list[Violation]:
        """The first MAX_LISTED problems, then one line counting the rest (a file of 50,000 unknown keys)."""
        listed = list(self.violations[:MAX_LISTED])
        rest = len(self.violations) - len(listed)
        if rest > 0:
            listed.append(Violation("...", f"{rest} more problem(s) not listed", "fix those above and check again"))
        return listed


BUMP = (
    "Bump the version (e.g. a new YYYY.MM.DD or YYYY.MM.DD.N) to build these inputs, or use version 'dev' while "
    "iterating."
)


class IdentityDriftError(RlbuildError):
    """A fixed version's stored artifact was built from other inputs than the config now resolves to."""

    def __init__(self, version: str, drifts: dict[str, dict[str, tuple[object, object]]]) -> None:
        self.version = version
        self.drifts = drifts
        lines = [f"version {version} is immutable, but what the config now resolves to differs from what is stored:"]
        for artifact, fields in drifts.items():
            lines.append(f"  {artifact}:")
            for name, (stored, current) in sorted(fields.items()):
                lines.append(f"    {name}: stored {quote(stored, 120)} -> now {quote(current, 120)}")
        lines.append(BUMP)
        super().__init__("\n".join(lines))

    def as_violations(self) -> list[Violation]:
        return [
            Violation(f"{kind}.{name}", f"stored {quote(stored, 120)} -> now {quote(current, 120)}", BUMP)
            for kind, fields in self.drifts.items()
            for name, (stored, current) in sorted(fields.items())
        ]


class RuntimeDriftError(RlbuildError):
    """A fixed version would start or resume training under other code than it was resolved or checkpointed by."""


class RetrainRefusedError(RlbuildError):
    """This invocation would retrain a completed training of a fixed version."""
