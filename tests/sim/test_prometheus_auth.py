"""The Prometheus bearer token reaches the server on every autoscaler query
(Prometheus behind an authenticating proxy: kube-rbac-proxy, Thanos, a managed
service), and a refused token is an error, not an empty answer (which would
read as "no data")."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pd_operator.autoscale.signals import PrometheusSignals
from tests.sim.conftest import loopback_host

TOKEN = "prom-token-123"


class AuthProxy(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        auth = self.headers.get("Authorization", "")
        AuthProxy.seen.append(auth)
        if auth != f"Bearer {TOKEN}":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b"Unauthorized")
            return
        body = {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"namespace": "ns", "pdserving_io_service": "svc"}, "value": [1.0, "0.25"]}]}}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy():
    server = ThreadingHTTPServer((loopback_host(), 0), AuthProxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    AuthProxy.seen = []
    yield f"http://{server.server_address[0]}:{server.server_address[1]}"
    server.shutdown()


def test_token_is_sent_on_every_query(proxy):
    obs = PrometheusSignals(proxy, token=TOKEN).pool("vllm", "prefill", 0.99)
    assert obs[("ns", "svc")].observed == 0.25
    assert AuthProxy.seen and set(AuthProxy.seen) == {f"Bearer {TOKEN}"}


def test_refused_token_is_an_error_not_missing_data(proxy):
    with pytest.raises(Exception) as err:
        PrometheusSignals(proxy, token="wrong").pool("vllm", "prefill", 0.99)
    assert "401" in str(err.value) or "Unauthorized" in str(err.value)
