"""Property: every valid spec renders manifests that pass the Kubernetes
OpenAPI schemas (kubernetes-validate, strict: unknown fields fail too)."""

from __future__ import annotations

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, assume, given, settings

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from tests.conftest import EXAMPLES, load_example, minimal
from tests.strategies import service

K8S_VERSION = "1.35.0"


# LeaderWorkerSet fields (sigs.k8s.io/lws v0.9.0 api/leaderworkerset/v1/leaderworkerset_types.go,
# json tags): kubernetes-validate has no schema for the CRD, so its own fields are
# checked against these and each pod template against the Kubernetes schema.
LWS_SPEC = {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"}
LWS_TEMPLATE = {"leaderTemplate", "workerTemplate", "size", "restartPolicy", "subGroupPolicy",
                "volumeClaimTemplates", "persistentVolumeClaimRetentionPolicy"}
LWS_RESTART = {"Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"}


def lws_as_statefulsets(obj: dict) -> list[dict]:
    spec = obj["spec"]
    assert set(spec) <= LWS_SPEC, set(spec) - LWS_SPEC
    lwt = spec["leaderWorkerTemplate"]
    assert set(lwt) <= LWS_TEMPLATE, set(lwt) - LWS_TEMPLATE
    assert lwt["restartPolicy"] in LWS_RESTART and lwt["size"] >= 2
    out = []
    for side in ("leaderTemplate", "workerTemplate"):
        tmpl = lwt[side]
        out.append({"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "metadata": {"name": f"{obj['metadata']['name']}-{side}"},
                    "spec": {"serviceName": obj["metadata"]["name"], "replicas": spec["replicas"],
                             "selector": {"matchLabels": tmpl["metadata"]["labels"]}, "template": tmpl}})
    return out


def check(objs):
    objs = [o for obj in objs for o in (lws_as_statefulsets(obj) if obj["kind"] == "LeaderWorkerSet" else [obj])]
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {err.message} at {list(err.path)}")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_pass_kubernetes_schemas(path):
    check(render(validate_service(load_example(path))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(service())
def test_every_valid_spec_renders_valid_manifests(obj):
    try:
        svc = validate_service(obj)
    except SpecError:
        assume(False)
        return
    check(render(svc))


def test_pod_template_overlay_renders_valid_manifests():
    """The overlay is merged into a pod the Kubernetes schema still accepts (both pools, both engines)."""
    from tests.unit.test_pod_template import OVERLAY

    for kind in ("vllm", "sglang"):
        check(render(validate_service(minimal(kind, prefill={"podTemplate": OVERLAY}, decode={"podTemplate": OVERLAY}))))


@pytest.mark.parametrize("cache", [
    {"kind": "pvc", "claimName": "hf-shared"},
    {"kind": "hostPath", "hostPath": "/var/lib/models"},
    {"kind": "image", "reference": "registry.example.com/w:v1", "pullPolicy": "Always", "path": "m"},
])
def test_model_cache_kinds_render_valid_manifests(cache):
    check(render(validate_service(minimal(model={"name": "Qwen/Qwen3-8B", "cache": cache, "startupSeconds": 600}))))
