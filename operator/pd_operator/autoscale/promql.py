"""All PromQL of the autoscaler, in one place, and the parsing of its results.

Pure: builds query strings and turns query results into per-pool signals.

Series are matched by the pod labels Prometheus copies from the engine pods
(a ``kubernetes_sd`` pod scrape with ``labelmap`` of
``__meta_kubernetes_pod_label_(.+)``, and ``namespace`` from
``__meta_kubernetes_namespace``): ``pdserving_io_service`` and
``pdserving_io_role``. One query per signal covers every service at once
(``sum by (namespace, pdserving_io_service, ...)``), not one per service.

Which pool's series drive which decision: prefill is sized on the TTFT its
own pods report (queueing + prefill compute; SGLang's PD prefill workers report
none, so the decode pods' TTFT of the same requests: ``LATENCY_ROLE``), decode
on the ITL of the decode pods. An idle pool (its request-count rate is 0) reports latency 0 (a real
signal: nothing to serve); a pool with no series at all has no data (hold).

Besides: the demand (tokens/s) of the model floor; the mean prompt length
(ISL, from the prefill pods) and output length (OSL, from the decode pods)
the per-replica capacity is estimated at; and, only when a service asks for
them, the secondary signals (waiting requests, KV-cache usage) averaged per
replica.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..api.models import duration_seconds

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
        # generated tokens as the steps produce them (the counter above: each step's, loggers.py)
        "decode_tokens": "vllm:generation_tokens_total",
        "e2e": "vllm:e2e_request_latency_seconds",
        # histogram of generated tokens per finished request (vllm/v1/metrics/loggers.py)
        "generation_hist": "vllm:request_generation_tokens",
        # histogram of each request's first scheduled step to its first token (vllm/v1/metrics/stats.py)
        "prefill_time": "vllm:request_prefill_time_seconds",
        # prompt tokens not computed: prefix-cache hits, local and external (vllm/v1/metrics/loggers.py)
        "prompt_cached": "vllm:prompt_tokens_cached_total",
        # histograms of prompt tokens per finished request: all of them, and those computed (not
        # served from a prefix cache) (vllm/v1/metrics/loggers.py)
        "prompt_hist": "vllm:request_prompt_tokens",
        "computed_hist": "vllm:request_prefill_kv_computed_tokens",
    },
    "sglang": {
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "waiting": "sglang:num_queue_reqs",
        "running": "sglang:num_running_reqs",
        "kv_usage": "sglang:token_usage",
        "prompt_tokens": "sglang:prompt_tokens_total",
        # counted when a request finishes (observability/metrics_collector.py,
        # observe_one_finished_request): consistent with the request count for a mean OSL, but
        # as a rate it trails production by a request's lifetime (a stream of 1,000 tokens at
        # 35 ms: 35 s, in one lump)
        "generation_tokens": "sglang:generation_tokens_total",
        # generated tokens as the decode batches produce them (METRIC_MATCHERS: mode="decode";
        # managers/scheduler_components/metrics_reporter.py, report_decode_stats)
        "decode_tokens": "sglang:realtime_tokens_total",
        "e2e": "sglang:e2e_request_latency_seconds",
        # sglang/srt/observability/metrics_collector.py
        "generation_hist": "sglang:generation_tokens_histogram",
        # per-stage latency histogram, its prefill_forward stage (METRIC_MATCHERS): a request's first
        # forward to its prefill done (sglang/srt/observability/req_time_stats.py)
        "prefill_time": "sglang:per_stage_req_latency_seconds",
        # cached prompt tokens by cache_source, series created at the first hit (same file)
        "prompt_cached": "sglang:cached_tokens_total",
        # histograms of prompt tokens per finished request, all and uncached (same file)
        "prompt_hist": "sglang:prompt_tokens_histogram",
        "computed_hist": "sglang:uncached_prompt_tokens_histogram",
    },
}

# More label matchers of a metric (engine, METRICS key) -> PromQL matcher. SGLang's request
# gauges carry the total under priority="" and, with priority scheduling, a breakdown under
# priority="<int>" besides (metrics_collector.py _log_gauge_queue_count), and every pipeline
# stage of a pod reports the same requests under its own pp_rank: summed unmatched, each
# request would count more than once.
_SGLANG_REQUESTS = 'priority="",pp_rank=~"|0"'
METRIC_MATCHERS = {("sglang", "prefill_time"): 'stage="prefill_forward"',
                   # a scheduler counter: each pipeline stage counts the same tokens
                   ("sglang", "decode_tokens"): 'mode="decode",pp_rank=~"|0"',
                   ("sglang", "waiting"): _SGLANG_REQUESTS, ("sglang", "running"): _SGLANG_REQUESTS,
                   ("sglang", "decode_prealloc"): _SGLANG_REQUESTS}
# Requests waiting for a slot, where the plain waiting gauge counts more or less (FACTS.md):
# vLLM's num_requests_waiting also counts requests deferred on a KV pull in flight (a decode
# pod's): its by-reason gauge's "capacity" leaves those out, and with them the pulled ones
# waiting for a seat, which its KV-fetch gauge counts ("completed_waiting", decode pods only).
# SGLang's num_queue_reqs leaves out a decode pod's requests waiting for KV memory (its PD
# prealloc queue). Each falls back, per pod, to what the engine has (another version, a
# prefill pod): down to the plain gauge.
SLOT_WAITING = {"vllm": ("vllm:num_requests_waiting_by_reason", "vllm:num_requests_kv_fetch_by_stage"),
                "sglang": ("sglang:num_decode_prealloc_queue_reqs",)}

POOL_METRIC = {"prefill": "ttft", "decode": "itl"}
# The pods whose latency histogram a pool is judged on, where not the pool's own: SGLang's PD
# prefill workers never observe TTFT (managers/tokenizer_manager.py, collect_metrics); its decode
# workers do, from the request's receipt (which the router sends to both pools at once) to the
# first token: the request's TTFT, the wait for the prefill and the KV included.
LATENCY_ROLE = {("sglang", "prefill"): "decode"}
# There, streamed requests where a service has any: for a request not streamed, a decode worker's
# TTFT is its first batched output (every SGLANG_FORCE_STREAM_INTERVAL = 50 tokens, or the end:
# managers/scheduler_components/output_streamer.py), as only a prefill worker stamps the
# scheduler's first-token time (tokenizer_manager.py, _get_scheduler_first_token_time).
LATENCY_STREAMED = {("sglang", "prefill"): 'is_streaming="true"'}

# Secondary signal (the CRD's secondaryTargets[].metric) -> (engine gauge in METRICS, Observation field).
SECONDARY = {"queueDepth": ("waiting", "queue"), "kvCacheUsage": ("kv_usage", "kv_usage")}

# Mean request length (Observation field) -> (role of the pods, token counter, request-count histogram).
# ISL: prompt tokens over prefill requests (each prefill request reports one TTFT; SGLang's: below);
# OSL: generated tokens over finished decode requests.
LENGTHS = {"mean_isl": ("prefill", "prompt_tokens", "ttft"), "mean_osl": ("decode", "generation_tokens", "e2e")}
# The request count of a length where an engine's pods lack the one above: SGLang's prefill pods
# report no TTFT (LATENCY_ROLE), but their prompt-length histogram counts each finished request.
LENGTH_REQUESTS = {("sglang", "mean_isl"): "prompt_hist"}

# What each pool's capacity estimate needs (autoscale/capacity.py): prefill
# capacity depends on the prompt length, decode capacity on the mean context.
CAPACITY_INPUTS = {"prefill": ("mean_isl",), "decode": ("mean_isl", "mean_osl")}

# Offered load (the queue, not only what the pool produced): the pool's waiting and
# running requests, summed over its pods and averaged over the window (Observation fields).
LOAD = {"waiting_total": "waiting", "running_total": "running"}

BY = f"{NS}, {SERVICE}"


@dataclass(frozen=True)
class Query:
    """One PromQL query and what its result means."""

    key: tuple[str, str, str, float]  # (engine, role, signal, quantile)
    promql: str


def _sel(role: str, extra: str = "") -> str:
    return f'{{{ROLE}="{role}"' + (f",{extra}" if extra else "") + "}"


def _latency_buckets(engine: str, role: str, window: str) -> str:
    """The rate of the pool's latency histogram by bucket, for all services: on the pods that
    report it (``LATENCY_ROLE``), of the streamed requests where a service has any
    (``LATENCY_STREAMED``), else of all."""
    metric = METRICS[engine][POOL_METRIC[role]]
    pods = LATENCY_ROLE.get((engine, role), role)
    every = f"sum by ({BY}, le) (rate({metric}_bucket{_sel(pods)}[{window}]))"
    streamed = LATENCY_STREAMED.get((engine, role))
    if streamed is None:
        return every
    sel = _sel(pods, streamed)
    some = f"sum by ({BY}) (rate({metric}_count{sel}[{window}])) > 0"
    # whole services either way (``on``): never buckets of the one mixed with the other's
    return (f"(sum by ({BY}, le) (rate({metric}_bucket{sel}[{window}])) and on ({BY}) ({some}))"
            f" or ({every} unless on ({BY}) ({some}))")


def latency_queries(engine: str, role: str, quantile: float, window: str = "1m") -> list[Query]:
    """The quantile of the pool's latency and its sample rate (all requests), for all services."""
    metric = METRICS[engine][POOL_METRIC[role]]
    sel = _sel(LATENCY_ROLE.get((engine, role), role))
    return [
        Query((engine, role, "quantile", quantile),
              f"histogram_quantile({quantile:g}, {_latency_buckets(engine, role, window)})"),
        Query((engine, role, "rate", quantile), f"sum by ({BY}) (rate({metric}_count{sel}[{window}]))"),
    ]


def demand_query(engine: str, role: str, window: str = "1m") -> Query:
    """Demand for the model floor, in tokens/s: prompt tokens into prefill,
    generated tokens out of decode. (Running streams would be the wrong unit
    for decode: capped at max-num-seqs per pod, so a queue is invisible, and
    self-referential; the benchmark in tests/benchmarks showed both.) Generated tokens as
    the steps produce them (``decode_tokens``) where the engine has a counter of its own for
    that: SGLang's generation counter moves only when a request finishes. There the larger of
    the two: each misses tokens the other counts. The batches' counter is a scheduler's (of a
    replica that spans nodes, each node's DP groups on that node's pod, all scraped: FACTS.md
    "Series per engine"), in time; the finished requests' counter is the tokenizer's, which
    sees every request, late."""
    key = "prompt_tokens" if role == "prefill" else "decode_tokens"
    metric, sel = METRICS[engine][key], _sel(role, METRIC_MATCHERS.get((engine, key), ""))
    produced = f"sum by ({BY}) (rate({metric}{sel}[{window}]))"
    if role == "decode" and metric != METRICS[engine]["generation_tokens"]:
        finished = f"sum by ({BY}) (rate({METRICS[engine]['generation_tokens']}{_sel(role)}[{window}]))"
        return Query((engine, role, "demand", 0.0), f"{finished} > {produced} or {produced} or {finished}")
    return Query((engine, role, "demand", 0.0), produced)


def mean_length_query(engine: str, name: str, window: str = "1m") -> Query:
    """Mean ISL (``mean_isl``) or OSL (``mean_osl``) in tokens over the window, for all
    services: the token rate over the request rate of the pods that see it. NaN when idle."""
    role, tokens, requests = LENGTHS[name]
    requests = LENGTH_REQUESTS.get((engine, name), requests)
    m, sel = METRICS[engine], _sel(role)
    return Query((engine, role, name, 0.0),
                 f"sum by ({BY}) (rate({m[tokens]}{sel}[{window}])) / sum by ({BY}) (rate({m[requests]}_count{sel}[{window}]))")


def _mean_query(engine: str, role: str, metric: str, name: str, window: str) -> Query:
    """A histogram's mean over the window (its ``_sum`` rate over its ``_count`` rate) on the
    pods of ``role``, for all services. NaN when idle."""
    m, sel = METRICS[engine][metric], _sel(role, METRIC_MATCHERS.get((engine, metric), ""))
    return Query((engine, role, name, 0.0),
                 f"sum by ({BY}) (rate({m}_sum{sel}[{window}])) / sum by ({BY}) (rate({m}_count{sel}[{window}]))")


def mean_itl_query(engine: str, window: str = "1m") -> Query:
    """The decode pods' mean inter-token latency (seconds) over the window, for all services:
    the ITL histogram's sum over its count. Each generated token is one decode step apart
    from the last, so this is the engines' mean step time as they run (the online check of
    the cost model, ``capacity.step_time_ratio``). NaN when idle."""
    return _mean_query(engine, "decode", "itl", "mean_itl", window)


def mean_prefill_time_query(engine: str, window: str = "1m") -> Query | None:
    """The prefill pods' mean prefill time (seconds: a request's first scheduled step to its
    first token) over the window, for all services: the prefill engines' speed as they run
    (``capacity.prefill_time_ratio``): vLLM's request prefill time, SGLang's prefill_forward
    stage latency. None for an engine without such a histogram. NaN when idle."""
    if "prefill_time" not in METRICS[engine]:
        return None
    return _mean_query(engine, "prefill", "prefill_time", "mean_prefill_time", window)


def cached_share_query(engine: str, window: str = "1m") -> Query:
    """The share of the prefill pods' prompt tokens served from a prefix cache (not
    computed) over the window, for all services. No series without cache hits."""
    m, sel = METRICS[engine], _sel("prefill")
    return Query((engine, "prefill", "cached_share", 0.0),
                 f"sum by ({BY}) (rate({m['prompt_cached']}{sel}[{window}])) / sum by ({BY}) (rate({m['prompt_tokens']}{sel}[{window}]))")


# A replica over several nodes is one LeaderWorkerSet group of pods, each scraped on its own
# (SGLang's nodes of rank >= 1 serve their own schedulers' series: FACTS.md "Series per
# engine"). Every pod of a group carries LWS's group key (the leader from LWS's pod webhook,
# the workers from their StatefulSet's template: pkg/webhooks/pod_webhook.go,
# pkg/controllers/pod_controller.go), which the scrape job copies as this label
# (manifests/prometheus/scrape-engines.yaml); a pod of a StatefulSet pool has none and is
# a replica of its own.
GROUP_KEY = "leaderworkerset_sigs_k8s_io_group_key"
# and LWS's worker index (0: the leader), copied alike: a label that tells a group's pods apart
WORKER_INDEX = "leaderworkerset_sigs_k8s_io_worker_index"


def per_replica(series) -> str:
    """``series`` (a function of one more label matcher) summed per replica and scrape job: the
    pods of an LWS group together, any other pod on its own (a scrape target: ``instance``, and
    ``pod`` where the scrape sets it, as a pod IP reused within the window is another pod). A
    group recreated within the window keeps its key (LWS hashes the leader pod's name): the
    gone pods' averages add to the new ones' until the window passes them, as a pod replaced
    in any pool adds to the pool's sums."""
    grouped, alone = series(GROUP_KEY + '!=""'), series(GROUP_KEY + '=""')
    return f"sum by ({BY}, job, {GROUP_KEY}) ({grouped}) or sum by ({BY}, job, instance, pod) ({alone})"


def secondary_query(engine: str, role: str, metric: str, window: str = "1m") -> Query:
    """A secondary signal (``queueDepth``, ``kvCacheUsage``): the engine gauge
    averaged over the window and over the pool's replicas, for all services. A replica with
    data-parallel engines exports one series per engine (vLLM ``engine``, SGLang
    ``dp_rank``), over its pods when it spans nodes: its waiting requests are their sum
    (``per_replica``: the target is per replica), its KV-cache usage their mean. A pod scraped by
    two jobs (the annotations invite a generic one) counts twice in the average, with the same
    value each time, which leaves it as it is."""
    name = SECONDARY[metric][0]
    gauge, matchers = METRICS[engine][name], METRIC_MATCHERS.get((engine, name), "")

    def series(extra: str = "") -> str:
        return f"avg_over_time({gauge}{_sel(role, ','.join(m for m in (matchers, extra) if m))}[{window}])"

    return Query((engine, role, metric, 0.0),
                 f"avg by ({BY}) ({per_replica(series) if metric == 'queueDepth' else series()})")


def per_pod(engine: str, role: str, name: str, fn) -> str:
    """One series per pod of the pool's ``waiting`` (requests waiting for a slot: SLOT_WAITING)
    or ``running`` requests, through ``fn`` (a function of one selector: ``avg_over_time(...[1m])``,
    the selector as is, with an ``offset``)."""
    def sel(key: str, extra: str = "") -> str:
        matchers = ",".join(m for m in (METRIC_MATCHERS.get((engine, key), ""), extra) if m)
        return _sel(role, matchers)

    plain = fn(f"{METRICS[engine][name]}{sel(name)}")
    if name != "waiting":
        return plain
    if engine == "vllm":
        by_reason, kv_fetch = SLOT_WAITING[engine]
        capacity_sel, pulled_sel = sel("", 'reason="capacity"'), sel("", 'stage="completed_waiting"')
        capacity = f"sum without (reason) ({fn(by_reason + capacity_sel)})"
        pulled = f"sum without (stage) ({fn(kv_fetch + pulled_sel)})"
        return f"{capacity} + {pulled} or {capacity} or {plain}"
    if role == "decode":
        return f"{plain} + {fn(SLOT_WAITING[engine][0] + sel('decode_prealloc'))} or {plain}"
    return plain


def _avg(window: str):
    return lambda selector: f"avg_over_time({selector}[{window}])"


def load_query(engine: str, role: str, name: str, window: str = "1m") -> Query:
    """The pool's waiting (``waiting_total``: for a slot, ``per_pod``) or running
    (``running_total``) requests: summed over the pool's pods, each averaged over the window."""
    return Query((engine, role, name, 0.0), f"sum by ({BY}) ({per_pod(engine, role, LOAD[name], _avg(window))})")


def waiting_min_query(engine: str, role: str, window: str = "1m") -> Query:
    """The least, over the pool's pods, of each pod's requests waiting for a slot averaged over
    the window: at least one means every pod had a queue (``waiting_min``). A pool's summed
    queue can sit on a few pods: an engine keeps the requests routed to it, so after a scale-up
    the old pods hold the backlog while the new ones take only new arrivals."""
    return Query((engine, role, "waiting_min", 0.0), f"min by ({BY}) ({per_pod(engine, role, 'waiting', _avg(window))})")


def backlog_queries(engine: str, window: str = "1m") -> dict[str, Query]:
    """The prefill pool's backlog (waiting + running requests, summed over its pods) now
    (``backlog_now``), and its growth per second over the window (``backlog_growth``: the
    backlog now less the backlog a window ago, over the window; the sums cover the pods of
    each moment, so pods added or removed meanwhile do not read as growth). No growth series
    for a pool that had no pods a window ago."""
    def backlog(offset: str = "") -> str:
        return " + ".join(f"sum by ({BY}) ({per_pod(engine, 'prefill', name, lambda x: x + offset)})"
                          for name in ("waiting", "running"))

    seconds = duration_seconds(window)
    return {"backlog_now": Query((engine, "prefill", "backlog_now", 0.0), backlog()),
            "backlog_growth": Query((engine, "prefill", "backlog_growth", 0.0),
                                    f"({backlog()} - ({backlog(f' offset {window}')})) / {seconds:g}")}


def length_hist_query(engine: str, window: str = "1m") -> Query:
    """The rate of the decode pods' histogram of generated tokens per request, by bucket
    (``le``): the spread of output lengths (capacity.length_bias)."""
    m = METRICS[engine]["generation_hist"]
    return Query((engine, "decode", "osl_hist", 0.0),
                 f"sum by ({BY}, le) (rate({m}_bucket{_sel('decode')}[{window}]))")


def prompt_hist_query(engine: str, window: str = "1m") -> Query:
    """The rate of the prefill pods' histogram of computed prompt tokens per request (not
    served from a prefix cache), by bucket (``le``), or of all prompt tokens where the engine
    has no such histogram: how many prompts are too long for the TTFT target
    (capacity.share_longer)."""
    m, sel = METRICS[engine], _sel("prefill")
    rate = lambda name: f"sum by ({BY}, le) (rate({m[name]}_bucket{sel}[{window}]))"  # noqa: E731
    return Query((engine, "prefill", "prompt_hist", 0.0), f"{rate('computed_hist')} or {rate('prompt_hist')}")


def latency_hist_query(engine: str, role: str, window: str = "1m") -> Query:
    """The rate of the pool's latency histogram by bucket (``le``): its quantile at any level
    (:func:`histogram_quantile`), when the level depends on other signals."""
    return Query((engine, role, "latency_hist", 0.0), _latency_buckets(engine, role, window))


def histogram_quantile(q: float, buckets) -> float | None:
    """Prometheus' ``histogram_quantile`` of cumulative ``(le, count)`` pairs: the first
    bucket whose count reaches the rank ``q x total``, empty or not; linear inside it (the
    first starting at 0); the highest finite bound when it is +Inf. None where Prometheus
    answers NaN: no counts, no +Inf bucket, or the rank on an empty bucket (q = 0 with the
    first bucket empty). Checked against Prometheus on random histograms
    (tests/sim/test_histogram_quantile.py); the autoscaling simulator reads its signals
    with it too."""
    pts = sorted((le, c) for le, c in buckets if c == c)
    if len(pts) < 2 or pts[-1][1] <= 0 or not math.isinf(pts[-1][0]):
        return None
    rank = q * pts[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in pts:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c <= prev_c:
                return None  # Prometheus' 0/0
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def samples(result: list[dict] | None):
    """(labels, value) of each series of an instant-vector result; malformed ones skipped."""
    for series in result or []:
        try:
            yield series.get("metric", {}), float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue


def by_service_buckets(result: list[dict]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(namespace, service) -> [(le, value)], from a ``sum by (..., le)`` query result."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for labels, value in samples(result):
        try:
            le = float(labels["le"])
        except (KeyError, TypeError, ValueError):
            continue
        if SERVICE in labels and NS in labels:
            out.setdefault((labels[NS], labels[SERVICE]), []).append((le, value))
    return out


def pool_queries(engine: str, role: str, quantile: float, window: str = "1m",
                 secondaries: Iterable[str] = ()) -> dict[str, Query]:
    """Every query of one (engine, role), by what it feeds: ``quantile``, ``rate``,
    ``demand``, the mean lengths the pool's capacity needs, and the Observation
    field of each secondary signal asked for (none unless some service wants it)."""
    quant, rate = latency_queries(engine, role, quantile, window)
    out = {"quantile": quant, "rate": rate, "demand": demand_query(engine, role, window)}
    out.update({name: mean_length_query(engine, name, window) for name in CAPACITY_INPUTS[role]})
    out.update({name: load_query(engine, role, name, window) for name in LOAD})
    out["waiting_min"] = waiting_min_query(engine, role, window)
    if role == "decode":
        out["osl_hist"] = length_hist_query(engine, window)
        out["mean_itl"] = mean_itl_query(engine, window)
    else:
        out.update(backlog_queries(engine, window))
        out["prompt_hist"] = prompt_hist_query(engine, window)
        out["latency_hist"] = latency_hist_query(engine, role, window)
        if (prefill_time := mean_prefill_time_query(engine, window)) is not None:
            out["mean_prefill_time"] = prefill_time
            out["cached_share"] = cached_share_query(engine, window)
    out.update({SECONDARY[m][1]: secondary_query(engine, role, m, window) for m in sorted(set(secondaries))})
    return out


def by_service(result: list[dict]) -> dict[tuple[str, str], float]:
    """(namespace, service) -> value, from an instant-vector query result."""
    return {(labels[NS], labels[SERVICE]): value for labels, value in samples(result) if SERVICE in labels and NS in labels}


@dataclass(frozen=True)
class Observation:
    """What Prometheus saw of one pool of one service; None: no data."""

    observed: float | None  # seconds; 0.0 when idle; None when no data
    demand: float | None
    mean_isl: float | None = None  # mean prompt tokens per request (prefill pods)
    mean_osl: float | None = None  # mean generated tokens per request (decode pods)
    queue: float | None = None     # waiting requests per replica
    kv_usage: float | None = None  # KV-cache usage fraction 0..1 per replica
    waiting_total: float | None = None  # waiting requests, all pods of the pool
    running_total: float | None = None  # running requests, all pods of the pool
    waiting_min: float | None = None    # the least of the pods' waiting requests (window averages)
    osl_bias: float | None = None       # E[OSL^2] / E[OSL] from the generated-tokens histogram
    mean_itl: float | None = None       # mean inter-token latency, seconds (decode pods): the mean step time
    mean_prefill_time: float | None = None  # mean prefill time, seconds (prefill pods)
    cached_share: float | None = None  # share of the prompt tokens served from a prefix cache (prefill pods)
    backlog_now: float | None = None     # waiting + running requests now, all pods (prefill pods)
    backlog_growth: float | None = None  # the backlog's growth over the window, requests/s (prefill pods)
    # cumulative (le, rate) of the computed prompt tokens per request (prefill pods)
    prompt_buckets: tuple[tuple[float, float], ...] | None = None
    # cumulative (le, rate) of the pool's latency histogram (prefill pods: TTFT)
    latency_buckets: tuple[tuple[float, float], ...] | None = None


# queries answered by bucket (``sum by (..., le)``), handed on as cumulative (le, rate) pairs
BUCKET_QUERIES = ("prompt_hist", "latency_hist")
BUCKET_FIELDS = {"prompt_hist": "prompt_buckets", "latency_hist": "latency_buckets"}


def _finite(value):
    if isinstance(value, tuple):  # a histogram's buckets
        return value or None
    return value if value is not None and math.isfinite(value) else None


def observations(quantiles: dict[tuple[str, str], float], rates: dict[tuple[str, str], float],
                 demand: dict[tuple[str, str], float] | None = None,
                 extra: Mapping[str, dict[tuple[str, str], float]] | None = None) -> dict[tuple[str, str], Observation]:
    """Combine the results of one (engine, role): quantile, rate, demand and
    ``extra`` (Observation field -> results: mean lengths, secondary signals;
    NaN, e.g. a length while idle, is no data)."""
    out = {}
    for key in set(quantiles) | set(rates):
        rate = rates.get(key)
        # idle: a real signal, not missing data; NaN (no samples) or no series: no data
        observed = 0.0 if rate is not None and rate == 0 else _finite(quantiles.get(key))
        more = {name: _finite(values.get(key)) for name, values in (extra or {}).items()}
        out[key] = Observation(observed, (demand or {}).get(key), **more)
    return out
