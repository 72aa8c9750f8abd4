"""Replicas that span nodes (issue 16): the layout rules, the LeaderWorkerSet
render and the leader/worker commands, checked against what the engines do
(tests/contract/FACTS.md, "Replicas that span nodes")."""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from pd_operator.render.engines.flagset import check_argv
from pd_operator.render.launch import resolve_argv
from tests.conftest import minimal

H200 = {"gpusPerNode": 8, "nvlinkDomainKey": "kubernetes.io/hostname"}


def sglang_wide_ep(**over) -> dict:
    """SGLang DeepSeek layout: prefill TP16 over 2 nodes, decode TP32 + DP attention 32 + DeepEP over 4."""
    spec = {
        "topology": H200,
        "prefill": {"tensorParallelSize": 16, "expertParallel": True, "deepepMode": "normal"},
        "decode": {"tensorParallelSize": 32, "dataParallelSize": 32, "dataParallelAttention": True,
                   "expertParallel": True, "deepepMode": "low_latency", "replicas": 2},
    }
    spec.update(over)
    return minimal("sglang", **spec)


def vllm_wide_ep(**over) -> dict:
    spec = {
        "topology": H200,
        "prefill": {"tensorParallelSize": 1, "dataParallelSize": 16, "expertParallel": True, "deepepMode": "normal"},
        "decode": {"tensorParallelSize": 1, "dataParallelSize": 32, "expertParallel": True, "deepepMode": "low_latency"},
    }
    spec.update(over)
    return minimal("vllm", **spec)


def problems(obj) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        validate_service(obj)
    return dict(err.value.problems)


def workloads(obj) -> dict[str, dict]:
    return {o["metadata"]["labels"]["app.kubernetes.io/component"]: o for o in render(validate_service(obj))
            if o["kind"] in ("StatefulSet", "LeaderWorkerSet")}


# -- layout ---------------------------------------------------------------------


@pytest.mark.parametrize("kind, pool, nodes, gpus_per_pod", [
    ("sglang", {"tensorParallelSize": 16}, 2, 8),                                   # TP over 2 nodes
    ("sglang", {"tensorParallelSize": 32, "dataParallelSize": 32, "dataParallelAttention": True}, 4, 8),
    ("sglang", {"tensorParallelSize": 8, "pipelineParallelSize": 2}, 2, 8),          # PP over nodes
    ("sglang", {"tensorParallelSize": 16, "nodesPerReplica": 4}, 4, 4),              # stated node count
    ("vllm", {"tensorParallelSize": 2, "dataParallelSize": 8}, 2, 8),               # DP over nodes
    ("vllm", {"tensorParallelSize": 1, "dataParallelSize": 32}, 4, 8),
])
def test_a_replica_spans_the_nodes_its_gpus_need(kind, pool, nodes, gpus_per_pod):
    # prefill of the same pipeline depth: an SGLang decode of more stages than its prefill is
    # refused (tests/unit/test_sglang_pd_pairing.py)
    prefill = {"pipelineParallelSize": pool.get("pipelineParallelSize", 1)}
    svc = validate_service(minimal(kind, topology=H200, prefill=prefill, decode=pool))
    assert svc.spec.decode.nodes(8) == nodes
    assert svc.spec.decode.gpus_per_pod(8) == gpus_per_pod
    lws = workloads(minimal(kind, topology=H200, prefill=prefill, decode=pool))["decode"]
    assert lws["kind"] == "LeaderWorkerSet"
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == nodes
    for side in ("leaderTemplate", "workerTemplate"):
        res = tmpl[side]["spec"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == gpus_per_pod


def test_a_replica_on_one_node_stays_a_statefulset():
    objs = workloads(sglang_wide_ep(decode={"tensorParallelSize": 8}))
    assert objs["decode"]["kind"] == "StatefulSet"
    assert objs["prefill"]["kind"] == "LeaderWorkerSet"


def test_sglang_refuses_dp_replicas_across_nodes_with_its_reason():
    p = problems(minimal("sglang", topology=H200, decode={"tensorParallelSize": 8, "dataParallelSize": 2}))
    assert "multi-node data-parallel replicas are not supported" in p["spec.decode.dataParallelSize"]


def test_layout_that_does_not_split_over_the_nodes_is_refused():
    # 16 GPUs over 3 nodes: SGLang asserts (tp_size * pp_size) % nnodes == 0
    p = problems(minimal("sglang", topology=H200, decode={"tensorParallelSize": 16, "nodesPerReplica": 3}))
    assert "split evenly over its nodes" in p["spec.decode.nodesPerReplica"]
    # 16 GPUs on 1 node of 8
    p = problems(minimal("sglang", topology=H200, decode={"tensorParallelSize": 16, "nodesPerReplica": 1}))
    assert "spec.decode.nodesPerReplica" in p


def test_vllm_spans_nodes_only_by_whole_dp_ranks():
    p = problems(minimal("vllm", topology=H200, decode={"tensorParallelSize": 16}))
    assert "dataParallelSize must be a multiple of the nodes" in p["spec.decode.dataParallelSize"]


def test_deepep_needs_expert_parallel_and_vllm_has_no_auto():
    p = problems(minimal("sglang", decode={"deepepMode": "auto"}))
    assert "spec.decode.deepepMode" in p
    p = problems(minimal("vllm", decode={"expertParallel": True, "deepepMode": "auto"}))
    assert "vLLM's --all2all-backend" in p["spec.decode.deepepMode"]


# -- commands -------------------------------------------------------------------


def group_env(index: int) -> dict[str, str]:
    return {"LWS_LEADER_ADDRESS": "svc-decode-0.svc-decode.ns", "LWS_WORKER_INDEX": str(index),
            "LWS_GROUP_SIZE": "4", "PD_ENGINE_API_KEY": "k", "POD_IP": LEADER_IP if index == 0 else f"10.0.0.{10 + index}"}


LEADER_IP = "10.0.0.7"


def parsed(kind: str, lws: dict, side: str, index: int):
    argv = lws["spec"]["leaderWorkerTemplate"][side]["spec"]["containers"][0]["command"]
    return check_argv(kind, "0.5.23" if kind == "sglang" else "0.33.0", resolve_argv(argv, group_env(index)))


def test_sglang_leader_and_workers_parse_with_node_rank_and_rendezvous():
    lws = workloads(sglang_wide_ep(engine={"kind": "sglang", "apiKeySecretRef": {"name": "k", "key": "k"}}))["decode"]
    leader = parsed("sglang", lws, "leaderTemplate", 0)
    worker = parsed("sglang", lws, "workerTemplate", 3)
    # the leader binds ZMQ sockets on the host of --dist-init-addr (libzmq: an IP, no DNS
    # name): its own pod IP; the workers connect to LWS's DNS name of the leader
    assert leader.dist_init_addr == f"{LEADER_IP}:20000"
    assert worker.dist_init_addr == "svc-decode-0.svc-decode.ns:20000"
    for ns, rank in ((leader, 0), (worker, 3)):
        assert ns.nnodes == 4 and ns.node_rank == rank
        assert ns.tp_size == 32 and ns.attn_dp_size == 32 and ns.ep_size == 32
        assert ns.moe_a2a_backend == "deepep" and ns.deepep_mode == "low_latency"
        assert ns.api_key == "k"
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"


def test_vllm_workers_are_headless_with_their_first_dp_rank():
    lws = workloads(vllm_wide_ep())["decode"]
    leader = parsed("vllm", lws, "leaderTemplate", 0)
    assert leader.data_parallel_size == 32 and leader.data_parallel_size_local == 8
    # the leader binds its ZMQ ROUTER sockets on --data-parallel-address: its pod IP
    assert leader.data_parallel_address == LEADER_IP and not leader.headless
    assert leader.data_parallel_start_rank is None  # a start rank would switch the leader to hybrid LB
    assert leader.enable_expert_parallel and leader.all2all_backend == "deepep_low_latency"
    worker = parsed("vllm", lws, "workerTemplate", 3)
    assert worker.headless and worker.data_parallel_start_rank == 24 and worker.data_parallel_size_local == 8
    assert worker.data_parallel_address == "svc-decode-0.svc-decode.ns"


@pytest.mark.parametrize("kind, obj", [("sglang", sglang_wide_ep()), ("vllm", vllm_wide_ep())])
def test_the_simulated_leader_refuses_to_bind_on_a_dns_name(kind, obj, monkeypatch):
    """The simulated engine fails to start as the engine does when its leader would bind
    ZMQ sockets on a DNS name, and starts with the rendered command (the pod IP)."""
    from pd_operator_tools.enginesim.__main__ import EngineStartError, config_from_argv

    lws = workloads(obj)["decode"]
    argv = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"]
    for k, v in group_env(0).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PD_SIM_LEADER_IP", raising=False)
    assert config_from_argv(argv).group.leader
    monkeypatch.setenv("POD_IP", "svc-decode-0.svc-decode.ns")  # what the old command gave
    with pytest.raises(EngineStartError, match="No such device"):
        config_from_argv(argv)


def test_only_leaders_serve_the_api_and_routers_select_only_them():
    objs = render(validate_service(sglang_wide_ep()))
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet" and o["metadata"]["name"].endswith("decode"))
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert "readinessProbe" in leader and "readinessProbe" not in worker
    router = next(o for o in objs if o["kind"] == "Deployment")
    argv = router["spec"]["template"]["spec"]["containers"][0]["command"]
    for flag in ("--prefill-selector", "--decode-selector"):
        rest = argv[argv.index(flag) + 1:]
        labels = rest[: next(i for i, a in enumerate(rest) if a.startswith("--"))]
        assert "leaderworkerset.sigs.k8s.io/worker-index=0" in labels, (flag, labels)


# -- status and autoscaling count groups -------------------------------------------

from pd_operator.autoscale import fit  # noqa: E402
from pd_operator.controller.status import _pool_condition, pool_status  # noqa: E402


def gpu_node(name: str, gpus: int = 8) -> dict:
    return {"metadata": {"name": name, "labels": {}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def test_free_gpu_cap_counts_whole_groups():
    lws = workloads(sglang_wide_ep())["decode"]          # groups of 4 pods x 8 GPUs
    template, size = fit.workload_template(lws)
    assert size == 4
    nodes = [gpu_node(f"n{i}") for i in range(7)]
    free = fit.free_gpus(nodes, [], "nvidia.com/gpu")
    assert fit.room(free, nodes, template, "nvidia.com/gpu", size) == 1   # 7 free nodes hold one group of 4
    fit.take(free, nodes, template, "nvidia.com/gpu", 1, size)
    assert sum(free.values()) == 3 * 8


def pending_pod(name: str, group: str) -> dict:
    return {"metadata": {"name": name, "labels": {"leaderworkerset.sigs.k8s.io/group-index": group}},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "message": "0/7 nodes are available: Insufficient nvidia.com/gpu"}]}}


def test_status_counts_groups_not_pods():
    svc = validate_service(sglang_wide_ep())
    lws = {**workloads(sglang_wide_ep())["decode"], "status": {"replicas": 2, "readyReplicas": 1}}
    cond, _ = _pool_condition(svc, "decode", lws, [], 1)
    assert cond["status"] == "False" and "1/2 decode groups of 4 pods ready" in cond["message"]
    # three pods of one group pending are one replica held back, not three
    pods = [pending_pod(f"p{i}", "1") for i in range(3)]
    assert pool_status(lws, pods)["pendingReplicas"] == 1


def test_per_rail_rdma_and_wide_ep_fabric_env():
    obj = sglang_wide_ep(kvTransfer={"backend": "mooncake", "rdma": {
        "railResourceNames": [f"nvidia.com/rail{i}" for i in range(8)], "ibDevices": ["mlx5_0", "mlx5_1"],
        "gidIndex": 3, "trafficClass": 106}})
    objs = workloads(obj)
    for role in ("prefill", "decode"):
        c = objs[role]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        assert all(c["resources"]["limits"][f"nvidia.com/rail{i}"] == 1 for i in range(8))
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["NVSHMEM_HCA_LIST"] == "mlx5_0:1,mlx5_1:1"
        assert env["NVSHMEM_ENABLE_NIC_PE_MAPPING"] == "1"
        assert env["NCCL_IB_GID_INDEX"] == env["NVSHMEM_IB_GID_INDEX"] == "3"
        assert env["NCCL_IB_TC"] == env["NVSHMEM_IB_TRAFFIC_CLASS"] == "106"
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]  # RDMA memory registration
        assert env["MC_GID_INDEX"] == "3"  # Mooncake's KV transfer over RDMA
    # a one-node pool without DeepEP gets no collective-fabric env, but Mooncake's GID index
    one = workloads(minimal("sglang", kvTransfer=obj["spec"]["kvTransfer"]))
    for role in ("prefill", "decode"):
        env = {e["name"]: e.get("value") for e in one[role]["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert not any(name.startswith(("NCCL_", "NVSHMEM_")) for name in env) and env["MC_GID_INDEX"] == "3"
    # Mooncake over TCP (no RDMA resources) and NIXL have no use for it
    for kvt in ({"backend": "mooncake", "rdma": {"gidIndex": 3}}, {**obj["spec"]["kvTransfer"], "backend": "nixl"}):
        c = workloads(minimal("sglang", kvTransfer=kvt))["decode"]["spec"]["template"]["spec"]["containers"][0]
        assert "MC_GID_INDEX" not in {e["name"] for e in c["env"]}


def test_sglang_attention_dp_handshake_port_is_checked_and_bootstrap_is_on_the_leader_only():
    # node 0 with attention DP binds the worker-ports handshake at the --dist-init-addr
    # port + 13 (server_args.py:729, data_parallel_controller.py:508-509): a bootstrap
    # port there is refused; only node 0 runs the bootstrap server (tokenizer_manager.py:806,
    # managers/disagg_service.py:21-50), so the worker pods do not declare it
    dp_prefill = {"tensorParallelSize": 16, "dataParallelSize": 16, "dataParallelAttention": True}
    with pytest.raises(SpecError) as err:  # the port check runs with the render
        workloads(sglang_wide_ep(prefill=dp_prefill, kvTransfer={"bootstrapPort": 20013}))
    assert "port 20013" in dict(err.value.problems)["spec.kvTransfer.bootstrapPort"]
    workloads(sglang_wide_ep(kvTransfer={"bootstrapPort": 20013}))  # no attention DP on prefill: no handshake
    lws = workloads(sglang_wide_ep())["prefill"]["spec"]["leaderWorkerTemplate"]
    ports = {side: {p["name"] for p in lws[side]["spec"]["containers"][0]["ports"]}
             for side in ("leaderTemplate", "workerTemplate")}
    assert "bootstrap" in ports["leaderTemplate"] and "bootstrap" not in ports["workerTemplate"]


def scrape_annotations(template: dict) -> dict:
    return {k: v for k, v in template["metadata"].get("annotations", {}).items() if k.startswith("prometheus.io/")}


def test_sglang_workers_are_scraped_vllm_headless_workers_are_not():
    # SGLang's node rank >= 1 serves /metrics on --port (launch_dummy_health_check_server), its
    # schedulers' series: with attention DP across nodes, the groups the leader does not report
    for role in ("prefill", "decode"):
        obj = workloads(sglang_wide_ep())[role]
        lws = obj["spec"]["leaderWorkerTemplate"]
        leader, worker = lws["leaderTemplate"], lws["workerTemplate"]
        assert scrape_annotations(worker) == scrape_annotations(leader) == {
            "prometheus.io/scrape": "true", "prometheus.io/port": "30000", "prometheus.io/path": "/metrics"}
        c = worker["spec"]["containers"][0]
        assert {"name": "http", "containerPort": 30000, "protocol": "TCP"} in c["ports"]
        assert parsed("sglang", obj, "workerTemplate", 1).port == 30000
    # vLLM's headless workers run no API server: nothing to scrape, no http port
    lws = workloads(vllm_wide_ep())["decode"]["spec"]["leaderWorkerTemplate"]
    assert scrape_annotations(lws["workerTemplate"]) == {} and scrape_annotations(lws["leaderTemplate"])
    assert "http" not in {p["name"] for p in lws["workerTemplate"]["spec"]["containers"][0]["ports"]}
