"""Iris job names: sanitised, unique per output set, readable (rule, wildcards such as the version, attempt)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

MAX_NAME = 63
_UNSAFE = re.compile(r"[^a-z0-9._-]+")


def sanitise(text: str) -> str:
    """Lower-case; anything but [a-z0-9._-] becomes '-'; no leading/trailing separators."""
    return _UNSAFE.sub("-", text.lower()).strip("-.") or "x"


def job_name(rule: str, wildcards: Mapping[str, str], attempt: int, outputs: Iterable[str]) -> str:
    """`<rule>-<wildcard values>-a<attempt>-<hash of the outputs>`.

    Deterministic, so a restarted Snakemake finds the job it submitted before; the hash over the outputs'
    storage locations keeps two experiments (or storage prefixes) apart.
    """
    digest = hashlib.sha256("\n".join(sorted(outputs)).encode()).hexdigest()[:10]
    tail = f"-a{attempt}-{digest}"
    head = sanitise("-".join([rule, *(str(v) for v in wildcards.values())]))
    return head[: MAX_NAME - len(tail)].rstrip("-.") + tail
