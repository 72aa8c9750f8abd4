"""The Serving diagnosis against the real routers (vllm-router 0.1.17, sglang-router 0.3.2)
in front of simulated engines, read by real Prometheus: each failure produced for real
(a router key the engines refuse, a worker port nothing listens on, a client asking for
another model, failing KV transfers, a queue limit) and named by autoscale/diagnose.py
from the grouped queries, the same code path as the operator's loop."""

from __future__ import annotations

import dataclasses

import json
import os
import time
import urllib.error
import urllib.request

import pytest

from pd_operator.autoscale.diagnose import diagnose, worker_host
from pd_operator.autoscale.signals import PrometheusSignals
from pd_operator_tools.enginesim.__main__ import config_from_argv

from .conftest import free_port, loopback_host, rendered_engine, wait_http
from .test_prometheus_signals import PROMETHEUS, engine_labels, start_prometheus

pytestmark = [pytest.mark.routers, pytest.mark.skipif(PROMETHEUS is None, reason="needs prometheus")]

KEY = "engine-key"


def post(base: str, model: str, key: str | None = None) -> int:
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hello there"}]}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def stack(procs, router_py, tmp_path, kind: str, *, router_key: str = KEY, decode_opts=(), decode_flags=(),
          dead_decode: bool = False, router_env: dict | None = None):
    """Prefill and decode sims (engine key KEY), the real router, Prometheus scraping all three
    with the labels the shipped scrape job sets. (router URL, Prometheus URL, served name)"""
    example = "vllm-nixl" if kind == "vllm" else "sglang-mooncake"
    pa, pe = rendered_engine(example, "prefill")
    da, de = rendered_engine(example, "decode")
    h = loopback_host()
    pp, dp, rp, mp, dead = (free_port(h) for _ in range(5))
    procs.sim([*pa, "--api-key", KEY], h, pp, env={**pe, "VLLM_NIXL_SIDE_CHANNEL_HOST": h})
    procs.sim([*da, "--api-key", KEY, *decode_flags], h, dp, sim_opts=list(decode_opts),
              env={**de, "VLLM_NIXL_SIDE_CHANNEL_HOST": h})
    if kind == "vllm":
        # vllm-router 0.1.17 sends OPENAI_API_KEY to the workers (its --api-key alone does not: FACTS.md)
        module, flags, prefill = "vllm_router.launch_router", ["--vllm-pd-disaggregation", "--kv-connector", "nixl"], \
            ["--prefill", f"http://{h}:{pp}"]
        env = {"OPENAI_API_KEY": router_key}
    else:
        module, flags = "sglang_router.launch_router", ["--pd-disaggregation"]
        prefill = ["--prefill", f"http://{h}:{pp}", str(config_from_argv(pa).bootstrap_port)]
        env = {}
    decodes = ["--decode", f"http://{h}:{dp}"] + (["--decode", f"http://{h}:{dead}"] if dead_decode else [])
    args = ["--host", h, "--port", str(rp), *flags, *prefill, *decodes, "--api-key", router_key,
            "--prometheus-host", h, "--prometheus-port", str(mp), "--worker-startup-check-interval", "1",
            "--worker-startup-timeout-secs", "5", "--health-check-interval-secs", "1"]
    router = procs.start([str(router_py), "-m", module, *args], env={**env, **(router_env or {})})
    wait_http(f"http://{h}:{rp}/liveness", timeout=60, proc=router)
    url = start_prometheus(procs, tmp_path, {
        "prefill": [(h, pp, engine_labels("svc", "prefill"))], "decode": [(h, dp, engine_labels("svc", "decode"))],
        "router": [(h, mp, engine_labels("svc", "router"))]})
    return f"http://{h}:{rp}", url, config_from_argv(da).served_name


def verdict(prom: str, kind: str, served: str, ready: int):
    router = "vllm-router" if kind == "vllm" else "sglang-router"
    signals = PrometheusSignals(prom).diagnosis(kind, router, window="30s").get(("team-a", "svc"))
    return diagnose(signals, served_name=served, engine=kind, router=router, backend="nixl", ready_workers=ready)


def load(base: str, model: str, key: str | None, seconds: float = 3.0) -> list[int]:
    """Requests spread over a few scrapes (a counter's first sample is not an increase)."""
    codes, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        codes.append(post(base, model, key))
        time.sleep(0.2)
    time.sleep(2.5)  # two scrapes at 1 s
    return codes


CLIENT = {"vllm": None, "sglang": KEY}  # sglang-router also requires its key from clients


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_serving_when_nothing_fails(procs, router_py, tmp_path, kind):
    base, prom, served = stack(procs, router_py, tmp_path, kind)
    codes = load(base, served, CLIENT[kind])
    assert set(codes) == {200}, codes
    v = verdict(prom, kind, served, ready=2)
    assert (v.status, v.reason) == ("True", "Serving"), v
    # each worker's health and circuit breaker, by URL (the verdict matches them to the ready pods' IPs)
    router = "vllm-router" if kind == "vllm" else "sglang-router"
    signals = PrometheusSignals(prom).diagnosis(kind, router, window="30s")[("team-a", "svc")]
    host = base.split("://")[1].rsplit(":", 1)[0]
    assert len(signals.health) == 2 and set(signals.health.values()) == {1.0}, signals.health
    assert {worker_host(w) for w in signals.health} == {host}, signals.health
    # sglang-router exports each worker's breaker (0 closed); vllm-router 0.1.17 exported none here
    if kind == "sglang":
        assert set(signals.circuits) == set(signals.health), signals.circuits
    assert set(signals.circuits.values()) <= {0.0}, signals.circuits


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_engine_key_mismatch(procs, router_py, tmp_path, kind):
    base, prom, served = stack(procs, router_py, tmp_path, kind, router_key="stale-key")
    codes = load(base, served, "stale-key" if kind == "sglang" else None)
    assert 200 not in codes, codes
    v = verdict(prom, kind, served, ready=2)
    assert v.reason == "EngineAuthRejected", v


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_worker_port_nothing_listens_on(procs, router_py, tmp_path, kind):
    base, prom, served = stack(procs, router_py, tmp_path, kind, dead_decode=True)
    load(base, served, CLIENT[kind])
    v = verdict(prom, kind, served, ready=3)  # three engine pods ready as Kubernetes sees them
    assert v.reason == "WorkersUnreachable", v


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_router_behind_a_proxy(procs, router_py, tmp_path, kind):
    """HTTP_PROXY in the router's environment (a cluster-wide proxy injected into
    every pod, no NO_PROXY for pod IPs): the router's requests to the workers
    go to the proxy, which nothing answers here."""
    closed = free_port(loopback_host())
    proxy = {"HTTP_PROXY": f"http://127.0.0.1:{closed}"}
    if kind == "vllm":
        # vllm-router 0.1.17 with static workers waits for them at startup, then exits
        # (with --service-discovery, as rendered, it stays up and waits for each pod:
        # tests/integration/test_diagnose.py)
        with pytest.raises(RuntimeError, match="to become healthy"):
            stack(procs, router_py, tmp_path, kind, router_env=proxy)
        return
    base, prom, served = stack(procs, router_py, tmp_path, kind, router_env=proxy)
    codes = load(base, served, CLIENT[kind])
    assert 200 not in codes, codes
    v = verdict(prom, kind, served, ready=2)
    assert v.reason == "WorkersUnreachable", v


def test_client_asks_for_another_model_sglang(procs, router_py, tmp_path):
    # SGLang 0.5.23's chat handler never compares the model name and sglang-router passes
    # the request on: served with the loaded model, not a failure; the status notes the name
    base, prom, served = stack(procs, router_py, tmp_path, "sglang")
    codes = load(base, "gpt-4o", KEY)
    assert set(codes) == {200}, codes
    v = verdict(prom, "sglang", served, ready=2)
    assert v.reason == "Serving" and "'gpt-4o'" in v.message and "any model name" in v.message, v


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_kv_transfer_failing(procs, router_py, tmp_path, kind):
    base, prom, served = stack(procs, router_py, tmp_path, kind, decode_opts=["--fail-kv-transfer", "1"])
    codes = load(base, served, CLIENT[kind])
    assert 200 not in codes, codes
    v = verdict(prom, kind, served, ready=2)
    assert v.reason == "KVTransferFailing", v
    if kind == "sglang":
        # the failures opened sglang-router's breakers: once they leave the window, the open
        # circuits are what the verdict names (requests answer 503 "all circuits open")
        signals = PrometheusSignals(prom).diagnosis(kind, "sglang-router", window="30s")[("team-a", "svc")]
        assert 1.0 in signals.circuits.values(), signals.circuits
        after = diagnose(dataclasses.replace(signals, kv_failures=0, worker_errors=0), served_name=served,
                         engine=kind, router="sglang-router", ready_workers=2)
        assert after.reason == "WorkersUnreachable" and "circuit breaker is open" in after.message, after


def test_queue_limit_vllm(procs, router_py, tmp_path):
    # vLLM --max-num-queued-reqs 0: every request is refused with 503 at admission
    base, prom, served = stack(procs, router_py, tmp_path, "vllm", decode_flags=["--max-num-queued-reqs", "0"])
    codes = load(base, served, None)
    assert 200 not in codes, codes
    v = verdict(prom, "vllm", served, ready=2)
    assert v.reason == "Overloaded", v
