"""How many more replicas of a pool fit on the GPUs that are free now (pure).

The autoscaler caps a scale-up at this number, so a pool is not grown into
GPUs that do not exist (the Pending pods of a peer planner that scaled into a
full cluster). Inputs are plain API objects the caller lists: the nodes, the
pods bound to them, and the pool's pod template (from its StatefulSet). A
replica is one pod, so it must fit on one node: its GPU request
(``topology.gpuResourceName``) against the node's allocatable minus what the
pods on it request. Nodes the pod cannot land on are left out: cordoned,
not Ready, not matching the template's nodeSelector or its required node
affinity (the renderer pins ``gpuProduct`` there, not in nodeSelector), or
with a NoSchedule / NoExecute taint the template does not tolerate (the
renderer tolerates the taints named after the extended resources a pod
requests, as the ExtendedResourceToleration admission plugin would). What this
does not see (other resources such as RDMA, pod affinity, GPUs a DRA driver
hands out: no node advertising the resource makes the room unknown) the
scheduler still decides; the Unschedulable guard of decide() covers it.

A pool whose replicas span nodes (a LeaderWorkerSet) grows by whole groups:
one replica is ``size`` pods, each of which must fit on its own node, so the
room is the free pod slots divided by the group size, and booking a replica
books ``size`` pods.
"""

from __future__ import annotations


def _quantity(value) -> int:
    """A GPU count (extended resources are integers)."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def workload_template(workload: dict) -> tuple[dict, int]:
    """(pod template, pods per replica) of a pool's StatefulSet or LeaderWorkerSet.
    The LWS leader and workers request the same GPUs (render/pools.py), so the
    leader template stands for every pod of the group."""
    spec = (workload or {}).get("spec") or {}
    if (workload or {}).get("kind") == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        return lwt.get("leaderTemplate") or lwt.get("workerTemplate") or {}, int(lwt.get("size") or 1)
    return spec.get("template") or {}, 1


def _container_gpus(c: dict, resource: str) -> int:
    res = c.get("resources") or {}
    return _quantity((res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource, 0)))


def template_gpus(template: dict, resource: str) -> int:
    """GPUs one pod (or pod template) requests, as the scheduler counts them
    (k8s.io/component-helpers resource/helpers.go PodRequests): its containers
    and its sidecars (init containers with restartPolicy Always) add up; an
    ordinary init container, which runs before them, needs its own request plus
    the sidecars started before it, and the pod reserves the larger of the two;
    plus the pod's overhead."""
    spec = (template or {}).get("spec") or {}
    total = sum(_container_gpus(c, resource) for c in spec.get("containers") or [])
    sidecars = init = 0
    for c in spec.get("initContainers") or []:
        need = _container_gpus(c, resource)
        if c.get("restartPolicy") == "Always":
            total += need
            sidecars += need
            init = max(init, sidecars)
        else:
            init = max(init, need + sidecars)
    return max(total, init) + _quantity((spec.get("overhead") or {}).get(resource, 0))


def free_gpus(nodes: list[dict], pods: list[dict], resource: str) -> dict[str, int]:
    """Node name -> GPUs not requested by the unfinished pods bound to it."""
    free = {n["metadata"]["name"]: _quantity(((n.get("status") or {}).get("allocatable") or {}).get(resource, 0))
            for n in nodes}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in free and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            free[node] -= template_gpus(pod, resource)
    return free


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _requirement(req: dict, values: dict) -> bool:
    """One NodeSelectorRequirement against a node's labels (or fields), with
    the scheduler's operators: In, NotIn, Exists, DoesNotExist, Gt, Lt."""
    key, op, want = req.get("key"), req.get("operator"), req.get("values") or []
    have = values.get(key)
    if op == "In":
        return have is not None and have in want
    if op == "NotIn":
        return have is None or have not in want
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt"):
        try:
            mine, bound = int(have), int(want[0])
        except (TypeError, ValueError, IndexError):
            return False
        return mine > bound if op == "Gt" else mine < bound
    return False


def _node_affinity(node: dict, template_spec: dict) -> bool:
    """The template's requiredDuringScheduling node affinity: terms ORed, the
    requirements of a term ANDed; an empty term matches no node."""
    required = (((template_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": (node.get("metadata") or {}).get("name")}
    for term in required.get("nodeSelectorTerms") or []:
        exprs, field_exprs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not field_exprs:
            continue
        if all(_requirement(r, labels) for r in exprs) and all(_requirement(r, fields) for r in field_exprs):
            return True
    return False


def _eligible(node: dict, template_spec: dict) -> bool:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if spec.get("unschedulable"):
        return False
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (template_spec.get("nodeSelector") or {}).items()):
        return False
    if not _node_affinity(node, template_spec):
        return False
    tolerations = template_spec.get("tolerations") or []
    return all(t.get("effect") not in ("NoSchedule", "NoExecute") or _tolerated(t, tolerations)
               for t in spec.get("taints") or [])


def room(free: dict[str, int], nodes: list[dict], template: dict, resource: str, group_size: int = 1) -> int | None:
    """More replicas (groups of ``group_size`` pods of the template) that fit on
    the free GPUs now; None when the template asks for no GPU (nothing to cap)."""
    per_pod = template_gpus(template, resource)
    if per_pod <= 0:
        return None
    spec = (template or {}).get("spec") or {}
    eligible = [n for n in nodes if _eligible(n, spec)]
    if eligible and not any(resource in ((n.get("status") or {}).get("allocatable") or {}) for n in eligible):
        # no node the pod may land on advertises the resource: GPUs handed out by a DRA
        # driver (the scheduler's DRAExtendedResource: a DeviceClass with this
        # extendedResourceName serves the request where no node lists it). Unknown, not
        # zero: the Unschedulable guard stands in for the cap
        return None
    slots = sum(max(0, free.get(n["metadata"]["name"], 0)) // per_pod for n in eligible)
    return slots // max(1, group_size)


def take(free: dict[str, int], nodes: list[dict], template: dict, resource: str, count: int, group_size: int = 1) -> None:
    """Book ``count`` more replicas (``group_size`` pods each) of the template on
    ``free`` (first fit), so that pools scaled up in the same round do not count
    the same GPUs twice."""
    per_pod = template_gpus(template, resource)
    count *= max(1, group_size)
    spec = (template or {}).get("spec") or {}
    for n in nodes:
        name = n["metadata"]["name"]
        while count > 0 and per_pod > 0 and _eligible(n, spec) and free.get(name, 0) >= per_pod:
            free[name] -= per_pod
            count -= 1
