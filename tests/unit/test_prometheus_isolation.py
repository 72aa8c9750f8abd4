"""Issue 19, item 1: one Prometheus that accepts connections and never answers
must not freeze autoscaling for the other services, and liveness follows the
autoscaler loop. Everything runs in-process on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pd_operator.autoscale import signals as signals_mod
from pd_operator.autoscale.signals import PrometheusSignals
from pd_operator.controller.autoscaler import Autoscaler, prometheus_signals, run_forever
from pd_operator.controller.health import Health, serve


@pytest.fixture
def silent_prometheus():
    """Accepts every connection, reads nothing, answers nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    for c in conns:
        c.close()
    listener.close()


class Answering(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        data = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"namespace": "good", "pdserving_io_service": "svc"}, "value": [1.0, "0.25"]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def finishes(fn, within: float):
    """Run fn on a thread; (finished in time, exception or None)."""
    box: dict = {}

    def run():
        try:
            fn()
        except BaseException as err:  # noqa: BLE001
            box["err"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(within)
    return not t.is_alive(), box.get("err")


def test_a_query_to_a_silent_prometheus_times_out(silent_prometheus, monkeypatch):
    monkeypatch.setattr(signals_mod, "READ_TIMEOUT_S", 0.5, raising=False)
    done, err = finishes(lambda: PrometheusSignals(silent_prometheus).pool("vllm", "prefill", 0.99), within=10)
    assert done, "the query to a Prometheus that never answers did not time out"
    assert err is not None  # an error (the pools hold), not an empty answer


class Kube:
    """Two namespaces, one service each; records each service's status."""

    def __init__(self):
        self.status: dict[tuple[str, str], dict] = {}

    def get(self, kind, namespace, name):
        template = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        return {"spec": {"replicas": 1, "template": template}, "status": {"replicas": 1, "readyReplicas": 1}}

    def cluster_gpu_view(self):
        return None

    def get_service(self, namespace, name):
        return {"metadata": {"namespace": namespace, "name": name, "generation": 1}}

    def pods(self, namespace, selector):
        return []

    def apply_replicas(self, *a):
        pass

    def patch_status(self, namespace, name, patch, manager=None):
        self.status[(namespace, name)] = patch


def body(namespace: str, url: str) -> dict:
    auto = {"enabled": True, "minReplicas": 1, "maxReplicas": 4}
    return {
        "apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService",
        "metadata": {"name": "svc", "namespace": namespace, "generation": 1},
        "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "engine": {"kind": "vllm"}, "router": {"image": "registry.example.com/pd/router:test"},
                 "prefill": {"replicas": 1, "autoscaling": dict(auto)}, "decode": {"replicas": 1, "autoscaling": dict(auto)},
                 "autoscaling": {"prometheus": {"url": url}, "interval": "30s"}},
    }


def metrics_available(kube: Kube, namespace: str) -> dict:
    return {c["type"]: c for c in kube.status[(namespace, "svc")]["conditions"]}["MetricsAvailable"]


def test_a_hanging_prometheus_does_not_stop_other_services(silent_prometheus, prometheus):
    kube = Kube()
    scaler = Autoscaler(kube, prometheus_signals(), lambda *a: None)
    scaler.query_deadline = 2.0  # a loaded CI machine can take a second over a first query's connection
    bodies = [body("bad", silent_prometheus), body("good", prometheus)]  # the hanging one first
    for round_ in range(2):  # the second round finds the first round's query still hanging
        kube.status.clear()
        started = time.monotonic()
        done, err = finishes(lambda: scaler.run_once(bodies, force=True), within=8)
        assert done, f"round {round_}: one silent Prometheus blocked the autoscaling round"
        assert err is None
        assert time.monotonic() - started < 6  # the hanging query's read timeout is 15 s
        good = metrics_available(kube, "good")
        assert good["status"] == "True" and kube.status[("good", "svc")]["metrics"]["observedAt"]
        bad = metrics_available(kube, "bad")
        assert bad["status"] == "False" and bad["reason"] == "PrometheusUnreachable"
        assert silent_prometheus in bad["message"]


def test_healthz_turns_503_when_the_autoscaler_loop_stops_progressing():
    class StuckKube:
        entered = threading.Event()

        def list_services(self, namespace):
            self.entered.set()
            threading.Event().wait(30)  # an API call that never returns
            return []

    health, stop, kube = Health(), threading.Event(), StuckKube()
    server = serve(health, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        scaler = Autoscaler(kube, lambda *a, **k: {}, lambda *a: None)
        threading.Thread(target=run_forever, args=(scaler, kube, [], stop, 0.01),
                         kwargs={"health": health, "max_age": 2.0}, daemon=True).start()
        assert kube.entered.wait(5)
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.status == 200  # stuck for less than max_age yet
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5):
                    pass
            except urllib.error.HTTPError as e:
                err = e
                break
            assert time.monotonic() < deadline, "/healthz stayed 200 with the loop stuck past max_age"
            time.sleep(0.1)
        assert err.code == 503
        assert "autoscaler" in json.loads(err.read())["stuck"]
    finally:
        stop.set()
        server.shutdown()


def test_a_deleted_service_leaves_no_series_and_no_loop_state():
    """Issue 19, item 8: per-service state goes with the service."""
    from prometheus_client import REGISTRY

    from pd_operator.controller import handlers, metrics

    kube = Kube()
    scaler = Autoscaler(kube, lambda *a, **k: {}, lambda *a: None)
    handlers.STATE["autoscaler"] = scaler
    try:
        for i in range(50):
            metrics.READY.labels("ns", f"svc{i}").set(1)
            scaler.run_once([body("ns", "http://127.0.0.1:1")], force=True)  # no token: state is kept
            scaler.histories[("ns", f"svc{i}")] = {}
            scaler.last_round[("ns", f"svc{i}")] = 1.0
        for i in range(50):
            handlers.forget_service("ns", f"svc{i}")
        series = [s for m in REGISTRY.collect() if m.name == "pd_operator_service_ready" for s in m.samples
                  if s.labels.get("namespace") == "ns" and s.labels["name"].startswith("svc") and s.labels["name"] != "svc"]
        assert series == []
        assert not [k for k in scaler.histories if k[1] != "svc"] and not [k for k in scaler.last_round if k[1] != "svc"]
        handlers.forget_service("ns", "svc")
        assert scaler.histories == {} and scaler.last_round == {} and scaler.last_scale == {}
    finally:
        handlers.STATE.pop("autoscaler", None)
