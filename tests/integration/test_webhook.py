"""Issue 15 on the local cluster: with the operator's admission webhook
registered, ``kubectl apply`` of a spec whose extraArgs the engine does not
have fails at once, naming the field.

The local API server reaches the webhook on loopback: the registration uses
``clientConfig.url: https://127.0.0.1:PORT/validate`` and the self-signed
certificate (IP SAN 127.0.0.1) as its caBundle. It is scoped to the test's
namespace (namespaceSelector) and removed afterwards; failurePolicy Ignore.
"""

from __future__ import annotations

import base64
import socket
import subprocess
import time

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.integration.conftest import load_local_cluster_module
from tests.integration.test_operator import Operator, crd, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kubectl_apply_of_an_unknown_flag_fails_at_once_with_the_field(kube_cluster, crd, namespace,  # noqa: F811
                                                                        api_client, tmp_path):
    if not kube_cluster.local:
        pytest.skip("the webhook is registered by URL on loopback: only the local API server reaches it")
    key, crt = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    port = free_port()
    op = Operator(kube_cluster.kubeconfig, namespace, tmp_path / "operator.log")
    op.start()
    op.proc.kill()  # restart with the webhook flags (Operator has no extra-args hook)
    op.proc.wait(10)
    import os
    import sys

    from tests.integration.test_operator import REPO

    op.proc = subprocess.Popen(
        [sys.executable, "-m", "pd_operator", "-n", namespace, "--liveness-port", "0", "--metrics-port", "0",
         "--bind", "127.0.0.1", "--webhook-port", str(port), "--webhook-cert", str(crt), "--webhook-key", str(key)],
        env={**os.environ, "KUBECONFIG": kube_cluster.kubeconfig, "PYTHONUNBUFFERED": "1"},
        stdout=(tmp_path / "operator.log").open("a"), stderr=subprocess.STDOUT, cwd=REPO)
    adm = client.AdmissionregistrationV1Api(api_client)
    name = f"pd-test-{namespace}"[:63]
    cfg = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "pdinferenceservices.pdserving.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 30,  # what is refused, not how fast: a loaded API server dry-runs slowly
            "clientConfig": {"url": f"https://127.0.0.1:{port}/validate",
                             "caBundle": base64.b64encode(crt.read_bytes()).decode()},
            "rules": [{"apiGroups": ["pdserving.io"], "apiVersions": ["v1alpha1"], "resources": ["pdinferenceservices"],
                       "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        }],
    }
    adm.create_validating_webhook_configuration(cfg)
    kubectl = str(load_local_cluster_module().binary("kubectl"))
    try:
        # up when it answers: a valid spec goes through
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "operator.log").read_text()[-3000:]) from None
                time.sleep(0.3)
        good = service("good", namespace)
        bad = service("bad", namespace)
        bad["spec"]["engine"] = {"kind": "sglang"}
        bad["spec"]["prefill"]["extraArgs"] = ["--pd-disaggregation"]
        for body in (good, bad):
            (tmp_path / f"{body['metadata']['name']}.yaml").write_text(yaml.safe_dump(body))
        started = time.monotonic()
        r = subprocess.run([kubectl, "--kubeconfig", kube_cluster.kubeconfig, "apply", "-f", str(tmp_path / "bad.yaml")],
                           capture_output=True, text=True, timeout=30)
        took = time.monotonic() - started
        assert r.returncode != 0, r.stdout
        assert "denied the request" in r.stderr and "spec.prefill.extraArgs" in r.stderr, r.stderr
        assert "--pd-disaggregation" in r.stderr, r.stderr
        refused = r.stderr.strip()
        # what the API server refuses of the children (here a toleration Exists with a
        # value, in the decode StatefulSet's pod template): refused too, nothing created
        tol = service("bad-toleration", namespace)
        tol["spec"]["decode"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "value": "yes"}]
        (tmp_path / "tol.yaml").write_text(yaml.safe_dump(tol))
        r = subprocess.run([kubectl, "--kubeconfig", kube_cluster.kubeconfig, "apply", "-f", str(tmp_path / "tol.yaml")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0, r.stdout
        assert "StatefulSet/bad-toleration-decode spec.template.spec.tolerations[0].operator" in r.stderr, r.stderr
        left = subprocess.run([kubectl, "--kubeconfig", kube_cluster.kubeconfig, "get", "statefulsets,services,deployments",
                               "-n", namespace, "-l", "pdserving.io/service=bad-toleration", "-o", "name"],
                              capture_output=True, text=True, timeout=30)
        assert left.returncode == 0 and left.stdout.strip() == "", left
        r = subprocess.run([kubectl, "--kubeconfig", kube_cluster.kubeconfig, "apply", "-f", str(tmp_path / "good.yaml")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        print(f"\nkubectl apply refused in {took:.2f}s: {refused[:400]}")
        # the operator down: failurePolicy Ignore admits (status reports it instead)
        op.kill()
        bad["metadata"]["name"] = "bad-while-down"
        (tmp_path / "down.yaml").write_text(yaml.safe_dump(bad))
        r = subprocess.run([kubectl, "--kubeconfig", kube_cluster.kubeconfig, "apply", "-f", str(tmp_path / "down.yaml")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    finally:
        try:
            adm.delete_validating_webhook_configuration(name)
        except ApiException:
            pass
        op.stop()
