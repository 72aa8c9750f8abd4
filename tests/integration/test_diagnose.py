"""The Serving condition on the local cluster (issue 18), everything real but the GPUs:

operator process -> pods (kwok) -> the e2e harness backs them with simulated
engines and the REAL router -> real Prometheus with the shipped scrape job
(engines and routers) -> the operator's loop queries it -> status.

Each failure is produced for real, in turn, through the router, while a client
keeps sending requests; status must name it within two Prometheus scrapes (plus
one operator round) of the first failed request, then go back to Serving once
it is fixed (a shortened counter window, PD_OPERATOR_DIAGNOSIS_WINDOW):

- EngineAuthRejected: the engine-key Secret is rotated and only the router
  restarts (it reads the new key, the engines still hold the old one);
  fixed by restarting the engine pods.
- WorkersUnreachable: an HTTP proxy is put into the router's environment
  from outside the operator (as a cluster-wide proxy injector does, with no
  NO_PROXY for the pod IPs), so the router's health checks and requests go to
  a proxy that does not answer; fixed by removing it. (A port the engines do
  not listen on is not this failure on a real cluster: the readiness probe
  fails, the pod never gets Ready and the router never discovers it.)
- KVTransferFailing: the decode engine fails every KV transfer
  (PDSIM_FAIL_KV_TRANSFER=1, counted in the engine's real failure counter).
- Overloaded (vLLM): decode runs with --max-num-queued-reqs 0, every request
  is refused with 503 at admission, as vLLM 0.33.0 does.
- another model name (sglang-router labels the model asked for): SGLang's
  chat API serves any name with the loaded model, so Serving stays True and
  its message notes the name (UnknownModelRequested needs the 404s that only
  vLLM, or SGLang's Responses API, answers).

Timings are printed (run with -s).
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from tests.integration.test_autoscale_closed_loop import PROMETHEUS, Prometheus
from tests.integration.test_e2e_serving import ENGINES, MODEL, SERVED, decode_workers, router_py, running_stack  # noqa: F401
from tests.integration.test_operator import crd  # noqa: F401  (fixture)
from tests.integration.test_operator import condition, create, get_svc, wait_for, wait_ready

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(PROMETHEUS is None, reason="needs prometheus (tests/run.sh builds it)")]

SCRAPE_S = 2.0
INTERVAL_S = 2.0
# two scrapes (a lazily created counter needs a second sample), one operator round and its query,
# with 8 s for a loaded CI machine (a diagnosis that waited out its 10 s window would take ~16 s)
WITHIN_S = 2 * SCRAPE_S + INTERVAL_S + 8.0
OPERATOR_ENV = {"PD_OPERATOR_AUTOSCALE_TICK_SECONDS": "1", "PD_OPERATOR_DIAGNOSIS_WINDOW": "10s"}


class Client:
    """A client sending a small chat completion every 0.25 s; remembers when each status code was first seen."""

    def __init__(self, url: str, model: str, key: str | None):
        self.url, self.model, self.key = url, model, key
        self.first: dict[int, float] = {}
        self.last_code: int | None = None
        self.changes: list[tuple[float, int]] = []  # (when, code) each time the answer changed
        self.reset_at = time.monotonic()  # when the clock was last restarted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Client":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(35)

    def reset(self, model: str | None = None, key: str | None = None) -> None:
        self.first.clear()
        self.changes.clear()
        self.reset_at = time.monotonic()
        if model:
            self.model = model
        if key:
            self.key = key

    def failing_since(self) -> float | None:
        bad = [t for code, t in self.first.items() if code not in (0, 200)]  # 0: router restarting
        return min(bad) if bad else None

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            body = {"model": self.model, "max_tokens": 2, "messages": [{"role": "user", "content": "hello " * 20}]}
            headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.key}"} if self.key else {})}
            req = urllib.request.Request(self.url + "/v1/chat/completions", json.dumps(body).encode(), headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    code = resp.status
            except urllib.error.HTTPError as err:
                code = err.code
            except Exception:  # noqa: BLE001 - router restarting: no answer
                code = 0
            if code != self.last_code:
                self.changes.append((time.monotonic(), code))
            self.last_code = code
            self.first.setdefault(code, time.monotonic())


def secret(core_v1, namespace: str, key: str) -> None:
    body = client.V1Secret(metadata=client.V1ObjectMeta(name="engine-key"),
                           data={"key": base64.b64encode(key.encode()).decode()})
    try:
        core_v1.create_namespaced_secret(namespace, body)
    except client.ApiException as err:
        if err.status != 409:
            raise
        core_v1.replace_namespaced_secret("engine-key", namespace, body)


def delete_pods(core_v1, namespace: str, name: str, role: str) -> None:
    for pod in core_v1.list_namespaced_pod(namespace, label_selector=f"pdserving.io/service={name},pdserving.io/role={role}").items:
        core_v1.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def router_proxy(apps_v1, namespace: str, name: str, port: int | None) -> None:
    """HTTP_PROXY in the router container's env (None: taken out again), written by
    this test's own field manager, as a proxy injector would; the operator's apply
    owns its own env entries only, so it leaves this one alone."""
    dep = apps_v1.read_namespaced_deployment(f"{name}-router", namespace)
    container = dep.spec.template.spec.containers[0].name
    env = [] if port is None else [{"name": "HTTP_PROXY", "value": f"http://127.0.0.1:{port}"}]
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{name}-router", "namespace": namespace},
            "spec": {"template": {"spec": {"containers": [{"name": container, "env": env}]}}}}
    apps_v1.api_client.call_api(*apps_v1.api_client.param_serialize(
        "PATCH", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}-router",
        query_params=[("fieldManager", "proxy-injector"), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml"}, body=body,
        auth_settings=["BearerToken"])).read()


def patch_spec(custom_objects, namespace: str, name: str, spec: dict) -> None:
    from tests.integration.test_operator import GROUP, PLURAL, VERSION

    custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


class Serving:
    """The service's Serving condition, polled every 0.25 s on a thread: a reason that
    held for only a few seconds (SGLang: KVTransferFailing for one window, then the
    router's open circuit breakers) is still seen."""

    def __init__(self, custom_objects, namespace: str, name: str):
        self.custom, self.namespace, self.name = custom_objects, namespace, name
        self.timeline: list[str] = []
        self.seen: list[tuple[float, str, str]] = []  # (when, reason, message) at each change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def cond(self) -> dict:
        return condition(get_svc(self.custom, self.namespace, self.name), "Serving") or {}

    def _poll(self) -> None:
        while not self._stop.wait(0.25):
            try:
                c = self.cond()
            except Exception:  # noqa: BLE001 - API server busy: next poll
                continue
            if c and (not self.seen or self.seen[-1][1] != c.get("reason")):
                self.seen.append((time.monotonic(), c.get("reason", ""), c.get("message", "")))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def named(self, reason: str, after: float) -> tuple[float, str] | None:
        """When ``reason`` was first seen after ``after`` (or ``after`` itself, if it was the
        reason then), and its message."""
        seen = list(self.seen)
        before = [x for x in seen if x[0] < after]
        if before and before[-1][1] == reason:
            return after, before[-1][2]
        return next(((t, m) for t, r, m in seen if r == reason and t >= after), None)

    def wait(self, reason: str, load: Client | None = None, timeout: float = 120.0) -> float | None:
        """Wait for the reason (named since the client's clock started, or now); the
        seconds from the client's first failure to status naming it."""
        after = load.reset_at if load else time.monotonic()
        if reason == "Serving":
            wait_for(lambda: self.cond().get("reason") == reason, timeout, f"Serving reason {reason} (now {self.cond()})")
            hit = (time.monotonic(), self.cond().get("message", ""))
        else:
            hit = wait_for(lambda: self.named(reason, after), timeout,
                           f"Serving reason {reason} (seen {[r for _, r, _ in self.seen[-6:]]})")
        t, message = hit
        if load and reason != "Serving":
            # named before the client saw its first failure since its clock started (the
            # faulty pod was routable): counted to that first failure
            wait_for(load.failing_since, 30, f"a failed request while {reason}")
            t = max(t, load.failing_since())
        since = load.failing_since() if load else None
        delay = None if since is None else t - since
        self.timeline.append(f"  {reason:<24} {'' if delay is None else f'{delay:5.1f}s after the first failed request'}"
                             f"  {message[:160]}")
        if load and load.changes:
            self.timeline.append("      client answers: " + ", ".join(f"{c} at {w - t:+.1f}s" for w, c in load.changes[-8:]))
        return delay


@pytest.fixture
def diag(kube_cluster, crd, namespace, tmp_path, router_py):  # noqa: F811 - fixtures
    prom = Prometheus(kube_cluster.kubeconfig, namespace, tmp_path, scrape_interval=f"{SCRAPE_S:g}s").start()
    try:
        with running_stack(kube_cluster, namespace, tmp_path, router_py, operator_env=OPERATOR_ENV) as harness:
            yield prom, harness
    finally:
        prom.stop()


def diag_service(namespace: str, example: str, prom_url: str, **extra) -> dict:
    from tests.integration.test_operator import service

    spec = ENGINES[example]
    return service("diag", namespace, model={"name": MODEL, "servedName": SERVED},
                   engine={**spec["engine"], "apiKeySecretRef": {"name": "engine-key", "key": "key"}},
                   # health checks every 2 s (default 60); a new worker re-checked every 1 s until
                   # healthy (default 30: kwok marks pods Ready before the sim listens, see routed_decode)
                   router={**spec["router"], "extraArgs": ["--health-check-interval-secs", "2",
                                                           "--worker-startup-check-interval", "1"]},
                   kvTransfer=spec["kvTransfer"], autoscaling={"prometheus": {"url": prom_url}, "interval": f"{INTERVAL_S:g}s"},
                   **extra)


def routed_decode(harness, router_url: str, key: str | None, fault=lambda p: True):
    """The newest serving decode pod matching ``fault`` (a predicate on its process), once
    the router holds it as a healthy worker. Waiting for the router too matters: kwok marks
    a pod Ready before its process listens (e2e/harness.py), and vllm-router's discovery
    handles one pod at a time, waiting up to --worker-startup-timeout-secs for each to get
    healthy; a pod rolled away before that check passed stalls its discovery for minutes,
    which a kubelet (Ready only after the readiness probe) would not cause."""
    def newest():
        pods = [p for p in harness.wait_serving("decode", 1, timeout=120) if fault(p)]
        pod = max(pods, key=lambda p: p.started) if pods else None
        # serving for a few of the router's 1-s startup checks: a worker URL listed now is
        # this pod's, not one left from an earlier pod on the same IP (the harness reuses IPs)
        settled = pod is not None and time.monotonic() - pod.started >= 3.0
        return pod if settled and pod.url in decode_workers(router_url, key) else None
    return wait_for(newest, 120, "the router holding the new decode pod")


def faulty_decode_serving(harness, router_url: str, key: str | None, load: Client, fault) -> None:
    """Wait for the decode pod carrying ``fault`` to serve through the router, then restart
    the client's clock: the answers of the rollout in between (the old pod draining, the
    router between workers) are not the failure under test."""
    routed_decode(harness, router_url, key, fault)
    load.reset()


def up(harness, namespace: str, key: str | None = None):
    harness.wait_serving("prefill", 1, timeout=90)
    (router,) = harness.wait_serving("router", 1, timeout=90)
    routed_decode(harness, router.url, key)
    return router


@pytest.mark.parametrize("example", ["vllm-nixl", "sglang-mooncake"])
def test_each_failure_is_named_then_clears(example, diag, namespace, core_v1, apps_v1, custom_objects):
    prom, harness = diag
    vllm = example.startswith("vllm")
    secret(core_v1, namespace, "key-1")
    create(custom_objects, diag_service(namespace, example, prom.url))
    wait_ready(custom_objects, namespace, "diag")
    client_key = None if vllm else "key-1"  # sglang-router also wants its key from clients
    router = up(harness, namespace, client_key)
    status = Serving(custom_objects, namespace, "diag")
    load = Client(router.url, SERVED, client_key).start()
    delays: dict[str, float | None] = {}
    try:
        status.wait("Serving", timeout=90)

        # 1. engine key: the Secret rotated, only the router restarted
        secret(core_v1, namespace, "key-2")
        load.reset(key=None if vllm else "key-2")
        old = router.pod
        delete_pods(core_v1, namespace, "diag", "router")
        # clients reach the router through its Service; here: the new router pod's process
        router = wait_for(lambda: next((p for p in harness.wait_serving("router", 1, timeout=90) if p.pod != old), None),
                          90, "the new router pod serving")
        load.url = router.url
        load.reset()  # the old router's answers (a 401 for the new client key on sglang) are not this failure
        wait_for(lambda: load.last_code not in (None, 0, 200), 90, "requests refused through the new router")
        delays["EngineAuthRejected"] = status.wait("EngineAuthRejected", load)
        delete_pods(core_v1, namespace, "diag", "prefill")
        delete_pods(core_v1, namespace, "diag", "decode")
        up(harness, namespace, load.key)
        status.wait("Serving", timeout=120)

        # 3. every KV transfer into decode fails
        load.reset()
        patch_spec(custom_objects, namespace, "diag", {"decode": {"replicas": 1, "tensorParallelSize": 1,
                   "gpuProduct": "NVIDIA-H200", "env": [{"name": "PDSIM_FAIL_KV_TRANSFER", "value": "1"}]}})
        faulty_decode_serving(harness, router.url, load.key, load, lambda p: p.env.get("PDSIM_FAIL_KV_TRANSFER") == "1")
        # a 500 seen since the clock started (on SGLang the 500s last ~1 s: then the breakers open, 503)
        wait_for(load.failing_since, 120, "KV transfers failing (500, then 503 once sglang-router's breakers open)")
        delays["KVTransferFailing"] = status.wait("KVTransferFailing", load)
        patch_spec(custom_objects, namespace, "diag", {"decode": {"replicas": 1, "tensorParallelSize": 1,
                   "gpuProduct": "NVIDIA-H200", "env": []}})
        up(harness, namespace, load.key)
        status.wait("Serving", timeout=120)

        if vllm:
            # 4. a queue limit of 0: vLLM refuses every request at admission with 503
            load.reset()
            patch_spec(custom_objects, namespace, "diag", {"decode": {"replicas": 1, "tensorParallelSize": 1,
                       "gpuProduct": "NVIDIA-H200", "extraArgs": ["--max-num-queued-reqs", "0"]}})
            faulty_decode_serving(harness, router.url, load.key, load, lambda p: "--max-num-queued-reqs" in p.argv)
            wait_for(lambda: load.last_code not in (None, 0, 200), 120, "requests refused at the queue limit")
            delays["Overloaded"] = status.wait("Overloaded", load)
            patch_spec(custom_objects, namespace, "diag", {"decode": {"replicas": 1, "tensorParallelSize": 1,
                       "gpuProduct": "NVIDIA-H200", "extraArgs": []}})
            up(harness, namespace, load.key)
            status.wait("Serving", timeout=120)
        else:
            # 4. the client asks for another model name: SGLang's chat API serves any name with
            #    the loaded model (it never compares it), so nothing fails; sglang-router labels
            #    the name asked for and the Serving message notes it
            load.reset(model="gpt-4o")
            wait_for(lambda: load.first.get(200), 60, "answers for the other name")
            t = time.monotonic()
            wait_for(lambda: "'gpt-4o'" in status.cond().get("message", ""), WITHIN_S, "the other model name noted")
            status.timeline.append(f"  Serving (noted 'gpt-4o')  {time.monotonic() - t:5.1f}s after the first request for it")
            assert status.cond()["status"] == "True" and set(load.first) == {200}, (status.cond(), load.first)
            load.reset(model=SERVED)
        # 5. the router behind a proxy that does not answer: HTTP_PROXY added to the router's
        #    Deployment by another writer (the operator owns its own env entries, not this one).
        #    The new router holds no healthy worker, so its /readiness answers 503: on a real
        #    cluster that pod stays unready (its Service has no endpoint once the old pod is
        #    gone, e.g. evicted); kwok marks it Ready and the old one goes at once. The client
        #    talks to the new router's process, which is up (/liveness).
        old = router.pod
        router_proxy(apps_v1, namespace, "diag", closed_port())
        router = wait_for(lambda: next((p for p in harness.wait_serving("router", 1, timeout=90, path="/liveness")
                                        if p.pod != old), None), 90, "the router pod with the proxy up")
        load.url = router.url
        load.reset()
        wait_for(lambda: load.last_code not in (None, 0, 200), 90, "requests failing through the proxied router")
        delays["WorkersUnreachable"] = status.wait("WorkersUnreachable", load, timeout=120)
        old = router.pod
        router_proxy(apps_v1, namespace, "diag", None)
        router = wait_for(lambda: next((p for p in harness.wait_serving("router", 1, timeout=90) if p.pod != old), None),
                          90, "the router pod without the proxy serving")
        load.url = router.url
        up(harness, namespace, load.key)
        status.wait("Serving", timeout=120)

    finally:
        load.stop()
        status.stop()
        print(f"\n=== Serving condition, {example} (scrape {SCRAPE_S:g} s, round {INTERVAL_S:g} s) ===\n"
              + "\n".join(status.timeline))
    events = [e for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.name == "diag"]
    reasons = {e.reason for e in events}
    for failure in delays:
        assert failure in reasons, (failure, reasons)  # an Event when it started
    assert "ServingRecovered" in reasons  # and when it ended
    for failure, delay in delays.items():
        assert delay is not None and delay <= WITHIN_S, (failure, delay)
