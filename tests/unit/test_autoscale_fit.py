"""autoscale/fit.py: how many more replicas the free GPUs fit (pure)."""

from __future__ import annotations

from pd_operator.autoscale import fit

GPU = "nvidia.com/gpu"


def node(name: str, gpus: int = 8, labels: dict | None = None, ready: bool = True, taints: list | None = None,
         cordoned: bool = False) -> dict:
    return {"metadata": {"name": name, "labels": labels or {"nvidia.com/gpu.product": "NVIDIA-H200"}},
            "spec": {"unschedulable": cordoned, "taints": taints or []},
            "status": {"allocatable": {GPU: str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(node_name: str, gpus: int, phase: str = "Running") -> dict:
    return {"spec": {"nodeName": node_name, "containers": [{"resources": {"requests": {GPU: str(gpus)}}}]},
            "status": {"phase": phase}}


def template(gpus: int, selector: dict | None = None, tolerations: list | None = None) -> dict:
    return {"spec": {"nodeSelector": selector or {}, "tolerations": tolerations or [],
                     "containers": [{"resources": {"limits": {GPU: str(gpus)}}}]}}


def test_room_counts_whole_replicas_per_node():
    nodes = [node("a"), node("b")]
    pods = [pod("a", 6), pod("b", 3), pod("b", 4, phase="Succeeded")]  # finished pods hold nothing
    free = fit.free_gpus(nodes, pods, GPU)
    assert free == {"a": 2, "b": 5}
    assert fit.room(free, nodes, template(1), GPU) == 7
    assert fit.room(free, nodes, template(2), GPU) == 1 + 2
    assert fit.room(free, nodes, template(4), GPU) == 1  # a replica does not span nodes
    assert fit.room(free, nodes, template(8), GPU) == 0
    assert fit.room(free, nodes, template(0), GPU) is None  # no GPU asked: nothing to cap


def test_nodes_the_pod_cannot_land_on_are_left_out():
    nodes = [node("h200"), node("a100", labels={"nvidia.com/gpu.product": "NVIDIA-A100"}),
             node("down", ready=False), node("cordoned", cordoned=True),
             node("tainted", taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}])]
    free = fit.free_gpus(nodes, [], GPU)
    h200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert fit.room(free, nodes, template(8, h200), GPU) == 1
    assert fit.room(free, nodes, template(8), GPU) == 2  # no selector: the A100 node too
    tolerate = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert fit.room(free, nodes, template(8, h200, tolerate), GPU) == 2


def test_take_books_gpus_so_two_pools_do_not_count_them_twice():
    nodes = [node("a"), node("b")]
    free = fit.free_gpus(nodes, [pod("a", 4), pod("b", 6)], GPU)
    t = template(2)
    assert fit.room(free, nodes, t, GPU) == 3
    fit.take(free, nodes, t, GPU, 2)
    assert fit.room(free, nodes, t, GPU) == 1 and sum(free.values()) == 2


# --- Templates the renderer produced (not hand-built): gpuProduct is pinned
# through nodeAffinity, not nodeSelector, so the cap must read node affinity.

def _rendered_template(role: str = "decode", **spec) -> dict:
    from pd_operator.api import validate_service
    from pd_operator.render import render
    from tests.conftest import minimal

    objs = render(validate_service(minimal(**spec)))
    sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == f"svc-{role}")
    return sts["spec"]["template"]


def test_rendered_gpu_product_affinity_leaves_other_gpu_models_out():
    """H200 nodes full, an idle A100 node: a pool pinned to NVIDIA-H200 has no room."""
    t = _rendered_template(decode={"tensorParallelSize": 8, "gpuProduct": "NVIDIA-H200"},
                           prefill={"tensorParallelSize": 8, "gpuProduct": "NVIDIA-H200"})
    assert "nodeSelector" not in t["spec"]  # the renderer pins the product through affinity
    nodes = [node("h200-a"), node("h200-b"), node("a100", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})]
    free = fit.free_gpus(nodes, [pod("h200-a", 8), pod("h200-b", 8)], GPU)
    assert fit.room(free, nodes, t, GPU) == 0
    fit.take(free, nodes, t, GPU, 1)
    assert free["a100"] == 8  # nothing booked on a node the pod cannot land on
    # Without gpuProduct the A100 node is a candidate.
    assert fit.room(free, nodes, _rendered_template(decode={"tensorParallelSize": 8},
                                                    prefill={"tensorParallelSize": 8}), GPU) == 1


def test_node_affinity_operators_and_terms():
    """nodeSelectorTerms are ORed, matchExpressions ANDed (the scheduler's rule)."""
    def tmpl(terms):
        return {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
                         "containers": [{"resources": {"limits": {GPU: "8"}}}]}}
    nodes = [node("h200", labels={"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8"}),
             node("h100", labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}),
             node("bare", labels={"kubernetes.io/hostname": "bare"})]
    free = fit.free_gpus(nodes, [], GPU)
    product = "nvidia.com/gpu.product"
    assert fit.room(free, nodes, tmpl([{"matchExpressions": [{"key": product, "operator": "NotIn", "values": ["NVIDIA-H200"]}]}]), GPU) == 2
    assert fit.room(free, nodes, tmpl([{"matchExpressions": [{"key": product, "operator": "Exists"}]}]), GPU) == 2
    assert fit.room(free, nodes, tmpl([{"matchExpressions": [{"key": product, "operator": "DoesNotExist"}]}]), GPU) == 1
    assert fit.room(free, nodes, tmpl([{"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["4"]}]}]), GPU) == 2
    assert fit.room(free, nodes, tmpl([{"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Lt", "values": ["4"]}]}]), GPU) == 0
    both = [{"matchExpressions": [{"key": product, "operator": "In", "values": ["NVIDIA-H200"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["bare"]}]}]
    assert fit.room(free, nodes, tmpl(both), GPU) == 2
    anded = [{"matchExpressions": [{"key": product, "operator": "Exists"},
                                   {"key": product, "operator": "NotIn", "values": ["NVIDIA-H200"]}]}]
    assert fit.room(free, nodes, tmpl(anded), GPU) == 1
    assert fit.room(free, nodes, tmpl([{}]), GPU) == 0  # an empty term matches no node (core/v1 NodeSelectorTerm)


def test_gpu_nodes_tainted_with_the_resource_name_take_the_rendered_pools():
    """GKE taints GPU pools nvidia.com/gpu=present:NoSchedule and relies on the
    ExtendedResourceToleration admission plugin, which gives a pod requesting the resource
    a toleration for it. The renderer writes that toleration into the pool's template, so
    the pods land there where the plugin is off too, and the fit, which reads the template,
    counts those nodes (it counted none: a room of 0 held every scale-up)."""
    from pd_operator.api import validate_service
    from pd_operator.render import render
    from tests.conftest import minimal

    objs = render(validate_service(minimal()))
    sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-decode"))
    tmpl, size = fit.workload_template(sts)
    gke = [node("gke-gpu", taints=[{"key": GPU, "value": "present", "effect": "NoSchedule"}])]
    free = fit.free_gpus(gke, [], GPU)
    assert fit.room(free, gke, tmpl, GPU) == 8 // fit.template_gpus(tmpl, GPU)
    # a taint of another key, or NoExecute, is still not tolerated
    other = [node("x", taints=[{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]),
             node("y", taints=[{"key": GPU, "effect": "NoExecute"}])]
    assert fit.room(fit.free_gpus(other, [], GPU), other, tmpl, GPU) == 0


def test_init_containers_and_sidecars_count_as_the_scheduler_counts_them():
    """k8s.io/component-helpers PodRequests: sidecars (restartPolicy Always) add to the
    containers; an init container needs its own request plus the sidecars before it; the
    pod reserves the larger; plus overhead. The fit counted containers only, and saw GPUs
    free that the scheduler does not."""
    def with_init(containers, inits, overhead=None):
        spec = {"containers": [{"resources": {"requests": {GPU: str(g)}}} for g in containers],
                "initContainers": [{"resources": {"requests": {GPU: str(g)}}, **({"restartPolicy": "Always"} if side else {})}
                                   for g, side in inits]}
        if overhead:
            spec["overhead"] = {GPU: str(overhead)}
        return {"spec": spec}

    assert fit.template_gpus(with_init([0], [(8, False)]), GPU) == 8        # an init container holding 8
    assert fit.template_gpus(with_init([4], [(4, True)]), GPU) == 8         # a sidecar next to the container
    assert fit.template_gpus(with_init([1], [(2, True), (3, False)]), GPU) == 5  # init + the sidecar before it
    assert fit.template_gpus(with_init([2], [], overhead=1), GPU) == 3
    nodes = [node("a")]
    busy = {**with_init([0], [(8, False)]), "status": {"phase": "Pending"}}
    busy["spec"]["nodeName"] = "a"
    assert fit.free_gpus(nodes, [busy], GPU) == {"a": 0}


def test_gpus_no_node_advertises_make_the_room_unknown_not_zero():
    """With NVIDIA's DRA driver the GPUs are devices in ResourceSlices and nodes list no
    nvidia.com/gpu allocatable; the scheduler serves the extended-resource request through
    the DeviceClass's extendedResourceName (DRAExtendedResource). The fit cannot count them:
    unknown (no cap), not 0 (no scale-up ever). No eligible node at all is still 0."""
    dra = [node("a"), node("b")]
    for n in dra:
        n["status"]["allocatable"] = {"cpu": "64"}
    assert fit.room(fit.free_gpus(dra, [], GPU), dra, template(8), GPU) is None
    assert fit.room(fit.free_gpus(dra, [], GPU), dra, template(8, selector={"pool": "none"}), GPU) == 0
