"""Engine pods are not BestEffort: default CPU/memory/ephemeral-storage
requests sized from the GPU count, overridable per key; /dev/shm size a field."""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from tests.conftest import minimal


def sts(objs, role):
    return next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == f"svc-{role}")


def engine(objs, role):
    return sts(objs, role)["spec"]["template"]["spec"]["containers"][0]


def qos_class(pod_spec: dict) -> str:
    """Kubernetes' QoS rule (pkg/apis/core/helper/qos/qos.go, GetPodQOS): only
    cpu and memory count; no request or limit on them in any container is
    BestEffort; limits equal to requests for both in every container is
    Guaranteed; anything else Burstable."""
    compute = ("cpu", "memory")
    any_set, guaranteed = False, True
    for c in pod_spec.get("containers", []) + pod_spec.get("initContainers", []):
        req = {k: str(v) for k, v in (c.get("resources", {}).get("requests") or {}).items() if k in compute}
        lim = {k: str(v) for k, v in (c.get("resources", {}).get("limits") or {}).items() if k in compute}
        any_set = any_set or bool(req) or bool(lim)
        if set(lim) != set(compute) or any(req.get(k, lim[k]) != lim[k] for k in compute):
            guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def gi(q) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for u, f in units.items():
        if str(q).endswith(u):
            return float(str(q)[:-2]) * f / 2**30
    return float(q) / 2**30


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_engine_pods_are_not_best_effort_by_default(kind):
    objs = render(validate_service(minimal(kind)))
    for role in ("prefill", "decode"):
        spec = sts(objs, role)["spec"]["template"]["spec"]
        assert qos_class(spec) == "Burstable", role
        req = spec["containers"][0]["resources"]["requests"]
        assert {"cpu", "memory", "ephemeral-storage"} <= set(req)
        # No memory limit by default: an engine is not OOM-killed at its request.
        assert "memory" not in spec["containers"][0]["resources"]["limits"]


def test_default_requests_grow_with_the_gpus_and_cover_shm():
    objs = render(validate_service(minimal(prefill={"tensorParallelSize": 2}, decode={"tensorParallelSize": 8})))
    p, d = engine(objs, "prefill")["resources"]["requests"], engine(objs, "decode")["resources"]["requests"]
    assert int(d["cpu"]) == 4 * int(p["cpu"])
    # /dev/shm is tmpfs, charged to the pod's memory: the request covers it.
    shm = next(v for v in sts(objs, "decode")["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
    assert gi(d["memory"]) > gi(p["memory"]) > gi(shm["emptyDir"]["sizeLimit"])
    assert gi(d["memory"]) - gi(p["memory"]) == pytest.approx(6 * (gi(p["memory"]) - gi(shm["emptyDir"]["sizeLimit"])) / 2)


def test_lmcache_cpu_tier_is_in_the_memory_request():
    base = engine(render(validate_service(minimal(kvTransfer={"backend": "lmcache"}, prefill={"tensorParallelSize": 2}, decode={"tensorParallelSize": 2}))), "decode")
    big = engine(render(validate_service(minimal(kvTransfer={"backend": "lmcache", "lmcache": {"maxLocalCpuSizeGb": 100}},
                                                 prefill={"tensorParallelSize": 2}, decode={"tensorParallelSize": 2}))), "decode")
    # 95 GB more per engine worker (one per GPU), in GiB, rounded up.
    assert gi(big["resources"]["requests"]["memory"]) - gi(base["resources"]["requests"]["memory"]) >= 2 * 95e9 / 2**30


def test_user_requests_and_limits_win_key_by_key():
    objs = render(validate_service(minimal(decode={"resources": {"requests": {"cpu": "30"}, "limits": {"memory": "64Gi"}}})))
    res = engine(objs, "decode")["resources"]
    assert res["requests"]["cpu"] == "30"
    # A limit without a request: Kubernetes takes the limit as the request, so no default is added.
    assert "memory" not in res["requests"] and res["limits"]["memory"] == "64Gi"
    assert "ephemeral-storage" in res["requests"]


def test_shm_size_is_a_pool_field():
    objs = render(validate_service(minimal(decode={"shmSize": "64Gi"})))
    vols = {v["name"]: v for v in sts(objs, "decode")["spec"]["template"]["spec"]["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert gi(engine(objs, "decode")["resources"]["requests"]["memory"]) >= 64 + 32
    p_vols = {v["name"]: v for v in sts(objs, "prefill")["spec"]["template"]["spec"]["volumes"]}
    assert p_vols["dshm"]["emptyDir"]["sizeLimit"] == "16Gi"


def test_shm_size_must_be_a_quantity():
    with pytest.raises(SpecError) as e:
        validate_service(minimal(decode={"shmSize": "lots"}))
    assert "decode.shmSize" in str(e.value) and "should match pattern" in str(e.value)
