"""The operator on the real control plane: create, update, delete, drift,
Pending reasons, crash in mid-reconcile, and many services at once.

Each test runs its own operator process (``python -m pd_operator -n NS``), as a
user runs it, against the real API server; kwok plays the kubelet, so pods
become Running/Ready once the real scheduler has placed them.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.integration.conftest import failed, load_local_cluster_module

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "pdserving.io", "v1alpha1", "pdinferenceservices"
CHILD_KINDS = [
    ("Service", "v1", "services"), ("StatefulSet", "apps/v1", "statefulsets"),
    ("Deployment", "apps/v1", "deployments"), ("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets"),
    ("ServiceAccount", "v1", "serviceaccounts"), ("Role", "rbac.authorization.k8s.io/v1", "roles"),
    ("RoleBinding", "rbac.authorization.k8s.io/v1", "rolebindings"),
    ("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies"), ("ConfigMap", "v1", "configmaps"),
]


# --------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def crd(api_client):
    body = yaml.safe_load((REPO / "crds" / "pdinferenceservices.yaml").read_text())
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as err:
        if err.status != 409:
            raise
        current = ext.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(body["metadata"]["name"], body)
    wait_for(lambda: any(c.type == "Established" and c.status == "True"
                         for c in (ext.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or [])),
             30, "CRD established")
    return body


class Operator:
    """The operator as a child process, scoped to one namespace."""

    def __init__(self, kubeconfig: str, namespace: str, log: Path, env: dict[str, str] | None = None):
        self.kubeconfig, self.namespace, self.log = kubeconfig, namespace, log
        self.env = env or {}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Operator":
        # PD_OPERATOR_KUBECONFIG: run the operator under another identity (e.g. the
        # Helm chart's ServiceAccount, tests/integration/test_install.py); the
        # test itself keeps the admin kubeconfig.
        kubeconfig = os.environ.get("PD_OPERATOR_KUBECONFIG") or self.kubeconfig
        env = {**os.environ, "KUBECONFIG": kubeconfig, "PD_OPERATOR_RESYNC_SECONDS": "5", "PYTHONUNBUFFERED": "1",
               **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pd_operator", "-n", self.namespace, "--liveness-port", "0", "--metrics-port", "0"],
            env=env, stdout=self.log.open("a"), stderr=subprocess.STDOUT, cwd=REPO,
        )
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def show_log(request, log: Path) -> None:
    """The operator's log after the test: all of it with PD_SHOW_OPERATOR_LOG, its
    last 60 lines when the test failed."""
    if os.environ.get("PD_SHOW_OPERATOR_LOG"):
        print(log.read_text())
    elif failed(request):
        print("\n[operator log, last 60 lines]\n" + "\n".join(log.read_text().splitlines()[-60:]))


@pytest.fixture
def operator(request, kube_cluster, crd, namespace, tmp_path):
    op = Operator(kube_cluster.kubeconfig, namespace, tmp_path / "operator.log").start()
    yield op
    op.stop()
    show_log(request, tmp_path / "operator.log")


# Longer than any deadline of the tests that use the fixture below: there, only
# watch events can make the operator act.
NO_RESYNC_SECONDS = 3600


@pytest.fixture
def operator_without_resync(request, kube_cluster, crd, namespace, tmp_path):
    """The operator with its periodic resync out of the way (an hour)."""
    op = Operator(kube_cluster.kubeconfig, namespace, tmp_path / "operator.log",
                  env={"PD_OPERATOR_RESYNC_SECONDS": str(NO_RESYNC_SECONDS)}).start()
    yield op
    op.stop()
    show_log(request, tmp_path / "operator.log")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except ApiException as err:
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def service(name: str, namespace: str, **spec) -> dict:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PDInferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen3-8B", "servedName": "qwen3-8b"},
            "engine": {"kind": "vllm"},
            "router": {"image": "registry.example.com/pd/router:test"},
            "prefill": {"replicas": 1, "tensorParallelSize": 1, "gpuProduct": "NVIDIA-H200"},
            "decode": {"replicas": 1, "tensorParallelSize": 1, "gpuProduct": "NVIDIA-H200"},
        },
    }
    for key, value in spec.items():
        body["spec"][key] = value
    return body


def get_svc(custom_objects, namespace, name):
    return custom_objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def condition(obj, type_):
    for c in (obj.get("status") or {}).get("conditions", []):
        if c["type"] == type_:
            return c
    return None


def wait_ready(custom_objects, namespace, name, timeout=90):
    def ready():
        obj = get_svc(custom_objects, namespace, name)
        c = condition(obj, "Ready")
        gen = obj["metadata"]["generation"]
        return obj if c and c["status"] == "True" and obj["status"].get("observedGeneration") == gen else None
    return wait_for(ready, timeout, f"{namespace}/{name} Ready")


def children(api_client, namespace, name) -> dict[tuple[str, str], dict]:
    out = {}
    for kind, api_version, plural in CHILD_KINDS:
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        items = api_client.call_api(
            *api_client.param_serialize("GET", f"{base}/namespaces/{namespace}/{plural}",
                                        query_params=[("labelSelector", f"pdserving.io/service={name}")],
                                        auth_settings=["BearerToken"]))
        for item in yaml.safe_load(items.read())["items"]:
            out[(kind, item["metadata"]["name"])] = item
    return out


EXPECTED = {
    ("Service", "{n}-prefill"), ("StatefulSet", "{n}-prefill"), ("PodDisruptionBudget", "{n}-prefill"),
    ("Service", "{n}-decode"), ("StatefulSet", "{n}-decode"), ("PodDisruptionBudget", "{n}-decode"),
    ("ServiceAccount", "{n}-router"), ("Role", "{n}-router"), ("RoleBinding", "{n}-router"),
    ("Deployment", "{n}-router"), ("Service", "{n}-router"), ("NetworkPolicy", "{n}-engines"), ("NetworkPolicy", "{n}-router"),
}


def expected(name):
    return {(k, n.format(n=name)) for k, n in EXPECTED}


def create(custom_objects, body):
    return custom_objects.create_namespaced_custom_object(GROUP, VERSION, body["metadata"]["namespace"], PLURAL, body)


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------


def test_create_becomes_ready_with_columns(operator, namespace, custom_objects, api_client, core_v1, kube_cluster):
    create(custom_objects, service("qwen", namespace, prefill={"replicas": 2, "tensorParallelSize": 4, "gpuProduct": "NVIDIA-H200"},
                                   decode={"replicas": 1, "tensorParallelSize": 4, "gpuProduct": "NVIDIA-H200"}))
    obj = wait_ready(custom_objects, namespace, "qwen")
    kids = children(api_client, namespace, "qwen")
    assert set(kids) == expected("qwen")
    uid = obj["metadata"]["uid"]
    for key, child in kids.items():
        refs = child["metadata"].get("ownerReferences", [])
        assert [r["uid"] for r in refs] == [uid], key
        assert any(m["manager"] == "pd-operator" and m["operation"] == "Apply" for m in child["metadata"]["managedFields"]), key
    st = obj["status"]
    assert st["prefillReady"] == "2/2" and st["decodeReady"] == "1/1"
    assert st["endpoint"] == f"http://qwen-router.{namespace}.svc:8000/v1"
    assert st["servedModelName"] == "qwen3-8b"
    for t in ("PrefillReady", "DecodeReady", "RouterReady"):
        assert condition(obj, t)["status"] == "True"
    assert condition(obj, "Degraded")["status"] == "False"
    # pods really run on GPU nodes with 4 GPUs each
    pods = core_v1.list_namespaced_pod(namespace, label_selector="pdserving.io/role=prefill").items
    assert len(pods) == 2 and all(p.spec.node_name.startswith("gpu-node-") for p in pods)
    assert all(p.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4" for p in pods)
    # kubectl get pdservices shows the columns
    out = _kubectl(kube_cluster.kubeconfig, "get", "pdservices", "-n", namespace)
    header, row = out.strip().splitlines()[:2]
    assert header.split() == ["NAME", "ENGINE", "MODEL", "PREFILL", "DECODE", "TTFT", "ITL", "READY", "SERVING", "AGE"]
    assert row.split()[:5] == ["qwen", "vllm", "Qwen/Qwen3-8B", "2/2", "1/1"] and "True" in row.split()
    events = core_v1.list_namespaced_event(namespace, field_selector="involvedObject.kind=PDInferenceService").items
    assert any(e.reason == "Created" for e in events)


def _kubectl(kubeconfig, *args) -> str:
    mod = load_local_cluster_module()
    binary = mod.binary("kubectl")
    return subprocess.run([str(binary), "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, check=True).stdout


def test_update_rolls_the_statefulsets(operator, namespace, custom_objects, apps_v1):
    create(custom_objects, service("roll", namespace))
    wait_ready(custom_objects, namespace, "roll")
    before = apps_v1.read_namespaced_stateful_set("roll-decode", namespace)
    custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "roll",
                                                  {"spec": {"engine": {"kind": "vllm", "image": "registry.example/vllm:patched"}}})

    def rolled():
        sts = apps_v1.read_namespaced_stateful_set("roll-decode", namespace)
        image = sts.spec.template.spec.containers[0].image
        return image == "registry.example/vllm:patched" and sts.status.update_revision != before.status.update_revision
    wait_for(rolled, 30, "decode StatefulSet rolled to the new image")
    obj = wait_ready(custom_objects, namespace, "roll")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"] == 2


def test_delete_leaves_nothing(operator, namespace, custom_objects, api_client, core_v1):
    create(custom_objects, service("gone", namespace))
    wait_ready(custom_objects, namespace, "gone")
    custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gone")
    wait_for(lambda: not children(api_client, namespace, "gone"), 60, "children garbage-collected")
    wait_for(lambda: not core_v1.list_namespaced_pod(namespace, label_selector="pdserving.io/service=gone").items, 60, "pods gone")


def test_drift_is_restored(operator_without_resync, namespace, custom_objects, apps_v1, core_v1):
    """Children edited or deleted by hand come back within 10 s, from the child
    watch events alone: the resync (60 s by default, the backstop) is an hour
    here, so a missing or broken child-event handler fails this test."""
    create(custom_objects, service("drift", namespace))
    wait_ready(custom_objects, namespace, "drift")
    apps_v1.delete_namespaced_stateful_set("drift-prefill", namespace)
    core_v1.delete_namespaced_service("drift-router", namespace)
    wait_for(lambda: apps_v1.read_namespaced_stateful_set("drift-prefill", namespace), 10, "prefill StatefulSet recreated")
    wait_for(lambda: core_v1.read_namespaced_service("drift-router", namespace), 10, "router Service recreated")
    # One edit: a field the operator owns and one it does not. The reconcile that
    # restores the first must leave the second as the other writer set it.
    apps_v1.patch_namespaced_stateful_set("drift-decode", namespace, {
        "metadata": {"annotations": {"team.example/owner": "alice"}},
        "spec": {"template": {"spec": {"terminationGracePeriodSeconds": 42}}}})
    wait_for(lambda: apps_v1.read_namespaced_stateful_set("drift-decode", namespace).spec.template.spec.termination_grace_period_seconds == 600,
             10, "decode grace period restored")
    assert apps_v1.read_namespaced_stateful_set("drift-decode", namespace).metadata.annotations["team.example/owner"] == "alice"
    # Status follows the pods the StatefulSet controller rolls twice (to 42 s and
    # back) from pod and StatefulSet events alone; the deadline is the default
    # one (CI once took over 30 s here late in a long run), far below the resync.
    wait_ready(custom_objects, namespace, "drift")


def test_apply_without_replicas_keeps_a_scaled_pool(operator, namespace, custom_objects, apps_v1):
    body = service("keep", namespace)
    del body["spec"]["decode"]["replicas"]
    create(custom_objects, body)
    wait_ready(custom_objects, namespace, "keep")
    apps_v1.patch_namespaced_stateful_set_scale("keep-decode", namespace, {"spec": {"replicas": 3}})
    # an edit elsewhere in the spec (as a re-apply would do) must not reset it
    custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "keep",
                                                  {"spec": {"router": {"decodePolicy": "power_of_two"}}})
    obj = wait_ready(custom_objects, namespace, "keep")
    assert apps_v1.read_namespaced_stateful_set("keep-decode", namespace).spec.replicas == 3
    assert obj["status"]["decodeReady"] == "3/3"


def test_invalid_spec_refused_by_the_api_server(crd, namespace, custom_objects, api_client):
    body = service("bad", namespace,
                   prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 6, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}})
    with pytest.raises(ApiException) as info:
        create(custom_objects, body)
    assert info.value.status == 422
    message = json.loads(info.value.body)["message"]
    assert "spec.decode.tensorParallelSize" in message and "one tensorParallelSize divides the other" in message
    assert "spec.decode.autoscaling.minReplicas" in message and "minReplicas must be <= maxReplicas" in message
    assert not children(api_client, namespace, "bad")


def test_bad_extra_args_reported_nothing_created(operator, namespace, custom_objects, api_client):
    create(custom_objects, service("flags", namespace, engine={"kind": "sglang", "extraArgs": ["--pd-disaggregation"]}))

    def reported():
        c = condition(get_svc(custom_objects, namespace, "flags"), "Ready")
        return c if c and c["reason"] == "InvalidSpec" else None
    c = wait_for(reported, 30, "InvalidSpec condition")
    assert "spec.engine.extraArgs" in c["message"] and "--pd-disaggregation" in c["message"]
    assert not children(api_client, namespace, "flags")


def test_pending_reason_when_gpus_run_out(operator, namespace, custom_objects):
    # 5 x 8 GPUs asked, the cluster has 4 nodes x 8
    create(custom_objects, service("big", namespace, prefill={"replicas": 5, "tensorParallelSize": 8},
                                   decode={"replicas": 1, "tensorParallelSize": 8}))

    def surfaced():
        obj = get_svc(custom_objects, namespace, "big")
        c = condition(obj, "PrefillReady")
        return obj if c and c["reason"] == "Unschedulable" else None
    obj = wait_for(surfaced, 60, "Unschedulable reason in status")
    msg = condition(obj, "PrefillReady")["message"]
    assert "nvidia.com/gpu" in msg and "needs 8" in msg
    assert condition(obj, "Degraded")["status"] == "True" and condition(obj, "Ready")["status"] == "False"
    assert obj["status"]["prefill"]["pendingReplicas"] >= 1


def test_missing_api_key_secret_is_reported(operator, namespace, custom_objects, core_v1):
    create(custom_objects, service("auth", namespace, engine={"kind": "vllm", "apiKeySecretRef": {"name": "auth-key"}}))

    def reported():
        c = condition(get_svc(custom_objects, namespace, "auth"), "Degraded")
        return c if c and c["reason"] == "SecretNotFound" else None
    c = wait_for(reported, 60, "SecretNotFound")
    assert "auth-key" in c["message"] and "kubectl" in c["message"]
    core_v1.create_namespaced_secret(namespace, {"metadata": {"name": "auth-key"}, "stringData": {"api-key": "s3cret"}})
    wait_ready(custom_objects, namespace, "auth")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_killed_mid_reconcile_converges(kube_cluster, crd, namespace, custom_objects, api_client, tmp_path, seed):
    """Kill -9 the operator at a random point of its first reconciles, restart
    it: the same objects, once each, all owned by the service."""
    rng = random.Random(seed)
    op = Operator(kube_cluster.kubeconfig, namespace, tmp_path / "op.log").start()
    try:
        body = service("crash", namespace, kvTransfer={"backend": "lmcache"})
        create(custom_objects, body)
        time.sleep(rng.uniform(0.5, 3.0))  # operator start-up takes ~1 s; kill somewhere in its work
        op.kill()
        op.start()
        obj = wait_ready(custom_objects, namespace, "crash")
        kids = children(api_client, namespace, "crash")
        assert set(kids) == expected("crash") | {("ConfigMap", "crash-config")}
        assert all([r["uid"] for r in k["metadata"]["ownerReferences"]] == [obj["metadata"]["uid"]] for k in kids.values())
        sts = [k for (kind, _), k in kids.items() if kind == "StatefulSet"]
        assert all(s["spec"]["replicas"] == 1 for s in sts)
    finally:
        op.stop()


def add_nodes(core_v1, count: int, first: int) -> list[str]:
    """More kwok GPU nodes, shaped like gpu-node-0, for tests that need them."""
    template = core_v1.read_node("gpu-node-0")
    octet = template.spec.pod_cidr.split(".")[1]  # the cluster's own pod range (e2e/cluster.py pod_octet)
    names = []
    for i in range(first, first + count):
        name = f"gpu-node-{i}"
        labels = dict(template.metadata.labels)
        labels["kubernetes.io/hostname"] = name
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"podCIDR": f"127.{octet}.{i}.0/24", "podCIDRs": [f"127.{octet}.{i}.0/24"]},
        }
        core_v1.create_node(node)
        status = {"status": {"capacity": template.status.capacity, "allocatable": template.status.allocatable}}
        core_v1.patch_node_status(name, status)
        names.append(name)
    return names


def test_twenty_services_at_once(operator, namespace, custom_objects, core_v1):
    # 20 services x (1 prefill + 1 decode) x 1 GPU = 40 GPUs: two more 8-GPU nodes
    nodes = add_nodes(core_v1, 2, 10)
    try:
        t0 = time.monotonic()
        for i in range(20):
            create(custom_objects, service(f"svc-{i:02d}", namespace))
        for i in range(20):
            wait_ready(custom_objects, namespace, f"svc-{i:02d}", timeout=240)
        elapsed = time.monotonic() - t0
        print(f"20 services Ready in {elapsed:.1f}s")
    finally:
        for name in nodes:
            core_v1.delete_node(name)
