"""engine.accelerator amd renders an AMD service, and MoRIIO is wired end to end.

Facts (tests/contract/FACTS.md, "AMD accelerators" and "MoRIIO discovery"):
the ROCm device plugin's resource is amd.com/gpu and the AMD node labeller's
product label amd.com/gpu.product-name; UCX's ROCm transports are rocm_copy
and rocm_ipc; vllm-router 0.1.17 in moriio mode dispatches only to engines
that registered over ZMQ (--vllm-discovery-address), which vLLM's
MoRIIOConnector does from proxy_ip/proxy_ping_port.
"""

from __future__ import annotations

import json

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from pd_operator.render.launch import logical_argv
from tests.conftest import minimal
from tests.unit.test_cel_equivalence import cel_failures

AMD = {"kind": "vllm", "accelerator": "amd", "image": "rocm/vllm:custom"}
RDMA = {"resourceName": "rdma/ib", "ibDevices": ["mlx5_0"]}


def by_kind(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def container(objs, role):
    return by_kind(objs)[("StatefulSet", f"svc-{role}")]["spec"]["template"]["spec"]["containers"][0]


def env_of(c) -> dict:
    return {e["name"]: e for e in c.get("env", [])}


def kv_config(c) -> dict:
    argv = c["command"]
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


def problems(obj) -> dict:
    try:
        validate_service(obj)
    except SpecError as err:
        return dict(err.problems)
    return {}


# -- GPU resource and product label follow the accelerator --------------------


def test_amd_asks_amd_gpus_without_naming_the_resource():
    objs = render(validate_service(minimal(engine=AMD, prefill={"tensorParallelSize": 2})))
    for role, n in (("prefill", 2), ("decode", 1)):
        res = container(objs, role)["resources"]
        assert res["limits"]["amd.com/gpu"] == n and res["requests"]["amd.com/gpu"] == n
        assert "nvidia.com/gpu" not in res["limits"] and "nvidia.com/gpu" not in res["requests"]


def test_amd_product_affinity_uses_the_amd_labeller_label():
    objs = render(validate_service(minimal(engine=AMD, prefill={"gpuProduct": "AMD_Instinct_MI300X_OAM"})))
    sts = by_kind(objs)[("StatefulSet", "svc-prefill")]
    terms = sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "amd.com/gpu.product-name", "operator": "In", "values": ["AMD_Instinct_MI300X_OAM"]}]}]


def test_nvidia_keeps_its_names():
    objs = render(validate_service(minimal(prefill={"gpuProduct": "NVIDIA-H200"})))
    c = container(objs, "prefill")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    sts = by_kind(objs)[("StatefulSet", "svc-prefill")]
    key = sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"]
    assert key == "nvidia.com/gpu.product"


def test_explicit_names_win_over_the_accelerator():
    topo = {"gpuResourceName": "amd.com/gpu-partition", "gpuProductLabel": "beta.amd.com/gpu.product-name"}
    objs = render(validate_service(minimal(engine=AMD, topology=topo, decode={"gpuProduct": "MI300X"})))
    c = container(objs, "decode")
    assert c["resources"]["limits"]["amd.com/gpu-partition"] == 1 and "amd.com/gpu" not in c["resources"]["limits"]
    sts = by_kind(objs)[("StatefulSet", "svc-decode")]
    key = sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"]
    assert key == "beta.amd.com/gpu.product-name"


@pytest.mark.parametrize("where", ["requests", "limits"])
def test_amd_gpu_in_pool_resources_is_refused_by_both_validators(where):
    """The operator owns the GPU count: on AMD that is amd.com/gpu, unnamed."""
    obj = minimal(engine=AMD, prefill={"resources": {where: {"amd.com/gpu": 1}}})
    msg = problems(obj).get("spec.prefill.resources")
    assert msg and "GPU resource" in msg
    assert msg in cel_failures(obj)


def test_nvidia_gpu_in_amd_pool_resources_is_not_the_gpu_count():
    """On AMD nvidia.com/gpu is just another extended resource (no rule fires)."""
    obj = minimal(engine=AMD, prefill={"resources": {"limits": {"nvidia.com/gpu": 1}}})
    assert "spec.prefill.resources" not in problems(obj)
    assert not any("GPU resource" in m for m in cel_failures(obj))


def test_crd_leaves_the_vendor_names_unset():
    """A CRD default would be stored by the API server and pin every AMD
    service to nvidia.com/gpu: the default is resolved at render time."""
    from pd_operator.api.crd import generate_crd

    topo = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["topology"]["properties"]
    assert "default" not in topo["gpuResourceName"] and "default" not in topo["gpuProductLabel"]


# -- UCX transports -----------------------------------------------------------


def test_amd_ucx_transports_are_rocm():
    objs = render(validate_service(minimal(engine=AMD, kvTransfer={"backend": "nixl", "rdma": RDMA})))
    tls = env_of(container(objs, "prefill"))["UCX_TLS"]["value"].split(",")
    assert {"rocm_copy", "rocm_ipc"} <= set(tls)
    assert not [t for t in tls if t.startswith("cuda")]


def test_nvidia_ucx_transports_are_cuda():
    objs = render(validate_service(minimal(kvTransfer={"backend": "nixl", "rdma": RDMA})))
    tls = env_of(container(objs, "decode"))["UCX_TLS"]["value"].split(",")
    assert {"cuda_copy", "cuda_ipc"} <= set(tls) and not [t for t in tls if t.startswith("rocm")]


# -- MoRIIO: the engines register with the router -----------------------------


def moriio(**spec):
    return minimal(engine=AMD, kvTransfer={"backend": "moriio", "rdma": RDMA}, **spec)


def router_argv(objs):
    dep = by_kind(objs)[("Deployment", "svc-router")]
    return logical_argv(dep["spec"]["template"]["spec"]["containers"][0]["command"])


def test_moriio_router_listens_for_registrations_instead_of_watching_pods():
    argv = router_argv(render(validate_service(moriio())))
    assert argv[argv.index("--kv-connector") + 1] == "moriio"
    addr = argv[argv.index("--vllm-discovery-address") + 1]
    host, port = addr.rsplit(":", 1)
    assert host == "0.0.0.0" and 1 <= int(port) <= 65535
    # K8s pod discovery would fill a worker list the moriio router never reads
    assert "--service-discovery" not in argv and "--prefill-selector" not in argv


def test_moriio_engines_heartbeat_to_the_router_discovery_service():
    objs = render(validate_service(moriio()))
    port = int(router_argv(objs)[router_argv(objs).index("--vllm-discovery-address") + 1].rsplit(":", 1)[1])
    disc = by_kind(objs)[("Service", "svc-router-discovery")]
    assert disc["spec"]["type"] == "ClusterIP"
    assert disc["spec"]["ports"] == [{"name": "discovery", "port": port, "targetPort": "discovery", "protocol": "TCP"}]
    dep = by_kind(objs)[("Deployment", "svc-router")]
    ports = {p["name"]: p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports["discovery"] == port
    for role in ("prefill", "decode"):
        c = container(objs, role)
        extra = kv_config(c)["kv_connector_extra_config"]
        assert extra["proxy_ip"] == "svc-router-discovery.ns.svc"
        assert extra["proxy_ping_port"] == port
        assert extra["http_port"] == 8000
        # the address the engine registers (http_address) is the pod IP
        assert env_of(c)["VLLM_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_moriio_router_policy_lets_the_engines_register():
    objs = render(validate_service(moriio()))
    pol = by_kind(objs)[("NetworkPolicy", "svc-router")]
    port = int(router_argv(objs)[router_argv(objs).index("--vllm-discovery-address") + 1].rsplit(":", 1)[1])
    rules = [r for r in pol["spec"]["ingress"] if {"protocol": "TCP", "port": port} in r.get("ports", [])]
    assert len(rules) == 1
    sel = rules[0]["from"][0]["podSelector"]
    assert sel["matchLabels"] == {"pdserving.io/service": "svc"} or sel["matchLabels"].get("pdserving.io/service") == "svc"
    assert {"key": "pdserving.io/role", "operator": "In", "values": ["prefill", "decode"]} in sel["matchExpressions"]


def test_moriio_router_gets_ready_from_its_registrations():
    """In discovery mode vllm-router 0.1.17's /readiness counts the static worker
    registry, which stays empty (503 forever); /health counts the registered
    workers. The registrations reach the router through the discovery Service
    before it is Ready, and a rollout replaces the pod rather than surging a
    second one the engines' connections never reach (FACTS.md, "MoRIIO and
    vllm-router discovery")."""
    objs = render(validate_service(moriio()))
    dep = by_kind(objs)[("Deployment", "svc-router")]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["livenessProbe"]["httpGet"]["path"] == "/liveness"
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert by_kind(objs)[("Service", "svc-router-discovery")]["spec"]["publishNotReadyAddresses"] is True
    # the client Service still sends requests to a Ready router only
    assert "publishNotReadyAddresses" not in by_kind(objs)[("Service", "svc-router")]["spec"]
    # pod discovery (every other backend): /readiness and a surge rollout, as before
    other = by_kind(render(validate_service(minimal(engine=AMD, kvTransfer={"backend": "nixl"}))))[("Deployment", "svc-router")]
    assert other["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert other["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_other_backends_get_no_discovery_service():
    objs = render(validate_service(minimal(engine=AMD, kvTransfer={"backend": "nixl"})))
    assert ("Service", "svc-router-discovery") not in by_kind(objs)
    assert "--vllm-discovery-address" not in router_argv(objs)
    assert "proxy_ip" not in json.dumps(kv_config(container(objs, "prefill")))


def test_moriio_with_several_router_replicas_is_refused():
    """Each engine heartbeats to one address; through a Service that is one
    router pod, so the other replicas would know no worker."""
    obj = moriio(router={"replicas": 2})
    msg = problems(obj).get("spec.router.replicas")
    assert msg and "moriio" in msg and "replicas 1" in msg
    assert msg in cel_failures(obj)
    assert "spec.router.replicas" not in problems(moriio(router={"replicas": 1}))


def test_moriio_with_data_parallel_ranks_whose_ports_collide_is_refused():
    """MoRIIO binds base + DP rank + TP rank per rank (get_port_offset without tp_size), and
    a dense model's DP ranks all run as rank 0: DP 2 x TP 2, or DP 2 on a dense model, binds
    one port twice and the engine hangs at start. DP 1, or TP 1 with expert parallelism
    (an MoE model keeps its DP ranks), is accepted."""
    for pool in ({"dataParallelSize": 2, "tensorParallelSize": 2, "expertParallel": True},
                 {"dataParallelSize": 2}):
        obj = moriio(decode=pool)
        msg = problems(obj).get("spec.decode.dataParallelSize")
        assert msg and "MoRIIO" in msg and "expertParallel" in msg, problems(obj)
        assert msg in cel_failures(obj)
    for pool in ({"tensorParallelSize": 4}, {"dataParallelSize": 4, "expertParallel": True}):
        assert "spec.decode.dataParallelSize" not in problems(moriio(decode=pool, router={"replicas": 2}))


def test_discovery_address_is_managed():
    obj = moriio(router={"extraArgs": ["--vllm-discovery-address", "0.0.0.0:1"]})
    with pytest.raises(SpecError) as err:
        render(validate_service(obj))
    assert "--vllm-discovery-address" in str(err.value)
