"""The local cluster's node profiles, checked against the rules of the labellers
they imitate (facts and commits in tests/contract/FACTS.md, "Node labels")."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.conftest import ROOT, load_e2e_module

profiles = load_e2e_module("nodeprofiles")
NVIDIA = [p for p in profiles.PROFILES if "nvidia.com/gpu" in profiles.PROFILES[p]["resources"]]


def labels(profile):
    return [n["metadata"]["labels"] for n in profiles.nodes(profile)]


def gfd_sanitise(text: str) -> str:
    """GFD's rule for product and machine names (k8s-device-plugin
    internal/lm/resource.go sanitise): drop characters outside
    [A-Za-z0-9-_. ], then join the blank-separated fields with '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split())


# NVML device names of the GPUs (nvidia-smi --query-gpu=name) and their CUDA
# compute capability.
NVML = {"NVIDIA-H200": ("NVIDIA H200", 9, 0), "NVIDIA-H100-80GB-HBM3": ("NVIDIA H100 80GB HBM3", 9, 0),
        "NVIDIA-GB200": ("NVIDIA GB200", 10, 0)}
# GFD getArchFamily: compute major -> family.
FAMILY = {9: "hopper", 10: "blackwell", 12: "blackwell"}


@pytest.mark.parametrize("profile", NVIDIA)
def test_gfd_labels_follow_gfd_rules(profile):
    for lab in labels(profile):
        name, major, minor = NVML[lab["nvidia.com/gpu.product"]]
        assert lab["nvidia.com/gpu.product"] == gfd_sanitise(name)
        assert lab["nvidia.com/gpu.machine"] == gfd_sanitise(lab["nvidia.com/gpu.machine"])
        assert (lab["nvidia.com/gpu.compute.major"], lab["nvidia.com/gpu.compute.minor"]) == (str(major), str(minor))
        assert lab["nvidia.com/gpu.family"] == FAMILY[major]
        assert lab["nvidia.com/gpu.sharing-strategy"] == "none" and lab["nvidia.com/gpu.replicas"] == "1"
        # gpu.present / gpu.deploy.* are the GPU Operator's, not GFD's: not claimed here.
        assert "nvidia.com/gpu.present" not in lab


@pytest.mark.parametrize("profile", ["hgx-h200", "hgx-h100", "efa-p5"])
def test_hgx_nodes_have_no_clique(profile):
    """GFD's imex labeler sets gpu.clique only for fabric-attached GPUs (a
    completed GPU fabric with a non-zero cluster UUID): multi-node NVLink only."""
    assert all("nvidia.com/gpu.clique" not in lab for lab in labels(profile))


def test_nvl72_trays_carry_their_rack_clique():
    cliques: dict[str, list] = {}
    for lab in labels("gb200-nvl72"):
        cluster_uuid, clique_id = lab["nvidia.com/gpu.clique"].rsplit(".", 1)  # "<ClusterUUID>.<CliqueID>"
        assert str(uuid.UUID(cluster_uuid)) == cluster_uuid and clique_id.isdigit()
        assert lab["kubernetes.io/arch"] == "arm64"  # Grace
        cliques.setdefault(lab["nvidia.com/gpu.clique"], []).append(lab["kubernetes.io/hostname"])
    assert sorted(len(v) for v in cliques.values()) == [4, 4]


def test_amd_labels_follow_the_rocm_labeller():
    """cmd/k8s-node-labeller: product_name with blanks -> '_' and parentheses
    dropped; amd.com/gpu.<p> = value (homogeneous node) plus the legacy
    beta.amd.com/gpu.<p> and beta.amd.com/gpu.<p>.<value> = count."""
    for node in profiles.nodes("mi300x"):
        lab = node["metadata"]["labels"]
        assert lab["amd.com/gpu.product-name"] == "AMD Instinct MI300X OAM".replace(" ", "_")
        gpus = node["status"]["allocatable"]["amd.com/gpu"]
        for prop in ("product-name", "device-id", "family", "vram", "cu-count", "simd-count"):
            value = lab[f"amd.com/gpu.{prop}"]
            assert lab[f"beta.amd.com/gpu.{prop}"] == value
            assert lab[f"beta.amd.com/gpu.{prop}.{value}"] == gpus
        assert int(lab["amd.com/gpu.simd-count"]) == 4 * int(lab["amd.com/gpu.cu-count"])
        assert not [k for k in lab if k.startswith("nvidia.com/")]
        assert "nvidia.com/gpu" not in node["status"]["allocatable"]


def test_efa_pool_advertises_efa_on_a_supported_instance_type():
    """aws-efa-k8s-device-plugin: vpc.amazonaws.com/efa, on the instance types
    of the chart's supportedInstanceLabels (node.kubernetes.io/instance-type)."""
    for node in profiles.nodes("efa-p5"):
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
        assert node["status"]["allocatable"]["vpc.amazonaws.com/efa"] == "32"
        assert not [k for k in node["status"]["allocatable"] if k.startswith("rdma/")]


@pytest.mark.parametrize("profile", list(profiles.PROFILES))
def test_profiles_are_kwok_nodes_with_unique_loopback_addresses(profile):
    nodes = profiles.nodes(profile)
    assert len({n["metadata"]["name"] for n in nodes}) == len(nodes)
    for n in nodes:
        assert n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert n["spec"]["podCIDR"].startswith("127.100.")
        assert n["status"]["capacity"].keys() == n["status"]["allocatable"].keys()


def test_profiles_never_share_pod_cidrs():
    cidrs = [n["spec"]["podCIDR"] for p in profiles.PROFILES for n in profiles.nodes(p)]
    assert len(cidrs) == len(set(cidrs))


def test_default_nodes_yaml_is_the_default_profile():
    path = ROOT / "e2e" / "controlplane" / "nodes.yaml"
    assert path.read_text() == profiles.to_yaml(profiles.DEFAULT_PROFILE), \
        "e2e/controlplane/nodes.yaml is stale: run `python3 e2e/nodeprofiles.py hgx-h200 > e2e/controlplane/nodes.yaml`"


def test_the_default_cluster_nodes_are_hgx_without_clique():
    """The nodes the integration tests get: HGX H200, which GFD never gives a
    clique (the old nodes.yaml did, hiding colocate: required Pending forever)."""
    import yaml

    docs = [d for d in yaml.safe_load_all((ROOT / "e2e" / "controlplane" / "nodes.yaml").read_text()) if d]
    assert len(docs) == 4
    for d in docs:
        assert d["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert "nvidia.com/gpu.clique" not in d["metadata"]["labels"]


def test_each_local_cluster_hands_out_its_own_pod_ips():
    """The main job's cluster (pd-local) and the tests' (pd-test) shared
    127.100.x.y: a harness of one could bind an address the other handed out.
    Each cluster's nodes and kwok fallback now take the cluster's own octet."""
    import ipaddress

    cluster = load_e2e_module("cluster")
    seen = {}
    for name in ("pd-local", "pd-test"):
        octet = cluster.pod_octet(name)
        assert octet == cluster.pod_octet(name)  # stable
        assert octet in cluster.POD_OCTETS
        nets = [ipaddress.ip_network(n["spec"]["podCIDR"]) for p in profiles.PROFILES for n in profiles.nodes(p, octet)]
        nets.append(ipaddress.ip_network(cluster.kwok_fallback_pod_cidr(name)))
        assert f"value: {cluster.kwok_fallback_pod_cidr(name)}" in cluster._kwokctl_config(name)
        for net in nets:
            assert net.subnet_of(ipaddress.ip_network(f"127.{octet}.0.0/16"))
            assert not net.overlaps(ipaddress.ip_network(cluster.SERVICE_CIDR))
        seen[name] = nets
    assert not any(a.overlaps(b) for a in seen["pd-local"] for b in seen["pd-test"])


def test_each_local_cluster_listens_on_its_own_ports():
    """kwokctl picked the same free ports (32764...) for clusters created while
    the other was stopped: a warm start of one then waited for an API server
    that could not listen, the other's etcd holding its port. Each cluster now
    names its own block, below the ephemeral range."""
    cluster = load_e2e_module("cluster")
    a, b = cluster.ports("pd-local"), cluster.ports("pd-test")
    assert len(set(a.values())) == len(cluster.PORT_NAMES) and not set(a.values()) & set(b.values())
    for name, ports in (("pd-local", a), ("pd-test", b)):
        assert all(1024 < p < 32768 for p in ports.values())
        config = cluster._kwokctl_config(name)
        for key, port in ports.items():
            assert f"  {key}: {port}\n" in config
