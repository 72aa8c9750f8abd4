"""What is wrong with a service that is up: the ``Serving`` condition from live signals.

Pure: builds the PromQL (one query per signal for every service, grouped by
namespace and service, like :mod:`.promql`) and maps the per-service results
to a verdict (status, reason, message with the numbers and the fix).

The metric names and what they count are in tests/contract/FACTS.md
("Serving diagnosis"), read from the pinned engines' source and, for the
routers (Rust binaries), from their own /metrics in front of simulated
engines. What the routers do NOT tell apart, the messages say.

Reasons, first match wins (a failure that explains the others goes first):

- ``WorkersUnreachable``: the router's health check fails for some workers
  (``*_worker_health`` 0): a port or proxy mismatch, or pods that do not
  answer.
- ``KVTransferFailing``: the engines count failed or expired KV transfers.
- ``Overloaded``: the engines refuse requests at their queue limit (vLLM
  ``--max-num-queued-reqs``/``--max-num-queued-tokens``, HTTP 503) or the
  router rate-limits (429).
- ``UnknownModelRequested``: requests for a model name the service does not
  serve are answered 404 (sglang-router counts the 404s it passes on and
  labels requests with the model asked for). SGLang 0.5.23 answers 404 only
  on its Responses API: its chat and completions handlers never compare the
  name and serve any with the loaded model, so there other names are noted
  in the ``Serving`` message, not a failure.
- ``EngineAuthRejected``: the router's requests to healthy workers fail and
  nothing above explains it: the engines refuse the router's key (401).
  vllm-router 0.1.17 counts every refused upstream request the same way
  (``vllm_router_pd_{prefill,decode}_errors_total``, no status label), so for
  it a wrong model name looks the same: the message says both.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .promql import GROUP_KEY, NS, SERVICE, WORKER_INDEX, by_service, samples

BY = f"{NS}, {SERVICE}"
# How far back the counters are read: a failure shows within two scrapes and clears
# one window after it stops (the integration test shortens it).
WINDOW = os.environ.get("PD_OPERATOR_DIAGNOSIS_WINDOW", "1m")

# Router metrics (Rust binaries: names and labels as the pinned routers export them).
ROUTER = {
    "vllm-router": {
        "worker_health": "vllm_router_worker_health",
        "circuit": "vllm_router_cb_state",
        "worker_errors": 'vllm_router_pd_prefill_errors_total|vllm_router_pd_decode_errors_total',
        "requests": "vllm_router_pd_requests_total",
    },
    "sglang-router": {
        "worker_health": "smg_worker_health",
        "circuit": "smg_worker_cb_state",
        "worker_errors": "smg_worker_errors_total",
        "requests": "smg_router_requests_total",
    },
}

# Engine counters of failed KV transfers (pinned engines' source; see FACTS.md).
KV_FAILURES = {
    "vllm": ("vllm:nixl_num_failed_transfers_total|vllm:nixl_num_kv_expired_reqs_total|"
             "vllm:mooncake_num_failed_transfers_total|vllm:mooncake_num_failed_recvs_total|"
             "vllm:mooncake_num_kv_expired_reqs_total"),
    "sglang": "sglang:num_transfer_failed_reqs_total|sglang:num_bootstrap_failed_reqs_total",
}
# SGLang counts a failed KV transfer on every rank of the request's attention-TP group, each
# under its own tp_rank (the status is all-reduced over the group and each rank concludes the
# request: disaggregation/prefill.py handle_inflight_transfer_failure, decode.py
# _record_transfer_failure; FACTS.md): the most of the group's ranks is the request count, over
# the pods of an LWS group when the replica spans nodes. vLLM's and the routers' series carry
# none of these labels.
RANKS = "tp_rank, pp_rank, moe_ep_rank"
# Requests refused at a queue limit: vLLM's admission counter (HTTP 503); the
# sglang-router's rate limiter. SGLang's --max-queued-requests is ignored in
# disaggregation mode (its own help text), so SGLang engines have none here.
OVERLOAD = {
    "vllm": "vllm:admission_rejections_total",
    "sglang": "smg_http_rate_limit_total",
}
ENGINE_REQUESTS = {"vllm": "vllm:request_success_total", "sglang": "sglang:e2e_request_latency_seconds_count"}


@dataclass(frozen=True)
class DiagnosisQuery:
    """One signal for every service. A signal that several metrics make up (e.g. NIXL's
    and Mooncake's failure counters) is one query per metric, summed per service by
    :func:`merge`: ``increase()`` of a ``{__name__=~...}`` selector drops the names and
    Prometheus refuses the clashing series."""

    key: tuple[str, str, str]  # (engine, router, signal)
    promql: tuple[str, ...]


def merge(results: list[list[dict]]) -> list[dict]:
    """The instant vectors of one signal's queries, summed per label set."""
    total: dict[tuple, tuple[dict, float]] = {}
    for result in results:
        for labels, value in samples(result):
            k = tuple(sorted(labels.items()))
            total[k] = (labels, total.get(k, (labels, 0.0))[1] + value)
    return [{"metric": labels, "value": [0, repr(v)]} for labels, v in total.values()]


def _each(metrics: str, template: str) -> tuple[str, ...]:
    """``template`` (with ``{m}``) for each metric of a ``a|b`` list."""
    return tuple(template.format(m=m) for m in metrics.split("|"))


def diagnosis_queries(engine: str, router: str, window: str = WINDOW) -> dict[str, DiagnosisQuery]:
    """Every query of the diagnosis for one (engine, router) pair, covering all services."""
    r = ROUTER[router]
    k = (engine, router)
    # increase() needs two samples of a series: the first value of a counter created at its
    # first increment (the routers' error counters, SGLang's) would never count, and after
    # a circuit breaker opens no second increment may come for a minute. A counter counts
    # whole (counters start at 0 with their process) when
    # - born: it has fewer samples in the window than its target has scrapes, so it was
    #   created while the target was being scraped; or
    # - on a young target: the target itself has at least two scrapes fewer than the
    #   longest-scraped target of its job, so its pod started within the window (a new
    #   router or engine pod whose counter was created before its first scrape). After a
    #   restart of Prometheus every target of a job starts together (one discovery; the
    #   scrape offsets within an interval make counts differ by at most one), so none is
    #   young and a counter there at the first scrape counts only its increase.
    # A job with a single target has no young target.
    # A target is (instance, job, pod): a pod IP is reused by a new pod within the window
    # (kwok does it in seconds, CNI IPAM too), and matched on (instance, job) alone the
    # two pods' `up` series make the join many-to-many and Prometheus refuses the whole
    # query (422 "found duplicate series for the match group"; seen in CI). The scrape job
    # (manifests/prometheus/scrape-engines.yaml) puts the pod name in `pod`.
    born = f"count_over_time({{m}}[{window}]) < on (instance, job, pod) group_left count_over_time(up[{window}])"
    young = (f"count_over_time(up[{window}]) < on (job) group_left() "
             f"(max by (job) (count_over_time(up[{window}])) - 1)")
    per_series = (f"(({{m}} and ({born})) or ({{m}} and on (instance, job, pod) ({young})) "
                  f"or increase({{m}}[{window}]))")
    inc = f"sum by ({BY}) {per_series}"
    # an engine's request counted once per rank of the group that handled it: one of them (RANKS),
    # over the pods of a replica that spans nodes (its LWS group: the ranks of one TP group
    # there are on several pods), on each pod of any other replica
    grouped, alone = (per_series.replace("{m}", "{m}{{" + GROUP_KEY + match + '""}}') for match in ("!=", "="))
    inc_requests = (f"sum by ({BY}) (max without ({RANKS}, instance, pod, {WORKER_INDEX}) {grouped} "
                    f"or max without ({RANKS}) {alone})")
    q = {
        # workers the router holds unhealthy / healthy / all (max over the router's replicas)
        "unhealthy": (f"count by ({BY}) (max by ({BY}, worker) ({r['worker_health']}) == 0)",),
        "healthy": (f"count by ({BY}) (max by ({BY}, worker) ({r['worker_health']}) == 1)",),
        "workers": (f"count by ({BY}) (max by ({BY}, worker) ({r['worker_health']}))",),
        "worker_errors": _each(r["worker_errors"], inc),
        "requests": _each(r["requests"], inc),
        "kv_failures": _each(KV_FAILURES[engine], inc_requests),
        "overload": _each(OVERLOAD[engine], inc),
        # each worker's health and circuit breaker (0 closed, 1 open, 2 half-open), by URL:
        # the routers keep exporting a removed worker's last value, so the verdict counts
        # only the workers on the IPs of the engine pods ready now
        "health": (f"max by ({BY}, worker) ({r['worker_health']})",),
        "circuits": (f"max by ({BY}, worker) ({r['circuit']})",),
    }
    if router == "sglang-router":
        # the model each client asked for (label ``model``) and the 404s the router passed through
        q["models"] = (f"sum by ({BY}, model) (increase(smg_router_requests_total[{window}]))",)
        q["not_found"] = (f'sum by ({BY}) (increase(smg_http_responses_total{{status_code="404"}}[{window}]))',)
    return {name: DiagnosisQuery((*k, name), promql) for name, promql in q.items()}


def by_service_label(result: list[dict], label: str) -> dict[tuple[str, str], dict[str, float]]:
    """(namespace, service) -> {label value: value}."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for labels, value in samples(result):
        if SERVICE in labels and NS in labels:
            out.setdefault((labels[NS], labels[SERVICE]), {})[labels.get(label, "")] = value
    return out


@dataclass(frozen=True)
class Signals:
    """What Prometheus saw of one service over the window; None: no series."""

    workers: float | None = None
    healthy: float | None = None
    unhealthy: float | None = None
    worker_errors: float | None = None
    requests: float | None = None
    kv_failures: float | None = None
    overload: float | None = None
    not_found: float | None = None
    models: Mapping[str, float] = field(default_factory=dict)
    health: Mapping[str, float] = field(default_factory=dict)  # worker URL -> 1 healthy, 0 not
    circuits: Mapping[str, float] = field(default_factory=dict)  # worker URL -> 0 closed, 1 open, 2 half-open


PER_LABEL = {"models": "model", "health": "worker", "circuits": "worker"}


def signals_by_service(results: Mapping[str, list[dict]]) -> dict[tuple[str, str], Signals]:
    """Raw query results (signal name -> instant vector) -> Signals per service."""
    plain = {name: by_service(res) for name, res in results.items() if name not in PER_LABEL}
    labelled = {name: by_service_label(results.get(name) or [], label) for name, label in PER_LABEL.items()}
    keys = set().union(*[set(v) for v in (*plain.values(), *labelled.values())])
    out = {}
    for key in keys:
        vals = {name: _finite(v.get(key)) for name, v in plain.items()}
        per = {name: {k: n for k, n in v.get(key, {}).items() if _finite(n) is not None} for name, v in labelled.items()}
        out[key] = Signals(**vals, **per)
    return out


def ready_pod_ips(pods: list[dict]) -> frozenset[str]:
    """The IPs of the pods whose Ready condition is True (the routers add a pod as a
    worker once Kubernetes reports it Ready)."""
    return frozenset(p["status"]["podIP"] for p in pods
                     if (p.get("status") or {}).get("podIP")
                     and any(c.get("type") == "Ready" and c.get("status") == "True"
                             for c in p["status"].get("conditions") or []))


def worker_host(url: str) -> str:
    """The host of a router's worker URL (``http://10.0.0.5:8000`` -> ``10.0.0.5``)."""
    host = url.split("://", 1)[-1].split("/", 1)[0]
    if host.startswith("["):  # IPv6
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if ":" in host else host


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _n(v: float | None) -> int:
    return int(round(v or 0))


@dataclass(frozen=True)
class Verdict:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str

    def condition(self, generation: int | None) -> dict:
        return {"type": "Serving", "status": self.status, "reason": self.reason, "message": self.message[:2000],
                "observedGeneration": generation}


REASONS = ("WorkersUnreachable", "KVTransferFailing", "Overloaded", "UnknownModelRequested", "EngineAuthRejected")


def diagnose(s: Signals | None, *, served_name: str, engine: str, router: str, window: str = WINDOW,
             engine_port: int | None = None, key_ref: str | None = None, backend: str | None = None,
             ready_workers: int | None = None, ready_ips: frozenset[str] | None = None) -> Verdict:
    """The Serving verdict of one service from its signals; ``ready_workers``: the
    engine pods Kubernetes reports ready (the router should hold each one healthy);
    ``ready_ips``: their IPs, when known: then only the router's workers on those IPs
    count (a removed worker's health stays exported at its last value) and each IP
    the router does not hold healthy is missing."""
    if s is None or (s.workers is None and s.requests is None and s.kv_failures is None and not s.health):
        return Verdict("Unknown", "NoData",
                       f"Prometheus has no {router} or engine series for this service: scrape the router pods too "
                       "(manifests/prometheus/scrape-engines.yaml keeps roles prefill|decode|router)")
    errors, requests = _n(s.worker_errors), _n(s.requests)
    of = f" of {requests}" if requests else ""
    through = f" ({requests} requests through the router)" if requests else ""
    workers, healthy, unhealthy = _n(s.workers), _n(s.healthy), _n(s.unhealthy)
    circuits = s.circuits
    if ready_ips is not None and s.health:
        held = {w: v for w, v in s.health.items() if worker_host(w) in ready_ips}
        workers, healthy = len(held), sum(1 for v in held.values() if v == 1)
        unhealthy = workers - healthy
        ready_workers = len(ready_ips)
        missing = len(ready_ips - {worker_host(w) for w, v in held.items() if v == 1})
        circuits = {w: v for w, v in s.circuits.items() if worker_host(w) in ready_ips}
    else:
        missing = max(0, (ready_workers or 0) - healthy) if s.workers is not None or ready_workers else 0
    if unhealthy > 0 or missing > 0:
        port = f" port {engine_port}" if engine_port else " the engine port"
        seen = (f"cannot reach {unhealthy}/{workers} workers (its health checks fail)" if unhealthy
                else f"holds {healthy} healthy worker(s) for the {ready_workers} ready engine pods")
        return Verdict("False", "WorkersUnreachable",
                       f"{router} {seen}: "
                       f"check that the engines listen on{port} of the pod IP the router discovers, that no HTTP(S)_PROXY "
                       "in the router's environment covers the pod network (set NO_PROXY), and the pods' NetworkPolicy")
    if _n(s.kv_failures) > 0:
        how = {"nixl": "NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT) and the RDMA/UCX path",
               "mooncake": "Mooncake transfer engine and the bootstrap port"}.get(backend or "", "KV connector")
        return Verdict("False", "KVTransferFailing",
                       f"the engines counted {_n(s.kv_failures)} failed or expired KV transfers in the last {window}"
                       f"{through}; decode answers those requests with 500: check the {how} between prefill and decode "
                       "pods (kvTransfer.rdma, the NetworkPolicy between the pools, the engines' logs)")
    if _n(s.overload) > 0:
        what = ("the engines' queue limit (HTTP 503, --max-num-queued-reqs)" if engine == "vllm"
                else "the router's rate limit (HTTP 429)")
        return Verdict("False", "Overloaded",
                       f"{_n(s.overload)} requests in the last {window} were refused at {what}{through}: raise the "
                       "replicas (or autoscaling maxReplicas) of the pool whose queue is full, or the limit")
    asked = {m: n for m, n in s.models.items() if m and m != served_name and n > 0}
    names = ", ".join(f"{m!r} ({_n(n)})" for m, n in sorted(asked.items()))
    if _n(s.not_found) > 0:
        return Verdict("False", "UnknownModelRequested",
                       f"{_n(s.not_found)} requests in the last {window} were answered 404, a model this service does "
                       f"not serve" + (f" (clients asked for {names})" if names else "") + ": use "
                       f"\"model\": \"{served_name}\" (status.servedModelName), or set model.servedName to the name the "
                       "clients use")
    if errors > 0:
        auth = (f"the engines refuse the router's key (401): the router and the engines must read the same key "
                f"({key_ref or 'engine.apiKeySecretRef'}); after rotating the Secret, restart both pools and the router")
        if router == "vllm-router":
            auth += (f"; or clients ask for another model than {served_name!r} (404): vllm-router 0.1.17 counts both "
                     "the same way, so check the clients' \"model\" against status.servedModelName too")
        return Verdict("False", "EngineAuthRejected",
                       f"the workers refused {errors}{of} requests from {router} in the last {window}, with the workers "
                       f"healthy and no KV transfer failures: {auth}")
    opened = sorted(w for w, v in circuits.items() if v == 1)
    if opened:
        # the failures that opened them are out of the window (else named above); the router
        # still sends these workers nothing: requests answer 503 if no other worker is left
        return Verdict("False", "WorkersUnreachable",
                       f"{router}'s circuit breaker is open for {len(opened)}/{len(circuits)} workers "
                       f"({', '.join(opened[:4])}) after earlier failures: it sends them no requests until its timeout "
                       "passes and trial requests succeed (router extraArgs --cb-timeout-duration-secs, "
                       "--cb-success-threshold); if it stays open, read the router's log for the workers' errors")
    other = (f"; clients also asked for {names}: SGLang serves any model name with {served_name!r} (its chat and "
             "completions APIs do not check it)" if names and engine == "sglang" else "")
    return Verdict("True", "Serving",
                   f"{healthy} workers healthy; no refused requests, KV transfer failures or queue-limit "
                   f"rejections in the last {window}" + (f" ({requests} requests)" if requests else "") + other)
