"""Issue 15: the validating admission webhook answers as ``pdctl validate``
does, over TLS, so ``kubectl apply`` of a bad spec fails at once with the field."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import urllib.request

import pytest

from pd_operator.controller.webhook import review, serve
from tests.conftest import minimal


def admission(obj: dict, operation: str = "CREATE") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "abc-123", "operation": operation, "namespace": "team-a", "object": obj}}


def test_an_unknown_engine_flag_is_refused_with_the_field_path():
    bad = minimal("sglang", prefill={"extraArgs": ["--pd-disaggregation"]})
    out = review(admission(bad))
    assert out["kind"] == "AdmissionReview" and out["response"]["uid"] == "abc-123"
    assert out["response"]["allowed"] is False and out["response"]["status"]["code"] == 422
    assert "spec.prefill.extraArgs" in out["response"]["status"]["message"]
    assert "--pd-disaggregation" in out["response"]["status"]["message"]


def test_a_managed_flag_and_an_unknown_router_flag_are_refused():
    for bad, where in ((minimal("vllm", decode={"extraArgs": ["--port", "1"]}), "spec.decode.extraArgs"),
                       (minimal("vllm", router={"extraArgs": ["--no-such-router-flag"]}), "spec.router.extraArgs")):
        out = review(admission(bad, "UPDATE"))
        assert out["response"]["allowed"] is False and where in out["response"]["status"]["message"], out


def test_a_flag_that_would_multiply_the_engines_metrics_is_refused_with_why():
    """SGLang's --enable-metrics-for-all-schedulers has every TP rank export its group's
    requests and tokens again (observability/metrics_collector.py, init_new): the sums the
    autoscaler reads would be TP times the load. The engine has the flag; the operator refuses it."""
    bad = minimal("sglang", decode={"extraArgs": ["--enable-metrics-for-all-schedulers"]})
    out = review(admission(bad))["response"]
    assert out["allowed"] is False
    message = out["status"]["message"]
    assert "spec.decode.extraArgs[0]" in message and "tensorParallelSize times" in message


def test_a_valid_spec_and_a_delete_are_allowed():
    assert review(admission(minimal("vllm")))["response"] == {"uid": "abc-123", "allowed": True}
    bad = minimal("sglang", prefill={"extraArgs": ["--pd-disaggregation"]})
    assert review(admission(bad, "DELETE"))["response"]["allowed"] is True


@pytest.fixture
def cert(tmp_path):
    key, crt = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    return crt, key


def test_served_over_tls_as_the_api_server_calls_it(cert):
    crt, key = cert
    server = serve("127.0.0.1", 0, str(crt), str(key))
    try:
        port = server.server_address[1]
        ctx = ssl.create_default_context(cafile=str(crt))
        bad = minimal("vllm", prefill={"extraArgs": ["--no-such-flag"]})
        req = urllib.request.Request(f"https://127.0.0.1:{port}/validate", data=json.dumps(admission(bad)).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            out = json.loads(resp.read())
        assert out["response"]["allowed"] is False and "spec.prefill.extraArgs" in out["response"]["status"]["message"]
    finally:
        server.shutdown()


def test_what_the_api_server_refuses_of_the_children_is_refused_at_admission_and_nothing_written():
    from pd_operator.controller.reconcile import REFUSALS
    from tests.unit.fakeapi import FakeApi, toleration_exists_with_value

    api = FakeApi(refuse=toleration_exists_with_value)
    bad = minimal(decode={"tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]})
    bad["metadata"] = {"name": "svc"}  # a create: no uid yet, the namespace in the request
    out = review(admission(bad), api)["response"]
    assert out["allowed"] is False, out
    assert "StatefulSet/svc-decode spec.template.spec.tolerations[0].operator" in out["status"]["message"]
    assert "value must be empty when `operator` is 'Exists'" in out["status"]["message"]
    assert {verb for verb, _ in api.calls} <= {"apply-dry-run", "get"} and api.objects == {}
    # a spec whose children the API server takes is allowed, and still nothing is written
    REFUSALS.forget("team-a", "svc")
    good = minimal()
    good["metadata"] = {"name": "svc"}
    assert review(admission(good), api)["response"]["allowed"] is True
    assert api.objects == {} and "apply" not in {verb for verb, _ in api.calls}
    # without the operator's client (the spec checks only), the same bad spec passes
    assert review(admission(bad))["response"]["allowed"] is True


def _served_cert(port: int) -> bytes:
    """The DER certificate the server presents now (no verification: only which one)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True)


def test_a_changed_certificate_is_served_without_a_restart(cert, tmp_path):
    """The kubelet updates a mounted Secret in place, and a `helm template` render makes a new
    CA (and caBundle) each time: the server must present the new pair, not the one it started with."""
    crt, key = cert
    server = serve("127.0.0.1", 0, str(crt), str(key), reload_seconds=0.1)
    try:
        port = server.server_address[1]
        first = _served_cert(port)
        assert first == ssl.PEM_cert_to_DER_cert(crt.read_text())
        key.write_text("not a key")  # caught mid-update: the pair does not load, the old one stays
        time.sleep(0.5)
        assert _served_cert(port) == first
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=renewed",
                        "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
        deadline = time.monotonic() + 10
        while _served_cert(port) == first and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _served_cert(port) == ssl.PEM_cert_to_DER_cert(crt.read_text()) != first
    finally:
        server.shutdown()
        server.server_close()


def test_a_client_that_says_nothing_holds_no_other_handshake(cert):
    """A half-open connection or a port scan must not stop admission: the handshake runs in
    the connection's own thread, with a timeout."""
    crt, key = cert
    server = serve("127.0.0.1", 0, str(crt), str(key), reload_seconds=0)
    idle = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
    try:
        started = time.monotonic()
        assert _served_cert(server.server_address[1]) == ssl.PEM_cert_to_DER_cert(crt.read_text())
        assert time.monotonic() - started < 5
    finally:
        idle.close()
        server.shutdown()
        server.server_close()


def test_an_update_that_leaves_the_spec_unchanged_is_not_judged_again():
    """A service stored before a rule existed (an operator upgrade) or while the webhook was
    down (failurePolicy Ignore) must still take a label, an annotation or a finalizer: the API
    server ratchets the CRD's own schema and CEL rules on update, judging only what changed
    (apiextensions-apiserver v0.37.2 pkg/registry/customresource/strategy.go:287-290,
    CRDValidationRatcheting, GA and locked on since 1.33). The rendering depends on the spec
    only (name and namespace do not change), so an unchanged spec has nothing new to refuse."""
    from tests.unit.fakeapi import FakeApi

    old = minimal("sglang", prefill={"extraArgs": ["--pd-disaggregation"]})
    new = {**old, "metadata": {**old["metadata"], "labels": {"team": "a"}}}
    request = admission(new, "UPDATE")
    request["request"]["oldObject"] = old
    api = FakeApi()
    assert review(request, api)["response"] == {"uid": "abc-123", "allowed": True}
    assert api.calls == []  # nothing to dry-run either
    # a changed spec is judged whole, as before
    changed = {**new, "spec": {**new["spec"], "decode": {"replicas": 2}}}
    request["request"]["object"] = changed
    out = review(request, api)["response"]
    assert out["allowed"] is False and "spec.prefill.extraArgs" in out["status"]["message"]


@pytest.mark.parametrize("kind, where", [("vllm", "prefill"), ("sglang", "engine"), ("vllm", "router")])
@pytest.mark.parametrize("arg", ["", " "])
def test_an_empty_extra_arg_is_refused_with_its_field_not_a_crash(kind, where, arg):
    """The CRD takes an empty (or blank) extraArgs entry (maxLength only); the engine and the
    router would get it as a stray positional argument and refuse to start. The flag-set check
    read argparse's "unrecognized arguments: " with nothing after it and raised IndexError:
    the webhook answered HTTP 400, which the API server, with failurePolicy Ignore, takes as
    "admit" (apiserver v0.37.2 pkg/admission/plugin/webhook/validating/dispatcher.go:170-200),
    and each reconcile crashed before writing any status."""
    spec = {"engine": {"kind": kind, "extraArgs": [arg]}} if where == "engine" else {where: {"extraArgs": [arg]}}
    out = review(admission(minimal(kind, **spec)))["response"]
    assert out["allowed"] is False, out
    assert f"spec.{where}.extraArgs" in out["status"]["message"]


def test_a_check_that_crashes_admits_with_a_warning_not_a_silent_400(monkeypatch, cert):
    """A crash in the check is the operator's, not a bad request: answered as HTTP 400 it is a
    webhook call failure, which the API server drops without a word under failurePolicy Ignore
    (apiserver v0.37.2 pkg/admission/plugin/webhook/validating/dispatcher.go:170-200). Admitted,
    the user is told so in a warning (kubectl prints it; dispatcher.go:326 passes warnings on),
    within the API server's 256 characters per warning (endpoints/filters/warning.go:41) and
    without control characters."""
    from pd_operator.controller import webhook

    def boom(*_a, **_k):
        raise ZeroDivisionError("line\n" + "x" * 1000)

    monkeypatch.setattr(webhook, "check", boom)
    out = review(admission(minimal()))
    assert out["response"]["uid"] == "abc-123" and out["response"]["allowed"] is True
    (warning,) = out["response"]["warnings"]
    assert "ZeroDivisionError" in warning and "pdctl validate" in warning and len(warning) <= 256
    assert warning.isprintable()  # a control character gets the warning dropped (apimachinery util/net/http.go:669)
    crt, key = cert
    server = serve("127.0.0.1", 0, str(crt), str(key), reload_seconds=0)
    try:
        req = urllib.request.Request(f"https://127.0.0.1:{server.server_address[1]}/validate",
                                     data=json.dumps(admission(minimal())).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(crt)), timeout=10) as resp:
            assert resp.status == 200 and json.loads(resp.read())["response"]["warnings"]
    finally:
        server.shutdown()
        server.server_close()


def test_every_endpoint_takes_ipv6_and_ipv4_by_default(cert):
    """The chart's probes (/healthz) and Services (metrics, webhook) reach the pod IP, which
    on an IPv6 single-stack cluster is IPv6. The endpoints bound 0.0.0.0 (--bind default),
    an IPv4-only socket: the kubelet's probes were refused and killed every replica, and
    `--bind ::` failed at start (http.server's AF_INET: "Address family for hostname not
    supported"). The default is now :: with IPv4 too (0.0.0.0 where the node has no IPv6)."""
    import socket

    from pd_operator.controller.health import HEALTH, default_bind, serve_metrics
    from pd_operator.controller.health import serve as serve_health
    from pd_operator.controller.main import build_parser

    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError:
        assert default_bind() == "0.0.0.0"
        pytest.skip("this host has no IPv6")
    assert build_parser().parse_args([]).bind is None and default_bind() == "::"
    health = serve_health(HEALTH, default_bind(), 0)
    metrics = serve_metrics(default_bind(), 0)
    crt, key = cert
    hook = serve(default_bind(), 0, str(crt), str(key), reload_seconds=0)
    try:
        # IPv4 too whatever net.ipv6.bindv6only says (it is 0 here; 1 on some hosts)
        for server in (health, metrics, hook):
            assert server.socket.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        for host, url_host in (("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")):
            with urllib.request.urlopen(f"http://{url_host}:{health.server_address[1]}/healthz", timeout=10) as resp:
                assert resp.status == 200, host
            with urllib.request.urlopen(f"http://{url_host}:{metrics.server_address[1]}/metrics", timeout=10) as resp:
                assert resp.status == 200 and b"python_info" in resp.read(), host
            with socket.create_connection((host, hook.server_address[1]), timeout=10) as raw:
                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                with ctx.wrap_socket(raw) as tls:
                    assert tls.version(), host
    finally:
        health.shutdown()
        metrics.shutdown()
        hook.shutdown()
