"""Status of a PDInferenceService from what is observed in the cluster.

Pure: the observed objects and the clock come in, the status dict goes out.
The messages say what is wrong and what to change, so that the
troubleshooting list users otherwise keep by hand reads from
``kubectl describe pdservice``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ..api.constants import ROLES
from ..api.models import PDInferenceService
from ..render import endpoint
from ..render.pools import gpu_count, nodes_per_replica, pool_kind



@dataclass
class Observed:
    """What the controller saw of one service's children."""

    statefulsets: dict[str, dict | None]
    """role -> StatefulSet (None: missing)."""
    router: dict | None
    """The router Deployment."""
    pods: dict[str, list[dict]]
    """role -> pods of that role (prefill, decode, router)."""
    missing_secrets: list[tuple[str, str]] = field(default_factory=list)
    """(spec field, what is missing and how to fix it)."""
    spec_error: list[tuple[str, str]] | None = None
    """Problems that made the spec unusable (field, message)."""
    apply_error: str | None = None
    """The last apply failure, if any."""
    scaled: dict[str, str] = field(default_factory=dict)
    """role -> why the operator resized that pool in this reconcile."""
    create_failures: dict[str, list[dict]] = field(default_factory=dict)
    """role -> FailedCreate Warning events of that role's StatefulSet. The StatefulSet controller reports a pod
    the API server refused (Pod Security admission, quota) only as such an event, not in the StatefulSet's status."""


def condition(type_: str, ok: bool | None, reason: str, message: str, generation: int | None) -> dict:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    return {"type": type_, "status": status, "reason": reason, "message": message, "observedGeneration": generation}


def merge_conditions(previous: list[dict], current: list[dict], now: str) -> list[dict]:
    """Keep lastTransitionTime when a condition's status did not change.

    Only the writer's own conditions come out: status is server-side applied
    (conditions are a map keyed by type), so the reconciler's and the
    autoscaler's conditions live side by side without either copying the other's.
    """
    before = {c.get("type"): c for c in previous or []}
    out = []
    for cond in current:
        old = before.get(cond["type"])
        same = old is not None and old.get("status") == cond["status"]
        out.append({**cond, "lastTransitionTime": old.get("lastTransitionTime", now) if same else now})
    return out


# --------------------------------------------------------------------------
# Why pods are Pending
# --------------------------------------------------------------------------


def unschedulable_reason(svc: PDInferenceService, role: str, message: str) -> str:
    """Turn the scheduler's message into what is wrong and what to change."""
    spec = svc.spec
    topo = spec.topology
    pool = spec.pool(role)
    rdma = spec.kv_transfer.rdma.resource_name
    hints = []
    if f"Insufficient {spec.gpu_resource_name()}" in message:
        hints.append(
            f"not enough free {spec.gpu_resource_name()}: each {role} pod needs {gpu_count(svc, role)} on one node; "
            f"free GPUs, add nodes, or lower {role}.replicas / parallel sizes"
        )
    if rdma and f"Insufficient {rdma}" in message:
        hints.append(
            f"no free {rdma} (kvTransfer.rdma.resourceName): check that the RDMA device plugin runs on the GPU nodes "
            "and that the resource name matches it"
        )
    if "node affinity/selector" in message or "didn't match Pod's node affinity" in message:
        what = f"{spec.gpu_product_label()}={pool.gpu_product}" if pool.gpu_product else "the pool's nodeSelector"
        hints.append(f"no node matches {what}: check {role}.gpuProduct / nodeSelector against your node labels")
    if "pod affinity" in message:
        hints.append(
            f"topology.colocate required: no node next to a prefill pod in its NVLink domain ({topo.nvlink_domain_key}) "
            f"has room, or no node carries the label {topo.nvlink_domain_key} at all (GPU Feature Discovery sets "
            "nvidia.com/gpu.clique only on multi-node NVLink systems such as GB200 NVL72, never on HGX H100/H200 nodes): "
            "use colocate preferred (the default), set topology.nvlinkDomainKey to a label your nodes carry, "
            "or free GPUs in that domain"
        )
    if "untolerated taint" in message:
        hints.append(f"the nodes have taints the pods do not tolerate: add {role}.tolerations")
    if not hints:
        hints.append(message.strip() or "the scheduler has not placed the pod yet")
    return "; ".join(hints)


def _pending(pods: list[dict]) -> list[tuple[dict, str]]:
    out = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Pending" or pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                out.append((pod, cond.get("message") or cond.get("reason") or ""))
    return out


# --------------------------------------------------------------------------
# Pools, router, conditions
# --------------------------------------------------------------------------


def pool_status(sts: dict | None, pods: list[dict]) -> dict:
    st = (sts or {}).get("status") or {}
    desired = ((sts or {}).get("spec") or {}).get("replicas", 0) if sts else 0
    return {
        "replicas": st.get("replicas", 0) or 0,
        "readyReplicas": st.get("readyReplicas", 0) or 0,
        "desiredReplicas": desired or 0,
        "pendingReplicas": _pending_replicas(pods),
    }


LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


def _pending_replicas(pods: list[dict]) -> int:
    """Replicas with a pod that cannot be scheduled: pods, or for a
    LeaderWorkerSet the groups (one pending pod holds its whole group back)."""
    keys = set()
    for pod, _ in _pending(pods):
        meta = pod.get("metadata") or {}
        group = (meta.get("labels") or {}).get(LWS_GROUP_INDEX_LABEL)
        keys.add(("group", group) if group is not None else ("pod", meta.get("name")))
    return len(keys)


def create_failure(svc: PDInferenceService, role: str, message: str) -> tuple[str, str]:
    """(reason, message with the fix) of a pod create the API server refused."""
    if "violates PodSecurity" in message:
        rdma = svc.spec.rdma_configured()
        level = "privileged" if rdma else "baseline"
        why = ("engine pods with kvTransfer.rdma add the IPC_LOCK capability (RDMA memory registration), which the "
               "baseline level forbids" if rdma else "the engine images run as root, which the restricted level forbids")
        fix = (f"label the namespace: kubectl label namespace {svc.metadata.namespace or '<namespace>'} "
               f"pod-security.kubernetes.io/enforce={level} --overwrite")
        if rdma:
            fix += ", or remove kvTransfer.rdma (KV transfer then runs over TCP)"
        return "PodSecurityForbidden", f"Pod Security admission refuses the {role} pods: {why}; {fix} ({message})"
    return "FailedCreate", f"the {role} StatefulSet cannot create pods: {message}"


def _time(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m"


def loading_model(svc: PDInferenceService, role: str, pods: list[dict], now: str) -> str:
    """What the pool's starting pods are doing: the engine running but not past
    its startup probe yet (loading the model) against spec.model.startupSeconds,
    and engines the kubelet restarted at that budget. Empty when none."""
    budget = svc.spec.model.startup_seconds
    at = _time(now)
    loading: list[float] = []
    at_budget = 0
    creating = 0
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != "engine" or cs.get("started"):
                continue
            if ((cs.get("state") or {}).get("waiting") or {}).get("reason") in ("ContainerCreating", "PodInitializing"):
                creating += 1
                continue
            started = _time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
            if started is None or at is None:
                continue
            loading.append(max(0.0, (at - started).total_seconds()))
            last = (cs.get("lastState") or {}).get("terminated") or {}
            t0, t1 = _time(last.get("startedAt")), _time(last.get("finishedAt"))
            # The startup probe kills the engine once the budget is spent: a
            # previous run that lasted about the budget ended there.
            if t0 and t1 and (t1 - t0).total_seconds() >= 0.9 * budget:
                at_budget += 1
    parts = []
    if loading:
        msg = (f"{len(loading)} pod(s) still loading the model, {_minutes(max(loading))} of {_minutes(budget)} startup "
               "budget used (spec.model.startupSeconds)")
        if at_budget:
            msg += (f"; {at_budget} of them restarted after using the whole startup budget: raise "
                    "spec.model.startupSeconds, or keep the weights between starts with spec.model.cache (pvc, hostPath "
                    "or image)")
        parts.append(msg)
    if creating:
        image = " and the weights image (model.cache.reference)" if svc.spec.model.effective_cache().kind == "image" else ""
        parts.append(f"{creating} pod(s) not started yet: pulling the engine image{image} or running init containers "
                     "(the startup budget starts when the engine does)")
    return "; ".join(parts)


def _pool_condition(svc: PDInferenceService, role: str, sts: dict | None, pods: list[dict], gen: int | None,
                    failures: list[dict] | None = None, now: str = "") -> tuple[dict, bool]:
    """(condition, unschedulable)"""
    type_ = "PrefillReady" if role == "prefill" else "DecodeReady"
    if sts is None:
        return condition(type_, False, "NotCreated", f"the {role} {pool_kind(svc, role)} does not exist yet", gen), False
    # A LeaderWorkerSet counts groups (one replica over several nodes): its
    # readyReplicas are the groups whose every pod is ready (LWS status).
    unit = "pods" if sts.get("kind", "StatefulSet") == "StatefulSet" else f"groups of {nodes_per_replica(svc, role)} pods"
    ps = pool_status(sts, pods)
    desired, ready = ps["desiredReplicas"], ps["readyReplicas"]
    if failures and ps["replicas"] < desired:
        last = max(failures, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        reason, msg = create_failure(svc, role, last.get("message") or "")
        return condition(type_, False, reason, msg, gen), False
    pending = _pending(pods)
    if pending:
        pod, msg = pending[0]
        why = unschedulable_reason(svc, role, msg)
        return condition(type_, ready >= desired > 0, "Unschedulable",
                         f"{len(pending)} {role} pod(s) cannot be scheduled ({pod['metadata']['name']}): {why}", gen), True
    if desired == 0:
        return condition(type_, False, "ScaledToZero", f"{role}.replicas is 0: the service cannot answer", gen), False
    if ready < desired:
        loading = loading_model(svc, role, pods, now)
        what = loading or "the others are starting (model load can take minutes)"
        return condition(type_, False, "Starting", f"{ready}/{desired} {role} {unit} ready; {what}", gen), False
    return condition(type_, True, "AllReplicasReady", f"{ready}/{desired} {role} {unit} ready", gen), False


def _router_condition(svc: PDInferenceService, obs: Observed, gen: int | None) -> dict:
    dep = obs.router
    if dep is None:
        return condition("RouterReady", False, "NotCreated", "the router Deployment does not exist yet", gen)
    want = (dep.get("spec") or {}).get("replicas", 1)
    ready = ((dep.get("status") or {}).get("readyReplicas") or 0)
    workers = {role: ((obs.statefulsets.get(role) or {}).get("status") or {}).get("readyReplicas", 0) or 0 for role in ROLES}
    idle = [role for role in ROLES if workers[role] == 0]
    if ready >= want and idle:
        return condition("RouterReady", False, "NoReadyWorkers",
                         f"the router is up but has no ready {' or '.join(idle)} workers: requests fail until one is ready", gen)
    if ready < want:
        return condition("RouterReady", False, "Starting", f"{ready}/{want} router pods ready", gen)
    return condition("RouterReady", True, "Ready", f"{ready}/{want} router pods ready, routing to {workers['prefill']} prefill and {workers['decode']} decode workers", gen)


def _rolling(sts: dict | None) -> bool:
    if not sts:
        return True
    st = sts.get("status") or {}
    desired = (sts.get("spec") or {}).get("replicas", 0)
    if st.get("observedGeneration", 0) < (sts.get("metadata") or {}).get("generation", 0):
        return True
    if st.get("updateRevision") and st.get("currentRevision") and st["updateRevision"] != st["currentRevision"]:
        return True
    return (st.get("readyReplicas", 0) or 0) != desired or (st.get("replicas", 0) or 0) != desired


def compute_status(svc: PDInferenceService | None, obs: Observed, generation: int | None, previous: dict | None, now: str) -> dict:
    """The whole status subresource."""
    previous = previous or {}
    gen = generation
    if svc is None or obs.spec_error:
        problems = "; ".join(f"{f}: {m}" for f, m in (obs.spec_error or [])) or "the spec could not be read"
        conds = [
            condition("Ready", False, "InvalidSpec", problems, gen),
            condition("Degraded", True, "InvalidSpec", problems, gen),
            condition("Progressing", False, "InvalidSpec", "nothing is applied until the spec is fixed", gen),
        ]
        keep = {k: v for k, v in previous.items() if k in ("prefill", "decode", "prefillReady", "decodeReady", "servedModelName", "endpoint")}
        return {**keep, "observedGeneration": gen, "conditions": merge_conditions(previous.get("conditions", []), conds, now)}

    conds = []
    unschedulable = False
    status: dict = {"observedGeneration": gen}
    for role in ROLES:
        cond, unsched = _pool_condition(svc, role, obs.statefulsets.get(role), obs.pods.get(role, []), gen,
                                        obs.create_failures.get(role), now)
        unschedulable |= unsched
        conds.append(cond)
        ps = pool_status(obs.statefulsets.get(role), obs.pods.get(role, []))
        prev_pool = previous.get(role) or {}
        ps = {**{k: v for k, v in prev_pool.items() if k.startswith("lastScale")}, **ps}
        if role in obs.scaled:
            ps["lastScaleTime"], ps["lastScaleReason"] = now, obs.scaled[role]
        status[role] = ps
        status[f"{role}Ready"] = f"{ps['readyReplicas']}/{ps['desiredReplicas']}"
    conds.append(_router_condition(svc, obs, gen))

    degraded = []
    if obs.missing_secrets:
        degraded.append(("SecretNotFound", "; ".join(f"{f}: {m}" for f, m in obs.missing_secrets)))
    if obs.apply_error:
        degraded.append(("ApplyFailed", obs.apply_error))
    for c in conds:
        if c["reason"] in ("PodSecurityForbidden", "FailedCreate"):
            degraded.append((c["reason"], c["message"]))
    if unschedulable:
        degraded.append(("Unschedulable", next(c["message"] for c in conds if c["reason"] == "Unschedulable")))
    rolling = [role for role in ROLES if _rolling(obs.statefulsets.get(role))]
    conds.append(
        condition("Progressing", bool(rolling), "RollingOut" if rolling else "Stable",
                  f"{' and '.join(rolling)} rolling out or scaling" if rolling else "all pools at their desired state", gen)
    )
    conds.append(
        condition("Degraded", bool(degraded), degraded[0][0] if degraded else "AsExpected",
                  " | ".join(m for _, m in degraded) if degraded else "no problems found", gen)
    )
    parts = [c for c in conds if c["type"] in ("PrefillReady", "DecodeReady", "RouterReady") and c["status"] != "True"]
    if degraded:
        ready = condition("Ready", False, degraded[0][0], degraded[0][1], gen)
    elif parts:
        ready = condition("Ready", False, parts[0]["reason"], parts[0]["message"], gen)
    else:
        note = ""
        if svc.spec.backend() == "mooncake" and svc.spec.kv_transfer.mooncake.protocol is None and svc.spec.mooncake_protocol() == "tcp":
            note = ("; KV moves over Mooncake TCP because kvTransfer.rdma is not set (set it, or "
                    "kvTransfer.mooncake.protocol tcp to make this explicit)")
        ready = condition("Ready", True, "Ready", f"serving {svc.spec.served_model_name()} at {endpoint(svc)}{note}", gen)
    conds.insert(0, ready)

    status["conditions"] = merge_conditions(previous.get("conditions", []), conds, now)
    status["servedModelName"] = svc.spec.served_model_name()
    status["endpoint"] = endpoint(svc)
    return status
