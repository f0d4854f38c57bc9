"""Keep secrets out of plans, launch documents and logs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rlbuild.core.wire import is_secret_name

REDACTED = "<redacted>"
MIN_SECRET_LENGTH = 8


def redact(value: Any) -> Any:
    """A copy of a document with secret-named keys and known secret values replaced."""
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_name(str(k)) and v else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return sorted(
        (v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True
    )


def redact_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    for secret in secret_values(environ):
        text = text.replace(secret, REDACTED)
    return text
