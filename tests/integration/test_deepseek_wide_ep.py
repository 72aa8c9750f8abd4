"""The DeepSeek wide-EP example (manifests/examples/deepseek-wide-ep.yaml: SGLang,
prefill replicas of 2 nodes, decode replicas of 4 nodes, 8 GPUs and 8 RDMA rails
per pod) through the operator, the real LWS controller and the real sglang-router,
on simulated engines started from the rendered leader and worker commands
(e2e/harness.py; a group serves once all its workers joined its leader,
enginesim/group.py; the cost shape is the MoE one, perfmodel/costmodel.py).

The local cluster's 4 HGX-H200 nodes cannot hold it (and carry no rail
resources), so the test adds kwok nodes of its own: the ``hgx-h200`` profile's
Node objects (e2e/nodeprofiles.py ``nodes()``), renamed ``gpu-node-x<N>`` with
their own pod CIDRs and IPs (offsets 4..13: the profile uses 0..3 for
hgx-h200, 16 and up for the others) and one ``rdma/rail<i>`` resource per NIC,
deleted at the end. Ten nodes: one prefill group (2) + two decode groups (4 + 4).

Then: Ready with all groups, a request through the router to the leaders, a
worker deleted by hand recreating its group (Ready and serving again), and a
decode scale-up creating a whole new group of 4 pods, Ready and found by the
router (with fewer extra nodes the new group waits for nodes, as the service's
status says: the test checks that instead).
"""
from __future__ import annotations

import contextlib
import copy
import threading
import time

import pytest
import yaml

from tests.conftest import load_e2e_module
from tests.integration.test_e2e_serving import REPO, decode_workers, router_py, running_stack  # noqa: F401
from tests.integration.test_operator import crd  # noqa: F401  (fixture)
from tests.integration.test_operator import condition, create, get_svc, wait_for, wait_ready
from tests.sim.conftest import stream_chat

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "manifests" / "examples" / "deepseek-wide-ep.yaml"
ROUTER_IMAGE = "registry.example.com/pd/router:test"  # as the other integration tests
LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
NAME_LABEL, WORKER_INDEX, GROUP_INDEX = ("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/worker-index",
                                         "leaderworkerset.sigs.k8s.io/group-index")
EXTRA_OFFSETS = range(4, 14)  # pod CIDR 127.<octet>.<N>.0/24, node IP 127.101.0.<N+1>
RAILS = 8


def extra_nodes(pod_octet: int, offsets=EXTRA_OFFSETS) -> list[dict]:
    """The hgx-h200 profile's nodes, copied under new names, CIDRs and IPs, with rail resources."""
    profile = load_e2e_module("nodeprofiles")
    base = profile.nodes("hgx-h200", pod_octet)
    out = []
    for k, n in enumerate(offsets):
        node = copy.deepcopy(base[k % len(base)])
        name = f"gpu-node-x{n}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        node["metadata"]["labels"]["pdserving.io/test-node"] = "deepseek-wide-ep"
        cidr = f"127.{pod_octet}.{n}.0/24"
        node["spec"] = {"podCIDR": cidr, "podCIDRs": [cidr]}
        node["status"]["addresses"] = [{"type": "InternalIP", "address": f"127.101.0.{n + 1}"},
                                       {"type": "Hostname", "address": name}]
        for key in ("capacity", "allocatable"):
            node["status"][key].update({f"rdma/rail{i}": "1" for i in range(RAILS)})
        out.append(node)
    return out


@pytest.fixture
def wide_nodes(core_v1, kube_cluster):
    if not kube_cluster.local:
        pytest.skip("adds kwok nodes: needs the local cluster")
    octet = int(core_v1.read_node("gpu-node-0").spec.pod_cidr.split(".")[1])  # the cluster's pod octet
    names = []
    try:
        for node in extra_nodes(octet):
            status = node.pop("status")
            core_v1.create_node(node)
            names.append(node["metadata"]["name"])
            core_v1.patch_node_status(node["metadata"]["name"], {"status": status})
        yield names
    finally:
        for name in names:
            try:
                core_v1.delete_node(name)
            except Exception as exc:  # noqa: BLE001 - delete the rest
                print(f"[nodes] delete {name}: {exc}")


def example(namespace: str) -> dict:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = namespace
    body["spec"]["router"]["image"] = ROUTER_IMAGE
    return body


def queue_ranks(url: str) -> list[str]:
    """The dp_rank of each sglang:num_queue_reqs series of a metrics page ("none": no such label)."""
    import re
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    found = [dict(re.findall(r'(\w+)="([^"]*)"', m)).get("dp_rank", "none")
             for m in re.findall(r"^sglang:num_queue_reqs\{([^}]*)\}", text, re.M)]
    return sorted(found, key=lambda d: int(d) if d.isdigit() else -1)


def group_pods(core_v1, namespace: str, lws: str) -> list:
    return [p for p in core_v1.list_namespaced_pod(namespace, label_selector=f"{NAME_LABEL}={lws}").items
            if p.metadata.deletion_timestamp is None]


def running(pod) -> bool:
    return pod.status.phase == "Running" and any(c.type == "Ready" and c.status == "True"
                                                 for c in (pod.status.conditions or []))


def lws_status(custom_objects, namespace: str, name: str) -> dict:
    return custom_objects.get_namespaced_custom_object(*LWS[:2], namespace, LWS[2], name).get("status") or {}


@contextlib.contextmanager
def kubelet_reaper(stack, core_v1, namespace: str):
    """What a kubelet does and kwok does not: a pod being deleted goes once its
    containers stopped. kwok removes a deleted pod only when its grace period is
    over (the decode pods' is 600 s), whatever its process did; LWS cannot create
    the recreated group's pods (same names) until the old ones are gone. A pod
    whose process is no longer running (exited, or drained: preStop, SIGTERM) is
    deleted with grace 0 here."""
    stop = threading.Event()

    def live_uids() -> set[str]:
        with stack._lock:
            return {pp.uid for pp in [*stack.procs.values(), *stack.draining] if pp.alive()}

    def loop() -> None:
        while not stop.wait(0.5):
            try:
                pods = core_v1.list_namespaced_pod(namespace, label_selector=NAME_LABEL).items
                alive = live_uids()
                for pod in pods:
                    if pod.metadata.deletion_timestamp is not None and pod.metadata.uid not in alive:
                        core_v1.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
                        print(f"[reaper {time.strftime('%H:%M:%S')}] {pod.metadata.name} ({pod.metadata.uid[:8]}): "
                              "being deleted, no process running: removed")
            except Exception as exc:  # noqa: BLE001 - keep reaping
                print(f"[reaper] {exc!r}")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def chat_ok(router_url: str, served: str) -> None:
    pieces, models, done = stream_chat(router_url, served, "word " * 400, 8)
    assert done and len(pieces) == 8, pieces
    assert models == {served}


def test_deepseek_wide_ep_example(wide_nodes, kube_cluster, crd, namespace, tmp_path, router_py,  # noqa: F811
                                  custom_objects, core_v1):
    body = example(namespace)
    name, served = body["metadata"]["name"], body["spec"]["model"]["servedName"]
    pre_lws, dec_lws = f"{name}-prefill", f"{name}-decode"
    with running_stack(kube_cluster, namespace, tmp_path, router_py) as stack, \
            kubelet_reaper(stack, core_v1, namespace):
        t0 = time.monotonic()
        create(custom_objects, body)
        wait_ready(custom_objects, namespace, name, timeout=240)
        # every group complete: 2 prefill pods, 4 decode pods, one per extra node
        wait_for(lambda: lws_status(custom_objects, namespace, pre_lws).get("readyReplicas") == 1
                 and lws_status(custom_objects, namespace, dec_lws).get("readyReplicas") == 1, 120, "LWS groups ready")
        pods = group_pods(core_v1, namespace, pre_lws) + group_pods(core_v1, namespace, dec_lws)
        assert len(pods) == 6 and all(running(p) for p in pods), [(p.metadata.name, p.status.phase) for p in pods]
        assert {p.spec.node_name for p in pods} <= set(wide_nodes) and len({p.spec.node_name for p in pods}) == 6
        # the leaders serve only once their workers joined (sim rendezvous)
        (pre,) = stack.wait_serving("prefill", 1, timeout=120)
        (dec,) = stack.wait_serving("decode", 1, timeout=120)
        (router,) = stack.wait_serving("router", 1, timeout=90)
        assert pre.pod == f"{pre_lws}-0" and dec.pod == f"{dec_lws}-0"  # LWS leader pods: <lws>-<group>
        wait_for(lambda: decode_workers(router.url) == [dec.url], 90, "the router found the decode leader")
        print(f"\n[deepseek] Ready and serving in {time.monotonic() - t0:.1f}s: router {router.url}, "
              f"prefill leader {pre.url}, decode leader {dec.url}")
        obj = get_svc(custom_objects, namespace, name)
        print(f"[deepseek] status: {yaml.safe_dump(obj.get('status', {}).get('pools') or obj.get('status'))[:600]}")
        chat_ok(router.url, served)
        for pp in (pre, dec):
            log = pp.log_path.read_text()
            assert "joined" in log, log[-2000:]
        # every pod is scraped (the engine scrape keeps annotated pods with an http port) and serves
        # its own schedulers' series: with attention DP 16 over 2 nodes (prefill) and 32 over 4
        # (decode), each node the 8 DP groups whose first rank is on it, 8i..8i+7 on node i
        for lws in (pre_lws, dec_lws):
            for p in group_pods(core_v1, namespace, lws):
                i = int(p.metadata.labels[WORKER_INDEX])
                assert p.metadata.annotations.get("prometheus.io/scrape") == "true", p.metadata.name
                ranks = queue_ranks(f"http://{p.status.pod_ip}:{p.metadata.annotations['prometheus.io/port']}/metrics")
                assert ranks == [str(d) for d in range(8 * i, 8 * (i + 1))], (p.metadata.name, ranks)

        # a worker deleted by hand: LWS recreates its whole group (a new leader); serving again
        workers = [p for p in group_pods(core_v1, namespace, dec_lws) if p.metadata.labels.get(WORKER_INDEX) != "0"]
        leader_uid = next(p.metadata.uid for p in group_pods(core_v1, namespace, dec_lws)
                          if p.metadata.labels.get(WORKER_INDEX) == "0")
        t1 = time.monotonic()
        # deleted as `kubectl delete pod` does (its grace period): LWS recreates the group
        # from the pod it sees being deleted (pod_controller.go handleRestartPolicy,
        # PodDeleted). A grace-0 delete removes the pod at once and LWS may never see it
        core_v1.delete_namespaced_pod(workers[0].metadata.name, namespace)
        wait_for(lambda: any(p.metadata.labels.get(WORKER_INDEX) == "0" and p.metadata.uid != leader_uid
                             for p in group_pods(core_v1, namespace, dec_lws)), 120, "a new decode leader (group recreated)")
        wait_for(lambda: (ps := group_pods(core_v1, namespace, dec_lws)) and len(ps) == 4 and all(running(p) for p in ps)
                 and leader_uid not in {p.metadata.uid for p in ps}, 180, "the recreated decode group running")
        wait_ready(custom_objects, namespace, name, timeout=180)
        (new_dec,) = stack.wait_serving("decode", 1, timeout=150)
        assert new_dec.uid != leader_uid and new_dec.pod == f"{dec_lws}-0"
        wait_for(lambda: decode_workers(router.url) == [new_dec.url], 120, "the router found the new decode leader")
        chat_ok(router.url, served)
        # the old group's engines (and any worker started against its dying leader) exited:
        # a lost node takes the replica down, as the engines do; expected, not a crash
        group = {p.metadata.uid for p in group_pods(core_v1, namespace, dec_lws)}
        with stack._lock:
            down = [pp for pp in stack.exited if pp.role == "decode" and pp.uid not in group]
            assert all(pp.proc.returncode == 1 and "the replica is down" in pp.log_path.read_text() for pp in down), down
            stack.exited[:] = [pp for pp in stack.exited if pp not in down]
        print(f"[deepseek] old decode group's processes down: {sorted(pp.pod for pp in down)}")
        print(f"[deepseek] decode group recreated and serving again in {time.monotonic() - t1:.1f}s")

        # decode scale-up: one whole new group of 4 pods (group index 1)
        custom_objects.patch_namespaced_custom_object("pdserving.io", "v1alpha1", namespace, "pdinferenceservices", name,
                                                      {"spec": {"decode": {"replicas": 2}}})
        wait_for(lambda: lws_status(custom_objects, namespace, dec_lws).get("replicas") == 2
                 or len([p for p in group_pods(core_v1, namespace, dec_lws) if p.metadata.labels.get(GROUP_INDEX) == "1"]) > 0,
                 90, "the decode LWS scaled to 2")
        wait_for(lambda: len([p for p in group_pods(core_v1, namespace, dec_lws)
                              if p.metadata.labels.get(GROUP_INDEX) == "1"]) == 4, 120, "a whole new decode group of 4 pods")
        free = len(wide_nodes) - 6
        if free >= 4:
            wait_for(lambda: lws_status(custom_objects, namespace, dec_lws).get("readyReplicas") == 2, 180, "2 decode groups ready")
            wait_ready(custom_objects, namespace, name, timeout=180)
            leaders = stack.wait_serving("decode", 2, timeout=120)
            assert {pp.pod for pp in leaders} == {f"{dec_lws}-0", f"{dec_lws}-1"}
            wait_for(lambda: decode_workers(router.url) == sorted(pp.url for pp in leaders), 120,
                     "the router found both decode leaders")
            pods = group_pods(core_v1, namespace, dec_lws)
            assert len(pods) == 8 and len({p.spec.node_name for p in pods}) == 8
            chat_ok(router.url, served)
            print(f"[deepseek] decode scaled to 2 groups of 4 pods: Ready, router has {decode_workers(router.url)}")
        else:
            # 4 pods of 8 GPUs need 4 free nodes: the new group waits for them, the service says so
            time.sleep(5)
            placed = [p.spec.node_name for p in group_pods(core_v1, namespace, dec_lws)
                      if p.metadata.labels.get(GROUP_INDEX) == "1" and p.spec.node_name]
            assert len(placed) <= free, placed
            ready = condition(get_svc(custom_objects, namespace, name), "Ready")
            print(f"[deepseek] scale-up: a whole group of 4 pods created, {len(placed)} placed "
                  f"({free} extra nodes free); Ready: {ready and (ready['status'], ready.get('reason'), ready.get('message'))}")
            assert lws_status(custom_objects, namespace, dec_lws).get("readyReplicas") == 1
            chat_ok(router.url, served)  # the first group still serves
