"""Error types. Each one carries every problem found, so a user fixes them all in one pass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    """One problem with an experiment: which field, what is wrong, what would fix it."""

    field: str
    message: str
    fix: str = ""

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
        lines += [f"  - {v}" for v in violations]
        super().__init__("\n".join(lines))

    def as_violations(self) -> list[Violation]:
        return list(self.violations)


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
                lines.append(f"    {name}: stored {_short(stored)} -> now {_short(current)}")
        lines.append(BUMP)
        super().__init__("\n".join(lines))

    def as_violations(self) -> list[Violation]:
        return [
            Violation(f"{kind}.{name}", f"stored {_short(stored)} -> now {_short(current)}", BUMP)
            for kind, fields in self.drifts.items()
            for name, (stored, current) in sorted(fields.items())
        ]


class RuntimeDriftError(RlbuildError):
    """A fixed version would start or resume training under other code than it was resolved or checkpointed by."""


class RetrainRefusedError(RlbuildError):
    """This invocation would retrain a completed training of a fixed version."""


def _short(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
