"""The autoscaler's PromQL: one query per signal for all services, and the
reading of results (idle is 0, absent is no data)."""

from __future__ import annotations

import math

from pd_operator.autoscale.promql import by_service, demand_query, latency_queries, observations


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
    def series(ns, svc, v):
        return {"metric": {"namespace": ns, "pdserving_io_service": svc}, "value": [1.0, str(v)]}
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
