"""Hypothesis strategies for PDInferenceService objects, valid and invalid.

They draw from the values that matter for the cross-field rules (engines,
backends, parallel sizes near node limits, autoscaling bounds, accelerators,
RDMA, sources, auth), so both accepted and refused specs come up often.
"""

from __future__ import annotations

from hypothesis import strategies as st

tp = st.sampled_from([1, 2, 4, 8, 16])
small = st.sampled_from([1, 2])


@st.composite
def autoscaling(draw):
    out = {}
    if draw(st.booleans()):
        out["enabled"] = draw(st.booleans())
    if draw(st.booleans()):
        out["minReplicas"] = draw(st.integers(1, 6))
    if draw(st.booleans()):
        out["maxReplicas"] = draw(st.integers(1, 6))
    return out


@st.composite
def pool(draw):
    out: dict = {}
    if draw(st.booleans()):
        out["replicas"] = draw(st.integers(0, 4))
    out["tensorParallelSize"] = draw(tp)
    if draw(st.booleans()):
        out["pipelineParallelSize"] = draw(small)
    if draw(st.booleans()):
        out["dataParallelSize"] = draw(small)
    if draw(st.integers(0, 3)) == 0:
        out["dataParallelAttention"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:  # replicas that span nodes (issue 16)
        out["nodesPerReplica"] = draw(st.sampled_from([1, 2, 3, 4]))
    if draw(st.integers(0, 3)) == 0:
        out["expertParallel"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        out["deepepMode"] = draw(st.sampled_from(["auto", "normal", "low_latency"]))
    if draw(st.integers(0, 3)) == 0:
        out["drainSeconds"] = draw(st.sampled_from([0, 10, 60]))
        out["terminationGracePeriodSeconds"] = draw(st.sampled_from([0, 20, 120]))
    if draw(st.booleans()):
        out["gpuProduct"] = draw(st.sampled_from(["NVIDIA-H200", "NVIDIA-H100-80GB-HBM3"]))
    if draw(st.booleans()):
        out["autoscaling"] = draw(autoscaling())
    if draw(st.booleans()):
        out["resources"] = {"requests": {"cpu": draw(st.sampled_from([8, "16", "500m"])), "memory": "64Gi"}}
        if draw(st.integers(0, 5)) == 0:
            out["resources"]["limits"] = {"nvidia.com/gpu": 2}
    if draw(st.booleans()):
        out["gpuMemoryUtilization"] = draw(st.sampled_from([0.85, 0.9]))
        out["maxRunningRequests"] = draw(st.sampled_from([64, 256]))
        out["maxBatchedTokens"] = draw(st.sampled_from([2048, 8192]))
        out["enablePrefixCaching"] = draw(st.booleans())
    if draw(st.booleans()):
        out["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        out["nodeSelector"] = {"pool": "gpu"}
    if draw(st.integers(0, 3)) == 0:
        out["podTemplate"] = draw(st.sampled_from(POD_TEMPLATES))
    return out


# Pod-template overlays (spec.<pool>.podTemplate) that touch no owned field.
POD_TEMPLATES = [
    {"spec": {"imagePullSecrets": [{"name": "regcred"}], "serviceAccountName": "engine"}},
    {"metadata": {"labels": {"team": "a"}}, "spec": {"hostNetwork": True, "securityContext": {"runAsUser": 0}}},
    {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}],
              "containers": [{"name": "engine", "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                              "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]},
                             {"name": "sidecar", "image": "busybox:1.37", "command": ["sleep", "infinity"]}],
              "initContainers": [{"name": "init", "image": "busybox:1.37", "command": ["true"]}]}},
]


@st.composite
def service(draw):
    kind = draw(st.sampled_from(["vllm", "sglang"]))
    engine: dict = {"kind": kind}
    if draw(st.integers(0, 4)) == 0:
        engine["accelerator"] = "amd"
        if draw(st.booleans()):
            engine["image"] = "rocm/vllm:latest"
    if draw(st.booleans()):
        engine["apiKeySecretRef"] = {"name": "engine-key"}
    if draw(st.integers(0, 6)) == 0:
        engine["version"] = draw(st.sampled_from(["0.33.0", "0.5.23", "0.1.0"]))
    kv: dict = {}
    if draw(st.booleans()):
        kv["backend"] = draw(st.sampled_from(["nixl", "mooncake", "lmcache", "moriio"]))
    if draw(st.booleans()):
        kv["rdma"] = {
            "resourceName": draw(st.sampled_from(["rdma/rdma_shared_device_a", "nvidia.com/hostdev", "vpc.amazonaws.com/efa"])),
            "count": draw(small),
            "ibDevices": draw(st.sampled_from([[], ["mlx5_0"], ["mlx5_0", "mlx5_1:1"]])),
            "networks": draw(st.sampled_from([[], ["default/rdma-net"]])),
            "roce": draw(st.booleans()),
        }
    if draw(st.booleans()):
        kv["lmcache"] = {"remoteUrl": "lm://lmcache:65432"}
    if draw(st.booleans()):
        kv["nixl"] = {"backends": draw(st.sampled_from([["UCX"], ["LIBFABRIC"]]))}
    model: dict = {"name": draw(st.sampled_from(["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct"]))}
    if draw(st.booleans()):
        model["servedName"] = "served"
    if draw(st.booleans()):
        model["maxModelLen"] = 32768
    source_kind = draw(st.sampled_from(["none", "hf", "pvc", "pvc-missing"]))
    if source_kind == "hf":
        model["source"] = {"revision": "main", "tokenSecretRef": {"name": "hf", "key": "token"}, "cacheClaimName": "hf-cache"}
    elif source_kind == "pvc":
        model["source"] = {"type": "pvc", "claimName": "weights", "path": "qwen3-8b"}
    elif source_kind == "pvc-missing":
        model["source"] = {"type": "pvc"}
    if draw(st.integers(0, 2)) == 0:
        model["cache"] = draw(st.sampled_from([
            {"kind": "emptyDir"}, {"kind": "pvc", "claimName": "hf-shared"}, {"kind": "pvc"},
            {"kind": "hostPath", "hostPath": "/var/lib/hf"}, {"kind": "hostPath"},
            {"kind": "image", "reference": "registry.example.com/w:v1", "path": "m"}, {"kind": "image"},
            {"kind": "image", "reference": "registry.example.com/w:v1", "pullPolicy": "IfNotPresent"},
        ]))
    if draw(st.integers(0, 3)) == 0:
        model["startupSeconds"] = draw(st.sampled_from([60, 3600]))
    spec: dict = {"model": model, "engine": engine, "prefill": draw(pool()), "decode": draw(pool())}
    if kind == "sglang" and spec["decode"].get("pipelineParallelSize", 1) not in (1, spec["prefill"].get("pipelineParallelSize", 1)):
        # refused when rendered (SGLang's decode maps stages only from a prefill as deep, or onto
        # one stage: tests/unit/test_sglang_pd_pairing.py); every spec drawn here should render
        spec["decode"]["pipelineParallelSize"] = 1
    if kv:
        spec["kvTransfer"] = kv
    if draw(st.booleans()):
        spec["topology"] = {
            "colocate": draw(st.sampled_from(["none", "preferred", "required"])),
            "nvlinkDomainKey": draw(st.sampled_from(["nvidia.com/gpu.clique", "kubernetes.io/hostname"])),
            "gpusPerNode": draw(st.sampled_from([4, 8, 16])),
        }
    spec["router"] = {"image": "registry.example.com/pd/router:test"}  # required (no published router image)
    if draw(st.booleans()):
        spec["router"] |= {
            "kind": draw(st.sampled_from(["auto", "vllm-router", "sglang-router"])),
            "replicas": draw(st.integers(1, 3)),
            "service": {"type": draw(st.sampled_from(["ClusterIP", "LoadBalancer"])), "port": 8000},
        }
    if draw(st.booleans()):
        spec["networkPolicy"] = {"enabled": draw(st.booleans())}
    return {
        "apiVersion": "pdserving.io/v1alpha1",
        "kind": "PDInferenceService",
        "metadata": {"name": draw(st.sampled_from(["a", "qwen3-8b", "x" * 40])), "namespace": "team-a"},
        "spec": spec,
    }
