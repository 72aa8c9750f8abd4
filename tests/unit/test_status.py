"""Status from observed children: conditions, reasons with the fix, columns."""

from __future__ import annotations

from pd_operator.api import validate_service
from pd_operator.controller.status import Observed, compute_status, merge_conditions, unschedulable_reason
from tests.conftest import minimal

NOW = "2026-11-30T10:00:00Z"


def sts(desired, ready, gen=1, observed=1, rev=("a", "a")):
    return {
        "metadata": {"generation": gen},
        "spec": {"replicas": desired},
        "status": {"replicas": desired, "readyReplicas": ready, "observedGeneration": observed,
                   "currentRevision": rev[0], "updateRevision": rev[1]},
    }


def deploy(want, ready):
    return {"spec": {"replicas": want}, "status": {"readyReplicas": ready}}


def pending_pod(name, message):
    return {"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def conds(status):
    return {c["type"]: c for c in status["conditions"]}


def test_all_ready():
    svc = validate_service(minimal(model={"name": "Qwen/Qwen3-8B", "servedName": "qwen"}))
    obs = Observed({"prefill": sts(2, 2), "decode": sts(1, 1)}, deploy(1, 1), {})
    st = compute_status(svc, obs, 3, None, NOW)
    c = conds(st)
    assert c["Ready"]["status"] == "True" and "qwen" in c["Ready"]["message"]
    assert c["Progressing"]["status"] == "False" and c["Degraded"]["status"] == "False"
    assert st["prefillReady"] == "2/2" and st["decodeReady"] == "1/1"
    assert st["endpoint"] == "http://svc-router.ns.svc:8000/v1"
    assert st["observedGeneration"] == 3
    assert all(x["observedGeneration"] == 3 and x["lastTransitionTime"] == NOW for x in st["conditions"])
    assert st["conditions"][0]["type"] == "Ready"


def test_pending_for_gpus_says_why_and_what_to_do():
    svc = validate_service(minimal(prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 4}))
    msg = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: 4 No preemption victims found for incoming pod."
    obs = Observed({"prefill": sts(3, 2), "decode": sts(1, 1)}, deploy(1, 1), {"prefill": [pending_pod("svc-prefill-2", msg)]})
    st = compute_status(svc, obs, 1, None, NOW)
    c = conds(st)
    assert c["PrefillReady"]["reason"] == "Unschedulable"
    assert "needs 4" in c["PrefillReady"]["message"] and "nvidia.com/gpu" in c["PrefillReady"]["message"]
    assert c["Degraded"]["status"] == "True" and c["Ready"]["status"] == "False"
    assert st["prefill"]["pendingReplicas"] == 1


def test_unschedulable_reasons_map_to_fixes():
    svc = validate_service(minimal(prefill={"gpuProduct": "NVIDIA-B200"}, kvTransfer={"rdma": {"resourceName": "rdma/ib"}}, topology={"colocate": "required"}))
    assert "NVIDIA-B200" in unschedulable_reason(svc, "prefill", "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.")
    assert "device plugin" in unschedulable_reason(svc, "decode", "0/4 nodes are available: 4 Insufficient rdma/ib.")
    assert "colocate preferred" in unschedulable_reason(svc, "decode", "0/4 nodes are available: 4 node(s) didn't match pod affinity rules.")
    assert "tolerations" in unschedulable_reason(svc, "decode", "0/4 nodes are available: 4 node(s) had untolerated taint {gpu: true}.")


def test_missing_secret_is_degraded_with_the_command_to_fix():
    svc = validate_service(minimal(engine={"kind": "vllm", "apiKeySecretRef": {"name": "key"}}))
    obs = Observed({"prefill": sts(1, 1), "decode": sts(1, 1)}, deploy(1, 1), {},
                   missing_secrets=[("spec.engine.apiKeySecretRef", "Secret ns/key not found: create it")])
    c = conds(compute_status(svc, obs, 1, None, NOW))
    assert c["Ready"]["reason"] == "SecretNotFound" and "spec.engine.apiKeySecretRef" in c["Ready"]["message"]


def test_router_without_workers():
    svc = validate_service(minimal())
    obs = Observed({"prefill": sts(1, 0), "decode": sts(1, 1)}, deploy(1, 1), {})
    c = conds(compute_status(svc, obs, 1, None, NOW))
    assert c["RouterReady"]["reason"] == "NoReadyWorkers" and "prefill" in c["RouterReady"]["message"]
    assert c["PrefillReady"]["reason"] == "Starting"


def test_rollout_is_progressing():
    svc = validate_service(minimal())
    obs = Observed({"prefill": sts(1, 1, rev=("a", "b")), "decode": sts(1, 1, gen=2, observed=1)}, deploy(1, 1), {})
    c = conds(compute_status(svc, obs, 1, None, NOW))
    assert c["Progressing"]["status"] == "True" and "prefill and decode" in c["Progressing"]["message"]


def test_invalid_spec_status():
    obs = Observed({}, None, {}, spec_error=[("spec.engine.extraArgs", "vllm 0.33.0 has no flag --watermark")])
    st = compute_status(None, obs, 5, {"prefillReady": "1/1"}, NOW)
    c = conds(st)
    assert c["Ready"]["reason"] == "InvalidSpec" and "--watermark" in c["Ready"]["message"]
    assert st["prefillReady"] == "1/1"  # last known figures kept


def test_transition_time_kept_while_status_unchanged():
    first = merge_conditions([], [{"type": "Ready", "status": "True"}], "t1")
    again = merge_conditions(first, [{"type": "Ready", "status": "True"}], "t2")
    flip = merge_conditions(again, [{"type": "Ready", "status": "False"}], "t3")
    assert again[0]["lastTransitionTime"] == "t1" and flip[0]["lastTransitionTime"] == "t3"


def test_scale_reason_and_time_recorded_and_kept():
    svc = validate_service(minimal())
    obs = Observed({"prefill": sts(2, 1), "decode": sts(1, 1)}, deploy(1, 1), {}, scaled={"prefill": "prefill pool scaled from 1 to 2 replicas: spec.prefill.replicas is 2"})
    st = compute_status(svc, obs, 2, None, NOW)
    assert st["prefill"]["lastScaleTime"] == NOW and "from 1 to 2" in st["prefill"]["lastScaleReason"]
    later = compute_status(svc, Observed({"prefill": sts(2, 2), "decode": sts(1, 1)}, deploy(1, 1), {}), 2, st, "2026-11-30T11:00:00Z")
    assert later["prefill"]["lastScaleTime"] == NOW and "lastScaleTime" not in later["decode"]


PSA_MESSAGE = ('create Pod svc-prefill-0 in StatefulSet svc-prefill failed error: pods "svc-prefill-0" is forbidden: '
               'violates PodSecurity "baseline:latest": non-default capabilities (container "engine" must not include '
               '"IPC_LOCK" in securityContext.capabilities.add)')


def failed_create(message, count=3):
    return {"type": "Warning", "reason": "FailedCreate", "message": message, "count": count,
            "involvedObject": {"kind": "StatefulSet", "name": "svc-prefill"},
            "lastTimestamp": "2026-11-30T09:59:00Z"}


def test_pod_security_refusal_of_the_statefulset_says_which_level_and_the_fix():
    """The StatefulSet controller reports a refused pod create only as a FailedCreate event on the StatefulSet;
    status carries it with the Pod Security level the namespace needs."""
    svc = validate_service(minimal(kvTransfer={"rdma": {"resourceName": "rdma/hca", "ibDevices": ["mlx5_0"]}}))
    empty = {"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {"replicas": 0, "observedGeneration": 1}}
    obs = Observed({"prefill": empty, "decode": sts(1, 1)}, deploy(1, 1), {},
                   create_failures={"prefill": [failed_create(PSA_MESSAGE)]})
    c = conds(compute_status(svc, obs, 1, None, NOW))
    assert c["PrefillReady"]["status"] == "False"
    assert c["PrefillReady"]["reason"] == "PodSecurityForbidden"
    msg = c["PrefillReady"]["message"]
    assert "IPC_LOCK" in msg and "pod-security.kubernetes.io/enforce=privileged" in msg and "kvTransfer.rdma" in msg
    assert c["Degraded"]["status"] == "True"


def test_other_create_failures_are_reported_verbatim():
    svc = validate_service(minimal())
    empty = {"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {"replicas": 0, "observedGeneration": 1}}
    quota = 'create Pod svc-prefill-0 in StatefulSet svc-prefill failed error: pods "svc-prefill-0" is forbidden: exceeded quota: gpus'
    obs = Observed({"prefill": empty, "decode": sts(1, 1)}, deploy(1, 1), {}, create_failures={"prefill": [failed_create(quota)]})
    c = conds(compute_status(svc, obs, 1, None, NOW))
    assert c["PrefillReady"]["reason"] == "FailedCreate" and "exceeded quota" in c["PrefillReady"]["message"]
    # once the pods exist, an old event no longer decides the condition
    obs = Observed({"prefill": sts(1, 1), "decode": sts(1, 1)}, deploy(1, 1), {}, create_failures={"prefill": [failed_create(quota)]})
    assert conds(compute_status(svc, obs, 1, None, NOW))["PrefillReady"]["status"] == "True"


def loading_pod(name, started_at, restarts=0, last=None):
    cs = {"name": "engine", "ready": False, "started": False, "restartCount": restarts,
          "state": {"running": {"startedAt": started_at}}}
    if last:
        cs["lastState"] = {"terminated": {"startedAt": last[0], "finishedAt": last[1], "exitCode": 137, "reason": "Error"}}
    return {"metadata": {"name": name}, "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
                                                   "containerStatuses": [cs]}}


def test_pods_loading_the_model_show_the_startup_budget_used():
    svc = validate_service(minimal())
    pods = [loading_pod("svc-decode-0", "2026-11-30T09:56:00Z"), loading_pod("svc-decode-1", "2026-11-30T09:57:30Z")]
    obs = Observed({"prefill": sts(1, 1), "decode": sts(3, 1)}, deploy(1, 1), {"decode": pods})
    c = conds(compute_status(svc, obs, 1, None, NOW))
    assert c["DecodeReady"]["reason"] == "Starting"
    assert "2 pod(s) still loading the model, 4m of 30m startup budget used" in c["DecodeReady"]["message"]
    assert "spec.model.startupSeconds" in c["DecodeReady"]["message"]


def test_a_pod_restarted_at_the_startup_budget_says_to_raise_it():
    svc = validate_service(minimal(model={"name": "Qwen/Qwen3-8B", "startupSeconds": 600}))
    pods = [loading_pod("svc-prefill-0", "2026-11-30T09:59:00Z", restarts=1,
                        last=("2026-11-30T09:48:50Z", "2026-11-30T09:58:55Z"))]
    obs = Observed({"prefill": sts(1, 0), "decode": sts(1, 1)}, deploy(1, 1), {"prefill": pods})
    msg = conds(compute_status(svc, obs, 1, None, NOW))["PrefillReady"]["message"]
    assert "1 pod(s) still loading the model, 1m of 10m startup budget used" in msg
    assert "restarted" in msg and "raise spec.model.startupSeconds" in msg and "model.cache" in msg


def test_pods_pulling_the_weights_image_are_not_counted_against_the_budget():
    svc = validate_service(minimal(model={"name": "Qwen/Qwen3-8B", "cache": {"kind": "image", "reference": "r.example.com/w:1"}}))
    creating = {"metadata": {"name": "svc-decode-0"}, "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "engine", "ready": False, "started": False, "restartCount": 0,
                                       "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    obs = Observed({"prefill": sts(1, 1), "decode": sts(2, 0)}, deploy(1, 1),
                   {"decode": [creating, loading_pod("svc-decode-1", "2026-11-30T09:58:00Z")]})
    msg = conds(compute_status(svc, obs, 1, None, NOW))["DecodeReady"]["message"]
    assert "1 pod(s) still loading the model, 2m of 30m" in msg
    assert "1 pod(s) not started yet" in msg and "model.cache.reference" in msg
