"""The autoscaler's PromQL: one query per signal for all services, and the
reading of results (idle is 0, absent is no data)."""

from __future__ import annotations

import math

from pd_operator.autoscale.promql import (
    Observation,
    by_service,
    demand_query,
    latency_queries,
    mean_length_query,
    observations,
    pool_queries,
    secondary_query,
)


def series(ns, svc, v):
    return {"metric": {"namespace": ns, "pdserving_io_service": svc}, "value": [1.0, str(v)]}


def test_one_query_per_signal_grouped_by_service():
    q, rate = latency_queries("vllm", "prefill", 0.99)
    assert q.promql == ('histogram_quantile(0.99, sum by (namespace, pdserving_io_service, le) '
                        '(rate(vllm:time_to_first_token_seconds_bucket{pdserving_io_role="prefill"}[1m])))')
    assert rate.promql == 'sum by (namespace, pdserving_io_service) (rate(vllm:time_to_first_token_seconds_count{pdserving_io_role="prefill"}[1m]))'
    dq, _ = latency_queries("sglang", "decode", 0.95, window="2m")
    assert "sglang:inter_token_latency_seconds_bucket" in dq.promql and "[2m]" in dq.promql and "0.95" in dq.promql
    assert "vllm:prompt_tokens_total" in demand_query("vllm", "prefill").promql
    assert "rate(sglang:generation_tokens_total" in demand_query("sglang", "decode").promql


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


def test_mean_lengths_are_token_rate_over_request_rate_of_the_pods_that_see_them():
    isl = mean_length_query("vllm", "mean_isl")
    assert isl.promql == ('sum by (namespace, pdserving_io_service) (rate(vllm:prompt_tokens_total{pdserving_io_role="prefill"}[1m])) '
                          '/ sum by (namespace, pdserving_io_service) (rate(vllm:time_to_first_token_seconds_count{pdserving_io_role="prefill"}[1m]))')
    osl = mean_length_query("sglang", "mean_osl", window="2m")
    assert osl.promql == ('sum by (namespace, pdserving_io_service) (rate(sglang:generation_tokens_total{pdserving_io_role="decode"}[2m])) '
                          '/ sum by (namespace, pdserving_io_service) (rate(sglang:e2e_request_latency_seconds_count{pdserving_io_role="decode"}[2m]))')


def test_secondary_signals_are_per_replica_averages_of_the_engine_gauges():
    assert secondary_query("vllm", "prefill", "queueDepth").promql == (
        'avg by (namespace, pdserving_io_service) (avg_over_time(vllm:num_requests_waiting{pdserving_io_role="prefill"}[1m]))')
    assert secondary_query("sglang", "decode", "queueDepth").promql.count("sglang:num_queue_reqs{pdserving_io_role=\"decode\"}") == 1
    assert "avg_over_time(sglang:token_usage{" in secondary_query("sglang", "decode", "kvCacheUsage").promql
    assert "avg_over_time(vllm:kv_cache_usage_perc{" in secondary_query("vllm", "decode", "kvCacheUsage").promql


def test_pool_queries_ask_for_secondaries_only_when_wanted():
    load = {"waiting_total", "running_total"}  # offered load: always asked (decide's demand)
    assert set(pool_queries("vllm", "prefill", 0.99)) == {"quantile", "rate", "demand", "mean_isl"} | load
    decode = pool_queries("vllm", "decode", 0.99, secondaries={"kvCacheUsage", "queueDepth"})
    assert set(decode) == {"quantile", "rate", "demand", "mean_isl", "mean_osl", "queue", "kv_usage", "osl_hist"} | load
    assert decode["osl_hist"].promql == ('sum by (namespace, pdserving_io_service, le) '
                                         '(rate(vllm:request_generation_tokens_bucket{pdserving_io_role="decode"}[1m]))')
    assert "sum by (namespace, pdserving_io_service) (avg_over_time(vllm:num_requests_waiting{" in decode["waiting_total"].promql
    assert decode["queue"] == secondary_query("vllm", "decode", "queueDepth")
    assert decode["mean_isl"].promql == mean_length_query("vllm", "mean_isl").promql  # ISL from the prefill pods
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
