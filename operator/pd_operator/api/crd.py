"""Generate the CustomResourceDefinition from the pydantic models.

The models are the single source: field types, bounds, enums, defaults,
descriptions and the cross-field CEL rules all come from them. The result is a
structural OpenAPI v3 schema as the API server wants it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import yaml

from .constants import CATEGORIES, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from .models import PDInferenceServiceSpec, PDInferenceServiceStatus

HEADER = "# Generated from operator/pd_operator/api by `pdctl crd`; do not edit.\n"

# The hash of the CRD's spec, on the CRD: Helm never upgrades a chart's crds/, and the
# chart refuses to roll an operator onto an installed CRD whose hash differs from its own
# (charts/pd-operator/templates/crd-check.yaml).
SCHEMA_HASH_ANNOTATION = "pdserving.io/schema-hash"

PRINTER_COLUMNS = [
    {"name": "Engine", "type": "string", "jsonPath": ".spec.engine.kind"},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "Prefill", "type": "string", "jsonPath": ".status.prefillReady", "description": "Prefill replicas ready/desired"},
    {"name": "Decode", "type": "string", "jsonPath": ".status.decodeReady", "description": "Decode replicas ready/desired"},
    {"name": "TTFT", "type": "string", "jsonPath": ".status.metrics.ttft", "description": "Time to first token at the targeted quantile"},
    {"name": "ITL", "type": "string", "jsonPath": ".status.metrics.itl", "description": "Inter-token latency at the targeted quantile"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Serving", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Serving")].reason',
     "description": "What the live signals say: Serving, or the failure (pdctl doctor NAME)"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1},
]

# JSON-schema keywords the Kubernetes structural schema does not take.
_DROP = {"title", "propertyNames", "$defs"}


def _structural(node: Any, defs: dict) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").rsplit("/", 1)[-1]])
        target.update(node)  # field-level description/default win over the class's
        return _structural(target, defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if node.get("default", 0) is None:
            node.pop("default")
        if node.get("x-kubernetes-int-or-string") or any(o.get("x-kubernetes-int-or-string") for o in options):
            merged = {"x-kubernetes-int-or-string": True}
            merged.update({k: v for k, v in node.items() if k in ("description", "default")})
            return merged
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {options}")
        inner = copy.deepcopy(options[0])
        inner.update(node)
        return _structural(inner, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        elif key == "additionalProperties" and value is False:
            continue  # unknown fields are pruned (and refused by strict field validation)
        elif key == "patternProperties":
            # A map with constrained keys: structural schemas have no
            # patternProperties, so the value schema becomes additionalProperties
            # and the key pattern a CEL rule.
            ((pattern, value_schema),) = value.items()
            out["additionalProperties"] = _structural(value_schema, defs)
            out.setdefault("x-kubernetes-validations", []).append(
                {"rule": f"self.all(k, k.matches(r'{pattern}'))", "message": "keys must be Kubernetes qualified names such as example.com/name"}
            )
        else:
            out[key] = value
    if "properties" in out or "additionalProperties" in out:
        out.setdefault("type", "object")
    # description and type first, the rest as the models declare it
    return {k: out[k] for k in sorted(out, key=lambda k: (k != "description", k != "type"))}


def schema_of(model: type) -> dict:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def openapi_schema() -> dict:
    return {
        "type": "object",
        "description": "A prefill/decode-disaggregated LLM inference service: a prefill pool, a decode pool "
        "and the router clients call, each pool sized to its own latency target.",
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": schema_of(PDInferenceServiceSpec),
            "status": schema_of(PDInferenceServiceStatus),
        },
        "required": ["spec"],
        "x-kubernetes-validations": [
            {
                "rule": "self.metadata.name.size() <= 40",
                "message": "metadata.name must be at most 40 characters so the names of the StatefulSets, Services "
                "and pods derived from it stay valid",
            }
        ],
    }


def schema_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def generate_crd() -> dict:
    crd = _crd()
    crd["metadata"]["annotations"] = {SCHEMA_HASH_ANNOTATION: schema_hash(crd["spec"])}
    return crd


def _crd() -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "pd-operator", "app.kubernetes.io/part-of": "pd-operator"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(generate_crd(), sort_keys=False, width=120, allow_unicode=True)


def apply_defaults(schema: dict, obj: Any) -> Any:
    """Structural defaulting as the API server does it: fill missing fields
    that have a default, then descend (also into what was just defaulted)."""
    if isinstance(obj, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in obj and "default" in prop:
                obj[name] = copy.deepcopy(prop["default"])
            if name in obj:
                obj[name] = apply_defaults(prop, obj[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj:
                obj[key] = apply_defaults(extra, obj[key])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in obj]
    return obj


def cel_rules(schema: dict, obj: Any, path: str = ""):
    """Yield (path, rule, node) for every CEL rule that applies to a (defaulted)
    object: the rules the API server would evaluate."""
    if obj is None:
        return
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule, obj
    if isinstance(obj, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in obj:
                yield from cel_rules(prop, obj[name], f"{path}.{name}" if path else name)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in obj.items():
                yield from cel_rules(extra, value, f"{path}[{key}]")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            yield from cel_rules(schema["items"], item, f"{path}[{i}]")
