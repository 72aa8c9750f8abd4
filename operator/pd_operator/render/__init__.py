"""Pure rendering: a validated PDInferenceService -> the complete, ordered
manifest list. No cluster access, no clock, no randomness: the same spec gives
the same bytes."""

from __future__ import annotations

import copy

from ..api.models import PDInferenceService
from .common import child_name, metadata
from .engines import engine_for
from .network import network_policy, pod_disruption_budget, router_network_policy
from .pools import config_map_name, headless_service, pool_workload
from .routers import ROUTER_METRICS_PORT, ROUTER_PORT, deployment, discovery_service, endpoint, rbac, router_for, service

__all__ = ["render", "endpoint"]


def render(svc: PDInferenceService, owner: dict | None = None, current_replicas: dict[str, int] | None = None) -> list[dict]:
    """All objects of one service, in the order they should be applied.

    ``owner``: an ownerReference (apiVersion, kind, name, uid) to put on every
    object, so deleting the service garbage-collects them.
    ``current_replicas``: the pools' current sizes by role, when they exist;
    see :meth:`PoolSpec.desired_replicas` for who decides the size.
    """
    current_replicas = current_replicas or {}
    engine = engine_for(svc)
    engine.check_extra_args()
    engine.check_ports()
    router = router_for(svc, engine)
    router.check_extra_args()

    objs: list[dict] = []
    files = engine.config_files()
    if files:
        objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(svc, config_map_name(svc), "config"), "data": files})
    for role in ("prefill", "decode"):
        sts = pool_workload(svc, engine, role, current_replicas.get(role))
        if role == "prefill":
            tmpl = sts["spec"]["template"] if sts["kind"] == "StatefulSet" else sts["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
            tmpl["metadata"]["annotations"].update(router.prefill_annotations())
        objs += [headless_service(svc, engine, role), sts, pod_disruption_budget(svc, role)]
    objs += rbac(svc)
    objs += [deployment(svc, router), service(svc), *discovery_service(svc, router)]
    if svc.spec.router.replicas > 1:
        objs.append(pod_disruption_budget(svc, "router"))
    if svc.spec.network_policy.enabled:
        objs.append(network_policy(svc, engine))
        objs.append(router_network_policy(svc, ROUTER_PORT, ROUTER_METRICS_PORT, router.registration_port()))
    if owner:
        ref = {**owner, "controller": True, "blockOwnerDeletion": True}
        for obj in objs:
            obj["metadata"]["ownerReferences"] = [ref]
    # Every object stands alone: no dict shared between two of them.
    return copy.deepcopy(objs)
