"""Install as users do, on the real API server: ``helm install`` the chart and
``kubectl apply -f manifests/install.yaml``, then run the operator (a local
process: kwok nodes run no containers) with a token of the installed
ServiceAccount and pass operator scenarios under that identity. RBAC is then
sufficient; ``kubectl auth can-i`` shows it is not more than that. ``helm
upgrade`` and ``helm uninstall`` (CRD kept) are checked too.

Releases, namespaces and ClusterRoles get unique names: the cluster may be
shared. The CRD is the same file as crds/ (Helm skips it when present).
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.integration.conftest import load_local_cluster_module
from tests.integration.test_operator import (GROUP, PLURAL, VERSION, Operator, children, create, crd, expected, service,  # noqa: F401
                                             wait_for, wait_ready)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pd-operator"
# Representative operator scenarios rerun under the installed identity.
SCENARIOS = ("test_create_becomes_ready_with_columns or test_drift_is_restored or test_delete_leaves_nothing "
             "or test_pending_reason_when_gpus_run_out or test_bad_extra_args_reported_nothing_created")


def tool(name: str) -> str:
    path = load_local_cluster_module().binary(name)
    if not path.is_file():
        pytest.skip(f"{name} not built: run e2e/controlplane/build.sh")
    return str(path)


def run(kubeconfig: str, *argv: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "KUBECONFIG": kubeconfig, "HELM_CACHE_HOME": "/tmp/pd-helm-cache",
                            "HELM_CONFIG_HOME": "/tmp/pd-helm-config", "HELM_DATA_HOME": "/tmp/pd-helm-data"})
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def kubectl(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(kubeconfig, tool("kubectl"), *args, check=check)


def helm(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(kubeconfig, tool("helm"), *args, check=check)


def token_kubeconfig(admin_kubeconfig: str, namespace: str, sa: str, path: Path) -> str:
    """A kubeconfig that authenticates as ServiceAccount ``namespace/sa``."""
    token = kubectl(admin_kubeconfig, "-n", namespace, "create", "token", sa, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    ctx = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = dict(next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])["cluster"])
    ca = cluster.pop("certificate-authority", None)
    if ca:
        if not os.path.isabs(ca):
            ca = str(Path(admin_kubeconfig).parent / ca)
        cluster["certificate-authority-data"] = base64.b64encode(Path(ca).read_bytes()).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": namespace}}],
    }))
    return str(path)


def can_i(admin_kubeconfig: str, subject: str, *args: str) -> bool:
    r = kubectl(admin_kubeconfig, "auth", "can-i", *args, f"--as={subject}", check=False)
    return r.stdout.strip() == "yes"


def run_scenarios(admin_kubeconfig: str, operator_kubeconfig: str, selection: str, log: Path,
                  release_namespace: str) -> str:
    """tests/integration/test_operator.py -k SELECTION with the operator under another identity
    (its leader Lease in the release namespace, as the chart's POD_NAMESPACE puts it)."""
    env = {**os.environ, "KUBECONFIG": admin_kubeconfig, "PD_OPERATOR_KUBECONFIG": operator_kubeconfig,
           "PD_SHOW_OPERATOR_LOG": "1", "POD_NAMESPACE": release_namespace}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "-x",
                        str(REPO / "tests" / "integration" / "test_operator.py"), "-k", selection],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=540)
    log.write_text(r.stdout + r.stderr)
    assert r.returncode == 0, f"scenarios failed under the installed identity (log {log}):\n{r.stdout[-6000:]}"
    assert "Forbidden" not in r.stdout, f"the operator was refused something under the installed identity (log {log})"
    return r.stdout


def assert_minimal(admin_kubeconfig: str, subject: str, namespace: str, secret_reads: bool = False) -> None:
    assert can_i(admin_kubeconfig, subject, "patch", f"{PLURAL}.{GROUP}", "-n", namespace)
    assert can_i(admin_kubeconfig, subject, "create", "statefulsets.apps", "-n", namespace)
    assert can_i(admin_kubeconfig, subject, "watch", "customresourcedefinitions.apiextensions.k8s.io")
    assert can_i(admin_kubeconfig, subject, "get", "secrets", "-n", namespace) == secret_reads
    for denied in (("list", "secrets", "-n", namespace), ("watch", "secrets", "-A"), ("delete", "namespaces"),
                   ("*", "*"), ("create", "clusterroles"), ("create", "clusterrolebindings"), ("update", "nodes"),
                   ("delete", f"{PLURAL}.{GROUP}", "-n", namespace), ("create", "pods", "-n", namespace),
                   ("escalate", "roles", "-n", namespace), ("bind", "roles", "-n", namespace),
                   ("create", "serviceaccounts", "--subresource=token", "-n", namespace), ("update", "customresourcedefinitions")):
        assert not can_i(admin_kubeconfig, subject, *denied), f"{subject} may {' '.join(denied)}"


def assert_cluster_watch(admin_kubeconfig: str, subject: str) -> None:
    """What --all-namespaces (the chart's default args) needs: cluster-wide list/watch
    of the service and every kind it watches. Not run as a process here: on a
    shared cluster it would reconcile other people's services."""
    # nodes, read-only: the autoscaler's cap at the replicas the free GPUs fit
    assert can_i(admin_kubeconfig, subject, "list", "nodes") and not can_i(admin_kubeconfig, subject, "patch", "nodes")
    for res in (f"{PLURAL}.{GROUP}", "pods", "services", "configmaps", "serviceaccounts", "statefulsets.apps",
                "deployments.apps", "poddisruptionbudgets.policy", "roles.rbac.authorization.k8s.io",
                "rolebindings.rbac.authorization.k8s.io", "networkpolicies.networking.k8s.io"):
        for verb in ("list", "watch"):
            assert can_i(admin_kubeconfig, subject, verb, res, "-A"), f"{subject} cannot {verb} {res} -A"


def uid() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def release_namespace(core_v1):
    name = f"pdi-{uid()}"
    # Pod Security "restricted" enforced: the API server refuses the operator pod
    # unless it is non-root, seccomp RuntimeDefault, no privilege escalation, ...
    core_v1.create_namespace({"metadata": {"name": name, "labels": {
        "pdserving.io/test": "integration", "pod-security.kubernetes.io/enforce": "restricted"}}})
    yield name
    try:
        core_v1.delete_namespace(name, propagation_policy="Background")
    except ApiException as err:
        if err.status != 404:
            raise


# --------------------------------------------------------------------------


def test_helm_install_rbac_suffices_and_is_minimal(kube_cluster, crd, release_namespace, tmp_path, apps_v1, core_v1):
    admin = kube_cluster.kubeconfig
    release = f"pdi-{uid()}"
    fullname = f"{release}-pd-operator"
    # --wait: kwok plays the kubelet, so the pod counts as Ready once admitted and scheduled
    out = helm(admin, "install", release, str(CHART), "--namespace", release_namespace, "--wait", "--timeout", "120s").stdout
    assert "kubectl get pdservices" in out  # NOTES tell the next command
    try:
        pods = core_v1.list_namespaced_pod(release_namespace, label_selector=f"app.kubernetes.io/instance={release}").items
        # two replicas by default (one leads, the other stands by), both non-root
        assert len(pods) == 2 and all(p.spec.security_context.run_as_user == 65532 for p in pods)
        deploy = apps_v1.read_namespaced_deployment(fullname, release_namespace)
        assert deploy.spec.template.spec.service_account_name == fullname
        assert deploy.spec.template.spec.containers[0].args[0] == "--all-namespaces"
        subject = f"system:serviceaccount:{release_namespace}:{fullname}"
        assert_minimal(admin, subject, "default")
        assert_cluster_watch(admin, subject)
        kc = token_kubeconfig(admin, release_namespace, fullname, tmp_path / "sa.kubeconfig")
        out = run_scenarios(admin, kc, SCENARIOS, tmp_path / "scenarios.log", release_namespace)
        assert "5 passed" in out, out[-2000:]

        # helm upgrade: the same values change nothing; a new value rolls the pod template
        gen = apps_v1.read_namespaced_deployment(fullname, release_namespace).metadata.generation
        tls = core_v1.read_namespaced_secret(f"{fullname}-webhook-tls", release_namespace).data
        helm(admin, "upgrade", release, str(CHART), "--namespace", release_namespace, "--reuse-values")
        assert apps_v1.read_namespaced_deployment(fullname, release_namespace).metadata.generation == gen
        # the webhook's certificate: kept (lookup of the Secret), then renewed at once on request;
        # the API server is given the old CA with the new until the pods read the new Secret,
        # and the pods are not rolled (the operator reads the mounted files again)
        assert core_v1.read_namespaced_secret(f"{fullname}-webhook-tls", release_namespace).data == tls
        helm(admin, "upgrade", release, str(CHART), "--namespace", release_namespace, "--reuse-values",
             "--set", "webhook.certificate.renewDaysBefore=36500")
        renewed = core_v1.read_namespaced_secret(f"{fullname}-webhook-tls", release_namespace).data
        assert renewed["tls.crt"] != tls["tls.crt"] and renewed["ca.crt"] != tls["ca.crt"]
        assert renewed["ca-previous.crt"] == tls["ca.crt"]
        bundle = base64.b64decode(kubectl(admin, "get", "validatingwebhookconfiguration", fullname, "-o",
                                          "jsonpath={.webhooks[0].clientConfig.caBundle}").stdout)
        assert bundle == base64.b64decode(renewed["ca.crt"]) + base64.b64decode(tls["ca.crt"])
        assert apps_v1.read_namespaced_deployment(fullname, release_namespace).metadata.generation == gen
        # set back at once (as the values' comment says): the pair is kept, and so is the old CA
        # in the bundle for its hour
        helm(admin, "upgrade", release, str(CHART), "--namespace", release_namespace, "--reuse-values",
             "--set", "webhook.certificate.renewDaysBefore=90")
        assert core_v1.read_namespaced_secret(f"{fullname}-webhook-tls", release_namespace).data == renewed
        assert base64.b64decode(kubectl(admin, "get", "validatingwebhookconfiguration", fullname, "-o",
                                        "jsonpath={.webhooks[0].clientConfig.caBundle}").stdout) == bundle
        helm(admin, "upgrade", release, str(CHART), "--namespace", release_namespace, "--set", "resyncSeconds=30")
        after = apps_v1.read_namespaced_deployment(fullname, release_namespace)
        assert after.metadata.generation == gen + 1
        env = {e.name: e.value for e in after.spec.template.spec.containers[0].env}
        assert env["PD_OPERATOR_RESYNC_SECONDS"] == "30"
        # a bad value is refused by values.schema.json before anything changes
        bad = helm(admin, "upgrade", release, str(CHART), "--namespace", release_namespace,
                   "--set", "rbac.scope=everything", check=False)
        assert bad.returncode != 0 and "rbac" in bad.stderr
    finally:
        helm(admin, "uninstall", release, "--namespace", release_namespace, "--wait")
    # uninstall: the release's objects are gone, the CRD (and so every service) stays
    assert kubectl(admin, "get", "crd", "pdinferenceservices.pdserving.io", "-o", "name").stdout.strip()
    gone = kubectl(admin, "get", "clusterrole", fullname, f"{fullname}-discovery", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    assert not apps_v1.list_namespaced_deployment(release_namespace).items


def test_the_cert_manager_objects_are_what_cert_manager_accepts(kube_cluster, release_namespace, tmp_path):
    """webhook.certManager: the chart's Certificates and Issuers against cert-manager's own CRDs
    (deploy/crds of the pinned module, e2e/controlplane/build.sh), by a server-side dry-run
    with strict field validation (an unknown field is refused: shown on a misspelt one)."""
    admin = kube_cluster.kubeconfig
    crds = load_local_cluster_module().bin_dirs()["cert-manager"] / "crds"
    if not crds.is_dir():
        pytest.skip("cert-manager CRDs not fetched: run e2e/controlplane/build.sh")
    kubectl(admin, "apply", "--server-side", "-f", str(crds))
    try:
        kubectl(admin, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds))
        rendered = helm(admin, "template", f"pdc-{uid()}", str(CHART), "--namespace", release_namespace,
                        "--set", "webhook.certManager.enabled=true").stdout
        docs = [d for d in yaml.safe_load_all(rendered) if d and d["apiVersion"].startswith("cert-manager.io/")]
        assert sorted(d["kind"] for d in docs) == ["Certificate", "Certificate", "Issuer", "Issuer"]
        good = tmp_path / "cert-manager.yaml"
        good.write_text(yaml.safe_dump_all(docs))
        kubectl(admin, "apply", "--dry-run=server", "--validate=strict", "-f", str(good))
        serving = next(d for d in docs if d["kind"] == "Certificate" and not d["spec"].get("isCA"))
        serving["spec"]["dnsName"] = serving["spec"].pop("dnsNames")
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(serving))
        r = kubectl(admin, "apply", "--dry-run=server", "--validate=strict", "-f", str(bad), check=False)
        assert r.returncode != 0 and 'unknown field "spec.dnsName"' in r.stderr, r.stderr
    finally:
        kubectl(admin, "delete", "--wait=false", "-f", str(crds), check=False)


def test_helm_namespace_scope(kube_cluster, crd, release_namespace, namespace, tmp_path, custom_objects, api_client):
    """rbac.scope=namespace: Roles only in the served namespace; the operator
    (with -n, as the chart runs it) serves it under the ServiceAccount's token."""
    admin = kube_cluster.kubeconfig
    release = f"pdn-{uid()}"
    fullname = f"{release}-pd-operator"
    helm(admin, "install", release, str(CHART), "--namespace", release_namespace,
         "--set", "rbac.scope=namespace", "--set", f"watchNamespaces[0]={namespace}", "--set", "rbac.secretReads=true")
    try:
        subject = f"system:serviceaccount:{release_namespace}:{fullname}"
        assert_minimal(admin, subject, namespace, secret_reads=True)
        assert not can_i(admin, subject, "list", "nodes")  # no cluster view in this scope: no free-GPU cap
        assert not can_i(admin, subject, "list", "pods", "-n", "default")
        assert not can_i(admin, subject, "create", "statefulsets.apps", "-n", release_namespace)
        kc = token_kubeconfig(admin, release_namespace, fullname, tmp_path / "sa.kubeconfig")
        op = Operator(kc, namespace, tmp_path / "operator.log", env={"POD_NAMESPACE": release_namespace}).start()
        try:
            create(custom_objects, service("ns", namespace, engine={"kind": "vllm", "apiKeySecretRef": {"name": "key"}}))

            def secret_reported():
                obj = custom_objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "ns")
                return any(c["reason"] == "SecretNotFound" for c in obj.get("status", {}).get("conditions", []))
            wait_for(secret_reported, 60, "SecretNotFound (secretReads=true)")
            kubectl(admin, "-n", namespace, "create", "secret", "generic", "key", "--from-literal=api-key=x")
            wait_ready(custom_objects, namespace, "ns")
            assert set(children(api_client, namespace, "ns")) == expected("ns")
        finally:
            op.stop()
        log = (tmp_path / "operator.log").read_text()
        assert "Forbidden" not in log, log[-3000:]
    finally:
        helm(admin, "uninstall", release, "--namespace", release_namespace)


# Every kind the operator writes, as `kubectl auth can-i` names them.
WRITES = (("create", "statefulsets.apps"), ("patch", "deployments.apps"), ("delete", "services"),
          ("create", "serviceaccounts"), ("create", "configmaps"), ("create", "poddisruptionbudgets.policy"),
          ("create", "roles.rbac.authorization.k8s.io"), ("create", "rolebindings.rbac.authorization.k8s.io"),
          ("delete", "networkpolicies.networking.k8s.io"), ("patch", f"{PLURAL}.{GROUP}"),
          ("patch", f"{PLURAL}.{GROUP}", "--subresource=status"), ("create", "events"))


def test_helm_writes_only_in_served_namespaces(kube_cluster, crd, release_namespace, namespace, tmp_path,
                                               custom_objects, api_client, apps_v1):
    """rbac.scope=cluster (default) with watchNamespaces: every write, and Secret
    get, only in the served namespace (kube-system, default and the operator's own
    namespace are not writable); reads of PDInferenceServices, pods and nodes stay
    cluster-wide for the free-GPU cap. The operator, run as the chart runs it (-n)
    under the ServiceAccount's token, still brings a service to Ready."""
    admin = kube_cluster.kubeconfig
    release = f"pdw-{uid()}"
    fullname = f"{release}-pd-operator"
    helm(admin, "install", release, str(CHART), "--namespace", release_namespace,
         "--set", f"watchNamespaces[0]={namespace}", "--set", "rbac.secretReads=true")
    try:
        subject = f"system:serviceaccount:{release_namespace}:{fullname}"
        assert not can_i(admin, subject, "create", "statefulsets", "-n", "kube-system")
        assert can_i(admin, subject, "create", "statefulsets", "-n", namespace)
        for verb, res, *extra in WRITES:
            assert can_i(admin, subject, verb, res, *extra, "-n", namespace), f"{subject} cannot {verb} {res} in {namespace}"
            for other in ("kube-system", "default", release_namespace):
                assert not can_i(admin, subject, verb, res, *extra, "-n", other), f"{subject} may {verb} {res} in {other}"
        assert can_i(admin, subject, "get", "secrets", "-n", namespace)
        for other in ("kube-system", "default", release_namespace):
            assert not can_i(admin, subject, "get", "secrets", "-n", other), f"{subject} may get secrets in {other}"
        assert_minimal(admin, subject, namespace, secret_reads=True)
        # cluster-wide reads kept: the free-GPU cap (nodes, every pod) and its own resource
        assert can_i(admin, subject, "list", "nodes") and not can_i(admin, subject, "patch", "nodes")
        for res in ("pods", f"{PLURAL}.{GROUP}"):
            for verb in ("list", "watch"):
                assert can_i(admin, subject, verb, res, "-A"), f"{subject} cannot {verb} {res} -A"
        args = apps_v1.read_namespaced_deployment(fullname, release_namespace).spec.template.spec.containers[0].args
        assert "--all-namespaces" not in args and f"--namespace={namespace}" in args

        kc = token_kubeconfig(admin, release_namespace, fullname, tmp_path / "sa.kubeconfig")
        op = Operator(kc, namespace, tmp_path / "operator.log", env={"POD_NAMESPACE": release_namespace}).start()
        try:
            create(custom_objects, service("wr", namespace))
            wait_ready(custom_objects, namespace, "wr")
            assert set(children(api_client, namespace, "wr")) == expected("wr")
        finally:
            op.stop()
        log = (tmp_path / "operator.log").read_text()
        assert "Forbidden" not in log, log[-3000:]
        assert "no RBAC to list nodes" not in log, log[-3000:]  # the free-GPU cap kept its cluster view
    finally:
        helm(admin, "uninstall", release, "--namespace", release_namespace)
    # the per-namespace Role went with the release
    gone = kubectl(admin, "-n", namespace, "get", "role", fullname, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_helm_refuses_clusterwide_secret_reads(kube_cluster, release_namespace):
    """rbac.secretReads=true with every namespace served would be get on every
    Secret: refused before anything is created, naming the fix."""
    r = helm(kube_cluster.kubeconfig, "install", f"pds-{uid()}", str(CHART), "--namespace", release_namespace,
             "--set", "rbac.secretReads=true", check=False)
    assert r.returncode != 0 and "watchNamespaces" in r.stderr, r.stderr


def _unique_install_yaml(ns: str, suffix: str) -> list[dict]:
    """manifests/install.yaml, moved to namespace ``ns`` with cluster-scoped
    names suffixed (the shared cluster may hold another copy)."""
    docs = [d for d in yaml.safe_load_all((REPO / "manifests" / "install.yaml").read_text()) if d]
    out = []
    for d in docs:
        meta = d["metadata"]
        if d["kind"] == "Namespace":
            meta["name"] = ns
        elif d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] += suffix
        if meta.get("namespace") == "pd-operator-system":
            meta["namespace"] = ns
        for s in d.get("subjects", []):
            s["namespace"] = ns
        if d["kind"] == "ClusterRoleBinding":
            d["roleRef"]["name"] += suffix
        out.append(d)
    return out


def test_kubectl_apply_install_yaml(kube_cluster, crd, tmp_path, core_v1, apps_v1):
    admin = kube_cluster.kubeconfig
    ns, suffix = f"pdk-{uid()}", f"-{uid()}"
    docs = _unique_install_yaml(ns, suffix)
    assert [d["kind"] for d in docs][:2] == ["Namespace", "CustomResourceDefinition"]
    path = tmp_path / "install.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    try:
        kubectl(admin, "apply", "-f", str(path))
        assert apps_v1.read_namespaced_deployment("pd-operator", ns).spec.template.spec.service_account_name == "pd-operator"
        assert_minimal(admin, f"system:serviceaccount:{ns}:pd-operator", "default")
        assert_cluster_watch(admin, f"system:serviceaccount:{ns}:pd-operator")
        kc = token_kubeconfig(admin, ns, "pd-operator", tmp_path / "sa.kubeconfig")
        out = run_scenarios(admin, kc, "test_create_becomes_ready_with_columns or test_delete_leaves_nothing",
                            tmp_path / "scenarios.log", ns)
        assert "2 passed" in out, out[-2000:]
    finally:
        # never `kubectl delete -f install.yaml` here: that deletes the shared CRD
        rest = tmp_path / "uninstall.yaml"
        rest.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] != "CustomResourceDefinition"]))
        kubectl(admin, "delete", "--wait=false", "--ignore-not-found", "-f", str(rest))
