"""The real LeaderWorkerSet controller (sigs.k8s.io/lws, built by
e2e/controlplane/build.sh, run by e2e/cluster.py with its webhooks on loopback)
runs the LeaderWorkerSet pd-operator renders for a pool whose replicas span
nodes: groups of pods with the LWS labels and env, ready groups counted,
a lost worker recreating its group, a scale-up adding a whole group.

The workload is applied as pd-operator renders it (no operator process): the
pool's headless Service and LeaderWorkerSet. kwok runs no containers, so
what is checked here is LWS and the scheduler, not the engines.
"""
from __future__ import annotations

import time

import pytest
from kubernetes import client

from pd_operator.api import validate_service
from pd_operator.render import render
from tests.conftest import minimal

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"


def small_wide_ep(namespace: str) -> list[dict]:
    """An SGLang decode pool of replicas over 2 nodes (TP 8, DP attention 8, DeepEP;
    4 GPUs per pod), sized for the 4-node local cluster."""
    obj = minimal("sglang", topology={"gpusPerNode": 8, "nvlinkDomainKey": "kubernetes.io/hostname"},
                  decode={"replicas": 1, "tensorParallelSize": 8, "dataParallelSize": 8, "dataParallelAttention": True,
                          "expertParallel": True, "deepepMode": "low_latency", "nodesPerReplica": 2})
    obj["metadata"] = {"name": "ds", "namespace": namespace}
    objs = render(validate_service(obj))
    return [o for o in objs if o["metadata"]["name"] == "ds-decode" and o["kind"] in ("Service", "LeaderWorkerSet")]


def wait(what: str, fn, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def group_pods(core: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(namespace, label_selector="leaderworkerset.sigs.k8s.io/name=ds-decode").items


def ready(pod: client.V1Pod) -> bool:
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def lws_status(custom: client.CustomObjectsApi, namespace: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "ds-decode").get("status") or {}


def test_lws_groups_labels_env_recreate_and_scale(core_v1, custom_objects, namespace, kube_cluster):
    if not kube_cluster.local:
        pytest.skip("needs the local cluster's LWS controller")
    svc_obj, lws = small_wide_ep(namespace)
    core_v1.create_namespaced_service(namespace, svc_obj)
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, lws)

    # one group of 2 pods; the pod webhook labelled each with its worker index and
    # wrote the leader's address and its index into the env (no webhook: no labels)
    pods = wait("a ready group of 2 pods", lambda: (p := group_pods(core_v1, namespace)) and len(p) == 2
                and all(ready(x) for x in p) and p)
    by_index = {p.metadata.labels["leaderworkerset.sigs.k8s.io/worker-index"]: p for p in pods}
    assert set(by_index) == {"0", "1"}
    for index, pod in by_index.items():
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["LWS_WORKER_INDEX"] == index
        assert env["LWS_LEADER_ADDRESS"] == f"ds-decode-0.ds-decode.{namespace}"
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"
    assert by_index["0"].spec.containers[0].readiness_probe is not None      # the leader serves HTTP
    assert by_index["1"].spec.containers[0].readiness_probe is None          # the worker does not
    wait("LWS readyReplicas 1", lambda: lws_status(custom_objects, namespace).get("readyReplicas") == 1)

    # a worker deleted by hand takes its group down: the leader is recreated too
    leader_uid = by_index["0"].metadata.uid
    # with a grace period, as kubectl does: LWS acts on the pod it sees being deleted
    # (handleRestartPolicy, PodDeleted); a grace-0 pod may be gone before it looks
    core_v1.delete_namespaced_pod(by_index["1"].metadata.name, namespace, grace_period_seconds=2)
    wait("the group recreated (a new leader pod)", lambda: any(
        p.metadata.labels.get("leaderworkerset.sigs.k8s.io/worker-index") == "0" and p.metadata.uid != leader_uid
        and ready(p) for p in group_pods(core_v1, namespace)), timeout=120)
    wait("the recreated group ready", lambda: lws_status(custom_objects, namespace).get("readyReplicas") == 1
         and len([p for p in group_pods(core_v1, namespace) if ready(p)]) == 2, timeout=120)

    # the replicas writer's scale-up adds a whole group (2 more pods, group index 1)
    custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "ds-decode", {"spec": {"replicas": 2}})
    wait("2 ready groups", lambda: lws_status(custom_objects, namespace).get("readyReplicas") == 2, timeout=120)
    groups = {p.metadata.labels["leaderworkerset.sigs.k8s.io/group-index"] for p in group_pods(core_v1, namespace) if ready(p)}
    assert groups == {"0", "1"}
    # every pod carries its group's key, the leader and the worker the same, each group its own:
    # the autoscaler sums a replica's series over it (promql.GROUP_KEY, the scrape job copies it)
    keys: dict[str, set] = {}
    for p in group_pods(core_v1, namespace):
        if p.metadata.deletion_timestamp is None:
            keys.setdefault(p.metadata.labels["leaderworkerset.sigs.k8s.io/group-index"], set()).add(
                p.metadata.labels.get("leaderworkerset.sigs.k8s.io/group-key"))
    assert all(len(k) == 1 and None not in k for k in keys.values()) and len(set.union(*keys.values())) == 2, keys
    leaders = core_v1.list_namespaced_pod(
        namespace, label_selector="leaderworkerset.sigs.k8s.io/name=ds-decode,leaderworkerset.sigs.k8s.io/worker-index=0").items
    assert len(leaders) == 2  # what the routers' selector finds: one pod per group
