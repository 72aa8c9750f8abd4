"""Cross-field validation rules, written once for both validators.

Each rule carries its CEL expression (emitted into the CRD as
``x-kubernetes-validations``, enforced by the API server) and the same predicate
in Python (enforced by pydantic, so ``pdctl`` refuses offline what the API server
refuses online). Both report the identical message. A test evaluates every CEL
expression with a CEL interpreter against the Python predicate on generated
specs, so the two cannot drift apart silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Rule:
    """One cross-field rule of an object in the schema."""

    cel: str
    """CEL expression over ``self`` (the object the rule sits on); true = valid."""
    message: str
    """What is wrong and what to change; the same text online and offline."""
    check: Callable[[Any], bool]
    """Python predicate over the validated pydantic model; True = valid."""
    field_path: str | None = None
    """JSONPath of the field to blame, relative to the object (e.g. ``.maxReplicas``)."""

    def to_crd(self) -> dict:
        out: dict[str, Any] = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def cel_list(values) -> str:
    """A CEL list literal of strings."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"
