"""NetworkPolicy and PodDisruptionBudgets."""

from __future__ import annotations

from ..api.constants import LABEL_ROLE, LABEL_SERVICE
from ..api.models import PDInferenceService
from .common import child_name, metadata, selector_labels
from .engines import EngineAdapter


def network_policy(svc: PDInferenceService, engine: EngineAdapter) -> dict:
    """Engine pods accept traffic only from the router (API and bootstrap
    ports), from the pools of the same service (KV transfer over UCX/Mooncake
    uses ports chosen at run time, so peers get all ports) and from metrics
    scrapers (the API port, which serves /metrics)."""
    engines = _engine_pods(svc)
    ports = {p["containerPort"] for role in ("prefill", "decode") for p in engine.ports(role) if p["name"] in ("http", "bootstrap")}
    router_ports = [{"protocol": "TCP", "port": p} for p in sorted(ports)]
    scrapers = _peers(svc.spec.network_policy.metrics_from)
    ingress = [
        {"from": [{"podSelector": {"matchLabels": selector_labels(svc, "router")}}], "ports": router_ports},
        {"from": [{"podSelector": engines}]},
    ]
    if scrapers:
        ingress.append({"from": scrapers, "ports": [{"protocol": "TCP", "port": engine.http_port}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(svc, child_name(svc, "engines"), "engines"),
        "spec": {"podSelector": engines, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _engine_pods(svc: PDInferenceService) -> dict:
    """Label selector of the service's prefill and decode pods."""
    return {
        "matchLabels": {LABEL_SERVICE: svc.metadata.name},
        "matchExpressions": [{"key": LABEL_ROLE, "operator": "In", "values": ["prefill", "decode"]}],
    }


def _peers(peers) -> list[dict]:
    out = []
    for peer in peers:
        item = {}
        # Empty selectors are written as {} (as the API server stores them), or
        # every apply would look like a change.
        if peer.namespace_selector is not None:
            item["namespaceSelector"] = {k: v for k, v in peer.namespace_selector.dump().items() if v}
        if peer.pod_selector is not None:
            item["podSelector"] = {k: v for k, v in peer.pod_selector.dump().items() if v}
        out.append(item)
    return out


def router_network_policy(svc: PDInferenceService, api_port: int, metrics_port: int,
                          registration_port: int | None = None) -> dict:
    """The router's API port only to ``clientsFrom`` (default: the pods of the
    service's own namespace), its metrics port only to ``metricsFrom``.
    vllm-router authenticates no client (tests/contract/FACTS.md), so this
    policy is what keeps other tenants off the model."""
    spec = svc.spec.network_policy
    clients = _peers(spec.clients_from) or [{"podSelector": {}}]
    ingress = [{"from": clients, "ports": [{"protocol": "TCP", "port": api_port}]}]
    scrapers = _peers(spec.metrics_from)
    if scrapers:
        ingress.append({"from": scrapers, "ports": [{"protocol": "TCP", "port": metrics_port}]})
    if registration_port is not None:
        # the service's engine pods register with the router (MoRIIO heartbeats)
        ingress.append({"from": [{"podSelector": _engine_pods(svc)}], "ports": [{"protocol": "TCP", "port": registration_port}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(svc, child_name(svc, "router"), "router"),
        "spec": {"podSelector": {"matchLabels": selector_labels(svc, "router")}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }


def pod_disruption_budget(svc: PDInferenceService, role: str) -> dict:
    """Voluntary disruptions (node drains) take at most one pod of a role at a time. A pod that
    is not Ready (crash-looping, or loading a model for up to the startup probe's half hour) is
    evicted whatever the budget says: by default the eviction API lets an unready pod go only
    while the budget is met (pkg/registry/core/pod/storage/eviction.go), and a pool of one
    replica (desired healthy 0, disruptions allowed 0 while it is unready: pkg/controller/
    disruption) or of unready replicas would block `kubectl drain` for good."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(svc, child_name(svc, role), role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(svc, role)},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }
