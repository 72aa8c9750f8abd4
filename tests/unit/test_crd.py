"""The CRD: generated from the models, structural, and doing what the API server
and kubectl do with it: accepting and refusing the documents pdctl accepts and
refuses, keeping the status the operator writes, showing it in the columns."""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml

from pd_operator.api import SpecError, validate_service
from pd_operator.api.crd import apply_defaults, crd_yaml, generate_crd
from pd_operator.api.models import PDInferenceServiceStatus
from tests.conftest import EXAMPLES, ROOT, minimal

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


def test_names_are_the_ones_the_api_server_wants_and_the_docs_use():
    crd = generate_crd()
    names, spec = crd["spec"]["names"], crd["spec"]
    # the API server refuses a CRD whose name is not <plural>.<group>, and lists of it are <kind>List
    assert crd["metadata"]["name"] == f"{names['plural']}.{spec['group']}"
    assert names["listKind"] == names["kind"] + "List" and names["singular"] == names["kind"].lower()
    resource_names = {names["plural"], names["singular"], *names["shortNames"], *names["categories"]}
    # every `kubectl get|describe|explain X` of ours in the docs names this CRD
    docs = [ROOT / "README.md", *ROOT.glob("e2e/*.sh"), *ROOT.glob("charts/pd-operator/templates/NOTES.txt")]
    used = {m.group(1).split(".")[0] for d in docs if d.is_file()
            for m in re.finditer(r"kubectl (?:-n \S+ )?(?:get|describe|explain|delete|edit|wait)\s+(?:[\w/=.-]+\s+)*?(pd(?!b\b)[a-z]*)\b", d.read_text())}
    assert used and used <= resource_names, used - resource_names
    # and the examples are objects of it
    versions = {v["name"] for v in spec["versions"] if v["served"]}
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        assert doc["apiVersion"] == f"{spec['group']}/{sorted(versions)[0]}" and doc["kind"] == names["kind"], path


def jsonpath(obj, path: str) -> list:
    """The values of a printer column's JSONPath (the subset kubectl columns use:
    .field and [?(@.key=="value")])."""
    nodes = [obj]
    for field, key, value in re.findall(r'\.([A-Za-z0-9_]+)|\[\?\(@\.([A-Za-z0-9_]+)=="([^"]*)"\)\]', path):
        if field:
            nodes = [n[field] for n in nodes if isinstance(n, dict) and field in n]
        else:
            nodes = [item for n in nodes if isinstance(n, list) for item in n if isinstance(item, dict) and item.get(key) == value]
    return nodes


def operated_service(written: list | None = None) -> dict:
    """The vllm-autoscaling example as stored after the operator's two writers
    ran on an in-memory cluster: the reconciler (pods up) and one autoscaler
    round. ``written`` collects every status they sent."""
    from pd_operator.autoscale.diagnose import Signals
    from pd_operator.autoscale.promql import Observation
    from pd_operator.controller.autoscaler import Autoscaler
    from pd_operator.controller.reconcile import reconcile
    from tests.fakekube import FakeCluster, FakeKube

    cluster, events = FakeCluster(), (lambda *a: None)
    kube = FakeKube(cluster)
    if written is not None:
        cluster.hooks.append(lambda method, path, body, _: written.append(body["status"])
                             if method == "PATCH" and path.endswith("/status") else None)
    body = yaml.safe_load((ROOT / "manifests" / "examples" / "vllm-autoscaling.yaml").read_text())
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    ref = body["spec"]["engine"]["apiKeySecretRef"]
    cluster.put({"kind": "Secret", "metadata": {"name": ref["name"], "namespace": ns}, "data": {ref["key"]: "czNjcmV0"}})
    cluster.apply_service(body)
    reconcile(kube, kube.get_service(ns, name), events)
    for kind, child in (("StatefulSet", f"{name}-prefill"), ("StatefulSet", f"{name}-decode"), ("Deployment", f"{name}-router")):
        obj = cluster.get(kind, ns, child)
        n = obj["spec"]["replicas"]
        cluster.put({"kind": kind, "metadata": {"name": child, "namespace": ns}, "status": {
            "replicas": n, "readyReplicas": n, "observedGeneration": obj["metadata"]["generation"],
            "currentRevision": "r1", "updateRevision": "r1"}}, manager="kube-controller-manager")
    reconcile(kube, kube.get_service(ns, name), events)
    seen = {"prefill": 0.412, "decode": 0.031}
    signals = lambda prom, engine, role, q, secondaries=frozenset(): {(ns, name): Observation(seen[role], 100.0)}  # noqa: E731
    # the router and engines answer, no errors: the diagnosis writes Serving=True
    healthy = Signals(workers=10, healthy=10, unhealthy=0, worker_errors=0, requests=100, kv_failures=0, overload=0,
                      not_found=0)
    Autoscaler(kube, signals, events, diagnosis=lambda prom, engine, router: {(ns, name): healthy}).run_once(
        [kube.get_service(ns, name)], force=True)
    obj = cluster.get("PDInferenceService", ns, name)
    ready = [c for c in obj["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", obj["status"]["conditions"]
    return obj


def test_printer_columns_show_what_the_operator_writes():
    """Each column of `kubectl get pdservices` resolves to a value the operator
    writes, in the shape README shows; a column on a field nobody writes (or one
    the schema would prune) shows empty."""
    version = generate_crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}  # status is written through /status
    obj = operated_service()
    row = {c["name"]: jsonpath(obj, c["jsonPath"]) for c in version["additionalPrinterColumns"]}
    assert all(len(v) == 1 and v[0] not in ("", None) for v in row.values()), row
    readme = (ROOT / "README.md").read_text().splitlines()
    header = next(i for i, line in enumerate(readme) if line.startswith("NAME ") and "READY" in line)
    titles, example = readme[header].split(), readme[header + 1].split()
    shown = [c for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert titles == ["NAME"] + [c["name"].upper() for c in shown]
    # README's example row, cell by cell, against ours: same shape (ready/desired, "412ms p99", True)
    cells = dict(zip(titles[1:], re.split(r"\s{2,}", readme[header + 1].split(None, 1)[1].strip())))
    for c in shown:
        ours, theirs = str(row[c["name"]][0]), cells[c["name"].upper()]
        shape = re.sub(r"[0-9]+", "9", theirs)
        if c["type"] == "date":
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ours), ours  # kubectl shows its age
        elif c["name"] in ("Engine", "Model"):
            assert ours == jsonpath(obj, c["jsonPath"])[0]
        else:
            assert re.sub(r"[0-9]+", "9", ours) == shape, (c["name"], ours, theirs)
    assert example[0] and row["TTFT"] == ["412ms p99"] and row["ITL"] == ["31ms p99"]


def undeclared(schema: dict, value, path: str = "") -> list[str]:
    """Fields of ``value`` the structural schema does not declare: what the API
    server prunes (silently) from what a client writes."""
    out = []
    if isinstance(value, dict) and schema.get("type") == "object":
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, sub in value.items():
            if props is not None and key in props:
                out += undeclared(props[key], sub, f"{path}.{key}")
            elif isinstance(extra, dict):
                out += undeclared(extra, sub, f"{path}.{key}")
            elif props is not None or extra is not None:
                out.append(f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += undeclared(schema["items"], item, f"{path}[{i}]")
    return out


def test_the_status_the_operator_writes_is_kept_by_the_api_server():
    """Nothing the reconciler or the autoscaler writes is pruned or refused by
    the status schema, and it reads back as the status model."""
    written: list[dict] = []
    obj = operated_service(written)
    status_schema = schema()["properties"]["status"]
    assert len(written) >= 3  # the reconciler twice, the autoscaler once
    for status in [*written, obj["status"]]:
        assert undeclared(status_schema, status) == []
        assert not list(jsonschema.Draft4Validator(status_schema).iter_errors(status))
        PDInferenceServiceStatus.model_validate(status)


def test_the_schema_accepts_the_examples():
    validator = jsonschema.Draft4Validator(schema())
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        assert not [e.message for e in validator.iter_errors(doc)], path
        validate_service(doc)


@pytest.mark.parametrize("patch, field", [
    ({"prefill": {"replicas": -1}}, "spec.prefill.replicas"),
    ({"engine": {"kind": "trtllm"}}, "spec.engine.kind"),
    ({"kvTransfer": {"backend": "foo"}}, "spec.kvTransfer.backend"),
    ({"model": {"servedName": "x"}}, "spec.model.name"),
    ({"autoscaling": {"interval": "30 seconds"}}, "spec.autoscaling.interval"),
    ({"prefill": {"autoscaling": {"target": {"quantile": 1.5}}}}, "spec.prefill.autoscaling.target.quantile"),
    ({"topology": {"colocate": "always"}}, "spec.topology.colocate"),
    ({"decode": {"extraArgs": ["--x"] * 65}}, "spec.decode.extraArgs"),
    pytest.param({"prefill": {"tensorParallelSize": "4"}}, "spec.prefill.tensorParallelSize", marks=pytest.mark.xfail(
        strict=True, reason="pydantic coerces the string '4' to 4 (lax mode); the API server refuses it")),
])
def test_the_schema_and_pdctl_refuse_the_same_field(patch, field):
    """A document the API server's schema refuses is refused offline by pdctl,
    naming the same field."""
    doc = minimal(**patch)
    errors = list(jsonschema.Draft4Validator(schema()).iter_errors(doc))
    paths = set()
    for e in errors:
        base = ".".join(str(p) for p in e.absolute_path)
        missing = [r for r in (e.validator_value if e.validator == "required" else []) if r not in e.instance]
        paths |= {f"{base}.{r}" for r in missing} or {base}
    assert field in paths, [e.message for e in errors]
    with pytest.raises(SpecError) as info:
        validate_service(doc)
    assert field in {f for f, _ in info.value.problems}, info.value.problems


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
