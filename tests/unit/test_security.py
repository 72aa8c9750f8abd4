"""Issue 19: what a tenant's spec can make the operator render.

- $( in extraArgs is refused (the kubelet would expand it from the env, Secrets
  included, into the process list); the engine and router keys never travel
  in argv: the launcher appends them inside the process, proven by running it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from pd_operator.render.launch import LAUNCHER
from tests.conftest import minimal

KEY = {"apiKeySecretRef": {"name": "engine-key", "key": "api-key"}}


def containers(objs):
    for obj in objs:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            for c in obj["spec"]["template"]["spec"]["containers"]:
                yield obj, c


@pytest.mark.parametrize("where, spec, field", [
    ("engine", {"engine": {"kind": "vllm", "extraArgs": ["--root-path=$(HF_TOKEN)"]}}, "spec.engine.extraArgs[0]"),
    ("pool", {"decode": {"extraArgs": ["--enforce-eager", "--root-path", "$(HF_TOKEN)"]}}, "spec.decode.extraArgs[2]"),
    ("router", {"router": {"extraArgs": ["--log-level", "$(ROUTER_WORKER_API_KEY)"]}}, "spec.router.extraArgs[1]"),
])
def test_dollar_paren_in_extra_args_is_refused_naming_the_field(where, spec, field):
    obj = minimal()
    for k, v in spec.items():
        obj["spec"][k] = {**obj["spec"].get(k, {}), **v}
    with pytest.raises(SpecError) as err:
        render(validate_service(obj))
    fields = dict(err.value.problems)
    assert field in fields and "$(" in fields[field] and "environment variable" in fields[field]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_no_secret_is_expanded_into_any_command_line(kind):
    objs = render(validate_service(minimal(kind, engine={"kind": kind, **KEY})))
    secret_vars = set()
    for _, c in containers(objs):
        secret_vars |= {e["name"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
        assert not any("$(" in a for a in [*c.get("command", []), *c.get("args", [])]), c["command"]
    assert secret_vars  # the keys are there, through the environment only


def test_the_launcher_passes_the_key_to_the_program_but_not_to_the_command_line(tmp_path):
    """Run the rendered router launcher for real, on a stand-in module that
    reports what the program parses (sys.argv) and what `ps` shows (/proc)."""
    objs = render(validate_service(minimal("sglang", engine={"kind": "sglang", **KEY})))
    (router,) = [c for o, c in containers(objs) if o["kind"] == "Deployment"]
    argv = router["command"]
    assert argv[1:3] == ["-c", LAUNCHER]
    module = argv[3]
    pkg = tmp_path / module.split(".")[0]
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / (module.split(".")[1] + ".py")).write_text(
        "import sys\n"
        "if __name__ == '__main__':\n"
        "    print(repr(sys.argv[1:]))\n"
        "    print(open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode())\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), "ROUTER_WORKER_API_KEY": "s3cret-key"}
    out = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=30, check=True)
    parsed, cmdline = out.stdout.splitlines()[:2]
    parsed = eval(parsed)  # noqa: S307 - our own repr
    assert parsed[-2:] == ["--api-key", "s3cret-key"] and parsed[:2] == ["--host", "0.0.0.0"]
    assert "s3cret-key" not in cmdline and "ROUTER_WORKER_API_KEY" in cmdline


# --- engine pods: securityContext and the Pod Security level each configuration needs ---

# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards),
# the container fields the operator renders; enough to tell the level of our pods.
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def pss_level(pod_spec: dict) -> str:
    """The strictest Pod Security level a pod template meets (restricted, baseline, privileged)."""
    if pod_spec.get("hostNetwork") or pod_spec.get("hostPID") or pod_spec.get("hostIPC"):
        return "privileged"
    if any("hostPath" in v for v in pod_spec.get("volumes", [])):
        return "privileged"
    level = "restricted"
    pod_sc = pod_spec.get("securityContext", {})
    for c in pod_spec["containers"]:
        sc = c.get("securityContext", {})
        caps = sc.get("capabilities", {})
        if sc.get("privileged") or set(caps.get("add", [])) - BASELINE_CAPS:
            return "privileged"
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if (sc.get("allowPrivilegeEscalation") is not False or "ALL" not in caps.get("drop", [])
                or set(caps.get("add", [])) - {"NET_BIND_SERVICE"} or not non_root
                or seccomp not in ("RuntimeDefault", "Localhost")):
            level = "baseline"
    return level


def engine_pods(obj):
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in render(validate_service(obj))
            if o["kind"] == "StatefulSet"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_engine_pods_drop_privileges_and_mount_no_token(kind):
    for name, pod in engine_pods(minimal(kind, engine={"kind": kind})):
        assert pod["automountServiceAccountToken"] is False, name
        (c,) = pod["containers"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pss_level(pod) == "baseline"


def test_rdma_pods_add_only_ipc_lock_and_need_privileged():
    rdma = {"backend": "nixl", "rdma": {"resourceName": "rdma/rdma_shared_device_a", "ibDevices": ["mlx5_0"]}}
    for name, pod in engine_pods(minimal(kvTransfer=rdma)):
        (c,) = pod["containers"]
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert pss_level(pod) == "privileged"  # IPC_LOCK is outside baseline: documented in the chart README


def test_router_pods_meet_restricted():
    for o in render(validate_service(minimal())):
        if o["kind"] == "Deployment":
            assert pss_level(o["spec"]["template"]["spec"]) == "restricted"


# --- NetworkPolicies, evaluated (the local cluster has no CNI) ---


def _selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        have = e["key"] in labels
        ok = {"In": have and labels.get(e["key"]) in e.get("values", []),
              "NotIn": not have or labels[e["key"]] not in e.get("values", []),
              "Exists": have, "DoesNotExist": not have}[e["operator"]]
        if not ok:
            return False
    return True


def reachable(policies: list[dict], src: dict, dst: dict, port: int) -> bool:
    """NetworkPolicy ingress semantics: a pod no Ingress policy selects takes all
    traffic; a selected pod takes what some rule of some selecting policy allows.
    Pods: {"namespace", "labels", "nsLabels", "ports": {name: number}}."""
    selecting = [p for p in policies if p["metadata"].get("namespace", "ns") == dst["namespace"]
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and _selects(p["spec"]["podSelector"], dst["labels"])]
    if not selecting:
        return True
    for pol in selecting:
        pol_ns = pol["metadata"].get("namespace", "ns")
        for rule in pol["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p["port"] == port or dst.get("ports", {}).get(p["port"]) == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                if "namespaceSelector" in peer:
                    ns_ok = _selects(peer["namespaceSelector"], src["nsLabels"])
                else:
                    ns_ok = src["namespace"] == pol_ns
                pod_ok = _selects(peer.get("podSelector", {}), src["labels"])
                if ns_ok and pod_ok:
                    return True
    return False


def pod(namespace: str, **labels) -> dict:
    return {"namespace": namespace, "labels": labels, "nsLabels": {"kubernetes.io/metadata.name": namespace}}


def rendered(obj) -> tuple[list[dict], dict, dict, dict]:
    objs = render(validate_service(obj))
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    tmpl = {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
            for o in objs if o["kind"] in ("StatefulSet", "Deployment")}
    router = {"namespace": "ns", "labels": tmpl["svc-router"]}
    decode = {"namespace": "ns", "labels": tmpl["svc-decode"]}
    return policies, router, decode, {**pod("ns"), "labels": tmpl["svc-router"]}


@pytest.mark.parametrize("kind, engine_port", [("vllm", 8000), ("sglang", 30000)])
def test_the_router_and_the_engine_api_are_closed_to_other_namespaces(kind, engine_port):
    policies, router, decode, router_src = rendered(minimal(kind, engine={"kind": kind}))
    outsider = pod("team-b", app="curl")
    assert not reachable(policies, outsider, router, 8000)            # another tenant: no router
    assert reachable(policies, pod("ns", app="client"), router, 8000)  # the service's namespace: yes
    assert not reachable(policies, outsider, decode, engine_port)       # nor the engine API
    assert not reachable(policies, pod("ns", app="client"), decode, engine_port)  # engines: router only
    assert reachable(policies, router_src, decode, engine_port)


def test_prometheus_outside_the_monitoring_namespace_reaches_no_engine_api():
    policies, router, decode, _ = rendered(minimal())
    rogue = pod("team-b", **{"app.kubernetes.io/name": "prometheus"})  # a tenant labels its own pod
    scraper = pod("monitoring", **{"app.kubernetes.io/name": "prometheus"})
    assert not reachable(policies, rogue, decode, 8000)
    assert reachable(policies, scraper, decode, 8000)
    assert reachable(policies, scraper, router, 29000) and not reachable(policies, scraper, router, 8000)


def test_clients_named_in_the_spec_reach_the_router_and_no_one_else():
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}},
               "podSelector": {"matchLabels": {"app": "envoy"}}}
    policies, router, _, _ = rendered(minimal(networkPolicy={"clientsFrom": [gateway]}))
    assert reachable(policies, pod("gateway", app="envoy"), router, 8000)
    assert not reachable(policies, pod("ns", app="client"), router, 8000)
    assert not reachable(policies, pod("gateway", app="other"), router, 8000)
