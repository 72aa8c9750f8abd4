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
