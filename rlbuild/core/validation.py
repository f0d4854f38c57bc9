"""Pydantic validation errors as violations a person can act on: the field, the value, and a fix."""

from __future__ import annotations

import difflib
import re
from datetime import date
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rlbuild.core.errors import Violation, quote

LABEL = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # a GPU variant, a cluster name: one path or label segment
SIZE_PATTERN = re.compile(r"(\d+(\.\d+)?)\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.ASCII)
SIZE_UNITS = {
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
MAX_SIZE_BYTES = 2**50  # 1 PiB: no node has more memory or disk


class StrictModel(BaseModel):
    """The base of every typed document rlbuild reads (the experiment file, the recipe, the launch document):
    unknown keys refused, no coercion (`2.5` is not an int, `"1"` not a number), frozen, and no float NaN or
    infinite: no setting means either (YAML reads `.inf` and `.nan` as floats; `kl_loss_coef: .inf` would pass a
    `ge=0` bound and crash the training inside a Ray actor)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


def violations(error: ValidationError, raw: Any, model: type[BaseModel], prefix: str = "") -> list[Violation]:
    """One violation per problem pydantic found while validating `raw` as `model`; fields get `prefix`."""
    return [_describe(e, raw, model, prefix) for e in error.errors()]


def _describe(error: Any, raw: Any, root: type[BaseModel], prefix: str) -> Violation:
    loc = [str(p) for p in error["loc"]]
    field = prefix + (".".join(loc) or "<root>")
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        known = sorted(parent.model_fields) if parent else []
        close = difflib.get_close_matches(loc[-1], known, n=1)
        fix = f"did you mean '{close[0]}'?" if close else f"known keys here: {', '.join(known)}"
        return Violation(field, "unknown key", fix)
    if kind == "missing":
        return Violation(field, "is required", "add it; every role-plan and topology field is explicit")
    value = _value_at(raw, error["loc"])
    if kind == "finite_number":
        return Violation(field, f"must be a finite number (got {quote(value)})", "NaN and infinity mean nothing here")
    if kind == "string_type" and isinstance(value, bool | int | float | date):
        # The file said `on`, `2026-09-21` or `12` unquoted: YAML made it another type before anyone looked.
        read = "true/false" if isinstance(value, bool) else "a date" if isinstance(value, date) else "a number"
        fix = f"quote it in the file: YAML reads this unquoted value as {read}, not as text"
        return Violation(field, f"{error['msg']} (got {quote(value)})", fix)
    return Violation(field, f"{error['msg']} (got {quote(value)})")


def _model_at(root: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    model = root
    for part in loc:
        if part.isdigit():
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        for inner in list(candidates):
            candidates += list(getattr(inner, "__args__", ()))
        found = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if found is None:
            return None
        model = found
    return model


def _value_at(raw: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        try:
            raw = raw[part]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def size_bytes(value: str) -> int:
    """Bytes of a size like '512GB' or '64GiB'; ValueError naming the accepted forms otherwise."""
    match = SIZE_PATTERN.fullmatch(value.strip()) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"{value!r} is not a size; write it like '512GB' or '64GiB'")
    return int(float(match[1]) * SIZE_UNITS[match[3]])


def node_size(value: str) -> str:
    """A node's memory or disk, checked to be a size some node has."""
    if not 0 < size_bytes(value) <= MAX_SIZE_BYTES:
        raise ValueError(f"{value!r} is not a size a node has; give more than 0 and at most 1PB")
    return value.strip()
