"""Validation entry points and errors that name the field and the fix."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .constants import API_VERSION, KIND
from .models import PDInferenceService


class SpecError(ValueError):
    """A PDInferenceService that cannot be accepted; ``problems`` are (field, message)."""

    def __init__(self, problems: list[tuple[str, str]], name: str | None = None):
        self.problems = problems
        self.name = name
        head = f"{KIND} {name!r} is invalid" if name else f"{KIND} is invalid"
        super().__init__(head + ":\n" + "\n".join(f"  {field}: {msg}" for field, msg in problems))


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            # pydantic's internal names for validator layers and union members
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


_HINTS = {
    "missing": "required: set it",
    "extra_forbidden": "unknown field: remove it or check its spelling (kubectl explain pdservices.spec)",
}


def problems_of(err: ValidationError) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for e in err.errors(include_url=False):
        path = _path(tuple(e["loc"]))
        if e["type"] == "pd_rule":
            for field_path, message in e["ctx"]["rules"]:
                problems.append((path + (field_path or ""), message))
            continue
        msg = _HINTS.get(e["type"], e["msg"])
        if e["type"] == "literal_error":
            msg = f"{e['msg']} (got {e['input']!r})"
        problems.append((path, msg))
    # one line per field and message, in a stable order
    return sorted(set(problems))


def validate_service(obj: dict[str, Any]) -> PDInferenceService:
    """Validate a whole resource (apiVersion, kind, metadata, spec); raise SpecError."""
    if not isinstance(obj, dict):
        raise SpecError([("", f"expected a {KIND} object, got {type(obj).__name__}")])
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    problems: list[tuple[str, str]] = []
    if obj.get("apiVersion") != API_VERSION:
        problems.append(("apiVersion", f"must be {API_VERSION} (got {obj.get('apiVersion')!r})"))
    if obj.get("kind") != KIND:
        problems.append(("kind", f"must be {KIND} (got {obj.get('kind')!r})"))
    if problems:
        raise SpecError(problems, name)
    try:
        return PDInferenceService.model_validate(obj)
    except ValidationError as err:
        raise SpecError(problems_of(err), name) from None
