"""The committed CRD is generated from the models and is a structural schema."""

from __future__ import annotations

import copy

import yaml

from pd_operator.api import validate_service
from pd_operator.api.crd import apply_defaults, crd_yaml, generate_crd
from tests.conftest import ROOT, minimal

CRD_PATH = ROOT / "crds" / "pdinferenceservices.yaml"


def schema() -> dict:
    return generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node, path="$"):
    yield path, node
    for key, value in node.get("properties", {}).items():
        yield from walk(value, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from walk(node[key], f"{path}.{key}")


def test_committed_crd_is_current():
    assert CRD_PATH.read_text() == crd_yaml(), "crds/ is stale: run `pdctl crd > crds/pdinferenceservices.yaml`"


def test_names_short_names_and_category():
    names = generate_crd()["spec"]["names"]
    assert names["plural"] == "pdinferenceservices" and names["kind"] == "PDInferenceService"
    assert names["shortNames"] == ["pdservice", "pdservices", "pds"]
    assert names["categories"] == ["pd"]
    assert generate_crd()["metadata"]["name"] == "pdinferenceservices.pdserving.io"


def test_printer_columns_and_status_subresource():
    version = generate_crd()["spec"]["versions"][0]
    cols = [c["name"] for c in version["additionalPrinterColumns"]]
    assert cols[:9] == ["Engine", "Model", "Prefill", "Decode", "TTFT", "ITL", "Ready", "Serving", "Age"]
    assert version["subresources"] == {"status": {}}
    # every column points at a field that exists in the schema
    paths = {p for p, _ in walk(schema())}
    for col in version["additionalPrinterColumns"]:
        jp = col["jsonPath"].split("[")[0]
        if jp.startswith(".metadata"):
            continue
        assert "$" + jp in paths, col


def test_schema_is_structural():
    for path, node in walk(schema()):
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            continue
        if path == "$.metadata":
            continue
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        for banned in ("anyOf", "oneOf", "allOf", "$ref", "patternProperties", "propertyNames", "const", "title"):
            assert banned not in node, (path, banned)
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties", {}) is not False, path


def test_every_spec_and_status_field_is_documented():
    for path, node in walk(schema()):
        if path.startswith(("$.spec", "$.status")) and not path.endswith((".items", ".additionalProperties")):
            assert node.get("description"), f"{path} has no description"


def test_cel_rules_are_bounded():
    # CEL cost estimation needs bounds on the lists and strings rules can touch.
    for path, node in walk(schema()):
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node and path.startswith("$.spec"):
            assert "maxProperties" in node, path


def prune_empty(value):
    """Empty maps and lists mean the same as absent ones."""
    if isinstance(value, dict):
        out = {k: prune_empty(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [prune_empty(v) for v in value]
    return value


def test_crd_defaults_equal_model_defaults():
    """What the API server stores after defaulting is what pydantic fills in."""
    for kind in ("vllm", "sglang"):
        raw = minimal(kind)
        stored = apply_defaults(schema(), copy.deepcopy(raw))
        model = validate_service(raw).spec.dump()
        assert prune_empty(stored["spec"]) == prune_empty(model)
        # and the stored object validates to the very same model
        assert validate_service(stored).spec.dump() == model


def test_committed_file_parses_as_one_document():
    docs = list(yaml.safe_load_all(CRD_PATH.read_text()))
    assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"
