"""Names and labels of everything rendered for one PDInferenceService."""

from __future__ import annotations

from ..api.constants import (
    ROLES,
    LABEL_COMPONENT,
    LABEL_ENGINE,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_ROLE,
    LABEL_SERVICE,
    LABEL_VERSION,
)
from ..api.models import PDInferenceService

MANAGER = "pd-operator"


def child_name(svc: PDInferenceService, role: str) -> str:
    """NAME-prefill, NAME-decode, NAME-router."""
    return f"{svc.metadata.name}-{role}"


# vllm-router with --kv-connector moriio learns its workers from registration
# heartbeats (ZMQ, --vllm-discovery-address), which vLLM's MoRIIOConnector sends
# to proxy_ip:proxy_ping_port of kv_connector_extra_config
# (tests/contract/FACTS.md, "MoRIIO and vllm-router discovery"). 30001 is the
# router's own example port; any port clear of the API (8000) and metrics
# (29000) ports works.
ROUTER_DISCOVERY_PORT = 30001


def discovery_service_host(svc: PDInferenceService) -> str:
    """DNS name of the ClusterIP Service in front of the router's discovery port."""
    name = child_name(svc, "router-discovery")
    return f"{name}.{svc.metadata.namespace}.svc" if svc.metadata.namespace else name


def selector_labels(svc: PDInferenceService, role: str) -> dict[str, str]:
    """The immutable labels that select one role's pods."""
    return {LABEL_SERVICE: svc.metadata.name, LABEL_ROLE: role}


def labels(svc: PDInferenceService, role: str) -> dict[str, str]:
    """All labels of a role's objects and pods."""
    spec = svc.spec
    version = spec.engine.effective_version() if role in ROLES else None
    out = {
        LABEL_NAME: spec.router_kind() if role == "router" else spec.engine.kind,
        LABEL_INSTANCE: svc.metadata.name,
        LABEL_COMPONENT: role,
        LABEL_PART_OF: "pd-operator",
        LABEL_MANAGED_BY: MANAGER,
        LABEL_ENGINE: spec.engine.kind,
        **selector_labels(svc, role),
    }
    if version:
        out[LABEL_VERSION] = version
    return out


def metadata(svc: PDInferenceService, name: str, role: str, **extra) -> dict:
    meta: dict = {"name": name}
    if svc.metadata.namespace:
        meta["namespace"] = svc.metadata.namespace
    meta["labels"] = labels(svc, role)
    meta.update(extra)
    return meta


def secret_env(name: str, ref) -> dict:
    """An env var read from a Secret key: secrets never appear as literals."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
