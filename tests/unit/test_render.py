"""Rendering: complete, deterministic, GPU-pinned, secrets never literal."""

from __future__ import annotations

import json

import pytest
import yaml

from pd_operator.api import SpecError, validate_service
from pd_operator.cli import to_yaml
from pd_operator.render import endpoint, render
from pd_operator.render.launch import logical_argv
from tests.conftest import EXAMPLES, ROOT, load_example, minimal

GOLDEN = ROOT / "tests" / "golden"


def by_kind(objs):
    out: dict[tuple[str, str], dict] = {}
    for o in objs:
        out[(o["kind"], o["metadata"]["name"])] = o
    return out


def engine_container(objs, role, name="svc"):
    sts = by_kind(objs)[("StatefulSet", f"{name}-{role}")]
    return sts["spec"]["template"]["spec"]["containers"][0]


def env_of(container) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_match_golden_files(path):
    """Golden files: read them line by line against ../shared/ENGINES.md when they change.
    Regenerate with: python -m tests.regen_golden"""
    rendered = to_yaml(render(validate_service(load_example(path))))
    golden = GOLDEN / f"{path.stem}.yaml"
    assert golden.read_text() == rendered, f"{golden} is stale: run python -m tests.regen_golden and review the diff"


def test_render_is_deterministic_and_pure():
    obj = load_example(EXAMPLES[0])
    a = to_yaml(render(validate_service(obj)))
    b = to_yaml(render(validate_service(json.loads(json.dumps(obj)))))
    assert a == b
    assert obj == load_example(EXAMPLES[0])  # input untouched


def test_complete_object_set():
    objs = render(validate_service(minimal()))
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objs)
    assert kinds == sorted(
        [
            ("Service", "svc-prefill"), ("StatefulSet", "svc-prefill"), ("PodDisruptionBudget", "svc-prefill"),
            ("Service", "svc-decode"), ("StatefulSet", "svc-decode"), ("PodDisruptionBudget", "svc-decode"),
            ("ServiceAccount", "svc-router"), ("Role", "svc-router"), ("RoleBinding", "svc-router"),
            ("Deployment", "svc-router"), ("Service", "svc-router"), ("NetworkPolicy", "svc-engines"), ("NetworkPolicy", "svc-router"),
        ]
    )
    for o in objs:
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "pd-operator"
        assert labels["app.kubernetes.io/instance"] == "svc"
        assert labels["pdserving.io/service"] == "svc"
        assert o["metadata"]["namespace"] == "ns"


def test_gpus_per_pod_are_tp_times_pp_times_dp():
    objs = render(validate_service(minimal(prefill={"tensorParallelSize": 2, "pipelineParallelSize": 2}, decode={"tensorParallelSize": 4, "dataParallelSize": 2})))
    assert engine_container(objs, "prefill")["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert engine_container(objs, "decode")["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert engine_container(objs, "decode")["resources"]["requests"]["nvidia.com/gpu"] == 8


def test_gpu_resource_name_is_configurable():
    objs = render(validate_service(minimal(engine={"kind": "vllm", "accelerator": "amd", "image": "rocm/vllm:x"}, topology={"gpuResourceName": "amd.com/gpu"})))
    assert engine_container(objs, "prefill")["resources"]["limits"] == {"amd.com/gpu": 1}


def test_rdma_resource_ipc_lock_and_multus():
    objs = render(validate_service(minimal(kvTransfer={"rdma": {"resourceName": "rdma/ib", "count": 2, "networks": ["default/ib-a", "default/ib-b"], "ibDevices": ["mlx5_0"], "roce": True}})))
    for role in ("prefill", "decode"):
        c = engine_container(objs, role)
        assert c["resources"]["limits"]["rdma/ib"] == 2
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        env = env_of(c)
        assert env["UCX_NET_DEVICES"]["value"] == "mlx5_0:1"
        assert env["UCX_IB_ADDR_TYPE"]["value"] == "eth"
        tmpl = by_kind(objs)[("StatefulSet", f"svc-{role}")]["spec"]["template"]
        assert tmpl["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "default/ib-a,default/ib-b"


def test_no_rdma_no_ipc_lock_no_ucx_forcing():
    c = engine_container(render(validate_service(minimal())), "prefill")
    assert "add" not in c["securityContext"]["capabilities"]
    assert not [e for e in c["env"] if e["name"].startswith("UCX_")]


def test_vllm_nixl_flags_and_side_channel_from_pod_ip():
    objs = render(validate_service(minimal()))
    for role in ("prefill", "decode"):
        c = engine_container(objs, role)
        cmd = c["command"]
        assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
        cfg = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
        assert cfg["kv_connector"] == "NixlConnector"
        assert cfg["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")
        assert ("kv_load_failure_policy" in cfg) == (role == "decode")
        env = env_of(c)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"


def test_decode_recomputes_on_lost_kv_for_every_vllm_backend():
    for backend in ("nixl", "lmcache"):  # mooncake is refused with vllm (vllm-router 0.1.17)
        c = engine_container(render(validate_service(minimal(kvTransfer={"backend": backend}))), "decode")
        cfg = json.loads(c["command"][c["command"].index("--kv-transfer-config") + 1])
        assert cfg["kv_load_failure_policy"] == "recompute", backend


def test_sglang_roles_unequal_tp_without_staging_buffer():
    objs = render(validate_service(minimal("sglang", prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 8}, kvTransfer={"rdma": {"ibDevices": ["mlx5_0", "mlx5_1"]}})))
    p, d = engine_container(objs, "prefill")["command"], engine_container(objs, "decode")["command"]
    assert p[p.index("--disaggregation-mode") + 1] == "prefill" and d[d.index("--disaggregation-mode") + 1] == "decode"
    # SGLang 0.5.23 has no --disaggregation-decode-tp: the bootstrap carries the layout
    assert "--disaggregation-decode-tp" not in p + d
    assert p[p.index("--disaggregation-ib-device") + 1] == "mlx5_0,mlx5_1"
    assert "--pd-disaggregation" not in p + d and "--prefill-only" not in p
    assert "--enable-metrics" in p and "--enable-metrics" in d
    # unequal TP needs no staging buffer (conn.py maps the ranks); SGLang refuses the
    # staging buffer at start for MLA models (prefill.py:218-223, decode.py:451-456)
    for role in ("prefill", "decode"):
        assert "SGLANG_DISAGG_STAGING_BUFFER" not in env_of(engine_container(objs, role))
    # a user who knows the model is not MLA may still turn it on
    objs = render(validate_service(minimal("sglang", prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 8},
                                           engine={"kind": "sglang", "env": [{"name": "SGLANG_DISAGG_STAGING_BUFFER", "value": "1"}]})))
    for role in ("prefill", "decode"):
        assert env_of(engine_container(objs, role))["SGLANG_DISAGG_STAGING_BUFFER"]["value"] == "1"


def test_one_served_model_name_everywhere():
    for kind in ("vllm", "sglang"):
        objs = render(validate_service(minimal(kind, model={"name": "Qwen/Qwen3-8B", "servedName": "qwen"})))
        for role in ("prefill", "decode"):
            cmd = engine_container(objs, role)["command"]
            assert cmd[cmd.index("--served-model-name") + 1] == "qwen"


def test_api_key_only_through_secret_refs():
    for kind in ("vllm", "sglang"):
        objs = render(validate_service(minimal(kind, engine={"kind": kind, "apiKeySecretRef": {"name": "k", "key": "token"}})))
        text = yaml.safe_dump(objs)
        secret_envs = [e for o in objs for e in _all_env(o) if "secretKeyRef" in e.get("valueFrom", {})]
        assert secret_envs and all(e["valueFrom"]["secretKeyRef"] == {"name": "k", "key": "token"} for e in secret_envs)
        router = by_kind(objs)[("Deployment", "svc-router")]["spec"]["template"]["spec"]["containers"][0]
        # the launcher appends --api-key from this variable inside the process (render/launch.py)
        assert logical_argv(router["command"])[-2:] == ["--api-key", "$(ROUTER_WORKER_API_KEY)"]
        assert "value: token" not in text


def _all_env(obj):
    tmpl = obj.get("spec", {}).get("template", {}).get("spec", {})
    for c in tmpl.get("containers", []):
        yield from c.get("env", [])


def test_probes_shm_and_drain():
    c = engine_container(render(validate_service(minimal(decode={"drainSeconds": 30}))), "decode")
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1800
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["lifecycle"]["preStop"] == {"sleep": {"seconds": 30}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_node_affinity_on_gpu_product():
    objs = render(validate_service(minimal(prefill={"gpuProduct": "NVIDIA-H200"})))
    aff = by_kind(objs)[("StatefulSet", "svc-prefill")]["spec"]["template"]["spec"]["affinity"]
    term = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term == {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}
    decode = by_kind(objs)[("StatefulSet", "svc-decode")]["spec"]["template"]["spec"]["affinity"]
    assert "nodeAffinity" not in decode


@pytest.mark.parametrize("mode", ["none", "preferred", "required"])
def test_colocation_modes(mode):
    objs = render(validate_service(minimal(topology={"colocate": mode})))
    spec = lambda role: by_kind(objs)[("StatefulSet", f"svc-{role}")]["spec"]["template"]["spec"]
    for role, peer in (("prefill", "decode"), ("decode", "prefill")):
        aff = spec(role).get("affinity", {}).get("podAffinity")
        if mode == "none":
            assert aff is None
            continue
        keys = [t["podAffinityTerm"]["topologyKey"] for t in aff["preferredDuringSchedulingIgnoredDuringExecution"]]
        assert keys == ["nvidia.com/gpu.clique"]  # never the peer's host: see tests/unit/test_placement.py
        sel = aff["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert sel["pdserving.io/role"] == peer
        required = aff.get("requiredDuringSchedulingIgnoredDuringExecution")
        # only decode may require its peer, or the first pod could never schedule
        assert bool(required) == (mode == "required" and role == "decode")
        if required:
            assert required[0]["topologyKey"] == "nvidia.com/gpu.clique"


def test_spread_per_pool():
    objs = render(validate_service(minimal(topology={"spreadKey": "topology.kubernetes.io/zone"})))
    for role in ("prefill", "decode"):
        tsc = by_kind(objs)[("StatefulSet", f"svc-{role}")]["spec"]["template"]["spec"]["topologySpreadConstraints"][0]
        assert tsc["topologyKey"] == "topology.kubernetes.io/zone"
        assert tsc["labelSelector"]["matchLabels"]["pdserving.io/role"] == role


def test_router_discovers_workers_by_label_selector():
    for kind, module in (("vllm", "vllm_router.launch_router"), ("sglang", "sglang_router.launch_router")):
        objs = render(validate_service(minimal(kind)))
        cmd = by_kind(objs)[("Deployment", "svc-router")]["spec"]["template"]["spec"]["containers"][0]["command"]
        assert cmd[:3] == ["python3", "-m", module]
        assert "--service-discovery" in cmd
        i = cmd.index("--prefill-selector")
        assert cmd[i + 1 : i + 3] == ["pdserving.io/service=svc", "pdserving.io/role=prefill"]
        assert cmd[cmd.index("--service-discovery-namespace") + 1] == "ns"
        port = 8000 if kind == "vllm" else 30000
        assert cmd[cmd.index("--service-discovery-port") + 1] == str(port)
        assert "--prefill" not in cmd and "--worker-urls" not in cmd  # no static URL lists
        role = by_kind(objs)[("Role", "svc-router")]
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_router_watches_its_own_namespace_when_rendered_without_one():
    # Without --service-discovery-namespace both routers watch every namespace
    # (vllm-router service_discovery.rs:289-293, sglang-router :276-280: Api::all),
    # which the namespaced Role forbids. pdctl render without -n knows no namespace:
    # the router gets its pod's own through the downward API.
    for kind in ("vllm", "sglang"):
        obj = minimal(kind)
        del obj["metadata"]["namespace"]
        c = by_kind(render(validate_service(obj)))[("Deployment", "svc-router")]["spec"]["template"]["spec"]["containers"][0]
        cmd = c["command"]
        assert cmd[cmd.index("--service-discovery-namespace") + 1] == "$(POD_NAMESPACE)"
        assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in c["env"]
        # the only $(VAR) in the command is that one (no secret is expanded there)
        assert [a for a in cmd if "$(" in a] == ["$(POD_NAMESPACE)"]
        # with a namespace: the name itself, no extra variable
        c = by_kind(render(validate_service(minimal(kind))))[("Deployment", "svc-router")]["spec"]["template"]["spec"]["containers"][0]
        assert c["command"][c["command"].index("--service-discovery-namespace") + 1] == "ns"
        assert "POD_NAMESPACE" not in {e["name"] for e in c.get("env", [])}


def test_endpoint_and_client_service():
    svc = validate_service(minimal(router={"service": {"type": "LoadBalancer", "port": 443}}))
    assert endpoint(svc) == "http://svc-router.ns.svc:443/v1"
    s = by_kind(render(svc))[("Service", "svc-router")]
    assert s["spec"]["type"] == "LoadBalancer" and s["spec"]["ports"][0]["port"] == 443


def test_network_policy_opens_engine_ports_to_router_and_peers_only():
    objs = render(validate_service(minimal("sglang")))
    np_ = by_kind(objs)[("NetworkPolicy", "svc-engines")]["spec"]
    router_rule, peer_rule, metrics_rule = np_["ingress"]
    assert router_rule["from"][0]["podSelector"]["matchLabels"]["pdserving.io/role"] == "router"
    assert sorted(p["port"] for p in router_rule["ports"]) == [8998, 30000]
    assert peer_rule["from"][0]["podSelector"]["matchExpressions"][0]["values"] == ["prefill", "decode"]
    assert metrics_rule["ports"] == [{"protocol": "TCP", "port": 30000}]
    assert all(o["kind"] != "NetworkPolicy" for o in render(validate_service(minimal(networkPolicy={"enabled": False}))))


def test_lmcache_configmap_mounted_and_hashed():
    objs = render(validate_service(minimal(kvTransfer={"backend": "lmcache", "lmcache": {"remoteUrl": "lm://cache:65432"}})))
    cm = by_kind(objs)[("ConfigMap", "svc-config")]
    conf = yaml.safe_load(cm["data"]["lmcache.yaml"])
    assert conf["remote_url"] == "lm://cache:65432"
    c = engine_container(objs, "prefill")
    cfg = json.loads(c["command"][c["command"].index("--kv-transfer-config") + 1])
    assert cfg["kv_connector"] == "MultiConnector"
    assert [x["kv_connector"] for x in cfg["kv_connector_extra_config"]["connectors"]] == ["NixlConnector", "LMCacheConnectorV1"]
    assert env_of(c)["LMCACHE_CONFIG_FILE"]["value"] == "/etc/lmcache/lmcache.yaml"
    ann = by_kind(objs)[("StatefulSet", "svc-prefill")]["spec"]["template"]["metadata"]["annotations"]
    other = render(validate_service(minimal(kvTransfer={"backend": "lmcache", "lmcache": {"remoteUrl": "lm://other:65432"}})))
    ann2 = by_kind(other)[("StatefulSet", "svc-prefill")]["spec"]["template"]["metadata"]["annotations"]
    assert ann["pdserving.io/config-hash"] != ann2["pdserving.io/config-hash"]  # config edits roll the pods


def test_pvc_source_mounts_weights_read_only():
    objs = render(validate_service(minimal(model={"name": "Qwen/Qwen3-8B", "source": {"type": "pvc", "claimName": "w", "path": "qwen"}})))
    c = engine_container(objs, "prefill")
    assert c["command"][2] == "/models/qwen"
    assert c["command"][c["command"].index("--served-model-name") + 1] == "Qwen/Qwen3-8B"
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]


def test_owner_reference_on_every_object():
    owner = {"apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService", "name": "svc", "uid": "u-1"}
    for o in render(validate_service(minimal()), owner=owner):
        (ref,) = o["metadata"]["ownerReferences"]
        assert ref["uid"] == "u-1" and ref["controller"] is True


def test_extra_args_that_the_operator_manages_are_refused():
    with pytest.raises(SpecError) as info:
        render(validate_service(minimal(prefill={"extraArgs": ["--tensor-parallel-size=2"]})))
    assert info.value.problems[0][0] == "spec.prefill.extraArgs[0]"
    with pytest.raises(SpecError) as info:
        render(validate_service(minimal("sglang", router={"extraArgs": ["--policy", "random"]})))
    assert info.value.problems[0][0] == "spec.router.extraArgs[0]"


def _pod_spec(objs, role="prefill"):
    return by_kind(objs)[("StatefulSet", f"svc-{role}")]["spec"]["template"]["spec"]


@pytest.mark.parametrize("cache, volume, mount", [
    (None, {"name": "hf-cache", "emptyDir": {}}, {"name": "hf-cache", "mountPath": "/cache/huggingface"}),
    ({"kind": "pvc", "claimName": "hf-shared"},
     {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-shared"}}, {"name": "hf-cache", "mountPath": "/cache/huggingface"}),
    ({"kind": "hostPath", "hostPath": "/var/lib/models"},
     {"name": "hf-cache", "hostPath": {"path": "/var/lib/models", "type": "DirectoryOrCreate"}},
     {"name": "hf-cache", "mountPath": "/cache/huggingface"}),
])
def test_model_cache_kinds_keep_the_hugging_face_cache(cache, volume, mount):
    model = {"name": "Qwen/Qwen3-8B", **({"cache": cache} if cache else {})}
    objs = render(validate_service(minimal(model=model)))
    ps, c = _pod_spec(objs), engine_container(objs, "decode")
    assert volume in ps["volumes"] and mount in c["volumeMounts"]
    assert env_of(c)["HF_HOME"]["value"] == "/cache/huggingface"
    assert c["command"][2] == "Qwen/Qwen3-8B"   # the hub id: downloaded once into the kept cache


def test_model_cache_image_mounts_the_weights_read_only_and_loads_the_path():
    model = {"name": "Qwen/Qwen3-8B", "cache": {"kind": "image", "reference": "registry.example.com/weights/qwen3-8b:v1",
                                                "pullPolicy": "IfNotPresent", "path": "model"}}
    for kind in ("vllm", "sglang"):
        objs = render(validate_service(minimal(kind, model=model)))
        ps, c = _pod_spec(objs), engine_container(objs, "prefill")
        assert {"name": "models", "image": {"reference": "registry.example.com/weights/qwen3-8b:v1", "pullPolicy": "IfNotPresent"}} in ps["volumes"]
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
        assert "/models/model" in c["command"]
        assert c["command"][c["command"].index("--served-model-name") + 1] == "Qwen/Qwen3-8B"
        assert not any(v["name"] == "hf-cache" for v in ps["volumes"])


def test_startup_budget_sets_the_startup_probe():
    c = engine_container(render(validate_service(minimal(model={"name": "Qwen/Qwen3-8B", "startupSeconds": 3600}))), "decode")
    p = c["startupProbe"]
    assert p["periodSeconds"] * p["failureThreshold"] == 3600
    c = engine_container(render(validate_service(minimal())), "decode")
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 1800


def test_a_pool_budget_never_holds_an_unready_pod():
    """The eviction API lets an unready pod go only while the budget is met unless the budget
    says AlwaysAllow (k8s pkg/registry/core/pod/storage/eviction.go); a one-replica pool that
    crash-loops or is still loading its model would otherwise block kubectl drain for good."""
    for obj in render(validate_service(minimal())):
        if obj["kind"] == "PodDisruptionBudget":
            assert obj["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow" and obj["spec"]["maxUnavailable"] == 1


def test_several_routers_spread_over_nodes_and_one_does_not():
    """With more than one router, one node's drain or loss takes one of them: maxSkew 1 per node
    (the scheduler's own default, maxSkew 3, lets three share a node), soft, and counting only the
    current ReplicaSet's pods (a rollout's old pods would skew it); a budget of one at a time."""
    def router_objs(replicas):
        objs = render(validate_service(minimal(router={"image": "r:1", "replicas": replicas})))
        dep = next(o for o in objs if o["kind"] == "Deployment")
        pdb = [o for o in objs if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"].endswith("router")]
        return dep["spec"]["template"]["spec"], pdb

    spec, pdb = router_objs(3)
    (tsc,) = spec["topologySpreadConstraints"]
    assert (tsc["maxSkew"], tsc["topologyKey"], tsc["whenUnsatisfiable"]) == (1, "kubernetes.io/hostname", "ScheduleAnyway")
    assert tsc["matchLabelKeys"] == ["pod-template-hash"]
    assert tsc["labelSelector"]["matchLabels"] == {"pdserving.io/service": "svc", "pdserving.io/role": "router"}
    assert len(pdb) == 1 and pdb[0]["spec"]["maxUnavailable"] == 1
    spec, pdb = router_objs(1)
    assert "topologySpreadConstraints" not in spec and pdb == []
