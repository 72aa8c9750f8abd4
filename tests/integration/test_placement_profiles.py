"""The examples' placement on real-shaped node profiles (issue 13 items 1, 2, 4).

The rendered StatefulSets are created directly (no operator needed: this is
about what the real scheduler does with the rendered pod templates) on
  * hgx-h200, the default test cluster: 4 HGX H200 nodes, no clique label;
  * gb200-nvl72, a second local cluster of its own (pd-test-gb200-nvl72): two
    NVL72 racks of 4 trays x 4 GPUs, one nvidia.com/gpu.clique per rack.
Only on the local control plane (kwok); the NVL72 cluster is stopped at the
end unless PD_KEEP_CLUSTER is set.
"""
from __future__ import annotations

import copy
import os
import time

import pytest
from kubernetes import client, config

from pd_operator.api import validate_service
from pd_operator.controller.kube import Kube
from pd_operator.render import render
from tests.conftest import EXAMPLES, load_example
from tests.integration.conftest import clear_leftovers, load_local_cluster_module, wait_gpus_released

pytestmark = pytest.mark.integration

NVL72_CLUSTER = os.environ.get("PD_TEST_NVL72_CLUSTER", "pd-test-gb200-nvl72")
EXAMPLE = next(p for p in EXAMPLES if p.stem == "vllm-nixl")


def _service(namespace: str, **spec) -> dict:
    obj = copy.deepcopy(load_example(EXAMPLE))
    obj["metadata"]["namespace"] = namespace
    for key, value in spec.items():
        obj["spec"].setdefault(key, {}).update(value)
    return obj


def _create_pools(apps: client.AppsV1Api, obj: dict) -> str:
    """The rendered StatefulSets as they are (the typed client would refuse integer
    quantities the API server takes), applied through the operator's REST facade."""
    svc = validate_service(obj)
    kube = Kube(apps.api_client)
    for o in render(svc):
        if o["kind"] == "StatefulSet":
            o["metadata"].pop("ownerReferences", None)  # no owner object here
            kube.apply(o)
    return svc.metadata.name


def _pods(core: client.CoreV1Api, namespace: str, name: str, role: str):
    return core.list_namespaced_pod(namespace, label_selector=f"pdserving.io/service={name},pdserving.io/role={role}").items


def _wait_scheduled(core, namespace, name, want: dict[str, int], timeout: float = 90.0):
    """Pods of each role once all exist and are bound (or the timeout: then as they are)."""
    deadline = time.monotonic() + timeout
    while True:
        pods = {r: _pods(core, namespace, name, r) for r in want}
        if all(len(pods[r]) == n and all(p.spec.node_name for p in pods[r]) for r, n in want.items()):
            return pods
        if time.monotonic() > deadline:
            return pods
        time.sleep(0.5)


def _namespace(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"pdserving.io/test": "integration"})))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_service_account("default", name)
            return name
        except client.ApiException:
            time.sleep(0.2)
    return name


# --- HGX H200 (default profile) ---------------------------------------------------

def test_hgx_defaults_leave_nothing_pending_and_spread_the_pools(kube_cluster, namespace, apps_v1, core_v1):
    if not kube_cluster.local:
        pytest.skip("node profiles are the local control plane's")
    wait_gpus_released(core_v1)  # an earlier test's pods still holding GPUs change where these land
    name = _create_pools(apps_v1, _service(namespace))
    pods = _wait_scheduled(core_v1, namespace, name, {"prefill": 2, "decode": 2})
    for role, ps in pods.items():
        assert len(ps) == 2 and all(p.spec.node_name for p in ps), (role, [(p.metadata.name, p.status.conditions) for p in ps])
    nodes = {n.metadata.name: n.metadata.labels for n in core_v1.list_node().items}
    assert all("nvidia.com/gpu.clique" not in nodes[p.spec.node_name] for ps in pods.values() for p in ps)
    # 4 nodes x 8 GPUs, four TP4 pods: the defaults keep prefill and decode on different hosts.
    prefill_hosts = {p.spec.node_name for p in pods["prefill"]}
    assert not prefill_hosts & {p.spec.node_name for p in pods["decode"]}
    # Not BestEffort (the API server computes status.qosClass at creation).
    assert {p.status.qos_class for ps in pods.values() for p in ps} == {"Burstable"}


def test_hgx_required_colocation_stays_pending_with_the_scheduler_s_reason(kube_cluster, namespace, apps_v1, core_v1):
    """What colocate: required does on HGX (no clique label): decode can never schedule."""
    if not kube_cluster.local:
        pytest.skip("node profiles are the local control plane's")
    name = _create_pools(apps_v1, _service(namespace, topology={"colocate": "required"},
                                           prefill={"replicas": 1}, decode={"replicas": 1}))
    pods = _wait_scheduled(core_v1, namespace, name, {"prefill": 1, "decode": 1}, timeout=30)
    assert pods["prefill"][0].spec.node_name
    decode = pods["decode"][0]
    assert not decode.spec.node_name
    cond = next(c for c in decode.status.conditions or [] if c.type == "PodScheduled")
    assert cond.reason == "Unschedulable" and "pod affinity" in cond.message


# --- GB200 NVL72 ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def nvl72(kube_cluster):
    if not kube_cluster.local:
        pytest.skip("node profiles are the local control plane's")
    mod = load_local_cluster_module()
    was_running = mod.is_running(NVL72_CLUSTER)
    kc = str(mod.up(NVL72_CLUSTER, profile="gb200-nvl72"))
    clear_leftovers(kc)  # a killed session's pods would hold clique GPUs
    api = config.new_client_from_config(config_file=kc)
    try:
        yield client.CoreV1Api(api), client.AppsV1Api(api)
    finally:
        api.close()
        if not was_running and not os.environ.get("PD_KEEP_CLUSTER"):
            mod.down(NVL72_CLUSTER)


@pytest.mark.parametrize("colocate", ["preferred", "required"])
def test_nvl72_decode_lands_in_the_prefill_clique(nvl72, colocate):
    core, apps = nvl72
    ns = _namespace(core, f"t-nvl72-{colocate}-{os.getpid()}")
    try:
        name = _create_pools(apps, _service(ns, topology={"colocate": colocate},
                                            prefill={"replicas": 1, "gpuProduct": "NVIDIA-GB200"},
                                            decode={"replicas": 2, "gpuProduct": "NVIDIA-GB200"}))
        pods = _wait_scheduled(core, ns, name, {"prefill": 1, "decode": 2})
        assert all(p.spec.node_name for ps in pods.values() for p in ps), pods
        clique = {n.metadata.name: n.metadata.labels["nvidia.com/gpu.clique"] for n in core.list_node().items}
        prefill_node = pods["prefill"][0].spec.node_name
        assert {clique[p.spec.node_name] for p in pods["decode"]} == {clique[prefill_node]}
        # Same NVLink domain, not the same tray.
        assert prefill_node not in {p.spec.node_name for p in pods["decode"]}
    finally:
        core.delete_namespace(ns, propagation_policy="Background")
