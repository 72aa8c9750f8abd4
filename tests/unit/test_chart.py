"""The Helm chart: generated files current, values documented, `helm lint` clean,
`helm template` output safe and least-privilege, manifests/install.yaml current.

The helm tests run the pinned helm that e2e/controlplane/build.sh builds (as
CI does); they skip only when that binary is absent.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from pd_operator_tools.generate import chart
from pd_operator.api.crd import crd_yaml
from tests.conftest import ROOT, prometheus_binary

CHART = ROOT / "charts" / "pd-operator"


def _helm_binary():
    from tests.integration.conftest import load_local_cluster_module  # e2e/cluster.py by path

    return load_local_cluster_module().binary("helm")


try:
    HELM = _helm_binary()
except Exception:  # pragma: no cover - e.g. the kubernetes client missing
    HELM = None
needs_helm = pytest.mark.skipif(HELM is None or not HELM.is_file(),
                                reason="pinned helm not built (e2e/controlplane/build.sh builds it; CI has it)")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/pd-helm-cache", "HELM_CONFIG_HOME": "/tmp/pd-helm-config",
           "HELM_DATA_HOME": "/tmp/pd-helm-data"}
    r = subprocess.run([str(HELM), *args], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def template(*sets: str, namespace: str = "pd-operator-system") -> list[dict]:
    argv = ["template", "pd-operator", str(CHART), "--namespace", namespace]
    for s in sets:
        argv += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*argv).stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


# -- generated files (no helm needed) --------------------------------------------------


def test_generated_chart_files_are_current():
    assert not chart.stale(CHART), "charts/pd-operator is stale: run `pdctl chart`"
    assert (CHART / "crds" / "pdinferenceservices.yaml").read_text() == crd_yaml()
    assert (ROOT / "crds" / "pdinferenceservices.yaml").read_text() == (CHART / "crds" / "pdinferenceservices.yaml").read_text()


def test_every_values_key_is_commented():
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if ":" in stripped and lines[i - 1].strip().startswith("#"):
            continue
        # entries of a default map (e.g. resources.requests.cpu) sit under their commented key
        indent = len(line) - len(line.lstrip())
        parent = next((lines[j] for j in range(i - 1, -1, -1)
                       if lines[j].strip() and not lines[j].strip().startswith("#")
                       and len(lines[j]) - len(lines[j].lstrip()) < indent), "")
        assert parent.rstrip().endswith(":"), f"values.yaml line {i + 1} has no comment: {line!r}"


def test_values_yaml_equals_the_model_defaults():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values == chart.Values().model_dump(by_alias=True, mode="json")
    assert chart.Values.model_validate(values) == chart.Values()


def test_schema_is_closed_and_described():
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node, path):
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path
            for key, sub in node["properties"].items():
                assert sub.get("description"), f"{path}.{key} has no description"
                walk(sub, f"{path}.{key}")
    walk(schema, "$")
    assert schema["properties"]["rbac"]["properties"]["scope"]["enum"] == ["cluster", "namespace"]


def test_pdctl_chart_check(tmp_path):
    from pd_operator.cli import main

    assert main(["chart", "--check"]) == 0
    assert main(["chart", "--check", "--dir", str(tmp_path)]) == 1
    assert main(["chart", "--dir", str(tmp_path)]) == 0
    assert main(["chart", "--check", "--dir", str(tmp_path)]) == 0


# -- helm ---------------------------------------------------------------------------------


@needs_helm
def test_install_yaml_is_current():
    r = subprocess.run(["bash", str(ROOT / "charts" / "render-install.sh")], capture_output=True, text=True,
                       env={**os.environ, "HELM": str(HELM)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (ROOT / "manifests" / "install.yaml").read_text() == r.stdout, \
        "manifests/install.yaml is stale: run `charts/render-install.sh > manifests/install.yaml`"
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert [d["kind"] for d in docs[:2]] == ["Namespace", "CustomResourceDefinition"]
    assert all(d["metadata"].get("namespace", "pd-operator-system") == "pd-operator-system" for d in docs)


@needs_helm
@pytest.mark.parametrize("sets", [
    (), ("rbac.scope=namespace",),
    ("prometheusRule.enabled=true", "dashboard.enabled=true", "kubeStateMetrics.enabled=true",
     "metrics.serviceMonitor.enabled=true", "rbac.secretReads=true", "watchNamespaces={a,b}", "rbac.scope=namespace"),
    ("watchNamespaces={a,b}", "rbac.secretReads=true"),
])
def test_helm_lint_clean(sets):
    argv = ["lint", str(CHART), "--strict"]
    for s in sets:
        argv += ["--set", s]
    out = helm(*argv).stdout
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@needs_helm
def test_schema_refuses_bad_values():
    r = helm("template", "x", str(CHART), "--set", "rbac.scope=everything", check=False)
    assert r.returncode != 0 and "rbac" in r.stderr
    r = helm("template", "x", str(CHART), "--set", "replicas=9", check=False)
    assert r.returncode != 0 and "replicas" in r.stderr
    r = helm("template", "x", str(CHART), "--set", "rbac.secretRead=true", check=False)  # a typo
    assert r.returncode != 0


@needs_helm
def test_deployment_is_locked_down():
    docs = template()
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
    assert c["image"] == "ghcr.io/pd-operator/pd-operator:0.1.0"
    assert c["args"][0] == "--all-namespaces" and "--metrics-port=9090" in c["args"]
    assert pod["serviceAccountName"] == "pd-operator"
    (svc,) = [d for d in by_kind(docs, "Service") if not d["metadata"]["name"].endswith("-webhook")]
    assert svc["spec"]["ports"][0]["port"] == 9090
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "PrometheusRule")


@needs_helm
def test_two_replicas_by_default_one_writer_by_lease():
    """Issue 15: the default install survives a node drain and a rolling upgrade."""
    docs = template()
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    # the new pod is up (caches warm) before the old one stops and releases the Lease
    assert deploy["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = deploy["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    args = pod["containers"][0]["args"]
    assert "--lease-duration=15" in args and "--lease-renew=5" in args and "--no-leader-elect" not in args
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"] == deploy["spec"]["selector"]
    # the Lease: in the release namespace, get/patch of that one Lease only (no update: a conditional merge patch)
    for verb in ("create", "get", "patch"):
        assert _can(docs, verb, "coordination.k8s.io", "leases", "pd-operator-system"), verb
        assert not _can(docs, verb, "coordination.k8s.io", "leases", "kube-system"), verb
    (lease_role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "pd-operator-leader"]
    assert all(r.get("resourceNames") == ["pd-operator-leader"] for r in lease_role["rules"] if r["verbs"] != ["create"])
    # one replica without a Lease still works (no PDB, Recreate); two without one would both write
    docs = template("replicas=1", "leaderElection.enabled=false")
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["spec"]["strategy"]["type"] == "Recreate" and not by_kind(docs, "PodDisruptionBudget")
    assert "--no-leader-elect" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    r = helm("template", "x", str(CHART), "--set", "leaderElection.enabled=false", check=False)
    assert r.returncode != 0 and "leaderElection.enabled" in r.stderr


@needs_helm
def test_the_pdb_never_holds_a_node_drain_on_replicas_that_are_not_ready():
    """Under the default unhealthyPodEvictionPolicy (IfHealthyBudget) a Running but unready
    pod is evicted only while currentHealthy >= desiredHealthy (k8s
    pkg/registry/core/pod/storage/eviction.go, the !IsPodReady branch): with both replicas
    crash-looping (currentHealthy 0, desiredHealthy 1) `kubectl drain` retries for ever.
    AlwaysAllow evicts such pods; Ready ones stay guarded by maxUnavailable 1."""
    (pdb,) = by_kind(template(), "PodDisruptionBudget")
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["maxUnavailable"] == 1


@needs_helm
def test_the_admission_webhook_is_wired_and_never_blocks_the_cluster():
    """Issue 15: kubectl apply gets the operator's answer at once; an operator
    that is down blocks nothing (failurePolicy Ignore)."""
    import base64
    import tempfile

    docs = template()
    (cfg,) = by_kind(docs, "ValidatingWebhookConfiguration")
    (hook,) = cfg["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["rules"] == [{"apiGroups": ["pdserving.io"], "apiVersions": ["v1alpha1"],
                              "resources": ["pdinferenceservices"], "operations": ["CREATE", "UPDATE"],
                              "scope": "Namespaced"}]
    ref = hook["clientConfig"]["service"]
    assert ref["path"] == "/validate"
    (svc,) = [d for d in by_kind(docs, "Service") if d["metadata"]["name"] == ref["name"]]
    (deploy,) = by_kind(docs, "Deployment")
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    c = deploy["spec"]["template"]["spec"]["containers"][0]
    assert "--webhook-port=9443" in c["args"] and {"name": "webhook", "containerPort": 9443} in c["ports"]
    (secret,) = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-webhook-tls")]
    assert secret["data"]["ca.crt"] == hook["clientConfig"]["caBundle"]
    # the serving certificate names the Service and is signed by the CA the API server is given
    with tempfile.TemporaryDirectory() as tmp:
        for k in ("tls.crt", "ca.crt"):
            (Path(tmp) / k).write_bytes(base64.b64decode(secret["data"][k]))
        r = subprocess.run(["openssl", "verify", "-CAfile", f"{tmp}/ca.crt", f"{tmp}/tls.crt"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["openssl", "x509", "-in", f"{tmp}/tls.crt", "-noout", "-ext", "subjectAltName"],
                           capture_output=True, text=True)
        assert f"DNS:{ref['name']}.pd-operator-system.svc" in r.stdout, r.stdout
    # served namespaces only, when there is a list
    docs = template("watchNamespaces={a,b}")
    (cfg,) = by_kind(docs, "ValidatingWebhookConfiguration")
    assert cfg["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["a", "b"]
    assert not [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text())
                if d and d["kind"] == "ValidatingWebhookConfiguration"]  # kubectl install: no certificate to give it


@needs_helm
def test_cert_manager_can_issue_and_renew_the_webhook_certificate():
    """webhook.certManager: a cert-manager Certificate makes the Secret the pods mount (the
    chart makes none), signed by a CA of the chart's own (a selfSigned Issuer signs a CA
    Certificate, a CA Issuer signs the serving one, so a renewal keeps the CA the API server
    trusts), and the CA injector writes the caBundle (cert-manager pkg/apis/certmanager/v1
    types.go WantInjectAnnotation). A given issuer replaces the chart's CA."""
    docs = template("webhook.certManager.enabled=true")
    (cfg,) = by_kind(docs, "ValidatingWebhookConfiguration")
    assert "caBundle" not in cfg["webhooks"][0]["clientConfig"]
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-webhook-tls")]
    certs = {c["metadata"]["name"]: c for c in by_kind(docs, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in by_kind(docs, "Issuer")}
    assert cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "pd-operator-system/pd-operator-webhook"
    serving = certs["pd-operator-webhook"]
    (deploy,) = by_kind(docs, "Deployment")
    mounted = {v["secret"]["secretName"] for v in deploy["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    assert serving["spec"]["secretName"] in mounted
    assert "pd-operator-webhook.pd-operator-system.svc" in serving["spec"]["dnsNames"]
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    ca = next(c for c in certs.values() if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"])
    assert ca["spec"]["isCA"] is True and "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]["spec"]
    # a renewed CA keeps its key, so what it signed stays valid under either caBundle
    assert ca["spec"]["privateKey"]["rotationPolicy"] == "Never"
    # cert-manager leaves the Secret behind: Helm may take it over (helm pkg/action/validate.go)
    template_ = serving["spec"]["secretTemplate"]
    assert template_["labels"] == {"app.kubernetes.io/managed-by": "Helm"}
    assert template_["annotations"] == {"meta.helm.sh/release-name": "pd-operator",
                                        "meta.helm.sh/release-namespace": "pd-operator-system"}
    # a release named 123 stays a string there (the Certificate's schema takes strings only)
    out = helm("template", "123", str(CHART), "--namespace", "ns", "--set", "webhook.certManager.enabled=true").stdout
    (named,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Certificate" and "secretTemplate" in d["spec"]]
    assert named["spec"]["secretTemplate"]["annotations"]["meta.helm.sh/release-name"] == "123"
    docs = template("webhook.certManager.enabled=true", "webhook.certManager.issuerRef.name=corp-ca",
                    "webhook.certManager.issuerRef.kind=ClusterIssuer")
    assert not by_kind(docs, "Issuer")
    (serving,) = by_kind(docs, "Certificate")
    assert serving["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}


@needs_helm
def test_the_helm_made_webhook_certificate_is_renewed_before_it_expires_without_a_gap(tmp_path):
    """Before, the chart's certificate was made once, valid 10 years, and never renewed. Now
    helm upgrade keeps it while more than webhook.certificate.renewDaysBefore days are left
    (its date kept in the Secret's annotation) and makes a new CA and certificate past that;
    the caBundle then holds the old CA as well, so the API server accepts the certificate a
    pod serves until it reads the renewed Secret. The lookup's result is handed to the
    same helper webhook.yaml calls."""
    import base64
    import datetime as dt
    import shutil

    webhook = (CHART / "templates" / "webhook.yaml").read_text()
    assert 'include "pd-operator.webhookCert" (list . (lookup "v1" "Secret" .Release.Namespace $secretName) $dns)' in webhook
    copy = tmp_path / "pd-operator"
    shutil.copytree(CHART, copy)
    dns = ["pd-operator-webhook", "pd-operator-webhook.ns", "pd-operator-webhook.ns.svc"]

    def cert(existing: dict, *sets: str) -> dict:
        (copy / "templates" / "zz-cert.yaml").write_text(
            '{{- include "pd-operator.fillDefaults" . -}}\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n'
            'data:\n  cert: {{ include "pd-operator.webhookCert" (list . (%s | fromJson) (%s | fromJsonArray)) | quote }}\n'
            % (json.dumps(json.dumps(existing)), json.dumps(json.dumps(dns))))
        argv = ["template", "pd-operator", str(copy), "--namespace", "ns", "--show-only", "templates/zz-cert.yaml"]
        for s in sets:
            argv += ["--set", s]
        return json.loads(yaml.safe_load(helm(*argv).stdout)["data"]["cert"])

    def secret(made: dict, not_after: str | None) -> dict:  # as webhook.yaml writes it
        import hashlib

        meta = {"annotations": {"pdserving.io/webhook-certificate-not-after": not_after,
                                "pdserving.io/webhook-certificate-sha256": hashlib.sha256(made["crt"].encode()).hexdigest()}
                } if not_after else {}
        data = {"tls.crt": made["crt"], "tls.key": made["key"], "ca.crt": made["ca"]}
        if made.get("previous"):  # what webhook.yaml writes
            meta["annotations"]["pdserving.io/webhook-previous-ca-until"] = made["previousUntil"]
            data["ca-previous.crt"] = made["previous"]
        return {"metadata": meta, "data": data}

    def verify(ca_b64: str, crt_b64: str) -> bool:
        (tmp_path / "ca.pem").write_bytes(base64.b64decode(ca_b64))
        (tmp_path / "crt.pem").write_bytes(base64.b64decode(crt_b64))
        return subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), str(tmp_path / "crt.pem")],
                              capture_output=True).returncode == 0

    def days_left(date: str) -> float:
        return (dt.datetime.fromisoformat(date.replace("Z", "+00:00")) - dt.datetime.now(dt.timezone.utc)).days

    first = cert({})  # a first install (or helm template: lookup finds nothing)
    assert first["bundle"] == first["ca"] and verify(first["ca"], first["crt"]) and not first["previous"]
    assert 3649 <= days_left(first["notAfter"]) <= 3650
    end = subprocess.run(["openssl", "x509", "-noout", "-enddate"], input=base64.b64decode(first["crt"]),
                         capture_output=True).stdout.decode()  # notAfter=Nov 30 03:07:55 2036 GMT
    assert dt.datetime.strptime(end.strip().split("=", 1)[1], "%b %d %H:%M:%S %Y %Z").date().isoformat() \
        == first["notAfter"][:10]
    far = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1000)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert cert(secret(first, far)) == {**first, "notAfter": far}  # an upgrade keeps it
    near = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for old in (secret(first, near), secret(first, None)):  # 30 days left; a Secret of an older chart
        new = cert(old)
        assert new["crt"] != first["crt"] and new["ca"] != first["ca"] and 3649 <= days_left(new["notAfter"])
        # the API server trusts both while the pods move; the Secret's CA is the new one alone
        assert verify(new["bundle"], new["crt"]) and verify(new["bundle"], first["crt"])
        assert verify(new["ca"], new["crt"]) and not verify(new["ca"], first["crt"])
        assert new["previous"] == first["ca"] and 0 < (dt.datetime.fromisoformat(new["previousUntil"].replace(
            "Z", "+00:00")) - dt.datetime.now(dt.timezone.utc)).total_seconds() <= 3600
    # an upgrade within the hour keeps the old CA in the bundle (found by a review: the next
    # upgrade dropped it, the pods perhaps still serving the old certificate); after it, not
    again = cert(secret(new, new["notAfter"]))
    assert again == new and verify(again["bundle"], first["crt"])
    past = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    later = cert(secret({**new, "previousUntil": past}, new["notAfter"]))
    assert later["bundle"] == new["ca"] and not later["previous"] and later["crt"] == new["crt"]
    # renewed again within the hour: the bundle keeps both CAs before it (found by a review)
    third = cert(secret(new, new["notAfter"]), "webhook.certificate.renewDaysBefore=36500")
    assert third["crt"] != new["crt"] and all(verify(third["bundle"], c) for c in (third["crt"], new["crt"], first["crt"]))
    # a certificate someone else wrote under the chart's date (cert-manager, still issuing when
    # certManager was turned off) is not kept: its own date is not the annotation's
    swapped = secret(first, far)
    swapped["data"]["tls.crt"] = new["crt"]
    assert cert(swapped)["crt"] not in (first["crt"], new["crt"])
    assert cert(secret(first, near), "webhook.certificate.renewDaysBefore=7")["crt"] == first["crt"]
    assert cert(secret(first, far), "webhook.certificate.renewDaysBefore=36500")["crt"] != first["crt"]  # at once
    assert 29 <= days_left(cert({}, "webhook.certificate.validityDays=30")["notAfter"]) <= 30


def _rules(docs):
    for d in docs:
        if d["kind"] in ("ClusterRole", "Role"):
            for rule in d["rules"]:
                yield d, rule


@needs_helm
@pytest.mark.parametrize("sets", [(), ("rbac.scope=namespace",), ("watchNamespaces={a,b}", "rbac.secretReads=true"),
                                  ("rbac.scope=namespace", "watchNamespaces={a,b}", "rbac.secretReads=true")])
def test_rbac_is_least_privilege(sets):
    docs = template(*sets)
    secret_reads = "rbac.secretReads=true" in sets
    for role, rule in _rules(docs):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule.get("apiGroups", []), role
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), rule
        # update only where OwnerReferencesPermissionEnforcement asks for it: the owner's finalizers
        assert "update" not in rule["verbs"] or (rule["resources"] == ["pdinferenceservices/finalizers"]
                                                 and rule["verbs"] == ["update"]), rule
        if "secrets" in rule["resources"]:
            assert secret_reads and rule["verbs"] == ["get"] and rule["resources"] == ["secrets"]
        if rule["resources"] == ["pods"]:
            assert rule["verbs"] == ["get", "list", "watch"]  # no exec, no writes
    assert any("secrets" in r["resources"] for _, r in _rules(docs)) == secret_reads
    # cluster-wide rules are read-only discovery, except the namespaced set in scope=cluster
    clusterroles = {d["metadata"]["name"]: d for d in by_kind(docs, "ClusterRole")}
    discovery = clusterroles.pop("pd-operator-discovery")
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in discovery["rules"])
    assert {res for r in discovery["rules"] for res in r["resources"]} <= {"customresourcedefinitions", "namespaces"}
    if "rbac.scope=namespace" in sets or "watchNamespaces={a,b}" in sets:
        # writes (and Secret reads) only ever in a Role of a served namespace
        for role in clusterroles.values():
            assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in role["rules"]), role
            assert not any("secrets" in r["resources"] for r in role["rules"]), role
    if "rbac.scope=namespace" in sets:
        assert not clusterroles and not [b for b in by_kind(docs, "ClusterRoleBinding") if b["metadata"]["name"] == "pd-operator"]
        namespaces = ["a", "b"] if "watchNamespaces={a,b}" in sets else ["pd-operator-system"]
        assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role") if not _leader(r)) == namespaces
        assert sorted(b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding") if not _leader(b)) == namespaces
        (deploy,) = by_kind(docs, "Deployment")
        assert [a for a in deploy["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--namespace")] \
            == [f"--namespace={n}" for n in namespaces]
    elif "watchNamespaces={a,b}" in sets:
        assert list(clusterroles) == ["pd-operator"]
        assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role") if not _leader(r)) == ["a", "b"]
    else:
        assert list(clusterroles) == ["pd-operator"] and not [r for r in by_kind(docs, "Role") if not _leader(r)]


def _leader(obj: dict) -> bool:
    """The leader-election Role and its binding (release namespace, leases only)."""
    return obj["metadata"]["name"] == "pd-operator-leader"


def _can(docs: list[dict], verb: str, group: str, resource: str, namespace: str | None,
         sa: str = "system:serviceaccount:pd-operator-system:pd-operator") -> bool:
    """What `kubectl auth can-i --as=SA VERB RESOURCE [-n NAMESPACE]` answers for the
    rendered RBAC alone (no wildcards to resolve: test_rbac_is_least_privilege)."""
    def bound(binding):
        return any(f"system:serviceaccount:{s['namespace']}:{s['name']}" == sa
                   for s in binding["subjects"] if s["kind"] == "ServiceAccount")

    def grants(role):
        return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in role["rules"])

    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("ClusterRole", "Role")}
    for b in docs:
        if b["kind"] == "ClusterRoleBinding" and bound(b):
            if grants(roles[("ClusterRole", None, b["roleRef"]["name"])]):
                return True
        elif b["kind"] == "RoleBinding" and bound(b) and b["metadata"]["namespace"] == namespace:
            ref = b["roleRef"]
            role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else namespace, ref["name"])]
            if grants(role):
                return True
    return False


WRITES = [("create", "apps", "statefulsets"), ("patch", "apps", "deployments"), ("delete", "", "services"),
          ("create", "", "serviceaccounts"), ("create", "rbac.authorization.k8s.io", "roles"),
          ("create", "rbac.authorization.k8s.io", "rolebindings"), ("delete", "networking.k8s.io", "networkpolicies"),
          ("patch", "pdserving.io", "pdinferenceservices"), ("create", "", "events")]


@needs_helm
def test_writes_only_in_served_namespaces_reads_stay_clusterwide():
    """scope=cluster with watchNamespaces: a Role per served namespace holds every
    write; the ClusterRole keeps the cluster-wide reads (services, pods and nodes
    for the free-GPU cap), so kube-system is no longer writable."""
    docs = template("watchNamespaces={team-a,team-b}", "rbac.secretReads=true")
    for verb, group, res in WRITES:
        for ns in ("team-a", "team-b"):
            assert _can(docs, verb, group, res, ns), (verb, res, ns)
        for ns in ("kube-system", "default", "pd-operator-system", "team-c"):
            assert not _can(docs, verb, group, res, ns), (verb, res, ns)
    assert _can(docs, "get", "", "secrets", "team-a") and not _can(docs, "get", "", "secrets", "kube-system")
    for verb in ("list", "watch"):
        assert _can(docs, verb, "pdserving.io", "pdinferenceservices", "kube-system")
        assert _can(docs, verb, "", "pods", "kube-system")  # the free-GPU cap counts every pod's requests
    assert _can(docs, "list", "", "nodes", None) and not _can(docs, "patch", "", "nodes", None)
    (deploy,) = by_kind(docs, "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" not in args  # it serves only where it may write
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


@needs_helm
def test_default_install_writes_everywhere_but_never_reads_secrets_clusterwide():
    docs = template()
    assert _can(docs, "create", "apps", "statefulsets", "kube-system")  # all namespaces served: the documented default
    assert not _can(docs, "get", "", "secrets", "kube-system")
    # Secret reads are granted per namespace only: with every namespace served the
    # chart refuses, naming the fix, instead of granting get on all Secrets
    r = helm("template", "x", str(CHART), "--set", "rbac.secretReads=true", check=False)
    assert r.returncode != 0 and "rbac.secretReads" in r.stderr and "watchNamespaces" in r.stderr, r.stderr


@needs_helm
def test_rbac_covers_what_the_operator_touches():
    """Every kind the controller applies (kube.KINDS) has create+patch+delete+watch;
    the router Role the operator grants is a subset of its own (escalation check)."""
    from pd_operator.controller.kube import KINDS

    docs = template()
    (role,) = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == "pd-operator"]
    granted = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                granted[(group, res)] = set(rule["verbs"])
    for api_version, plural in KINDS.values():
        group = api_version.split("/")[0] if "/" in api_version else ""
        assert {"get", "list", "watch", "create", "patch", "delete"} <= granted[(group, plural)], plural
    assert {"get", "list", "watch", "patch"} <= granted[("pdserving.io", "pdinferenceservices")]
    assert "patch" in granted[("pdserving.io", "pdinferenceservices/status")]
    assert granted[("", "events")] == {"create", "list"}
    assert {"get", "list", "watch"} <= granted[("", "pods")]
    # children own-referenced with blockOwnerDeletion need update on the owner's finalizers
    # where the OwnerReferencesPermissionEnforcement admission plugin runs (OpenShift)
    from pd_operator.api import validate_service
    from pd_operator.render import render
    from tests.conftest import minimal

    owner = {"apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService", "name": "x", "uid": "u"}
    refs = [r for o in render(validate_service(minimal("vllm")), owner) for r in o["metadata"]["ownerReferences"]]
    assert refs and any(r.get("blockOwnerDeletion") for r in refs)
    assert "update" in granted[("pdserving.io", "pdinferenceservices/finalizers")]


@needs_helm
def test_monitoring_objects_use_real_metric_names():
    docs = template("prometheusRule.enabled=true", "dashboard.enabled=true", "kubeStateMetrics.enabled=true",
                    "metrics.serviceMonitor.enabled=true")
    (rule,) = by_kind(docs, "PrometheusRule")
    text = json.dumps(rule)
    for metric in ("vllm:time_to_first_token_seconds_bucket", "sglang:time_to_first_token_seconds_bucket",
                   "vllm:inter_token_latency_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
                   "pd_operator_service_ready", "pdserving_pool_max_replicas"):
        assert metric in text, metric
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    # the operator's own series come from the chart's ServiceMonitor: without it the alerts on
    # them would fire forever (up of its job absent) or never (pd_operator_service_ready absent)
    (alone,) = by_kind(template("prometheusRule.enabled=true"), "PrometheusRule")
    assert alerts - {r["alert"] for g in alone["spec"]["groups"] for r in g["rules"] if "alert" in r} == {
        "PDServiceEngineMetricsMissing", "PDOperatorMetricsMissing"}
    assert alerts == {"PDServiceTTFTOverTarget", "PDServiceITLOverTarget", "PDServicePoolAtMaxReplicas",
                      "PDServiceEngineMetricsMissing", "PDOperatorMetricsMissing",
                      # the Serving condition's reasons (autoscale/diagnose.py), one alert each
                      "PDServiceWorkersUnreachable", "PDServiceKVTransferFailing", "PDServiceOverloaded",
                      "PDServiceUnknownModelRequested", "PDServiceEngineAuthRejected"}
    from pd_operator.controller import metrics

    operator_metrics = {m._name for m in vars(metrics).values() if hasattr(m, "_name")}
    maps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    dash = json.loads(maps["pd-operator-dashboard"]["data"]["pd-operator.json"])
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for name in ("pd_operator_reconciles", "pd_operator_reconcile_duration_seconds", "pd_operator_service_ready"):
        assert name in operator_metrics and name in exprs
    titles = " ".join(p["title"] for p in dash["panels"])
    for word in ("Replicas", "TTFT", "ITL", "Scaling", "Goodput"):
        assert word in titles
    # the same signals as the Serving condition: every metric its queries read
    from pd_operator.autoscale.diagnose import KV_FAILURES, OVERLOAD, ROUTER

    serving = {m for table in (KV_FAILURES, OVERLOAD) for ms in table.values() for m in ms.split("|")}
    serving |= {m for r in ROUTER.values() for key in ("worker_health", "worker_errors") for m in r[key].split("|")}
    for name in sorted(serving):
        assert name in text, f"PrometheusRule lacks {name}"
        assert name in exprs, f"dashboard lacks {name}"
    ksm = yaml.safe_load(maps["pd-operator-ksm"]["data"]["pdinferenceservices.yaml"])
    names = {m["name"] for m in ksm["spec"]["resources"][0]["metrics"]}
    assert names == {"pool_replicas", "pool_ready_replicas", "pool_desired_replicas", "pool_max_replicas"}
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True


PROMTOOL = prometheus_binary("promtool")


@needs_helm
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not built (e2e/controlplane/build.sh)")
def test_promql_parses(tmp_path):
    """The PrometheusRule and every dashboard query parse (promtool check rules)."""
    docs = template("prometheusRule.enabled=true", "dashboard.enabled=true")
    (rule,) = by_kind(docs, "PrometheusRule")
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "pd-operator-dashboard"]
    dash = json.loads(cm["data"]["pd-operator.json"])
    subst = {"$namespace": "default", "$service": ".*", "$__rate_interval": "1m", "$ttft_target": "1.0",
             "$itl_target": "0.05", "$sglang_itl_target": "0.04"}
    queries = []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in subst.items():
                expr = expr.replace(var, value)
            queries.append({"record": f"dashboard:panel{panel['id']}:{target['refId']}", "expr": expr})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"] + [{"name": "dashboard", "rules": queries}]}))
    r = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr



@pytest.mark.skipif(PROMTOOL is None, reason="promtool not built (e2e/controlplane/build.sh)")
def test_the_serving_failures_panel_adds_its_sources(tmp_path):
    """Each target of the Serving failures panel sums all its source metrics for a service. vLLM
    creates its KV connector counters at 0 per engine (nixl/stats.py), so a service always has
    vllm:nixl_num_failed_transfers_total: summed per service and joined with `or`, that 0 hid the
    expired-KV counter of the same service (`or` keeps the left side's label set), and a router's
    decode errors once its prefill errors existed."""
    dash = json.loads((CHART / "dashboards" / "pd-operator.json").read_text())
    (panel,) = [p for p in dash["panels"] if p["title"].startswith("Serving failures")]
    subst = {"$namespace": "ns", "$service": ".*", "$__rate_interval": "1m"}
    tests = []
    for target in panel["targets"][:3]:
        expr = target["expr"]
        for var, value in subst.items():
            expr = expr.replace(var, value)
        metrics = re.findall(r"increase\(([^{]+)\{", expr)
        assert len(metrics) >= 2, target["refId"]
        # every source present; the first at 0, each other one rising by 1 per scrape
        series = [{"series": f'{m}{{namespace="ns",pdserving_io_service="s",pod="p{i}"}}',
                   "values": "0x8" if i == 0 else "0+1x8"} for i, m in enumerate(metrics)]
        tests.append({"interval": "15s", "input_series": series, "promql_expr_test": [
            {"expr": expr, "eval_time": "2m",
             "exp_samples": [{"labels": '{pdserving_io_service="s"}', "value": 4 * (len(metrics) - 1)}]}]})
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "15s", "tests": tests}))
    r = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

# The engines' default latency buckets, as the simulated engines carry them (citing
# vllm/v1/metrics/buckets.py and sglang/srt/observability/metrics_collector.py)
from pd_operator_tools.enginesim import metrics as engine_metrics  # noqa: E402

ENGINE_BUCKETS = {("vllm", "ttft"): engine_metrics.TTFT_BUCKETS, ("vllm", "itl"): engine_metrics.ITL_BUCKETS,
                  ("sglang", "ttft"): engine_metrics.SGLANG_TTFT_BUCKETS,
                  ("sglang", "itl"): engine_metrics.SGLANG_ITL_BUCKETS}


def test_the_dashboards_targets_are_bucket_bounds_of_each_engine():
    """A target that is not a bound of the engine's buckets matches no `le` series and the
    panels that read it stay empty (SGLang's ITL buckets have 0.04 and 0.06, no 0.05)."""
    dash = json.loads((CHART / "dashboards" / "pd-operator.json").read_text())
    default = {v["name"]: float(v["query"]) for v in dash["templating"]["list"] if v.get("type") == "textbox"}
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for (engine, metric), bounds in ENGINE_BUCKETS.items():
        var = {"ttft": "ttft_target", "itl": "itl_target" if engine == "vllm" else "sglang_itl_target"}[metric]
        assert default[var] in bounds, (engine, metric, default[var])
        name = {"ttft": "time_to_first_token_seconds", "itl": "inter_token_latency_seconds"}[metric]
        assert re.search(rf'{engine}:{name}_bucket\{{[^}}]*le=~\\?"\${var}\\?"', exprs), (engine, metric)


def test_image_pins_every_runtime_dependency():
    """operator/Dockerfile's constraints hold each pyproject dependency at the
    pyproject pin, and the operator runs as non-root from a tag-pinned base."""
    import re
    import tomllib

    dockerfile = (ROOT / "operator" / "Dockerfile").read_text()
    block = dockerfile.split("/etc/pd-operator/constraints.txt\n", 1)[1].split("\nPINS\n", 1)[0]
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    pins = dict(line.split("==") for line in block.splitlines())
    pins = {norm(k): v for k, v in pins.items()}
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, version = dep.split("==")
        assert pins.get(norm(name)) == version, f"operator/Dockerfile does not pin {dep}"
    assert re.search(r"^ARG PYTHON_IMAGE=\S+:3\.\d+\.\d+-slim-\w+$", dockerfile, re.M)
    assert "USER 65532:65532" in dockerfile
    assert 'ENTRYPOINT ["python", "-m", "pd_operator"]' in dockerfile
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    from pd_operator import __version__

    assert chart_meta["appVersion"] == __version__  # the image tag the chart defaults to
    assert values["image"]["repository"] == "ghcr.io/pd-operator/pd-operator"


@needs_helm
def test_the_free_gpu_cap_can_be_turned_off_for_node_autoscaled_clusters():
    """A cluster autoscaler or Karpenter adds GPU nodes for Pending pods: with the cap a pool
    could never ask for them. The chart passes --no-free-gpu-cap, which the operator's
    parser takes, only when freeGPUCap is false."""
    from pd_operator.controller.main import build_parser

    parse_args = build_parser().parse_args
    def args(*sets):
        (deploy,) = by_kind(template(*sets), "Deployment")
        return deploy["spec"]["template"]["spec"]["containers"][0]["args"]

    assert "--no-free-gpu-cap" not in args()
    off = args("autoscaling.freeGPUCap=false")
    assert "--no-free-gpu-cap" in off
    assert parse_args(off).free_gpu_cap is False and parse_args(args()).free_gpu_cap is True


@needs_helm
def test_a_renewal_period_the_renew_deadline_cannot_cover_is_refused():
    """The leader writes only within leaseDuration - renew of its last renewal, and renews
    every renew seconds: renew must be under half the duration, or the leader would refuse
    its own writes for part of every cycle. Both the chart and the operator's flags refuse it."""
    import pytest as _pytest

    from pd_operator.controller.main import main

    bad = helm("template", "pd-operator", str(CHART), "--set", "leaderElection.renewSeconds=8", check=False)
    assert bad.returncode != 0 and "under half" in bad.stderr
    assert by_kind(template("leaderElection.renewSeconds=7"), "Deployment")
    with _pytest.raises(SystemExit):
        main(["--lease-duration", "15", "--lease-renew", "8"])


@needs_helm
def test_a_release_upgraded_with_reuse_values_keeps_the_free_gpu_cap():
    """helm upgrade --reuse-values from a release made before autoscaling.freeGPUCap existed
    has no such key: the cap stays on (only an explicit false turns it off)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write("autoscaling:\n  prometheusTokenURLs: []\n")
        f.flush()
        # the chart's own default filled in by helm, then removed as --reuse-values would
        argv = ["template", "pd-operator", str(CHART), "--set", "autoscaling.freeGPUCap=null", "-f", f.name]
        docs = [d for d in yaml.safe_load_all(helm(*argv).stdout) if d]
    (deploy,) = by_kind(docs, "Deployment")
    assert "--no-free-gpu-cap" not in deploy["spec"]["template"]["spec"]["containers"][0]["args"]


def _without_certificates(docs: list[dict]) -> list[dict]:
    """The rendering minus what differs at every render (the webhook's new CA and certificate,
    and its date)."""
    out = []
    for d in docs:
        d = json.loads(json.dumps(d))
        if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-webhook-tls"):
            d["data"] = {}
            d["metadata"]["annotations"].pop("pdserving.io/webhook-certificate-not-after")
            d["metadata"]["annotations"].pop("pdserving.io/webhook-certificate-sha256")
        for hook in d.get("webhooks") or []:
            hook["clientConfig"].pop("caBundle", None)
        out.append(d)
    return out


@needs_helm
def test_an_upgrade_with_reuse_values_from_an_older_chart_renders_the_defaults(tmp_path):
    """helm upgrade --reuse-values renders the new templates with the previous release's
    coalesced values in place of the new values.yaml (helm v3.22.0 pkg/action/upgrade.go
    reuseValues: `chart.Values = oldVals`): every key the chart added since is missing.
    Before, a missing section failed the upgrade (`nil pointer evaluating
    interface {}.enabled` for leaderElection, webhook, podDisruptionBudget, autoscaling)
    and a missing replicas rendered `replicas: null` (1 replica, no PDB). The templates
    now fill missing keys from the generated templates/_defaults.tpl, keeping what is set."""
    import shutil

    old = tmp_path / "pd-operator"
    shutil.copytree(CHART, old)

    def render(values: dict) -> list[dict]:
        (old / "values.yaml").write_text(yaml.safe_dump(values))
        out = helm("template", "pd-operator", str(old), "--namespace", "pd-operator-system").stdout
        return [d for d in yaml.safe_load_all(out) if d]

    want = _without_certificates(template())
    defaults = chart.Values().model_dump(by_alias=True, mode="json")
    assert _without_certificates(render({})) == want  # a release whose chart had none of today's keys
    # every section there, none of its keys
    assert _without_certificates(render({k: {} for k, v in defaults.items() if isinstance(v, dict)})) == want
    # what the old release set stays, false included (sprig's merge would turn it back to true)
    docs = render({"webhook": {"enabled": False}, "autoscaling": {"freeGPUCap": False}, "replicas": 1})
    assert not by_kind(docs, "ValidatingWebhookConfiguration") and not by_kind(docs, "PodDisruptionBudget")
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 1 and "--no-free-gpu-cap" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--lease-duration=15" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]


def test_every_template_fills_missing_values_first():
    """Each template (and NOTES.txt) reads .Values only after filling what is missing
    (a template rendered without it would fail on a key --reuse-values dropped)."""
    for path in sorted((CHART / "templates").iterdir()):
        if path.name.startswith("_"):
            continue
        first = path.read_text().splitlines()[0]
        assert first == '{{- include "pd-operator.fillDefaults" . -}}', path.name


@needs_helm
@pytest.mark.parametrize("sets", [("livenessPort=9090",), ("webhook.port=9090",), ("livenessPort=9443",)])
def test_ports_that_collide_are_refused(sets):
    """The operator binds /metrics (prometheus_client start_http_server), the webhook and
    /healthz on separate sockets (controller/main.py): two on one port fail with EADDRINUSE
    at start and the pods crash-loop, while the API server only warns of the duplicate
    containerPort (k8s pkg/api/pod/warnings.go). The chart refuses instead."""
    argv = ["template", "x", str(CHART)]
    for s in sets:
        argv += ["--set", s]
    r = helm(*argv, check=False)
    assert r.returncode != 0 and "must differ" in r.stderr, r.stderr
    # the webhook port is free to match another when there is no webhook
    assert by_kind(template("webhook.enabled=false", "webhook.port=9090"), "Deployment")


@needs_helm
def test_an_upgrade_onto_an_older_crd_is_refused(tmp_path):
    """Helm installs crds/ on first install only, skipping a CRD that exists (helm v3.22.0
    pkg/action/install.go:261-268), and pkg/action/upgrade.go never reads crds/: an upgrade
    that forgot `kubectl apply` of the new CRD ran the new operator on the old schema, whose
    pruning (apiextensions-apiserver pkg/apiserver/customresource_handler.go:1434) drops the
    fields it does not know from specs and the operator's status writes. The CRD carries
    the hash of its spec; the chart fails when the installed one's differs."""
    import shutil

    from pd_operator.api.crd import SCHEMA_HASH_ANNOTATION, generate_crd, schema_hash

    crd = generate_crd()
    want = crd["metadata"]["annotations"][SCHEMA_HASH_ANNOTATION]
    assert want == schema_hash(crd["spec"])
    chart_crd = yaml.safe_load((CHART / "crds" / "pdinferenceservices.yaml").read_text())
    assert chart_crd["metadata"]["annotations"][SCHEMA_HASH_ANNOTATION] == want
    check = (CHART / "templates" / "crd-check.yaml").read_text()
    assert '(lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "pdinferenceservices.pdserving.io")' in check

    copy = tmp_path / "pd-operator"
    shutil.copytree(CHART, copy)

    def render(installed: dict) -> subprocess.CompletedProcess:
        # what lookup would return, handed to the same check
        (copy / "templates" / "zz-installed.yaml").write_text(
            '{{- include "pd-operator.crdCheck" (list . (%s | fromJson)) -}}\n' % json.dumps(json.dumps(installed)))
        return helm("template", "pd-operator", str(copy), check=False)

    def annotated(value: str) -> dict:
        return {"metadata": {"name": crd["metadata"]["name"], "annotations": {SCHEMA_HASH_ANNOTATION: value}}}

    assert render({}).returncode == 0  # helm template / lint: nothing looked up
    assert render(annotated(want)).returncode == 0
    for old in ({"metadata": {"name": crd["metadata"]["name"]}}, annotated("0123456789abcdef")):
        r = render(old)
        assert r.returncode != 0 and "Helm never upgrades crds/" in r.stderr and want in r.stderr, r.stderr


@needs_helm
def test_resource_quantities_as_the_api_server_reads_them():
    """A resource.Quantity is a string of its form or a bare number (apimachinery
    pkg/api/resource/quantity.go: UnmarshalJSON strips quotes only when present).
    The schema refused `--set resources.limits.cpu=2` and `cpu: 1` in a values file
    (got number, want string) and let `memory: 1 Gi` through to a Deployment the API
    server refuses."""
    (deploy,) = by_kind(template("resources.limits.cpu=2", "resources.requests.cpu=1"), "Deployment")
    res = deploy["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"cpu": 2, "memory": "512Mi"} and res["requests"] == {"cpu": 1, "memory": "256Mi"}
    for bad in ("resources.limits.memory=1 Gi", "resources.requests.cpu=lots"):
        r = helm("template", "x", str(CHART), "--set-string", bad, check=False)
        assert r.returncode != 0 and "/resources/" in r.stderr, (bad, r.stderr)


@needs_helm
@pytest.mark.parametrize("entry", ["", "team-*", "Team-A", "a" * 64])
def test_watch_namespaces_must_be_namespace_names(entry):
    """Each entry becomes a Role's metadata.namespace and a --namespace flag. A namespace
    name is a DNS-1123 label (apimachinery pkg/api/validation/generic.go
    ValidateNamespaceName). Before, an empty entry rendered `namespace:` (empty) and
    `--namespace=`, and a glob (which kopf would take) a Role the API server refuses
    mid-install."""
    r = helm("template", "x", str(CHART), "--set-string", f"watchNamespaces[0]=ok,watchNamespaces[1]={entry}",
             check=False)
    assert r.returncode != 0 and "/watchNamespaces/1" in r.stderr, r.stderr
    assert by_kind(template("watchNamespaces={team-a,b2}"), "Role")


@needs_helm
def test_a_service_monitor_without_its_service_is_refused():
    """The ServiceMonitor selects the chart's metrics Service (labels ...component: metrics);
    with metrics.service=false it rendered, matched nothing, and PDOperatorMetricsMissing
    (absent(up{job="<fullname>-metrics"} == 1)) fired for ever."""
    r = helm("template", "x", str(CHART), "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service=false",
             check=False)
    assert r.returncode != 0 and "metrics.service" in r.stderr, r.stderr
    docs = template("metrics.serviceMonitor.enabled=true")
    (sm,) = by_kind(docs, "ServiceMonitor")
    (svc,) = [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-metrics")]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {p["name"] for p in svc["spec"]["ports"]} >= {e["port"] for e in sm["spec"]["endpoints"]}


@needs_helm
def test_cluster_wide_reads_only_for_the_free_gpu_cap_and_only_what_it_sends():
    """The free-GPU cap's one read is kube.cluster_gpu_view: a list of nodes and a list of
    all pods; nothing gets a node. With autoscaling.freeGPUCap=false the autoscaler never
    calls it (autoscaler.gpu_view), so the chart grants neither: before, nodes had get
    (never sent) and both reads stayed granted with the cap off."""
    nodes = [r for _, r in _rules(template()) if "nodes" in r["resources"]]
    assert [r["verbs"] for r in nodes] == [["list"]]
    assert _can(template(), "list", "", "nodes", None)
    for sets in [("autoscaling.freeGPUCap=false",), ("autoscaling.freeGPUCap=false", "watchNamespaces={a,b}")]:
        docs = template(*sets)
        assert not _can(docs, "list", "", "nodes", None), sets
        assert not _can(docs, "list", "", "pods", "kube-system") or "watchNamespaces={a,b}" not in sets, sets
    docs = template("autoscaling.freeGPUCap=false", "watchNamespaces={a,b}")
    assert _can(docs, "list", "", "pods", "a") and not _can(docs, "list", "", "pods", "kube-system")


@needs_helm
def test_each_release_in_a_namespace_can_have_its_own_lease(tmp_path):
    """The Lease name was fixed (controller/leader.py LEASE_NAME, the chart's RBAC
    resourceNames): two releases in one namespace (e.g. one per team's watchNamespaces)
    shared it, and since only its holder writes, the second release's replicas stood by
    for ever and its namespaces were never reconciled. leaderElection.leaseName now names
    it (--lease-name; the default keeps the old name, so an upgrade never has two Leases
    and two writers), and the chart refuses a Lease held by another release's pod."""
    import shutil

    from pd_operator.controller.main import build_parser

    def lease_of(docs):
        (deploy,) = by_kind(docs, "Deployment")
        args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader")]
        (named,) = [r["resourceNames"] for r in role["rules"] if r.get("resourceNames")]
        return build_parser().parse_args(args).lease_name, named

    assert lease_of(template()) == ("pd-operator-leader", ["pd-operator-leader"])
    assert lease_of(template("leaderElection.leaseName=team-b-leader")) == ("team-b-leader", ["team-b-leader"])
    r = helm("template", "x", str(CHART), "--set", "leaderElection.leaseName=Team_B", check=False)
    assert r.returncode != 0 and "leaseName" in r.stderr

    copy = tmp_path / "pd-operator"
    shutil.copytree(CHART, copy)

    def render(lease: dict, pod: dict) -> subprocess.CompletedProcess:
        # what the two lookups would return, handed to the same check
        (copy / "templates" / "zz-lookups.yaml").write_text(
            '{{- include "pd-operator.leaseCheck" (list . (%s | fromJson) (%s | fromJson)) -}}\n'
            % (json.dumps(json.dumps(lease)), json.dumps(json.dumps(pod))))
        return helm("template", "team-b", str(copy), "--namespace", "ops", check=False)

    held = {"spec": {"holderIdentity": "pd-operator-6d4b9c7f8-abcde_1a2b3c4d"}}
    pod = lambda instance: {"metadata": {"name": "pd-operator-6d4b9c7f8-abcde",  # noqa: E731
                                         "labels": {"app.kubernetes.io/instance": instance}}}
    r = render(held, pod("pd-operator"))
    assert r.returncode != 0 and "leaderElection.leaseName" in r.stderr, r.stderr
    assert render(held, pod("team-b")).returncode == 0  # its own pod: an upgrade
    assert render(held, {}).returncode == 0  # the holder is gone: the Lease expires
    assert render({}, {}).returncode == 0  # no Lease yet, or helm template
    assert render({"spec": {"holderIdentity": ""}}, {}).returncode == 0  # released
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    assert 'lookup "coordination.k8s.io/v1" "Lease" .Release.Namespace .Values.leaderElection.leaseName' in rbac
    assert 'lookup "v1" "Pod" $.Release.Namespace (regexReplaceAll "_[^_]*$" . "")' in rbac


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not built (e2e/controlplane/build.sh)")
def test_the_replicas_panel_counts_a_group_over_nodes_once(tmp_path):
    """The engine scrape keeps SGLang's worker pods (they serve their own schedulers' metrics) with
    LWS's worker index: the panel counts each group once, by its leader (the pod serving the
    API: a group whose leader is down is not counted), each pod of a StatefulSet pool once."""
    from tests.unit.test_diagnose import _promtool_values

    dash = json.loads((CHART / "dashboards" / "pd-operator.json").read_text())
    (panel,) = [p for p in dash["panels"] if p["title"].startswith("Replicas per pool")]
    (expr,) = [t["expr"] for t in panel["targets"] if t["expr"].startswith("count")]
    expr = expr.replace("$namespace", "ns").replace("$service", ".*")
    up = 'up{{namespace="ns",pdserving_io_service="{}",pdserving_io_role="decode",pod="{}"{}}}'
    group = ',leaderworkerset_sigs_k8s_io_group_key="{}",leaderworkerset_sigs_k8s_io_worker_index="{}"'
    series = ([{"series": up.format("wide", f"w-{g}-{i}", group.format(g, i)), "values": "1x8"}
               for g in ("a", "b") for i in range(4)]
              + [{"series": up.format("wide", f"w-c-{i}", group.format("c", i)), "values": "0x8" if i == 0 else "1x8"}
                 for i in range(4)]
              + [{"series": up.format("one", f"o-{i}", ""), "values": "1x8"} for i in range(3)]
              + [{"series": up.format("one", "o-down", ""), "values": "0x8"}])
    assert _promtool_values(PROMTOOL, tmp_path, series, expr, "1m") == {"wide": 2.0, "one": 3.0}
