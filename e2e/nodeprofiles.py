#!/usr/bin/env python3
"""Node profiles of the local (kwok) cluster: GPU nodes labelled as the real
device plugins and labellers label them.

    python3 e2e/nodeprofiles.py PROFILE      print the profile's Node objects (YAML)
    python3 e2e/nodeprofiles.py --list       the profile names

A cluster gets one profile when it is created (e2e/cluster.py ``up(profile=)``,
``e2e/cluster.sh up --profile NAME`` or $PD_NODE_PROFILE); the default is
``hgx-h200``, which is also written to e2e/controlplane/nodes.yaml for the kind
path (tests/unit/test_node_profiles.py checks that file is not stale).

Where each label comes from (upstream source read for the facts, nothing copied;
tests/contract/FACTS.md has the details and the commits):

* NVIDIA: GPU Feature Discovery, NVIDIA/k8s-device-plugin internal/lm/.
  ``nvidia.com/gpu.product`` is the NVML device name sanitised (characters
  outside ``[A-Za-z0-9-_. ]`` dropped, blanks joined with ``-``);
  ``nvidia.com/gpu.family`` follows the CUDA compute capability (9 hopper,
  10 and 12 blackwell); ``nvidia.com/gpu.machine`` is the DMI product name,
  sanitised the same way (vendor-specific); ``nvidia.com/gpu.clique`` is
  ``<ClusterUUID>.<CliqueID>`` and is set **only** when every GPU reports a
  completed GPU fabric with a non-zero cluster UUID (internal/lm/imex.go,
  go-nvlib IsFabricAttached): multi-node NVLink systems (GB200/GB300 NVL72),
  never an HGX H100/H200 board, whose NVSwitches are inside the node.
* AMD: ROCm/k8s-device-plugin cmd/k8s-node-labeller, with the flags of its
  example DaemonSet (-vram -cu-count -simd-count -device-id -family
  -product-name). Each property is written under ``amd.com/gpu.<name>`` (the
  value, when all GPUs of the node agree) and the legacy
  ``beta.amd.com/gpu.<name>`` plus ``beta.amd.com/gpu.<name>.<value>: <count>``.
  No GPU count label, nothing like an NVLink clique. The resource is
  ``amd.com/gpu``.
* EFA: the aws-efa-k8s-device-plugin (aws/eks-charts
  stable/aws-efa-k8s-device-plugin) advertises ``vpc.amazonaws.com/efa`` on
  the instance types of its supportedInstanceLabels (node.kubernetes.io/
  instance-type), e.g. p5.48xlarge (8 x H100 80GB HBM3, 32 EFA devices per
  the EC2 EFA docs). GFD labels as on any NVIDIA node (GPU Operator).

Capacities (cpu, memory) are the instance types' published sizes, rounded;
``nvidia.com/gpu.memory`` is the MiB NVML reports (H200 143771, H100 81559;
GB200 is an estimate, marked below).

Pod IPs: every profile keeps the loopback scheme of e2e/cluster.py
(podCIDR 127.<P>.<N>.0/24, InternalIP 127.101.0.<N+1>), with N offset per
profile and P the cluster's own pod octet (e2e/cluster.py ``pod_octet()``,
derived from the cluster name; 100 when no cluster is named, as in
e2e/controlplane/nodes.yaml), so two local clusters never hand out the same
pod IP. Node names are gpu-node-<i> in every profile.
"""

from __future__ import annotations

import sys

DEFAULT_PROFILE = "hgx-h200"

# GFD's label set on a fully working NVIDIA node (GPU Operator defaults:
# sharing off, MIG strategy single -- deployments/gpu-operator/values.yaml
# mig.strategy -- which GFD writes even where no GPU is in MIG mode,
# internal/lm/strategy.go; no vGPU, internal/lm/vgpu.go), for one GPU model.
_CUDA = {"driver": ("570", "133", "20"), "runtime": ("12", "8")}


def _gfd_labels(product: str, count: int, memory_mib: int, major: int, minor: int, family: str,
                machine: str, clique: str | None) -> dict[str, str]:
    drv, rt = _CUDA["driver"], _CUDA["runtime"]
    labels = {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.compute.major": str(major),
        "nvidia.com/gpu.compute.minor": str(minor),
        "nvidia.com/gpu.machine": machine,
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/vgpu.present": "false",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/cuda.driver.major": drv[0],
        "nvidia.com/cuda.driver.minor": drv[1],
        "nvidia.com/cuda.driver.rev": drv[2],
        "nvidia.com/cuda.runtime.major": rt[0],
        "nvidia.com/cuda.runtime.minor": rt[1],
        "nvidia.com/cuda.driver-version.major": drv[0],
        "nvidia.com/cuda.driver-version.minor": drv[1],
        "nvidia.com/cuda.driver-version.revision": drv[2],
        "nvidia.com/cuda.driver-version.full": ".".join(drv),
        "nvidia.com/cuda.runtime-version.major": rt[0],
        "nvidia.com/cuda.runtime-version.minor": rt[1],
        "nvidia.com/cuda.runtime-version.full": ".".join(rt),
        "nvidia.com/gfd.timestamp": "1767225600",
    }
    if clique is not None:
        labels["nvidia.com/gpu.clique"] = clique
    return labels


def _amd_labels(values: dict[str, str], count: int) -> dict[str, str]:
    """cmd/k8s-node-labeller's two prefixes for GPUs that all agree."""
    out = {}
    for name, value in values.items():
        out[f"amd.com/gpu.{name}"] = value
        out[f"beta.amd.com/gpu.{name}"] = value
        out[f"beta.amd.com/gpu.{name}.{value}"] = str(count)
    return out


# One entry per profile: how many nodes, their shape, and per-node extras.
PROFILES: dict[str, dict] = {
    "hgx-h200": {
        "doc": "HGX H200 (8 x H200 SXM per node, NVSwitch inside the node): no clique label.",
        "offset": 0, "nodes": 4, "arch": "amd64", "instance": "hgx-h200-8gpu",
        "cpu": ("224", "220"), "memory": ("2113616964Ki", "2092645444Ki"),
        "resources": {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1000"},
        "labels": lambda i: _gfd_labels("NVIDIA-H200", 8, 143771, 9, 0, "hopper", "PowerEdge-XE9680", None),
        "rack": lambda i: f"rack-{'ab'[i // 2]}",
    },
    "hgx-h100": {
        "doc": "HGX H100 80GB (8 x H100 SXM per node): no clique label.",
        "offset": 16, "nodes": 4, "arch": "amd64", "instance": "hgx-h100-8gpu",
        "cpu": ("224", "220"), "memory": ("2113616964Ki", "2092645444Ki"),
        "resources": {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1000"},
        "labels": lambda i: _gfd_labels("NVIDIA-H100-80GB-HBM3", 8, 81559, 9, 0, "hopper", "SYS-821GE-TNHR", None),
        "rack": lambda i: f"rack-{'ab'[i // 2]}",
    },
    "gb200-nvl72": {
        "doc": "GB200 NVL72: compute trays of 4 GPUs (arm64 Grace); two racks of 4 trays here (a real rack "
               "has 18), each rack one NVLink domain: nvidia.com/gpu.clique <ClusterUUID>.<CliqueID>.",
        "offset": 32, "nodes": 8, "arch": "arm64", "instance": "gb200-nvl72-tray",
        "cpu": ("144", "140"), "memory": ("943718400Ki", "927989760Ki"),
        "resources": {"nvidia.com/gpu": "4", "rdma/rdma_shared_device_a": "1000"},
        # gpu.memory: an estimate of NVML's MiB for a GB200 GPU (not read from a device).
        "labels": lambda i: _gfd_labels("NVIDIA-GB200", 4, 189471, 10, 0, "blackwell", "GB200-NVL72",
                                        (("5f3c6e0a-1b2d-4c8e-9f70-a1b2c3d4e5f6", "d2e8a4c1-7b3f-4e9a-8c05-6f1e2d3c4b5a")[i // 4]) + ".32766"),
        "rack": lambda i: f"nvl72-{i // 4}",
    },
    "mi300x": {
        "doc": "AMD Instinct MI300X (8 OAM per node): ROCm device plugin (amd.com/gpu) and node labeller.",
        "offset": 48, "nodes": 4, "arch": "amd64", "instance": "mi300x-8gpu",
        "cpu": ("256", "252"), "memory": ("2113616964Ki", "2092645444Ki"),
        "resources": {"amd.com/gpu": "8", "rdma/rdma_shared_device_a": "1000"},
        "labels": lambda i: _amd_labels({"product-name": "AMD_Instinct_MI300X_OAM", "device-id": "74a1", "family": "AI",
                                         "vram": "192G", "cu-count": "304", "simd-count": "1216"}, 8),
        "rack": lambda i: f"rack-{'ab'[i // 2]}",
    },
    "efa-p5": {
        "doc": "AWS p5.48xlarge node pool: 8 x H100 80GB HBM3, 32 EFA devices (vpc.amazonaws.com/efa), GFD labels.",
        "offset": 64, "nodes": 4, "arch": "amd64", "instance": "p5.48xlarge",
        "cpu": ("192", "191450m"), "memory": ("2097152000Ki", "2080374784Ki"),
        "resources": {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"},
        "labels": lambda i: _gfd_labels("NVIDIA-H100-80GB-HBM3", 8, 81559, 9, 0, "hopper", "p5.48xlarge", None),
        "rack": None,
        "zone": "us-east-2b",
    },
}


# The pod octet of nodes.yaml and of callers that name no cluster.
DEFAULT_POD_OCTET = 100


def nodes(profile: str = DEFAULT_PROFILE, pod_octet: int = DEFAULT_POD_OCTET) -> list[dict]:
    """The Node objects of a profile (kwok fake nodes); pod CIDRs 127.<pod_octet>.<N>.0/24."""
    if not 1 <= pod_octet <= 254:
        raise ValueError(f"pod_octet {pod_octet} is not the second octet of a 127.0.0.0/8 address (1..254)")
    if profile not in PROFILES:
        raise ValueError(f"unknown node profile {profile!r}: use one of {', '.join(PROFILES)}")
    p = PROFILES[profile]
    out = []
    for i in range(p["nodes"]):
        n = p["offset"] + i
        name = f"gpu-node-{i}"
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": p["arch"],
            "node.kubernetes.io/instance-type": p["instance"],
            "topology.kubernetes.io/region": "local",
            "topology.kubernetes.io/zone": p.get("zone", "local-a"),
            "type": "kwok",
            "pdserving.io/node-profile": profile,
        }
        if p["rack"]:
            labels["topology.pdserving.io/rack"] = p["rack"](i)
        labels.update(p["labels"](i))
        res = {"cpu": p["cpu"], "memory": p["memory"], "pods": ("110", "110"),
               "ephemeral-storage": ("30Ti", "29Ti"), "hugepages-1Gi": ("0", "0"), "hugepages-2Mi": ("0", "0")}
        out.append({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": labels},
            "spec": {"podCIDR": f"127.{pod_octet}.{n}.0/24", "podCIDRs": [f"127.{pod_octet}.{n}.0/24"]},
            "status": {
                "addresses": [{"type": "InternalIP", "address": f"127.101.0.{n + 1}"},
                              {"type": "Hostname", "address": name}],
                "capacity": {**{k: v[0] for k, v in res.items()}, **p["resources"]},
                "allocatable": {**{k: v[1] for k, v in res.items()}, **p["resources"]},
                "nodeInfo": {"architecture": p["arch"], "operatingSystem": "linux",
                             "osImage": "Ubuntu 22.04.5 LTS", "kernelVersion": "5.15.0-140-generic",
                             "containerRuntimeVersion": "containerd://1.7.27"},
            },
        })
    return out


HEADER = """\
# GENERATED by `python3 e2e/nodeprofiles.py {profile} > e2e/controlplane/nodes.yaml`: do not edit.
# The local cluster's default node profile ({profile}); the other profiles and
# where every label comes from: e2e/nodeprofiles.py. The kind path
# (e2e/kind/gpu-nodes.sh) applies these labels and extended resources to
# kind's worker nodes.
#
# {doc}
"""


def to_yaml(profile: str = DEFAULT_PROFILE, pod_octet: int = DEFAULT_POD_OCTET) -> str:
    import json

    # JSON is YAML: no PyYAML needed on the kind path. One document per node.
    docs = [json.dumps(n, indent=1) for n in nodes(profile, pod_octet)]
    return HEADER.format(profile=profile, doc=PROFILES[profile]["doc"]) + "".join(f"---\n{d}\n" for d in docs)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    if sys.argv[1] == "--list":
        print("\n".join(f"{k}: {v['doc']}" for k, v in PROFILES.items()))
    else:
        sys.stdout.write(to_yaml(sys.argv[1]))
