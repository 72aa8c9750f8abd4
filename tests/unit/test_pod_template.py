"""The per-pool pod-template overlay (spec.<pool>.podTemplate): merged into the
rendered pod like a strategic merge patch, refused where it would change what
the operator owns (engine command/args, GPU/RDMA resources, the ports the
router and peers use, the labels selectors use)."""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from tests.conftest import minimal
from tests.unit.test_render import by_kind

OVERLAY = {
    "metadata": {"labels": {"team": "a"}, "annotations": {"example.com/owner": "ml"}},
    "spec": {
        "serviceAccountName": "weights-reader",
        "imagePullSecrets": [{"name": "regcred"}],
        "hostNetwork": True,
        "securityContext": {"fsGroup": 1000},
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "initContainers": [{"name": "warm", "image": "busybox:1.37", "command": ["true"]}],
        "containers": [
            {"name": "engine",
             "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
             "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
             "resources": {"requests": {"cpu": "32"}}},
            {"name": "log-shipper", "image": "fluent/fluent-bit:4.0", "ports": [{"name": "fb", "containerPort": 2020}]},
        ],
    },
}


def pod(objs, role="prefill"):
    return by_kind(objs)[("StatefulSet", f"svc-{role}")]["spec"]["template"]


def render_with(role="prefill", overlay=OVERLAY, **spec):
    return render(validate_service(minimal(**{role: {"podTemplate": overlay}}, **spec)))


def test_overlay_is_merged_by_name_into_the_pod():
    objs = render_with()
    tmpl = pod(objs)
    ps = tmpl["spec"]
    assert tmpl["metadata"]["labels"]["team"] == "a"
    assert tmpl["metadata"]["labels"]["pdserving.io/role"] == "prefill"          # operator labels kept
    assert tmpl["metadata"]["annotations"]["example.com/owner"] == "ml"
    assert "prometheus.io/scrape" in tmpl["metadata"]["annotations"]
    assert ps["serviceAccountName"] == "weights-reader"
    assert ps["imagePullSecrets"] == [{"name": "regcred"}]
    assert ps["hostNetwork"] is True
    assert ps["dnsPolicy"] == "ClusterFirstWithHostNet"   # peers' headless names still resolve
    assert ps["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 1000}
    assert [v["name"] for v in ps["volumes"]] == ["dshm", "hf-cache", "scratch"]
    assert [c["name"] for c in ps["containers"]] == ["engine", "log-shipper"]
    assert [c["name"] for c in ps["initContainers"]] == ["warm"]
    engine = ps["containers"][0]
    env = {e["name"]: e for e in engine["env"]}
    assert env["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "INFO"} and "POD_IP" in env
    assert {"name": "scratch", "mountPath": "/scratch"} in engine["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    assert engine["resources"]["requests"]["cpu"] == "32"
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == 1            # GPUs untouched
    assert engine["command"] == pod(render(validate_service(minimal())))["spec"]["containers"][0]["command"]
    # the other pool is untouched
    assert "hostNetwork" not in pod(objs, "decode")["spec"]


def test_overlay_replaces_an_env_entry_in_place():
    objs = render_with(overlay={"spec": {"containers": [{"name": "engine", "env": [{"name": "HF_HOME", "value": "/x"}]}]}})
    env = pod(objs)["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("HF_HOME") == 1 and {"name": "HF_HOME", "value": "/x"} in env
    assert names.index("HF_HOME") == [e["name"] for e in pod(render(validate_service(minimal())))["spec"]["containers"][0]["env"]].index("HF_HOME")


@pytest.mark.parametrize("overlay, field, fix", [
    ({"spec": {"containers": [{"name": "engine", "command": ["bash"]}]}},
     "spec.prefill.podTemplate.spec.containers[engine].command", "extraArgs"),
    ({"spec": {"containers": [{"name": "engine", "args": ["--port", "1"]}]}},
     "spec.prefill.podTemplate.spec.containers[engine].args", "extraArgs"),
    ({"spec": {"containers": [{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}},
     "spec.prefill.podTemplate.spec.containers[engine].resources.limits[nvidia.com/gpu]", "tensorParallelSize"),
    ({"spec": {"containers": [{"name": "engine", "resources": {"requests": {"rdma/ib": 2}}}]}},
     "spec.prefill.podTemplate.spec.containers[engine].resources.requests[rdma/ib]", "kvTransfer.rdma"),
    ({"spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 9000}]}]}},
     "spec.prefill.podTemplate.spec.containers[engine].ports", "port"),
    ({"spec": {"containers": [{"name": "sidecar", "image": "x", "ports": [{"containerPort": 8000}]}]}},
     "spec.prefill.podTemplate.spec.containers[sidecar].ports", "8000"),
    ({"spec": {"containers": [{"name": "sidecar", "image": "x", "ports": [{"containerPort": 5600}]}]}},
     "spec.prefill.podTemplate.spec.containers[sidecar].ports", "NIXL"),
    ({"spec": {"containers": [{"name": "sidecar", "image": "x", "ports": [{"name": "http", "containerPort": 9100}]}]}},
     "spec.prefill.podTemplate.spec.containers[sidecar].ports", "port name http"),
    ({"metadata": {"labels": {"pdserving.io/role": "decode"}}},
     "spec.prefill.podTemplate.metadata.labels[pdserving.io/role]", "selector"),
    ({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
     "spec.prefill.podTemplate.spec.volumes[dshm]", "shmSize"),
    ({"spec": {"terminationGracePeriodSeconds": 5}},
     "spec.prefill.podTemplate.spec.terminationGracePeriodSeconds", "prefill.terminationGracePeriodSeconds"),
])
def test_owned_fields_are_refused_with_the_field_and_the_fix(overlay, field, fix):
    spec = {"kvTransfer": {"rdma": {"resourceName": "rdma/ib"}}}
    with pytest.raises(SpecError) as err:
        render_with(overlay=overlay, **spec)
    fields = dict(err.value.problems)
    assert field in fields, err.value.problems
    assert fix in fields[field]


@pytest.mark.parametrize("overlay, field", [
    ({"spec": {"containers": {"name": "engine"}}}, "spec.prefill.podTemplate.spec.containers"),
    ({"spec": {"hostNetwrk": True}}, "spec.prefill.podTemplate.spec.hostNetwrk"),
    ({"spec": {"hostNetwork": "yes"}}, "spec.prefill.podTemplate.spec.hostNetwork"),
    ({"spec": {"volumes": [{"emptyDir": {}}]}}, "spec.prefill.podTemplate.spec.volumes[0].name"),
    ({"spec": {"containers": [{"name": "sidecar"}]}}, "spec.prefill.podTemplate.spec.containers[sidecar].image"),
    ({"spec": {"containers": [{"name": "engine", "imagePullPolicyy": "Always"}]}},
     "spec.prefill.podTemplate.spec.containers[engine].imagePullPolicyy"),
    ({"metadata": {"name": "x"}}, "spec.prefill.podTemplate.metadata.name"),
    ({"metadata": {"labels": {"a": 1}}}, "spec.prefill.podTemplate.metadata.labels[a]"),
    ({"status": {}}, "spec.prefill.podTemplate.status"),
])
def test_shape_is_checked_without_the_api_server(overlay, field):
    with pytest.raises(SpecError) as err:
        validate_service(minimal(prefill={"podTemplate": overlay}))
    assert field in dict(err.value.problems), err.value.problems


@pytest.mark.parametrize("overlay, field", [
    ({"spec": {"containers": [{"name": "engine", "env": [{"name": ["X"], "value": "1"}]}]}},
     "spec.decode.podTemplate.spec.containers[engine].env[0].name"),
    ({"spec": {"volumes": [{"name": ["v"], "emptyDir": {}}]}}, "spec.decode.podTemplate.spec.volumes[0].name"),
    ({"spec": {"containers": [{"name": "engine", "volumeMounts": [{"name": "v", "mountPath": ["/x"]}]}]}},
     "spec.decode.podTemplate.spec.containers[engine].volumeMounts[0].mountPath"),
    ({"spec": {"containers": [{"name": "engine", "volumeMounts": [{"name": ["v"], "mountPath": "/x"}]}]}},
     "spec.decode.podTemplate.spec.containers[engine].volumeMounts[0].name"),
    ({"spec": {"containers": [{"name": "engine", "ports": [{"containerPort": [1234]}]}]}},
     "spec.decode.podTemplate.spec.containers[engine].ports[0].containerPort"),
    ({"spec": {"containers": [{"name": "engine", "ports": [{"containerPort": "1234"}]}]}},
     "spec.decode.podTemplate.spec.containers[engine].ports[0].containerPort"),
    ({"spec": {"containers": [{"name": "engine", "ports": [{"containerPort": 1234, "name": {"a": 1}}]}]}},
     "spec.decode.podTemplate.spec.containers[engine].ports[0].name"),
    ({"spec": {"topologySpreadConstraints": [{"topologyKey": ["zone"], "maxSkew": 1}]}},
     "spec.decode.podTemplate.spec.topologySpreadConstraints[0].topologyKey"),
    ({"spec": {"imagePullSecrets": [{"name": ["regcred"]}]}}, "spec.decode.podTemplate.spec.imagePullSecrets[0].name"),
])
def test_a_merge_key_of_the_wrong_type_is_refused_not_a_crash(overlay, field):
    """The CRD keeps the overlay as preserve-unknown-fields, so only this check stands between
    a list or object where a name, path or port goes and the merge, which indexes entries by
    it: the render raised TypeError (unhashable), so the webhook answered HTTP 400, which the
    API server treats as a webhook failure and, with failurePolicy Ignore, admits the spec;
    and every reconcile of it crashed before writing any status (no InvalidSpec, no event)."""
    from pd_operator.controller.webhook import review

    bad = minimal(decode={"podTemplate": overlay})
    with pytest.raises(SpecError) as err:
        validate_service(bad)
    assert field in dict(err.value.problems), err.value.problems
    out = review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u", "operation": "CREATE", "namespace": "ns", "object": bad}})["response"]
    assert out["allowed"] is False and field in out["status"]["message"]
