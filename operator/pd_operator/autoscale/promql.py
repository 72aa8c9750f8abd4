"""All PromQL of the autoscaler, in one place, and the parsing of its results.

Pure: builds query strings and turns query results into per-pool signals.

Series are matched by the pod labels Prometheus copies from the engine pods
(a ``kubernetes_sd`` pod scrape with ``labelmap`` of
``__meta_kubernetes_pod_label_(.+)``, and ``namespace`` from
``__meta_kubernetes_namespace``): ``pdserving_io_service`` and
``pdserving_io_role``. One query per signal covers every service at once
(``sum by (namespace, pdserving_io_service, ...)``), not one per service.

Which pool's series drive which decision: prefill is sized on the TTFT its
own pods report (queueing + prefill compute), decode on the ITL of the decode
pods. An idle pool (its request-count rate is 0) reports latency 0 (a real
signal: nothing to serve); a pool with no series at all has no data (hold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NS = "namespace"
SERVICE = "pdserving_io_service"
ROLE = "pdserving_io_role"

# Engine metric names (../shared/ENGINES.md; the simulated engines export the same).
METRICS: dict[str, dict[str, str]] = {
    "vllm": {
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "waiting": "vllm:num_requests_waiting",
        "running": "vllm:num_requests_running",
        "kv_usage": "vllm:kv_cache_usage_perc",
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
    },
    "sglang": {
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "waiting": "sglang:num_queue_reqs",
        "running": "sglang:num_running_reqs",
        "kv_usage": "sglang:token_usage",
        "prompt_tokens": "sglang:prompt_tokens_total",
        "generation_tokens": "sglang:generation_tokens_total",
    },
}

POOL_METRIC = {"prefill": "ttft", "decode": "itl"}


@dataclass(frozen=True)
class Query:
    """One PromQL query and what its result means."""

    key: tuple[str, str, str, float]  # (engine, role, signal, quantile)
    promql: str


def latency_queries(engine: str, role: str, quantile: float, window: str = "1m") -> list[Query]:
    """The quantile of the pool's latency and its sample rate, for all services."""
    metric = METRICS[engine][POOL_METRIC[role]]
    sel = f'{{{ROLE}="{role}"}}'
    by = f"{NS}, {SERVICE}"
    return [
        Query((engine, role, "quantile", quantile),
              f"histogram_quantile({quantile:g}, sum by ({by}, le) (rate({metric}_bucket{sel}[{window}])))"),
        Query((engine, role, "rate", quantile), f"sum by ({by}) (rate({metric}_count{sel}[{window}]))"),
    ]


def demand_query(engine: str, role: str, window: str = "1m") -> Query:
    """Demand for the model floor, in tokens/s: prompt tokens into prefill,
    generated tokens out of decode. (Running streams would be the wrong unit
    for decode: capped at max-num-seqs per pod, so a queue is invisible, and
    self-referential; the benchmark in tests/benchmarks showed both.)"""
    sel = f'{{{ROLE}="{role}"}}'
    by = f"{NS}, {SERVICE}"
    metric = METRICS[engine]["prompt_tokens" if role == "prefill" else "generation_tokens"]
    return Query((engine, role, "demand", 0.0), f"sum by ({by}) (rate({metric}{sel}[{window}]))")


def by_service(result: list[dict]) -> dict[tuple[str, str], float]:
    """(namespace, service) -> value, from an instant-vector query result."""
    out = {}
    for series in result or []:
        labels = series.get("metric", {})
        try:
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if SERVICE in labels and NS in labels:
            out[(labels[NS], labels[SERVICE])] = value
    return out


@dataclass(frozen=True)
class Observation:
    observed: float | None  # seconds; 0.0 when idle; None when no data
    demand: float | None


def observations(quantiles: dict[tuple[str, str], float], rates: dict[tuple[str, str], float],
                 demand: dict[tuple[str, str], float] | None = None) -> dict[tuple[str, str], Observation]:
    """Combine the quantile, rate and demand results of one (engine, role)."""
    out = {}
    for key in set(quantiles) | set(rates):
        rate = rates.get(key)
        q = quantiles.get(key)
        if rate is not None and rate == 0:
            observed = 0.0  # idle: a real signal, not missing data
        elif q is None or math.isnan(q) or math.isinf(q):
            observed = None
        else:
            observed = q
        out[key] = Observation(observed, (demand or {}).get(key))
    return out
