"""The reading of the autoscaler's query results (idle is 0, absent is no data).

What the queries themselves return is tested against real Prometheus in
tests/sim/test_promql_results.py."""

from __future__ import annotations

import math

from pd_operator.autoscale.promql import Observation, by_service, observations, pool_queries


def series(ns, svc, v):
    return {"metric": {"namespace": ns, "pdserving_io_service": svc}, "value": [1.0, str(v)]}


def test_results_by_service_idle_and_missing():
    quant = by_service([series("a", "busy", 0.8), series("a", "idle", "NaN"), series("b", "broken", "NaN")])
    rates = by_service([series("a", "busy", 5.0), series("a", "idle", 0.0)])
    obs = observations(quant, rates, by_service([series("a", "busy", 12000)]))
    assert obs[("a", "busy")].observed == 0.8 and obs[("a", "busy")].demand == 12000
    assert obs[("a", "idle")].observed == 0.0          # no requests: a real signal
    assert obs[("b", "broken")].observed is None       # NaN and no rate: no data -> hold
    assert ("c", "absent") not in obs
    assert not math.isnan(obs[("a", "busy")].observed)


def test_series_without_our_labels_are_ignored():
    assert by_service([{"metric": {"job": "x"}, "value": [1, "1"]}, {"metric": {}, "value": []}]) == {}


def test_pool_queries_ask_for_secondaries_only_when_wanted():
    load = {"waiting_total", "running_total", "waiting_min"}  # offered load: always asked (decide's demand)
    assert set(pool_queries("vllm", "prefill", 0.99)) == {"quantile", "rate", "demand", "mean_isl",
                                                          "mean_prefill_time", "cached_share",
                                                          "backlog_now", "backlog_growth", "prompt_hist",
                                                          "latency_hist"} | load
    # prompt lengths: the tokens computed (not served from a prefix cache) where the engine
    # has that histogram, else all of them
    assert pool_queries("vllm", "prefill", 0.99)["prompt_hist"].promql == (
        'sum by (namespace, pdserving_io_service, le) (rate(vllm:request_prefill_kv_computed_tokens_bucket'
        '{pdserving_io_role="prefill"}[1m])) or sum by (namespace, pdserving_io_service, le) '
        '(rate(vllm:request_prompt_tokens_bucket{pdserving_io_role="prefill"}[1m]))')
    # the share of prompt tokens served from a prefix cache: they cost no prefill time
    assert pool_queries("vllm", "prefill", 0.99)["cached_share"].promql == (
        'sum by (namespace, pdserving_io_service) (rate(vllm:prompt_tokens_cached_total{pdserving_io_role="prefill"}[1m]))'
        ' / sum by (namespace, pdserving_io_service) (rate(vllm:prompt_tokens_total{pdserving_io_role="prefill"}[1m]))')
    # SGLang: its PD prefill workers observe no TTFT; the decode pods' is the request's
    sg = pool_queries("sglang", "prefill", 0.99)
    assert 'sglang:time_to_first_token_seconds_bucket{pdserving_io_role="decode"}' in sg["quantile"].promql
    assert 'sglang:time_to_first_token_seconds_count{pdserving_io_role="decode"}' in sg["rate"].promql
    assert '{pdserving_io_role="decode"}' in sg["latency_hist"].promql
    # the streamed requests where a service has any (a batched one's TTFT is its first output batch)
    assert 'is_streaming="true"' in sg["quantile"].promql and 'is_streaming' not in sg["rate"].promql
    assert sg["mean_isl"].promql.endswith(
        '/ sum by (namespace, pdserving_io_service) (rate(sglang:prompt_tokens_histogram_count{pdserving_io_role="prefill"}[1m]))')
    # SGLang: the prefill_forward stage of its per-stage latency histogram
    assert pool_queries("sglang", "prefill", 0.99)["mean_prefill_time"].promql == (
        'sum by (namespace, pdserving_io_service) (rate(sglang:per_stage_req_latency_seconds_sum{pdserving_io_role="prefill",stage="prefill_forward"}[1m]))'
        ' / sum by (namespace, pdserving_io_service) (rate(sglang:per_stage_req_latency_seconds_count{pdserving_io_role="prefill",stage="prefill_forward"}[1m]))')
    assert pool_queries("vllm", "prefill", 0.99)["mean_prefill_time"].promql == (
        'sum by (namespace, pdserving_io_service) (rate(vllm:request_prefill_time_seconds_sum{pdserving_io_role="prefill"}[1m]))'
        ' / sum by (namespace, pdserving_io_service) (rate(vllm:request_prefill_time_seconds_count{pdserving_io_role="prefill"}[1m]))')
    decode = pool_queries("vllm", "decode", 0.99, secondaries={"kvCacheUsage", "queueDepth"})
    assert set(decode) == {"quantile", "rate", "demand", "mean_isl", "mean_osl", "queue", "kv_usage", "osl_hist",
                           "mean_itl"} | load
    # the engines' mean step time: the ITL histogram's sum over its count, decode pods only
    assert decode["mean_itl"].promql == (
        'sum by (namespace, pdserving_io_service) (rate(vllm:inter_token_latency_seconds_sum{pdserving_io_role="decode"}[1m]))'
        ' / sum by (namespace, pdserving_io_service) (rate(vllm:inter_token_latency_seconds_count{pdserving_io_role="decode"}[1m]))')
    # whether every pod has a queue: the least of the pods' window averages of the requests
    # waiting for a slot (vLLM: by reason, capacity, plus those whose KV pull is done, waiting for
    # a seat; per pod, what the engine has, down to the plain gauge)
    capacity = ('sum without (reason) (avg_over_time(vllm:num_requests_waiting_by_reason'
                '{pdserving_io_role="decode",reason="capacity"}[1m]))')
    assert decode["waiting_min"].promql == (
        f'min by (namespace, pdserving_io_service) ({capacity} + sum without (stage) (avg_over_time('
        'vllm:num_requests_kv_fetch_by_stage{pdserving_io_role="decode",stage="completed_waiting"}[1m]))'
        f' or {capacity} or avg_over_time(vllm:num_requests_waiting{{pdserving_io_role="decode"}}[1m]))')
    for q in decode.values():  # one query per signal for all services
        assert "by (namespace, pdserving_io_service" in q.promql


def test_extra_results_fill_the_observation_and_nan_is_no_data():
    quant = by_service([series("a", "busy", 0.5), series("a", "idle", "NaN")])
    rates = by_service([series("a", "busy", 2.0), series("a", "idle", 0.0)])
    extra = {
        "mean_isl": by_service([series("a", "busy", 1800.0), series("a", "idle", "NaN")]),  # 0/0 while idle
        "mean_osl": by_service([series("a", "busy", 400.0), series("a", "idle", "+Inf")]),
        "queue": by_service([series("a", "busy", 3.5), series("a", "idle", 0.0)]),
    }
    obs = observations(quant, rates, None, extra)
    assert obs[("a", "busy")] == Observation(0.5, None, mean_isl=1800.0, mean_osl=400.0, queue=3.5)
    assert obs[("a", "idle")] == Observation(0.0, None, mean_isl=None, mean_osl=None, queue=0.0)
    assert obs[("a", "busy")].kv_usage is None  # not asked for


def test_prefill_backlog_now_and_its_growth_over_the_window():
    q = pool_queries("sglang", "prefill", 0.99, window="30s")
    # SGLang's totals only (priority=""), not its per-priority breakdown besides, and one pipeline
    # stage's (each stage of a pod reports the same requests)
    m = 'pdserving_io_role="prefill",priority="",pp_rank=~"|0"'
    now = (f'sum by (namespace, pdserving_io_service) (sglang:num_queue_reqs{{{m}}})'
           f' + sum by (namespace, pdserving_io_service) (sglang:num_running_reqs{{{m}}})')
    assert q["backlog_now"].promql == now
    # the sums of each moment (pods come and go), a window apart, over the window's seconds
    assert q["backlog_growth"].promql == (
        f"({now} - (" + now.replace('"|0"})', '"|0"} offset 30s)') + ")) / 30")
    assert "backlog_now" not in pool_queries("vllm", "decode", 0.99)
