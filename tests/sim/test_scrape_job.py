"""The scrape job we ship (manifests/prometheus/scrape-engines.yaml), run by real Prometheus
on the pods the operator renders, as Kubernetes service discovery would describe them.

Its ``kubernetes_sd_configs`` are swapped for a file of targets that carry the same
``__meta_kubernetes_*`` labels the pod discovery sets (one target per declared container
port, the pod's labels and annotations with their names sanitized as Prometheus does), taken
from the rendered pod templates plus what LeaderWorkerSet adds to its pods (group key,
worker index). Each pod's metrics are an :class:`~tests.sim.conftest.Exporter` on a
loopback address at the port its annotation names. What is asserted: which pods the job
keeps, the labels their series get, and what the autoscaler's per-replica queue reads from
them.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from pd_operator.api import validate_service
from pd_operator.autoscale import promql
from pd_operator.render import render
from tests.conftest import ROOT, minimal, prometheus_binary
from tests.sim.conftest import Exporter, Procs, loopback_host, query, start_prometheus_with
from tests.unit.test_multinode import sglang_wide_ep, vllm_wide_ep

pytestmark = pytest.mark.skipif(prometheus_binary() is None, reason="needs prometheus (tests/run.sh builds it)")

LWS_GROUP_KEY, LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/group-key", "leaderworkerset.sigs.k8s.io/worker-index"


def sanitized(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def templates(obj: dict, role: str) -> list[tuple[str, dict]]:
    """(kind of pod, pod template) of a role's workload: a StatefulSet's, or an LWS's leader and worker."""
    (w,) = [o for o in render(validate_service(obj)) if o["kind"] in ("StatefulSet", "LeaderWorkerSet")
            and o["metadata"]["labels"].get("pdserving.io/role") == role]
    if w["kind"] == "StatefulSet":
        return [("pod", w["spec"]["template"])]
    lws = w["spec"]["leaderWorkerTemplate"]
    return [("leader", lws["leaderTemplate"]), ("worker", lws["workerTemplate"])]


def discovered(template: dict, name: str, ip: str, more_labels: dict) -> list[dict]:
    """The targets the pod role of kubernetes_sd gives for a pod of ``template``: one per container port."""
    meta = {"__meta_kubernetes_namespace": "ns", "__meta_kubernetes_pod_name": name,
            "__meta_kubernetes_pod_ip": ip, "__meta_kubernetes_pod_phase": "Running"}
    for k, v in {**template["metadata"].get("labels", {}), **more_labels}.items():
        meta[f"__meta_kubernetes_pod_label_{sanitized(k)}"] = v
    for k, v in template["metadata"].get("annotations", {}).items():
        meta[f"__meta_kubernetes_pod_annotation_{sanitized(k)}"] = v
    out = []
    for c in template["spec"]["containers"]:
        for p in c.get("ports", []):
            out.append({"targets": [f"{ip}:{p['containerPort']}"],
                        "labels": {**meta, "__meta_kubernetes_pod_container_port_name": p["name"]}})
    return out


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_shipped_job_scrapes_sglang_workers_with_their_group_and_not_vllm_headless_ones(tmp_path, jobs):
    """``jobs`` 2: a second job scrapes the same pods (the annotations invite a generic one): a
    replica's queue is still its own, not its two jobs' sum."""
    job = yaml.safe_load((ROOT / "manifests/prometheus/scrape-engines.yaml").read_text())[0]
    pods = []  # (service, role, pod name, template, LWS labels, waiting requests by dp_rank)
    for role_kind, tmpl in templates(sglang_wide_ep(), "decode"):
        for group, waiting in (("3f9a", {"leader": (2.0, 1.0), "worker": (3.0, 0.0)}),
                               ("c04e", {"leader": (1.0, 0.0), "worker": (0.0, 0.0)})):
            index = "0" if role_kind == "leader" else "1"
            pods.append(("wide", role_kind, f"wide-decode-{group}-{index}", tmpl,
                         {LWS_GROUP_KEY: group, LWS_WORKER_INDEX: index}, waiting[role_kind]))
    (one,) = templates(minimal("sglang"), "decode")
    pods.append(("one", "pod", "one-decode-0", one[1], {}, (4.0, 0.0)))
    for role_kind, tmpl in templates(vllm_wide_ep(), "decode"):
        pods.append(("vwide", role_kind, f"vwide-decode-0-{role_kind}", tmpl, {LWS_GROUP_KEY: "77aa"}, ()))  # its page: none of these

    procs, exporters, file_targets = Procs(), [], []
    try:
        for svc, role_kind, name, tmpl, lws_labels, waiting in pods:
            # every example is named svc: the pods of each get their own service's label
            tmpl = {**tmpl, "metadata": {**tmpl["metadata"], "labels": {**tmpl["metadata"]["labels"],
                                                                         "pdserving.io/service": svc}}}
            ip = loopback_host()
            port = int(tmpl["metadata"].get("annotations", {}).get("prometheus.io/port", 0))
            page = {f'sglang:num_queue_reqs{{dp_rank="{r}"}}': w for r, w in enumerate(waiting)}
            exporters.append(Exporter(lambda _n, _t, page=page: page, host=ip, port=port))
            file_targets += discovered(tmpl, name, ip, lws_labels)
        sd = tmp_path / "pods.json"
        sd.write_text(json.dumps(file_targets))
        job = {**job, "scrape_interval": "1s", "file_sd_configs": [{"files": [str(sd)]}]}
        del job["kubernetes_sd_configs"]
        kept = 4 + 1 + 1  # the SGLang leaders and workers, the StatefulSet pod, the vLLM leader
        url = start_prometheus_with(procs, tmp_path, [job, {**job, "job_name": "generic"}][:jobs], kept * jobs)

        up = {r["metric"]["pod"]: r["metric"] for r in query(url, "up == 1")}
        assert set(up) == {p[2] for p in pods if p[1] != "worker" or p[0] != "vwide"}  # vLLM's worker serves nothing
        worker = up["wide-decode-3f9a-1"]
        assert (worker["namespace"], worker["pdserving_io_service"], worker["pdserving_io_role"]) == ("ns", "wide", "decode")
        assert (worker["leaderworkerset_sigs_k8s_io_group_key"], worker["leaderworkerset_sigs_k8s_io_worker_index"]) == ("3f9a", "1")
        assert up["wide-decode-3f9a-0"]["leaderworkerset_sigs_k8s_io_worker_index"] == "0"
        assert "leaderworkerset_sigs_k8s_io_group_key" not in up["one-decode-0"]

        def signal(q) -> dict[str, float]:
            return {r["metric"]["pdserving_io_service"]: float(r["value"][1]) for r in query(url, q.promql)}

        # per replica, its leader's and worker's DP groups together: (2+1+3+0) and (1+0+0+0)
        assert signal(promql.secondary_query("sglang", "decode", "queueDepth", "5s")) == {
            "wide": pytest.approx((6 + 1) / 2), "one": pytest.approx(4)}
        if jobs == 1:  # the sums take each series once per job
            assert signal(promql.load_query("sglang", "decode", "waiting_total", "5s")) == {
                "wide": pytest.approx(7), "one": pytest.approx(4)}
    finally:
        procs.stop()
        for e in exporters:
            e.close()
