"""The reconciler in process, on an in-memory cluster behind the Kube facade
(tests/fakekube.py): who writes the pools' replicas, what status says when
the API server refuses a child, pruning, and the coalescing of concurrent
reconcile requests (controller/handlers.py). The same flows on a real API
server are tests/integration/test_operator.py."""

from __future__ import annotations


import pytest

from pd_operator.controller.kube import AUTOSCALER_MANAGER, FIELD_MANAGER, REPLICAS_MANAGER
from pd_operator.controller.reconcile import reconcile
from tests.fakekube import FakeCluster, FakeKube

NS = "ns"
EXPECTED = {
    ("Service", "svc-prefill"), ("StatefulSet", "svc-prefill"), ("PodDisruptionBudget", "svc-prefill"),
    ("Service", "svc-decode"), ("StatefulSet", "svc-decode"), ("PodDisruptionBudget", "svc-decode"),
    ("ServiceAccount", "svc-router"), ("Role", "svc-router"), ("RoleBinding", "svc-router"),
    ("Deployment", "svc-router"), ("Service", "svc-router"), ("NetworkPolicy", "svc-engines"),
}


def body(name: str = "svc", **spec) -> dict:
    out = {
        "apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "engine": {"kind": "vllm"},
                 "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                 "router": {"image": "registry.example.com/pd/vllm-router:test"}},
    }
    out["spec"].update(spec)
    return out


class Events(list):
    def __call__(self, _body, type_, reason, message):
        self.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self]


@pytest.fixture
def cluster():
    return FakeCluster()


@pytest.fixture
def kube(cluster):
    return FakeKube(cluster)


def run(kube: FakeKube, name: str = "svc", events: Events | None = None) -> dict:
    """One reconcile of the stored service, as a handler runs it."""
    return reconcile(kube, kube.get_service(NS, name), events if events is not None else Events())


def replicas(cluster: FakeCluster, role: str) -> int:
    return cluster.get("StatefulSet", NS, f"svc-{role}")["spec"]["replicas"]


def status(cluster: FakeCluster, name: str = "svc") -> dict:
    return cluster.get("PDInferenceService", NS, name)["status"]


def conditions(cluster: FakeCluster, name: str = "svc") -> dict[str, dict]:
    return {c["type"]: c for c in status(cluster, name)["conditions"]}


# --------------------------------------------------------------------------
# who writes replicas
# --------------------------------------------------------------------------


def test_the_replicas_writer_owns_replicas_and_the_main_apply_never_carries_them(cluster, kube):
    cluster.apply_service(body(prefill={"replicas": 2}))
    events = Events()
    run(kube, events=events)
    assert cluster.kinds(NS) >= EXPECTED
    assert "Created" in events.reasons()
    for role, n in (("prefill", 2), ("decode", 1)):
        assert replicas(cluster, role) == n
        # created at its size by the main apply alone (one request per pool)
        assert cluster.owners("StatefulSet", NS, f"svc-{role}", "spec", "replicas") == {FIELD_MANAGER}
    # an edit of the pools: the replicas writer takes the size over before the main
    # apply leaves it out (server-side apply would drop it: the pools would fall to 1)
    cluster.apply_service(body(prefill={"replicas": 2}, model={"name": "Qwen/Qwen3-8B", "startupSeconds": 1234}))
    run(kube)
    for role, n in (("prefill", 2), ("decode", 1)):
        assert replicas(cluster, role) == n
        assert "replicas" not in cluster.applied_by("StatefulSet", NS, f"svc-{role}", FIELD_MANAGER)["spec"]
        assert cluster.owners("StatefulSet", NS, f"svc-{role}", "spec", "replicas") == {REPLICAS_MANAGER}


def test_an_edit_keeps_an_autoscaled_pools_size_whoever_set_it(cluster, kube):
    scaled = {"enabled": True, "minReplicas": 2, "maxReplicas": 6}
    cluster.apply_service(body(prefill={"autoscaling": scaled}, decode={"autoscaling": scaled}))
    run(kube)
    kube.apply_replicas("StatefulSet", NS, "svc-decode", 5)  # the autoscaler scales decode; prefill stays at 2
    cluster.apply_service(body(prefill={"autoscaling": scaled}, decode={"autoscaling": scaled},
                               model={"name": "Qwen/Qwen3-8B", "startupSeconds": 1234}))
    seen = len(cluster.calls)
    run(kube)
    assert (replicas(cluster, "prefill"), replicas(cluster, "decode")) == (2, 5)
    patches = [(p, q) for m, p, q in cluster.calls[seen:] if m == "PATCH" and not q.get("dryRun")]
    # prefill: shared first, then the main apply; decode: the autoscaler owns it already
    assert [(p.rsplit("/", 1)[1], q["fieldManager"]) for p, q in patches if "/statefulsets/" in p] == [
        ("svc-prefill", REPLICAS_MANAGER), ("svc-prefill", FIELD_MANAGER), ("svc-decode", FIELD_MANAGER)]


def test_spec_replicas_win_over_a_hand_scale(cluster, kube):
    """Autoscaling off and spec.<pool>.replicas set: the spec is the writer."""
    cluster.apply_service(body(prefill={"replicas": 2}))
    run(kube)
    cluster.put({"kind": "StatefulSet", "metadata": {"name": "svc-prefill", "namespace": NS}, "spec": {"replicas": 5}},
                manager="kubectl")
    events = Events()
    run(kube, events=events)
    assert replicas(cluster, "prefill") == 2
    assert ("Normal", "Scaled", "prefill pool scaled from 5 to 2 replicas: spec.prefill.replicas is 2") in events
    assert status(cluster)["prefill"]["lastScaleReason"] == "prefill pool scaled from 5 to 2 replicas: spec.prefill.replicas is 2"


AUTO = {"enabled": True, "minReplicas": 1, "maxReplicas": 4}


def test_an_autoscaled_pool_keeps_the_autoscalers_size_within_bounds(cluster, kube):
    cluster.apply_service(body(prefill={"autoscaling": AUTO}))
    run(kube)
    assert replicas(cluster, "prefill") == 1  # created at minReplicas
    kube.apply_replicas("StatefulSet", NS, "svc-prefill", 3)  # the autoscaler's decision
    events = Events()
    run(kube, events=events)
    assert replicas(cluster, "prefill") == 3 and "Scaled" not in events.reasons()
    cluster.apply_service(body(prefill={"autoscaling": {**AUTO, "maxReplicas": 2}}))
    run(kube, events=events)
    assert replicas(cluster, "prefill") == 2
    assert ("Normal", "Scaled", "prefill pool scaled from 3 to 2 replicas: kept within "
                                "autoscaling.minReplicas..maxReplicas (1..2)") in events


def test_a_scale_between_the_read_and_the_apply_is_not_undone(cluster, kube):
    """The reconciler reads the pool's size, then applies; the autoscaler scales in
    between. The main apply carries no replicas, so it cannot put the old size back."""
    cluster.apply_service(body(prefill={"autoscaling": AUTO}))
    run(kube)
    kube.apply_replicas("StatefulSet", NS, "svc-prefill", 2)
    done = []

    def autoscaler_scales_first(method, path, _body, params):
        if (method == "PATCH" and path.endswith("/statefulsets/svc-prefill")
                and params.get("fieldManager") == FIELD_MANAGER and not done):
            done.append(True)
            cluster.put({"kind": "StatefulSet", "metadata": {"name": "svc-prefill", "namespace": NS},
                         "spec": {"replicas": 3}}, manager=REPLICAS_MANAGER)

    cluster.hooks.append(autoscaler_scales_first)
    run(kube)
    assert done and replicas(cluster, "prefill") == 3


# --------------------------------------------------------------------------
# apply errors and prune
# --------------------------------------------------------------------------


def managed_config_map(service: str, name: str, managed: bool = True) -> dict:
    labels = {"pdserving.io/service": service}
    if managed:
        labels["app.kubernetes.io/managed-by"] = FIELD_MANAGER
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "data": {"k": "v"}}


def test_a_refused_child_is_named_in_status_and_nothing_is_written(cluster, kube):
    """The API server refuses one rendered child at the dry-run: status names it,
    nothing is created and nothing is pruned (all or nothing)."""
    cluster.apply_service(body())
    cluster.put(managed_config_map("svc", "svc-leftover"))  # would be pruned by a successful reconcile
    cluster.refuse("NetworkPolicy", "svc-engines", 422, "Unprocessable Entity",
                   'NetworkPolicy.networking.k8s.io "svc-engines" is invalid: spec.ingress[0]: bad port')
    events = Events()
    run(kube, events=events)
    c = conditions(cluster)
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "InvalidSpec"
    assert "NetworkPolicy/svc-engines" in c["Ready"]["message"] and "bad port" in c["Ready"]["message"]
    assert ("Warning", "InvalidSpec") in [(t, r) for t, r, _ in events]
    assert sorted(k for k in cluster.kinds(NS) if k[0] != "PDInferenceService") == [("ConfigMap", "svc-leftover")]


def test_children_no_longer_rendered_are_pruned_and_only_those(cluster, kube):
    cluster.apply_service(body(kvTransfer={"backend": "lmcache"}))
    run(kube)
    assert ("ConfigMap", "svc-config") in cluster.kinds(NS)  # LMCache's config file
    cluster.put(managed_config_map("svc", "users-own", managed=False))   # labelled for the service, not ours
    cluster.put(managed_config_map("other", "other-config"))            # ours, another service's
    cluster.apply_service(body(kvTransfer={"backend": "nixl"}))
    events = Events()
    run(kube, events=events)
    names = cluster.kinds(NS)
    assert ("ConfigMap", "svc-config") not in names
    assert {("ConfigMap", "users-own"), ("ConfigMap", "other-config")} <= names
    assert names >= EXPECTED
    assert ("Normal", "Pruned", "deleted ConfigMap/svc-config: the spec no longer needs it") in events


def test_an_invalid_spec_is_reported_and_nothing_is_applied(cluster, kube):
    cluster.apply_service(body(prefill={"replicas": 1, "tensorParallelSize": 3},
                               decode={"replicas": 1, "tensorParallelSize": 2}))  # neither TP divides the other
    events = Events()
    run(kube, events=events)
    assert not [k for k in cluster.kinds(NS) if k[0] != "PDInferenceService"]
    c = conditions(cluster)
    assert c["Ready"]["reason"] == "InvalidSpec" and "tensorParallelSize" in c["Ready"]["message"]
    assert events.reasons() == ["InvalidSpec"]
    run(kube, events=events)  # the same generation again: no second event
    assert events.reasons() == ["InvalidSpec"]


def test_status_keeps_the_autoscalers_conditions(cluster, kube):
    """The reconciler and the autoscaler apply status as two managers: neither
    drops the other's conditions."""
    cluster.apply_service(body())
    run(kube)
    kube.patch_status(NS, "svc", {"conditions": [{"type": "AutoscalingActive", "status": "True", "reason": "Deciding",
                                                  "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
                      manager=AUTOSCALER_MANAGER)
    cluster.put({"kind": "StatefulSet", "metadata": {"name": "svc-prefill", "namespace": NS},
                 "status": {"replicas": 1, "readyReplicas": 1}}, manager="kube-controller-manager")
    run(kube)
    c = conditions(cluster)
    assert c["AutoscalingActive"]["reason"] == "Deciding" and c["PrefillReady"]["status"] == "True"


# --------------------------------------------------------------------------


# One run at a time per service, coalesced requests, per-key backoff and eviction
# are the work queue's (controller/workqueue.py): tests/unit/test_watch_cache_queue_lease.py.
