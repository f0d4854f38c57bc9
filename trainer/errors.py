"""The trainer's errors: one base class, so the command line reports any of them as one line naming the fix."""

from __future__ import annotations


class TrainerError(RuntimeError):
    """A run that cannot start or continue; the message says which setting or file, and what to do."""
