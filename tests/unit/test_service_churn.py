"""Issue 19, item 8 (and issue 15: the work queue, the watch cache and the
remembered refusals): 200 services created, reconciled and deleted through the
handlers against an in-memory Kube leave the operator's per-service state and
its ``pd_operator_service_ready`` series where they started."""

from __future__ import annotations

import copy
import gc
import uuid

from prometheus_client import REGISTRY

from pd_operator.controller import handlers, reconcile as reconcile_mod
from pd_operator.controller.autoscaler import Autoscaler
from pd_operator.controller.cache import CachedKube
from tests.conftest import minimal

N = 200


class MemoryKube:
    """The Kube methods reconcile and the handlers call, over dicts."""

    def __init__(self):
        self.services: dict[tuple[str, str], dict] = {}
        self.objects: dict[tuple[str, str, str], dict] = {}

    def get_service(self, namespace, name):
        return copy.deepcopy(self.services.get((namespace, name)))

    def list_services(self, namespace):
        return [copy.deepcopy(b) for (ns, _), b in self.services.items() if namespace in (None, ns)]

    def patch_status(self, namespace, name, status, manager=None):
        self.services[(namespace, name)]["status"] = status

    def get(self, kind, namespace, name):
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def list(self, kind, namespace, selector):
        return [o for (k, ns, _), o in self.objects.items() if k == kind and ns == namespace
                and selector.items() <= o["metadata"].get("labels", {}).items()]

    def pods(self, namespace, selector):
        return []

    def create_failures(self, namespace, kind, name):
        return []

    def cluster_gpu_view(self):
        return None

    def apply(self, obj, manager=None, dry_run=False):
        if dry_run:
            return obj
        meta = obj["metadata"]
        stored = copy.deepcopy(obj)
        stored["metadata"]["managedFields"] = [{"manager": manager or "pd-operator", "operation": "Apply",
                                                "fieldsV1": {"f:spec": {}}}]
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = stored
        return copy.deepcopy(stored)

    def apply_replicas(self, kind, namespace, name, replicas):
        self.objects[(kind, namespace, name)].setdefault("spec", {})["replicas"] = replicas

    def delete(self, kind, namespace, name):
        self.objects.pop((kind, namespace, name), None)

    def prune(self, namespace, service, keep):
        return []

    def secret_problem(self, namespace, name, key):
        return None

    def delete_service(self, namespace, name):
        """What the API server does on deletion: the children go by ownerReference."""
        del self.services[(namespace, name)]
        for key in [k for k, o in self.objects.items() if k[1] == namespace
                    and any(r["name"] == name for r in o["metadata"].get("ownerReferences", []))]:
            del self.objects[key]


def ready_series() -> int:
    return sum(1 for m in REGISTRY.collect() if m.name == "pd_operator_service_ready" for _ in m.samples)


def per_service_state(scaler: Autoscaler) -> dict[str, int]:
    return {"queue": handlers.QUEUE.state_size(), "cache": handlers.CACHE.size(),
            "refusals": len(reconcile_mod.REFUSALS), "owned": len(reconcile_mod.OWNED), "locks": len(reconcile_mod.LOCKS._locks),
            "histories": len(scaler.histories), "last_round": len(scaler.last_round),
            "last_scale": len(scaler.last_scale)}


def test_create_and_delete_200_services_returns_to_baseline(monkeypatch):
    kube = MemoryKube()
    scaler = Autoscaler(kube, lambda *a, **k: {}, lambda *a: None)
    # the service reads come from the watch cache, the rest from the in-memory API
    monkeypatch.setitem(handlers.STATE, "kube", CachedKube(kube, handlers.CACHE))
    monkeypatch.setitem(handlers.STATE, "autoscaler", scaler)
    monkeypatch.setattr(handlers, "post_event", lambda *a, **k: None)
    namespace = f"churn-{uuid.uuid4().hex[:6]}"
    gc.collect()
    series0, state0 = ready_series(), per_service_state(scaler)

    for i in range(N):
        body = minimal()
        body["metadata"] = {"namespace": namespace, "name": f"s{i}", "uid": f"uid-{i}", "generation": 1}
        kube.services[(namespace, f"s{i}")] = body
        handlers.on_service_event({"type": "ADDED", "object": body})
        assert handlers.QUEUE.run_once() == (namespace, f"s{i}")
        # a refused spec is remembered too (and must be forgotten)
        reconcile_mod.REFUSALS.put((namespace, f"s{i}"), frozenset({"h"}), [("StatefulSet", "x", "f", "m")])
        handlers.QUEUE.add((namespace, f"s{i}"), delay=60)  # a queued (settling) run
        # the autoscaler's memory of it, as a round leaves it
        scaler.histories[(namespace, f"s{i}")] = {}
        scaler.last_round[(namespace, f"s{i}")] = 1.0
        scaler.last_scale[(namespace, f"s{i}", "decode")] = 1.0
    # it really was reconciled: children applied and a series per service
    assert len(kube.objects) >= 5 * N
    assert ready_series() == series0 + N
    grown = per_service_state(scaler)
    assert all(grown[k] >= state0[k] + N for k in ("queue", "cache", "refusals", "owned", "locks", "histories", "last_round",
                                                   "last_scale")), grown

    for i in range(N):
        body = kube.services[(namespace, f"s{i}")]
        kube.delete_service(namespace, f"s{i}")
        handlers.on_service_event({"type": "DELETED", "object": body})
    gc.collect()
    assert not kube.objects and not kube.services
    assert ready_series() == series0
    assert per_service_state(scaler) == state0
