"""The autoscaler's queries against real Prometheus scraping a simulated engine."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from pd_operator.autoscale.signals import PrometheusSignals
from tests.conftest import prometheus_binary
from tests.sim.conftest import free_port, get, loopback_host, metric, parse_metrics, start_prometheus

PROMETHEUS = prometheus_binary()
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs prometheus (tests/run.sh builds it)")


def complete(url: str, n: int, max_tokens: int = 8, first: int = 0) -> None:
    """n completions with prompts of 400 + 50 i words, i from ``first``."""
    for i in range(first, first + n):
        body = json.dumps({"model": "q", "prompt": "word " * (400 + 50 * i), "max_tokens": max_tokens}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200


def bucket_bounds(metrics_text: str, name: str, q: float) -> tuple[float, float]:
    """The histogram bucket that holds quantile q of the engine's own histogram."""
    buckets = sorted(
        (float(k.split('le="')[1].split('"')[0]), v)
        for k, v in parse_metrics(metrics_text).items() if k.startswith(name + "_bucket")
    )
    total = buckets[-1][1]
    prev = 0.0
    for le, count in buckets:
        if count >= q * total:
            return prev, le
        prev = le
    raise AssertionError("empty histogram")


def engine_labels(service: str, role: str) -> dict:
    return {"namespace": "team-a", "pdserving_io_service": service, "pdserving_io_role": role}


def test_ttft_quantile_idle_and_absent(procs, tmp_path):
    busy_host, idle_host = loopback_host(), loopback_host()
    busy_port, idle_port = free_port(busy_host), free_port(idle_host)
    engine = ["vllm", "serve", "Qwen/Qwen3-8B", "--served-model-name", "q", "--port", "8000"]
    procs.sim(engine, busy_host, busy_port)
    procs.sim(engine, idle_host, idle_port)
    url = start_prometheus(procs, tmp_path, {"engines": [(busy_host, busy_port, engine_labels("busy", "prefill")),
                                                          (idle_host, idle_port, engine_labels("idle", "prefill"))]})
    complete(f"http://{busy_host}:{busy_port}", 12)
    time.sleep(3.5)
    obs = PrometheusSignals(url).pool("vllm", "prefill", 0.99, window="30s")
    lo, hi = bucket_bounds(get(f"http://{busy_host}:{busy_port}/metrics")[1], "vllm:time_to_first_token_seconds", 0.99)
    busy = obs[("team-a", "busy")].observed
    assert busy is not None and lo <= busy <= hi, (busy, lo, hi)
    assert obs[("team-a", "idle")].observed == 0.0
    assert obs[("team-a", "busy")].demand > 0  # prompt tokens/s
    assert ("team-a", "absent") not in obs
    assert obs[("team-a", "busy")].queue is None  # secondaries: only queried when asked for


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_lengths_and_secondary_signals(procs, tmp_path, kind):
    """Mean ISL/OSL as the engine's own counters give them, and the per-replica
    queue and KV-cache usage of an engine that keeps requests waiting (one
    sequence at a time), against an idle one."""
    busy_host, idle_host = loopback_host(), loopback_host()
    busy_port, idle_port = free_port(busy_host), free_port(idle_host)
    if kind == "vllm":
        engine = ["vllm", "serve", "Qwen/Qwen3-8B", "--served-model-name", "q", "--port", "8000", "--max-num-seqs", "1"]
    else:
        engine = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--served-model-name", "q",
                  "--port", "8000", "--enable-metrics", "--max-running-requests", "1"]
    procs.sim(engine, busy_host, busy_port)
    procs.sim(engine, idle_host, idle_port)
    # the busy engine seen as both pools of its service: prefill gives the ISL, decode the OSL
    url = start_prometheus(procs, tmp_path, {
        "prefill": [(busy_host, busy_port, engine_labels("busy", "prefill")), (idle_host, idle_port, engine_labels("idle", "prefill"))],
        "decode": [(busy_host, busy_port, engine_labels("busy", "decode")), (idle_host, idle_port, engine_labels("idle", "decode"))],
    })
    # SGLang makes its per-stage series at the first observation (metrics_collector.py
    # observe_per_stage_req_latency): one request first, scraped, so that the window's rate starts
    # from a sample of the series (a counter's first sample is its baseline)
    stage = "vllm:request_prefill_time_seconds" if kind == "vllm" else "sglang:per_stage_req_latency_seconds"
    complete(f"http://{busy_host}:{busy_port}", 1, 64)
    time.sleep(2.5)
    before = get(f"http://{busy_host}:{busy_port}/metrics")[1]
    with ThreadPoolExecutor(8) as pool:  # 8 at once into 1 slot: 7 wait
        list(pool.map(lambda i: complete(f"http://{busy_host}:{busy_port}", 1, 64 + i, first=i), range(8)))
    time.sleep(3.5)
    wanted = {"queueDepth", "kvCacheUsage"}
    signals = PrometheusSignals(url)
    prefill = signals.pool(kind, "prefill", 0.99, window="30s", secondaries=wanted)
    decode = signals.pool(kind, "decode", 0.99, window="30s", secondaries=wanted)
    text = get(f"http://{busy_host}:{busy_port}/metrics")[1]
    isl = metric(text, f"{kind}:prompt_tokens_total") / metric(text, f"{kind}:time_to_first_token_seconds_count")
    osl = metric(text, f"{kind}:generation_tokens_total") / metric(text, f"{kind}:e2e_request_latency_seconds_count")
    busy, idle = decode[("team-a", "busy")], decode[("team-a", "idle")]
    assert busy.mean_isl == pytest.approx(isl, rel=0.02) == prefill[("team-a", "busy")].mean_isl
    assert busy.mean_osl == pytest.approx(osl, rel=0.02) and 64 <= busy.mean_osl <= 71
    assert prefill[("team-a", "busy")].mean_osl is None  # prefill capacity needs no OSL: not queried
    # the engines' mean step time (the cost model's online check): the ITL histogram's sum over count
    itl = (metric(text, f"{kind}:inter_token_latency_seconds_sum")
           / metric(text, f"{kind}:inter_token_latency_seconds_count"))
    assert busy.mean_itl == pytest.approx(itl, rel=0.02) and 0 < busy.mean_itl < 0.05
    assert idle.mean_itl is None and prefill[("team-a", "busy")].mean_itl is None
    # the prefill engines' speed: vLLM's prefill-time histogram, SGLang's prefill_forward stage, sum over count
    # (vLLM's series is there from the start, at 0: the window sees every request; SGLang's from the
    # first request's scrape on)
    base = {part: 0.0 if kind == "vllm" else metric(before, stage + part) for part in ("_sum", "_count")}
    pt = (metric(text, stage + "_sum") - base["_sum"]) / (metric(text, stage + "_count") - base["_count"])
    assert prefill[("team-a", "busy")].mean_prefill_time == pytest.approx(pt, rel=0.02) and pt > 0
    # the share of prompt tokens from a prefix cache: none here (vLLM's counter at 0; SGLang's appears at a hit)
    assert prefill[("team-a", "busy")].cached_share == (0.0 if kind == "vllm" else None)
    if kind == "vllm":
        assert prefill[("team-a", "idle")].mean_prefill_time is None
    else:
        # SGLang creates its TTFT series at the first request: an engine never used has none, so
        # the pool has no latency data (and holds)
        assert ("team-a", "idle") not in prefill
    assert busy.mean_prefill_time is None
    assert busy.queue > 0 and busy.kv_usage > 0
    assert (idle.mean_isl, idle.mean_osl, idle.queue, idle.kv_usage) == (None, None, 0.0, 0.0)
    # offered load (issue 14): the pool's waiting and running requests, summed over its pods
    assert busy.waiting_total > 0 and idle.waiting_total == 0.0 and idle.running_total == 0.0
    # every pod with a queue: one pod here, so the least pod's average is the pool's average queue
    assert busy.waiting_min == pytest.approx(busy.queue) and busy.waiting_min > 0 and idle.waiting_min == 0.0
    # the prefill backlog now (all 8 done: none; tests/sim/test_promql_results.py checks its
    # growth's figures)
    assert prefill[("team-a", "busy")].backlog_now == 0.0
    assert kind == "sglang" or prefill[("team-a", "idle")].backlog_now == 0.0
    # OSL spread from the generated-tokens histogram (vLLM: vllm:request_generation_tokens,
    # 1-2-5 buckets): every OSL here is 64..71, all in (50, 100], read at its geometric middle
    if kind == "vllm":
        assert busy.osl_bias == pytest.approx((50 * 100) ** 0.5, rel=0.01)
    else:
        # SGLang's histogram without --generation-tokens-buckets has the prompt defaults
        # (100, 300, ...): every OSL here is in the first bucket, read at sqrt(1 * 100); the
        # capacity holds the bias at least at the mean OSL (capacity._context), so this coarse
        # reading cannot shrink the decode context below the mean
        assert busy.osl_bias == pytest.approx(10.0, rel=0.01) and busy.osl_bias < busy.mean_osl
