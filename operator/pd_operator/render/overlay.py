"""A pool's pod-template overlay (``spec.<pool>.podTemplate``) merged into the
rendered pod template, and the rendered fields it may not change.

The merge follows Kubernetes' strategic merge patch: maps merge key by key,
lists with a merge key (api/podtemplate.py MERGE_KEYS) merge entry by entry,
other lists and scalars are replaced. Env entries are replaced whole (a
``value`` and a ``valueFrom`` of one name cannot both stand). Pure: the shape
was checked when the spec was validated; here the rendered pod is known, so
the fields the operator owns are refused with the field that sets them.
"""

from __future__ import annotations

import copy
from typing import Any

from ..api.errors import SpecError
from ..api.models import PDInferenceService
from ..api.podtemplate import ENGINE_CONTAINER, MERGE_KEYS
from .engines import EngineAdapter

# Operator volumes and the field that sets each instead.
OWNED_VOLUMES = {
    "dshm": "its size is {pool}.shmSize",
    "hf-cache": "the weights' cache is spec.model.cache",
    "models": "the weights' volume is spec.model.cache (kind image) or spec.model.source (type pvc)",
    "engine-config": "it holds the operator's engine configuration (kvTransfer.lmcache)",
}


def merge(base: Any, overlay: Any, key: str | None = None) -> Any:
    """Strategic-merge ``overlay`` into ``base`` (neither is modified)."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for k, v in overlay.items():
            out[k] = merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(overlay, list) and key in MERGE_KEYS:
        mk = MERGE_KEYS[key]
        out = [copy.deepcopy(x) for x in base]
        index = {x.get(mk): i for i, x in enumerate(out) if isinstance(x, dict)}
        for item in overlay:
            at = index.get(item.get(mk)) if isinstance(item, dict) and item.get(mk) is not None else None
            if at is None:
                out.append(copy.deepcopy(item))
            elif key == "env":
                out[at] = copy.deepcopy(item)  # in place, so $(VAR) references keep their order
            else:
                out[at] = merge(out[at], item)
        return out
    return copy.deepcopy(overlay)


def _named(items, key: str = "name") -> list[dict]:
    return [x for x in items or [] if isinstance(x, dict)]


def owned_problems(svc: PDInferenceService, engine: EngineAdapter, role: str, template: dict, overlay: dict) -> list[tuple[str, str]]:
    """(field, what to set instead) for each rendered field the overlay would change."""
    spec = svc.spec
    base = f"spec.{role}.podTemplate"
    problems: list[tuple[str, str]] = []
    rendered_labels = template["metadata"].get("labels", {})
    for k in (overlay.get("metadata") or {}).get("labels", {}) or {}:
        if k in rendered_labels:
            problems.append((f"{base}.metadata.labels[{k}]",
                             "the operator sets this label, and the StatefulSet, Services, router worker discovery, "
                             "NetworkPolicies, PodDisruptionBudgets and the Prometheus scrape job use these labels in their selectors "
                             "to find the pods: use another label key"))
    pod = overlay.get("spec") or {}
    if "terminationGracePeriodSeconds" in pod:
        problems.append((f"{base}.spec.terminationGracePeriodSeconds",
                         f"set {role}.terminationGracePeriodSeconds instead: the engine's drain time "
                         "(--shutdown-timeout) is derived from it"))
    rendered_volumes = {v["name"] for v in template["spec"].get("volumes", [])}
    for v in _named(pod.get("volumes")):
        if v.get("name") in rendered_volumes:
            why = OWNED_VOLUMES.get(v["name"], "the operator renders it").format(pool=role)
            problems.append((f"{base}.spec.volumes[{v['name']}]",
                             f"{v['name']} is the operator's volume ({why}): give yours another name"))

    listen = {port: what for port, _field, what in engine.listen_ports(role)}
    engine_port_names = {p["name"] for p in engine.ports(role)}
    owned_resources = {spec.gpu_resource_name(): f"GPUs are {role}.tensorParallelSize x pipelineParallelSize x "
                                                  "dataParallelSize of topology.gpuResourceName: set those"}
    if spec.kv_transfer.rdma.resource_name:
        owned_resources[spec.kv_transfer.rdma.resource_name] = "the RDMA device comes from kvTransfer.rdma.resourceName and kvTransfer.rdma.count: set those"
    engine_mounts = {m["mountPath"] for m in template["spec"]["containers"][0].get("volumeMounts", [])}

    for list_name in ("containers", "initContainers"):
        for c in _named(pod.get(list_name)):
            path = f"{base}.spec.{list_name}[{c.get('name')}]"
            is_engine = list_name == "containers" and c.get("name") == ENGINE_CONTAINER
            if is_engine:
                for f in ("command", "args"):
                    if f in c:
                        problems.append((f"{path}.{f}",
                                         "the engine's command line is rendered from the spec and checked against the "
                                         "pinned engine's flags: add flags with engine.extraArgs or "
                                         f"{role}.extraArgs, environment with env"))
                for m in _named(c.get("volumeMounts")):
                    if m.get("mountPath") in engine_mounts:
                        problems.append((f"{path}.volumeMounts[{m['mountPath']}]",
                                         "the operator mounts its own volume there (/dev/shm: shmSize; the weights: "
                                         "model.cache / model.source): mount yours elsewhere"))
            res = c.get("resources") if isinstance(c.get("resources"), dict) else {}
            for kind in ("requests", "limits"):
                for r in (res.get(kind) or {}) if isinstance(res.get(kind), dict) else {}:
                    if r in owned_resources:
                        problems.append((f"{path}.resources.{kind}[{r}]", owned_resources[r]))
            for p in _named(c.get("ports")):
                port, name = p.get("containerPort"), p.get("name")
                if port in listen:
                    problems.append((f"{path}.ports",
                                     f"port {port} is {listen[port]}, which the router and the peer pool use "
                                     "(the containers of a pod share its network): use another port"))
                elif name in engine_port_names:
                    problems.append((f"{path}.ports",
                                     f"port name {name} is the engine's (the probes and the Services reach the "
                                     "engine by that name): use another port name"))
    return problems


def apply_overlay(svc: PDInferenceService, engine: EngineAdapter, role: str, template: dict) -> dict:
    """The pod template with the pool's overlay merged in; SpecError on owned fields."""
    overlay = svc.spec.pool(role).pod_template
    if not overlay:
        return template
    problems = owned_problems(svc, engine, role, template, overlay)
    if problems:
        raise SpecError(problems, svc.metadata.name)
    merged = merge(template, overlay)
    pod = merged["spec"]
    if pod.get("hostNetwork") and "dnsPolicy" not in (overlay.get("spec") or {}):
        # On the host's network the pod would get the node's resolver and
        # could not resolve the peers' headless Service names.
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    return merged
