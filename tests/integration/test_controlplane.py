"""Smoke tests of the test world: a real API server, controller-manager and
scheduler, and GPU-shaped nodes (kwok locally, patched kind workers elsewhere).

They run against whatever cluster the ``kube_cluster`` fixture provides, so
assertions stick to what holds on both: the local control plane and kind with
e2e/kind/gpu-nodes.sh applied.
"""
from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# PD_CRD_PATH: try a CRD from elsewhere (e.g. a candidate fix) against the server.
CRD_PATH = Path(os.environ.get("PD_CRD_PATH") or REPO / "crds" / "pdinferenceservices.yaml")
GPU_PRODUCT = "NVIDIA-H200"
# registry.k8s.io/pause is in every kind node image (it is the sandbox image);
# kwok never pulls anything.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def wait_for(what: str, fn, timeout: float = 60.0, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def condition(obj, type_: str):
    for c in (obj.status.conditions or []):
        if c.type == type_:
            return c
    return None


def gpu_pod(name: str, gpus: int) -> client.V1Pod:
    """A pod asking for `gpus` GPUs and requiring an H200 node, as the operator
    renders engine pods (requests == limits for extended resources)."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": name}),
        spec=client.V1PodSpec(
            containers=[client.V1Container(
                name="engine", image=PAUSE_IMAGE, image_pull_policy="IfNotPresent",
                resources=client.V1ResourceRequirements(
                    requests={"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"},
                    limits={"nvidia.com/gpu": str(gpus)}),
            )],
            affinity=client.V1Affinity(node_affinity=client.V1NodeAffinity(
                required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                    node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=[
                        client.V1NodeSelectorRequirement(
                            key="nvidia.com/gpu.product", operator="In", values=[GPU_PRODUCT]),
                    ])]),
            )),
            termination_grace_period_seconds=0,
        ),
    )


# --- the nodes ----------------------------------------------------------------

def test_gpu_nodes_are_shaped_like_h200_nodes(core_v1):
    nodes = core_v1.list_node(label_selector=f"nvidia.com/gpu.product={GPU_PRODUCT}").items
    assert len(nodes) >= 4, [n.metadata.name for n in nodes]
    for n in nodes:
        labels = n.metadata.labels
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.memory"] == "143771"
        assert "topology.kubernetes.io/zone" in labels
        assert n.status.allocatable["nvidia.com/gpu"] == "8"
        assert parse_quantity(n.status.allocatable["rdma/rdma_shared_device_a"]) > 0
        assert condition(n, "Ready").status == "True"
        # HGX H200: NVSwitches inside the node, so GFD sets no clique label
        # (e2e/nodeprofiles.py; the gb200-nvl72 profile has cliques).
        assert "nvidia.com/gpu.clique" not in labels


# --- (a), (b): the CRD on the real API server -----------------------------------

@pytest.fixture(scope="module")
def pd_crd(apiextensions_v1):
    crd = yaml.safe_load(CRD_PATH.read_text())
    name = crd["metadata"]["name"]
    # Server-side apply: idempotent across runs and clusters.
    refused = None
    try:
        apiextensions_v1.patch_custom_resource_definition(
            name, crd, field_manager="pd-operator-crd", force=True,  # as e2e/run.sh
            _content_type="application/apply-patch+yaml")
    except ApiException as e:
        try:
            causes = [c.get("field", "") + ": " + c.get("message", "")
                      for c in json.loads(e.body)["details"]["causes"]]
        except Exception:
            causes = [str(e.body)]
        refused = f"the API server refused {CRD_PATH} ({e.status}):\n  " + "\n  ".join(causes)
    if refused:
        pytest.fail(refused, pytrace=False)

    def established():
        got = apiextensions_v1.read_custom_resource_definition(name)
        c = condition(got, "Established")
        return got if c is not None and c.status == "True" else None

    return wait_for(f"CRD {name} Established", established, timeout=30)


def test_crd_is_accepted_and_established(pd_crd):
    assert pd_crd.spec.group == "pdserving.io"
    assert pd_crd.spec.names.kind == "PDInferenceService"
    assert condition(pd_crd, "NamesAccepted").status == "True"
    assert any(v.name == "v1alpha1" and v.served and v.storage for v in pd_crd.spec.versions)


def _pdservice(name: str, prefill_autoscaling: dict | None = None) -> dict:
    spec = {
        "model": {"name": "Qwen/Qwen3-32B", "servedName": "qwen3-32b"},
        "engine": {"kind": "vllm"},
        "router": {"image": "registry.example.com/pd/router:test"},
    }
    if prefill_autoscaling is not None:
        spec["prefill"] = {"autoscaling": prefill_autoscaling}
    return {"apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService",
            "metadata": {"name": name}, "spec": spec}


def _create_pdservice(custom_objects, namespace, body, dry_run=None):
    kwargs = {"dry_run": dry_run} if dry_run else {}
    return custom_objects.create_namespaced_custom_object(
        "pdserving.io", "v1alpha1", namespace, "pdinferenceservices", body, **kwargs)


def test_valid_pdservice_is_accepted(pd_crd, custom_objects, namespace):
    # Control for the next test: the same object with sane bounds is accepted,
    # so the refusal below is the CEL rule's doing, not a schema error.
    ok = _pdservice("ok", {"enabled": True, "minReplicas": 1, "maxReplicas": 2})
    _create_pdservice(custom_objects, namespace, ok, dry_run="All")


def test_invalid_pdservice_is_refused_with_cel_message(pd_crd, custom_objects, namespace):
    bad = _pdservice("bad", {"enabled": True, "minReplicas": 5, "maxReplicas": 2})
    with pytest.raises(ApiException) as exc:
        _create_pdservice(custom_objects, namespace, bad)
    assert exc.value.status == 422, exc.value.body
    status = json.loads(exc.value.body)  # JSON escapes "<" as \u003c: compare decoded
    assert status["reason"] == "Invalid"
    assert "minReplicas must be <= maxReplicas" in status["message"], status["message"]
    assert [c["field"] for c in status["details"]["causes"]] == ["spec.prefill.autoscaling.minReplicas"]
    # nothing half-created
    listed = custom_objects.list_namespaced_custom_object(
        "pdserving.io", "v1alpha1", namespace, "pdinferenceservices")
    assert listed["items"] == []


# --- (c), (d): GPU-aware scheduling by the real scheduler -----------------------

def test_gpu_pod_lands_on_h200_node_and_gets_ready(core_v1, namespace, kube_cluster):
    core_v1.create_namespaced_pod(namespace, gpu_pod("gpu4", 4))

    def ready():
        p = core_v1.read_namespaced_pod("gpu4", namespace)
        c = condition(p, "Ready")
        return p if c is not None and c.status == "True" and p.status.pod_ip else None

    pod = wait_for("pod gpu4 Ready", ready, timeout=90)
    node = core_v1.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == GPU_PRODUCT
    assert pod.status.phase == "Running"
    # The pod IP comes from its node's podCIDR (kwok allocates from it; on kind
    # the CNI does).
    pod_ip = ipaddress.ip_address(pod.status.pod_ip)
    cidrs = node.spec.pod_cidrs or [node.spec.pod_cidr]
    assert any(pod_ip in ipaddress.ip_network(c) for c in cidrs), (pod_ip, cidrs)
    if kube_cluster.local:
        # Locally pod IPs are loopback addresses, so a local process can stand
        # in for the pod on exactly its IP.
        assert pod_ip.is_loopback
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((str(pod_ip), 0))
            s.listen(1)
            with socket.create_connection(s.getsockname(), timeout=2):
                pass


def test_pod_asking_more_gpus_than_a_node_has_stays_pending(core_v1, namespace):
    core_v1.create_namespaced_pod(namespace, gpu_pod("gpu16", 16))

    def unschedulable():
        p = core_v1.read_namespaced_pod("gpu16", namespace)
        c = condition(p, "PodScheduled")
        return (p, c) if c is not None and c.status == "False" else None

    pod, cond = wait_for("PodScheduled=False on gpu16", unschedulable, timeout=60)
    assert cond.reason == "Unschedulable"
    assert "nvidia.com/gpu" in (cond.message or ""), cond.message
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name


# --- (e): the real controller-manager -------------------------------------------

def test_statefulset_pods_are_created_by_controller_manager(core_v1, apps_v1, namespace):
    labels = {"app": "sts"}
    core_v1.create_namespaced_service(namespace, client.V1Service(
        metadata=client.V1ObjectMeta(name="sts"),
        spec=client.V1ServiceSpec(cluster_ip="None", selector=labels,
                                  ports=[client.V1ServicePort(name="http", port=8000)])))
    template = gpu_pod("unused", 1)
    template.metadata = client.V1ObjectMeta(labels=labels)
    apps_v1.create_namespaced_stateful_set(namespace, client.V1StatefulSet(
        metadata=client.V1ObjectMeta(name="sts"),
        spec=client.V1StatefulSetSpec(
            replicas=2, service_name="sts", pod_management_policy="Parallel",
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(metadata=template.metadata, spec=template.spec))))

    def all_ready():
        s = apps_v1.read_namespaced_stateful_set("sts", namespace)
        return s if (s.status.ready_replicas or 0) == 2 else None

    wait_for("StatefulSet sts 2/2 ready", all_ready, timeout=90)
    pods = core_v1.list_namespaced_pod(namespace, label_selector="app=sts").items
    assert sorted(p.metadata.name for p in pods) == ["sts-0", "sts-1"]
    for p in pods:
        owner = p.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.controller) == ("StatefulSet", "sts", True)
        assert condition(p, "Ready").status == "True"


# --- issue 13.5/13.6: model cache and pod-template overlay on a real API server --


def test_overlay_and_cache_are_stored_whole_and_the_merged_pod_is_accepted(pd_crd, custom_objects, apps_v1, namespace):
    """podTemplate (preserve-unknown-fields) and model.cache survive the API
    server's pruning; the CEL rule on cache refuses a pvc without a claim; the
    StatefulSet rendered with an overlay and an image-volume cache passes the
    API server's own pod validation (server-side dry run)."""
    from pd_operator.api import validate_service
    from pd_operator.render import render
    from tests.unit.test_pod_template import OVERLAY

    body = _pdservice("overlay")
    body["spec"]["model"]["cache"] = {"kind": "image", "reference": "registry.example.com/weights/qwen3:v1", "path": "m"}
    body["spec"]["model"]["startupSeconds"] = 2700
    body["spec"]["prefill"] = {"podTemplate": OVERLAY}
    got = _create_pdservice(custom_objects, namespace, body)
    assert got["spec"]["prefill"]["podTemplate"] == OVERLAY
    assert got["spec"]["model"]["cache"]["reference"] == "registry.example.com/weights/qwen3:v1"

    bad = _pdservice("badcache")
    bad["spec"]["model"]["cache"] = {"kind": "pvc"}
    with pytest.raises(ApiException) as exc:
        _create_pdservice(custom_objects, namespace, bad)
    status = json.loads(exc.value.body)
    assert "kind pvc needs claimName" in status["message"], status["message"]

    svc = validate_service({**got, "metadata": {"name": "overlay", "namespace": namespace}})
    sts = next(o for o in render(svc) if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "overlay-prefill")
    # The raw object, as the operator sends it (the typed client insists on string quantities).
    from pd_operator.controller.kube import Kube

    out = Kube(apps_v1.api_client)._call("POST", f"/apis/apps/v1/namespaces/{namespace}/statefulsets", body=sts,
                                         query=[("dryRun", "All")])
    pod = out["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert [c["name"] for c in pod["containers"]] == ["engine", "log-shipper"]
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    # Without the ImageVolume feature the API server drops the field: say so.
    assert "image" in models, f"the API server dropped the image volume source (ImageVolume feature gate off): {models}"
    assert models["image"]["reference"] == "registry.example.com/weights/qwen3:v1"
