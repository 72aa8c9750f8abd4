"""End to end: operator -> pods -> processes -> real router -> simulated engines.

The operator runs as a process (``python -m pd_operator -n NS``) against the
real control plane; kwok makes the pods Running; the e2e harness
(e2e/harness.py) backs each engine pod with a simulated engine started with the
command the operator rendered, bound to the pod IP, and each router pod with
the REAL router (vllm-router 0.1.17 / sglang-router 0.3.2) from its venv,
discovering the workers by label selector with the router ServiceAccount's
token and the Role the operator rendered.

Then: a streamed chat completion through the router (prefill sim did the
prompt, decode sim the tokens), ``pdctl bench`` through the router and against
an aggregated (non-PD) sim with the same load, and a decode scale-up the router
picks up by discovery.

Figures are printed (run with ``-s`` to see them). Skipped only when the
routers' venv cannot be created (tests/sim/conftest.py:router_python()).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from pd_operator_tools.enginesim.__main__ import config_from_argv
from pd_operator_tools.enginesim.server import chat_tokens

from tests.conftest import load_e2e_module
from tests.integration.test_operator import (  # noqa: F401 - crd is a fixture
    GROUP,
    PLURAL,
    VERSION,
    Operator,
    crd,
    create,
    service,
    wait_for,
    wait_ready,
)
from tests.sim.conftest import (
    free_port,
    loopback_host,
    metric,
    router_python,
    stream_chat,
    wait_http,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODEL, SERVED = "Qwen/Qwen3-8B", "qwen3-8b"
RDMA = {"resourceName": "rdma/rdma_shared_device_a", "ibDevices": ["mlx5_0"]}
# the same shapes as manifests/examples/{vllm-nixl,sglang-mooncake}.yaml, on the calibrated model, TP1, 1P1D
ENGINES = {
    "vllm-nixl": {"engine": {"kind": "vllm"}, "router": {"image": "registry.example.com/pd/router:test"}, "kvTransfer": {"backend": "nixl", "rdma": RDMA}, "prefix": "vllm:"},
    "sglang-mooncake": {"engine": {"kind": "sglang"}, "router": {"image": "registry.example.com/pd/router:test"}, "kvTransfer": {"backend": "mooncake", "rdma": RDMA},
                        "prefix": "sglang:"},
}
STREAM_TOKENS = 20
PROMPT = "word " * 800  # 4000 characters: 1000 tokens (+ chat overhead)
BENCH = {"rate": 4, "n": 40, "isl": 2000, "osl": 100}


def load_harness_module():
    return load_e2e_module("harness")


@pytest.fixture(scope="module")
def router_py() -> Path:
    return router_python()  # skips (with the reason) when the venv cannot be created


@contextlib.contextmanager
def running_stack(kube_cluster, namespace: str, tmp_path: Path, router_py: Path, operator_env: dict | None = None,
                  sim_opts: tuple = ()):
    """Operator + harness on the test's namespace; yields the harness."""
    op = Operator(kube_cluster.kubeconfig, namespace, tmp_path / "operator.log", env=operator_env).start()
    harness = load_harness_module().Harness(kube_cluster.kubeconfig, namespace, tmp_path / "pods",
                                            router_python=router_py, sim_opts=sim_opts)
    harness.start()
    ok = False
    try:
        yield harness
        assert not harness.errors, harness.errors
        crashed = [(p.pod, p.proc.returncode, str(p.log_path)) for p in harness.exited]
        assert not crashed, f"pod processes exited: {crashed}"
        ok = True
    finally:
        harness.stop()
        op.stop()
        print(f"\n[logs] operator: {tmp_path / 'operator.log'}; pod processes: {tmp_path / 'pods'}")
        if not ok:  # the paths above are gone after CI: the operator's last words here
            lines = (tmp_path / "operator.log").read_text().splitlines()
            print("[operator log, last 60 lines]\n" + "\n".join(lines[-60:]))
        if harness.ip_conflicts:
            print("[harness] pods recreated for a duplicate kwok IP: " + "; ".join(harness.ip_conflicts))


@pytest.fixture
def stack(kube_cluster, crd, namespace, tmp_path, router_py):  # noqa: F811 - crd: the imported fixture
    with running_stack(kube_cluster, namespace, tmp_path, router_py) as harness:
        yield harness


# ----------------------------------------------------------------- helpers


def http_json(url: str, api_key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
        return json.loads(resp.read())


def metrics_of(pp) -> str:
    with urllib.request.urlopen(pp.url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def decode_workers(router_url: str, api_key: str | None = None) -> list[str]:
    """URLs of the decode workers the router has (and deems healthy)."""
    doc = http_json(router_url + "/workers", api_key)
    return sorted(w["url"] for w in doc.get("workers", [])
                  if w.get("worker_type") == "decode" and w.get("is_healthy", True))


def bench(url: str, out: Path, label: str) -> dict:
    cmd = [sys.executable, "-m", "pd_operator.cli", "bench", "--url", url, "--model", SERVED,
           "--rate", str(BENCH["rate"]), "-n", str(BENCH["n"]), "--isl", str(BENCH["isl"]),
           "--osl", str(BENCH["osl"]), "--seed", "7", "--timeout", "60", "--json", str(out), "-q"]
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=180, cwd=REPO)
    print(f"\n--- pdctl bench {label} ---\n{run.stdout}")
    assert run.returncode == 0, run.stderr
    return json.loads(out.read_text())["summary"]


def ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.1f} ms"


def figures(label: str, s: dict) -> str:
    return (f"{label:<22} ok {s['completed']}/{s['sent']}  TTFT p50 {ms(s['ttft_s']['p50'])} p99 {ms(s['ttft_s']['p99'])}"
            f"  ITL p50 {ms(s['itl_s']['p50'])} p99 {ms(s['itl_s']['p99'])}"
            f"  goodput {s['goodput_fraction'] * 100:.0f}% ({s['goodput_rps']:.2f} req/s)")


def rendered_engine_argv(pp) -> list[str]:
    """The engine command line a harness process was started with (after the sim's ``--``)."""
    return pp.argv[pp.argv.index("--") + 1:]


def aggregated_argv(pd_argv: list[str]) -> list[str]:
    """The same engine command without its PD flags: one engine doing both phases."""
    out, skip = [], False
    for a in pd_argv:
        if skip:
            skip = False
            continue
        if a in ("--kv-transfer-config", "--disaggregation-mode", "--disaggregation-transfer-backend",
                 "--disaggregation-bootstrap-port", "--disaggregation-ib-device"):
            skip = True
            continue
        out.append(a)
    return out


# ----------------------------------------------------------------- tests


@pytest.mark.parametrize("example", sorted(ENGINES))
def test_serving_through_the_real_router(example, stack, namespace, custom_objects, kube_cluster, tmp_path):
    spec = ENGINES[example]
    prefix = spec["prefix"]
    name = "pd"
    body = service(name, namespace, model={"name": MODEL, "servedName": SERVED},
                   engine=spec["engine"], kvTransfer=spec["kvTransfer"])
    create(custom_objects, body)
    t0 = time.monotonic()
    wait_ready(custom_objects, namespace, name)
    (pre,) = stack.wait_serving("prefill", 1)
    (dec,) = stack.wait_serving("decode", 1)
    (router,) = stack.wait_serving("router", 1, timeout=60)
    # the router found both workers through the API (none is configured statically)
    wait_for(lambda: decode_workers(router.url) == [dec.url], 45, "router discovered the decode worker")
    assert "--service-discovery" in router.argv and "--prefill" not in router.argv
    print(f"\n[{example}] Ready and serving in {time.monotonic() - t0:.1f}s: router {router.url}, "
          f"prefill {pre.url}, decode {dec.url}")

    # the router ran with the rendered ServiceAccount's token: pods yes, secrets no
    pod_api = client.CoreV1Api(config.new_client_from_config(config_file=str(stack.log_dir / f"{router.pod}.kubeconfig")))
    assert pod_api.list_namespaced_pod(namespace, label_selector="pdserving.io/role=decode").items
    with pytest.raises(ApiException) as denied:
        pod_api.list_namespaced_secret(namespace)
    assert denied.value.status == 403

    # one streamed chat completion through the router
    pieces, models, done = stream_chat(router.url, SERVED, PROMPT, STREAM_TOKENS)
    assert done and len(pieces) == STREAM_TOKENS, pieces
    assert models == {SERVED}
    n_prompt = chat_tokens([{"role": "user", "content": PROMPT}])
    pm, dm = metrics_of(pre), metrics_of(dec)
    assert metric(pm, f"{prefix}prompt_tokens_total") == n_prompt
    assert metric(pm, f"{prefix}generation_tokens_total") == 1
    assert metric(dm, f"{prefix}prompt_tokens_total") == n_prompt  # counted, not computed (its KV was pulled)
    assert metric(dm, f"{prefix}generation_tokens_total") == STREAM_TOKENS
    assert metric(dm, "pdsim_kv_transfer_seconds_count") == 1

    # pdctl bench through the router
    pd = bench(router.url, tmp_path / "bench-pd.json", f"{example} PD via router")
    assert pd["completed"] == pd["sent"] == BENCH["n"], pd["errors"]
    dec_cfg = config_from_argv(rendered_engine_argv(dec))
    cost = dec_cfg.cost()
    itl_lo = cost.decode_uniform_ms(1, BENCH["isl"]) / 1e3
    itl_hi = cost.decode_uniform_ms(16, BENCH["isl"] + BENCH["osl"]) / 1e3
    assert 0 < pd["ttft_s"]["p50"] < 1.0, pd["ttft_s"]
    # the model's step time, plus what a busy 2-core host adds to a real-time sim behind a real router
    assert itl_lo * 0.9 <= pd["itl_s"]["p50"] <= itl_hi * 1.5 + 0.015, (pd["itl_s"], itl_lo, itl_hi)
    # all the prompts' tokens were prefilled on the prefill pod, every output token decoded on the decode pod
    pm, dm = metrics_of(pre), metrics_of(dec)
    assert metric(pm, f"{prefix}generation_tokens_total") == 1 + BENCH["n"]
    assert metric(dm, f"{prefix}generation_tokens_total") == STREAM_TOKENS + BENCH["n"] * BENCH["osl"]
    # the decode pod counts the same prompts (vLLM as external KV; SGLang per finished request)
    assert metric(dm, f"{prefix}prompt_tokens_total") == metric(pm, f"{prefix}prompt_tokens_total")

    # the same load on one aggregated engine (same command without the PD flags)
    host = loopback_host()
    port = free_port(host)
    agg_cmd = aggregated_argv(rendered_engine_argv(pre))
    with (tmp_path / "aggregated.log").open("wb") as fh:
        agg = subprocess.Popen([sys.executable, "-m", "pd_operator_tools.enginesim", "--bind", host, "--bind-port", str(port),
                                "--", *agg_cmd], stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_http(f"http://{host}:{port}/health", proc=agg)
        ag = bench(f"http://{host}:{port}", tmp_path / "bench-agg.json", f"{example} aggregated")
    finally:
        agg.terminate()
        agg.wait(10)
    assert ag["completed"] == ag["sent"] == BENCH["n"], ag["errors"]
    print(f"\n=== {example}: {BENCH['n']} requests, Poisson {BENCH['rate']}/s, ISL {BENCH['isl']}, "
          f"OSL {BENCH['osl']}; model step {itl_lo * 1e3:.2f} ms (B=1) ===")
    print(figures("PD (1P1D, real router)", pd))
    print(figures("aggregated (1 engine)", ag))
    # each aggregated prefill (~60 ms of chunk for 2000 tokens) stalls every running decode;
    # with ~80 of ~4000 gaps stalled that is the p99, far above the PD decode step
    assert pd["itl_s"]["p99"] < ag["itl_s"]["p99"], (pd["itl_s"], ag["itl_s"])


def test_decode_scale_up_is_discovered(stack, namespace, custom_objects, core_v1):
    """Decode 1 -> 2 -> 1, then the router pod deleted: the harness follows the
    pods, the router follows by discovery."""
    name = "scale"
    create(custom_objects, service(name, namespace, model={"name": MODEL, "servedName": SERVED},
                                   engine={"kind": "vllm"}, kvTransfer={"backend": "nixl", "rdma": RDMA}))
    wait_ready(custom_objects, namespace, name)
    stack.wait_serving("prefill", 1)
    (first,) = stack.wait_serving("decode", 1)
    (router,) = stack.wait_serving("router", 1, timeout=60)
    wait_for(lambda: decode_workers(router.url) == [first.url], 45, "router discovered decode-0")

    custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                  {"spec": {"decode": {"replicas": 2}}})
    t0 = time.monotonic()
    decs = stack.wait_serving("decode", 2, timeout=60)
    urls = sorted(p.url for p in decs)
    # kwok marks a pod Ready at once (no readiness probe runs), so the router can see the pod
    # before its sim listens and re-checks after --worker-startup-check-interval (30 s)
    wait_for(lambda: decode_workers(router.url) == urls, 60, "router discovered the new decode pod")
    print(f"\n[scale] decode 1 -> 2 picked up by the router in {time.monotonic() - t0:.1f}s")
    before = {p.pod: metric(metrics_of(p), "vllm:generation_tokens_total") for p in decs}
    for _ in range(6):
        pieces, _, done = stream_chat(router.url, SERVED, "hello " * 50, 4)
        assert done and len(pieces) == 4
    after = {p.pod: metric(metrics_of(p), "vllm:generation_tokens_total") for p in decs}
    print(f"[scale] decode generation tokens before {before} after {after}")
    assert all(after[p] > before[p] for p in before), (before, after)
    assert sum(after.values()) - sum(before.values()) == 6 * 4

    # and back: the pod goes, its process with it, the router keeps serving on the other
    custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                  {"spec": {"decode": {"replicas": 1}}})
    gone = next(p for p in decs if p.pod.endswith("-1"))
    wait_for(lambda: not gone.alive() and len(stack.processes("decode")) == 1, 60, "decode-1 process stopped")
    wait_for(lambda: decode_workers(router.url) == [first.url], 30, "router dropped decode-1")
    pieces, _, done = stream_chat(router.url, SERVED, "hello " * 50, 4)
    assert done and len(pieces) == 4

    # a router pod deleted: the Deployment makes a new one, the harness moves the router to it
    core_v1.delete_namespaced_pod(router.pod, namespace)
    wait_for(lambda: not router.alive(), 30, "old router process stopped")
    (new_router,) = stack.wait_serving("router", 1, timeout=60)
    assert new_router.pod != router.pod
    wait_for(lambda: decode_workers(new_router.url) == [first.url], 45, "new router discovered the workers")
    pieces, _, done = stream_chat(new_router.url, SERVED, "hello " * 50, 4)
    assert done and len(pieces) == 4


@pytest.mark.parametrize("example", [
    # vllm-router 0.1.17 in PD mode sends --api-key only on its /render calls; the
    # prefill/decode requests carry "Authorization: Bearer $OPENAI_API_KEY", so the
    # renderer gives the router OPENAI_API_KEY from the same Secret (found by this test).
    "vllm-nixl",
    "sglang-mooncake",
])
def test_engine_api_key_from_the_secret(example, stack, namespace, custom_objects, core_v1):
    """engine.apiKeySecretRef: the engines get the key from the Secret (secretKeyRef, resolved
    by the harness as the kubelet would), the router as ``--api-key`` appended inside the
    process from ROUTER_WORKER_API_KEY (render/launch.py), never in its command line; the engine alone refuses a request without the key, a client
    through the router is served (sglang-router: only with the key, it checks clients too)."""
    spec, key = ENGINES[example], "e2e-engine-key-123"
    core_v1.create_namespaced_secret(namespace, {"metadata": {"name": "engine-key"}, "stringData": {"api-key": key}})
    create(custom_objects, service("auth", namespace, model={"name": MODEL, "servedName": SERVED},
                                   engine={**spec["engine"], "apiKeySecretRef": {"name": "engine-key"}},
                                   kvTransfer=spec["kvTransfer"]))
    wait_ready(custom_objects, namespace, "auth")
    stack.wait_serving("prefill", 1)
    (dec,) = stack.wait_serving("decode", 1)
    (router,) = stack.wait_serving("router", 1, timeout=60)
    wait_for(lambda: decode_workers(router.url, key) == [dec.url], 45, "router discovered the decode worker")
    assert key in dec.env.values() and key in router.env.values()  # resolved from the Secret
    assert key not in " ".join(router.argv)  # the launcher keeps it out of the process list
    with pytest.raises(urllib.error.HTTPError) as refused:
        stream_chat(dec.url, SERVED, "hello", 1)
    assert refused.value.code == 401
    if example.startswith("sglang"):
        # sglang-router 0.3.2 also requires its --api-key from clients (api/models.py documents it)
        with pytest.raises(urllib.error.HTTPError) as no_key:
            stream_chat(router.url, SERVED, "hello " * 50, 4)
        assert no_key.value.code == 401
        client_key = key
    else:
        client_key = None  # vllm-router 0.1.17 has no client-key check of its own
    pieces, models, done = stream_chat(router.url, SERVED, "hello " * 50, 4, api_key=client_key)
    assert done and len(pieces) == 4 and models == {SERVED}


# decode steps of the calibrated 8B model take ~5 ms at small batch: 1500 tokens keep a
# request in flight for ~8 s, longer than the preStop sleep below
LONG_TOKENS = 1500


@pytest.mark.parametrize("example", sorted(ENGINES))
def test_decode_scale_down_under_load_loses_no_request(example, stack, namespace, custom_objects):
    """Decode 2 -> 1 while streams run on both pods and new ones keep coming.

    The kubelet (the harness) gives the removed pod its preStop sleep, then
    SIGTERM, then SIGKILL at the grace period. vLLM 0.33.0 with the default
    --shutdown-timeout 0 aborts every in-flight request on SIGTERM (the sim does
    the same), so this fails unless the rendered command makes the engine drain.
    Asserts: the removed pod had requests in flight when it was told to go;
    every request (those in flight and those sent during the scale-down)
    returns all its tokens and [DONE]; the removed pod's process exits by
    itself (status 0) before the grace period, not by SIGKILL."""
    spec = ENGINES[example]
    prefix = spec["prefix"]
    name = "drain"
    create(custom_objects, service(name, namespace, model={"name": MODEL, "servedName": SERVED},
                                   engine=spec["engine"], kvTransfer=spec["kvTransfer"],
                                   decode={"replicas": 2, "drainSeconds": 2, "terminationGracePeriodSeconds": 120}))
    wait_ready(custom_objects, namespace, name)
    stack.wait_serving("prefill", 1)
    decs = stack.wait_serving("decode", 2, timeout=60)
    (router,) = stack.wait_serving("router", 1, timeout=60)
    urls = sorted(p.url for p in decs)
    wait_for(lambda: decode_workers(router.url) == urls, 60, "router discovered both decode pods")
    gone = next(p for p in decs if p.pod.endswith("-1"))
    running = f"{prefix}num_requests_running" if prefix == "vllm:" else "sglang:num_running_reqs"

    results: list[tuple[int, bool]] = []
    errors: list[str] = []
    stop_sending = threading.Event()
    lock = threading.Lock()

    def one() -> None:
        try:
            pieces, _, done = stream_chat(router.url, SERVED, "hello " * 50, LONG_TOKENS)
            with lock:
                results.append((len(pieces), done))
        except Exception as exc:  # noqa: BLE001 - a refused or cut request is a lost one
            with lock:
                errors.append(repr(exc))

    def load() -> None:
        threads = []
        while not stop_sending.is_set():
            t = threading.Thread(target=one)
            t.start()
            threads.append(t)
            stop_sending.wait(0.5)
        for t in threads:
            t.join(120)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        wait_for(lambda: metric(metrics_of(gone), running) >= 1, 30, "requests in flight on decode-1")
        in_flight = metric(metrics_of(gone), running)
        custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                      {"spec": {"decode": {"replicas": 1}}})
        wait_for(lambda: not gone.alive(), 120, "decode-1 process stopped")
        time.sleep(3)  # keep sending a little after the pod is gone
    finally:
        stop_sending.set()
        loader.join(240)
    print(f"\n[{example}] scale-down with {in_flight:g} requests in flight on {gone.pod}: "
          f"{len(results)} finished, {len(errors)} failed; {gone.pod} exit status {gone.proc.returncode}")
    assert in_flight >= 1
    assert not errors, errors
    short = [r for r in results if r != (LONG_TOKENS, True)]
    assert not short, f"{len(short)} of {len(results)} requests lost tokens (aborted): {short[:5]}"
    assert gone.proc.returncode == 0, "the engine did not finish draining before SIGKILL"
