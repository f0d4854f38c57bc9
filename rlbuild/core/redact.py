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
    return _redact(value, secret_values())


def _redact(value: Any, secrets: list[str]) -> Any:
    # The environment's secrets are found once per document, not once per string in it (a 50-version dry run
    # redacts thousands of strings).
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_name(str(k)) and v else _redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(v, secrets) for v in value]
    if isinstance(value, str):
        return _replace(value, secrets)
    return value


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return sorted(
        (v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True
    )


def redact_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    return _replace(text, secret_values(environ))


def _replace(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text
