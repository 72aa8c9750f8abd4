"""Placement defaults that hold on the hardware users have (issue 13 item 2).

Two engine pods on one HGX node are separate containers, each seeing only its
own GPUs, so KV goes through the NIC anyway and the node is one failure domain
for both pools: the default spreads prefill and decode over hosts. NVLink
co-location is asked for on the NVLink-domain label only, which GFD sets only
on multi-node NVLink systems (NVL72), so it is inert on HGX and never blocks."""

from __future__ import annotations

from pd_operator.api import validate_service
from pd_operator.controller.status import unschedulable_reason
from pd_operator.render import render
from tests.conftest import minimal

HOST = "kubernetes.io/hostname"
CLIQUE = "nvidia.com/gpu.clique"


def pod_spec(objs, role):
    return next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == f"svc-{role}")["spec"]["template"]["spec"]


def test_default_never_prefers_the_peer_s_host_and_spreads_from_it():
    objs = render(validate_service(minimal()))
    for role, peer in (("prefill", "decode"), ("decode", "prefill")):
        aff = pod_spec(objs, role)["affinity"]
        pref = aff["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert [t["podAffinityTerm"]["topologyKey"] for t in pref] == [CLIQUE]
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in aff["podAffinity"]
        anti = aff["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert [t["podAffinityTerm"]["topologyKey"] for t in anti] == [HOST]
        assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]["pdserving.io/role"] == peer


def test_required_follows_the_clique_and_still_spreads_hosts():
    objs = render(validate_service(minimal(topology={"colocate": "required"})))
    decode = pod_spec(objs, "decode")["affinity"]
    assert [t["topologyKey"] for t in decode["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]] == [CLIQUE]
    assert decode["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == HOST


def test_host_as_the_nvlink_domain_means_same_host_and_no_anti_affinity():
    """A user who names the host as the NVLink domain (e.g. pods sharing GPUs
    through one container) asks for the same host: no spreading away from it."""
    objs = render(validate_service(minimal(topology={"nvlinkDomainKey": HOST})))
    aff = pod_spec(objs, "decode")["affinity"]
    assert [t["podAffinityTerm"]["topologyKey"] for t in aff["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]] == [HOST]
    assert "podAntiAffinity" not in aff


def test_none_renders_no_pod_affinity_at_all():
    aff = pod_spec(render(validate_service(minimal(topology={"colocate": "none"}))), "decode").get("affinity", {})
    assert "podAffinity" not in aff and "podAntiAffinity" not in aff


def test_required_on_a_label_no_node_has_says_so_with_the_fix():
    svc = validate_service(minimal(topology={"colocate": "required"}))
    msg = unschedulable_reason(svc, "decode", "0/4 nodes are available: 4 node(s) didn't match pod affinity rules.")
    assert CLIQUE in msg and "HGX" in msg and "colocate preferred" in msg
