"""Prometheus metrics of a simulated engine, with the real engines' names and labels.

vLLM (labels ``model_name`` = served name, ``engine`` = "0"):
histograms ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:request_time_per_output_token_seconds``, ``vllm:e2e_request_latency_seconds``,
``vllm:request_queue_time_seconds``, ``vllm:request_prefill_time_seconds``,
``vllm:request_decode_time_seconds``, ``vllm:request_prompt_tokens``,
``vllm:request_prefill_kv_computed_tokens``, ``vllm:request_generation_tokens``; gauges ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` (with requests whose KV is being pulled, as vLLM keeps them),
``vllm:num_requests_waiting_by_reason`` (``capacity``, ``deferred``), on decode (a KV consumer)
``vllm:num_requests_kv_fetch_by_stage``, ``vllm:kv_cache_usage_perc``; counters
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total``, ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_cached_total``
(no prefix cache: on a decode pod, the prompts whose KV it pulled; 0 on a prefill pod). A decode
pod counts its requests' prompts in ``prompt_tokens_total`` too, as both engines do.

SGLang, the tokenizer's series (labels ``model_name``, ``engine_type`` = unified|prefill|decode;
observability/metrics_collector.py tokenizer_metric_labels): histograms
``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
``sglang:e2e_request_latency_seconds``, ``sglang:prompt_tokens_histogram``,
``sglang:uncached_prompt_tokens_histogram``, ``sglang:generation_tokens_histogram``; counters
``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``. Each scheduler's series (one
per attention-DP group; labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``,
``moe_ep_rank``, and ``dp_rank`` with DP; SchedulerMetricsCollector): histograms
``sglang:queue_time_seconds``, ``sglang:per_stage_req_latency_seconds`` (stage
``prefill_forward`` only); gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:token_usage``, ``sglang:gen_throughput``, ``sglang:cache_hit_rate``,
``sglang:num_decode_prealloc_queue_reqs``, ``sglang:num_decode_transfer_queue_reqs``; counter
``sglang:realtime_tokens_total`` (decode).

Failures (the real engines' names and labels; tests/contract/FACTS.md "Serving diagnosis"):
vLLM, by KV connector: ``vllm:nixl_num_failed_transfers``, ``vllm:nixl_num_failed_notifications``,
``vllm:nixl_num_kv_expired_reqs`` (NixlConnector) or ``vllm:mooncake_num_failed_transfers``,
``vllm:mooncake_num_failed_recvs``, ``vllm:mooncake_num_kv_expired_reqs`` (MooncakeConnector), each
created at 0 per engine as vLLM does; ``vllm:admission_rejections{model_name, reason}`` for
``max_num_queued_reqs`` and ``max_num_queued_tokens``, at 0. SGLang:
``sglang:num_transfer_failed_reqs_total`` and ``sglang:num_bootstrap_failed_reqs_total``, whose
series appear at the first failure (SGLang calls ``.labels()`` only when it counts one), one per
TP rank of the request's attention-TP group, each on the page of its node.

Sim-only (for harnesses): ``pdsim_kv_transfer_seconds`` histogram.
Every sink also keeps the raw samples (bounded) for tests (``samples``).
"""

from __future__ import annotations

import collections
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .engine import Engine, SimRequest, Sink

# vLLM's (vllm/v1/metrics/buckets.py: TIME_TO_FIRST_TOKEN_BUCKETS, INTER_TOKEN_LATENCY_BUCKETS)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
# SGLang's defaults (observability/metrics_collector.py, TokenizerMetricsCollector): no TTFT bound
# below 0.1 s, ITL bounds 0.04 then 0.06 (none at 0.05)
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                      0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
# SGLang's per_stage_req_latency_seconds: exponential_buckets(start=0.001, width=1.62, length=30)
STAGE_BUCKETS = tuple(0.001 * 1.62 ** i for i in range(30))
LAT_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)
TOK_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
# SGLang's default prompt-token buckets (observability/metrics_collector.py)
SGLANG_PROMPT_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
                         15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000,
                         400000, 600000, 800000, 1000000, 1100000)
XFER_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Samples:
    def __init__(self, maxlen: int = 200_000):
        self.ttft: collections.deque = collections.deque(maxlen=maxlen)
        self.itl: collections.deque = collections.deque(maxlen=maxlen)
        self.e2e: collections.deque = collections.deque(maxlen=maxlen)
        self.transfer: collections.deque = collections.deque(maxlen=maxlen)
        self.prompt_tokens = 0
        self.generation_tokens = 0


class PromSink(Sink):
    """Sink that exports an engine's observations in its engine's dialect."""

    def __init__(self, flavor: str, served_name: str, role: str, registry: CollectorRegistry | None = None,
                 kv_connector: str | None = None, dp: int = 1, tp: int = 1, nodes: int = 1, ep: int = 1,
                 moe_dp: int = 1):
        """``dp``, ``tp``, ``nodes``, ``ep``, ``moe_dp``: SGLang's attention-DP groups, tensor-parallel
        ranks, nodes, expert-parallel and MoE data-parallel sizes of the replica. Each group's
        scheduler exports its own series (label ``dp_rank`` with DP; ``moe_ep_rank`` its first
        rank's in the MoE EP group), from the node its first rank is on (``node_registries``: the
        leader's is ``registry``; a node of rank >= 1 serves its own, FACTS.md "Series per
        engine"): gauges, histograms and the decode batches' token counter."""
        if flavor not in ("vllm", "sglang"):
            raise ValueError(flavor)
        self.flavor = flavor
        self.registry = registry or CollectorRegistry()
        self.node_registries = {0: self.registry}
        self.samples = Samples()
        r = self.registry
        if flavor == "vllm":
            names = ["model_name", "engine"]
            lv = (served_name, "0")
            p = "vllm:"
            self._ttft = Histogram(p + "time_to_first_token_seconds", "Time to first token", names, registry=r, buckets=TTFT_BUCKETS).labels(*lv)
            self._ttft_family = None
            self._itl = Histogram(p + "inter_token_latency_seconds", "Inter-token latency", names, registry=r, buckets=ITL_BUCKETS).labels(*lv)
            self._tpot = Histogram(p + "request_time_per_output_token_seconds", "Time per output token", names, registry=r, buckets=ITL_BUCKETS).labels(*lv)
            self._e2e = Histogram(p + "e2e_request_latency_seconds", "End-to-end latency", names, registry=r, buckets=LAT_BUCKETS).labels(*lv)
            self._queue = Histogram(p + "request_queue_time_seconds", "Time waiting", names, registry=r, buckets=LAT_BUCKETS).labels(*lv)
            self._prefill = Histogram(p + "request_prefill_time_seconds", "Prefill phase", names, registry=r, buckets=LAT_BUCKETS).labels(*lv)
            self._decode = Histogram(p + "request_decode_time_seconds", "Decode phase", names, registry=r, buckets=LAT_BUCKETS).labels(*lv)
            self._req_prompt = Histogram(p + "request_prompt_tokens", "Prompt tokens per request", names, registry=r, buckets=TOK_BUCKETS).labels(*lv)
            self._req_gen = Histogram(p + "request_generation_tokens", "Generated tokens per request", names, registry=r, buckets=TOK_BUCKETS).labels(*lv)
            # no prefix cache in the sim: a prefill pod computes every prompt token, a decode pod
            # none (its KV is pulled: finished() observes 0 there)
            self._req_computed = Histogram(p + "request_prefill_kv_computed_tokens", "New KV tokens computed during prefill",
                                           names, registry=r, buckets=TOK_BUCKETS).labels(*lv)
            self._prompt = Counter(p + "prompt_tokens", "Prefill tokens processed", names, registry=r).labels(*lv)
            # created at 0 per engine, as vLLM does; no prefix cache in the sim, so only a decode
            # pod's prompts, whose KV came from the prefill pod (external)
            self._prompt_cached = Counter(p + "prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
                                          names, registry=r).labels(*lv)
            self._gen = Counter(p + "generation_tokens", "Generation tokens processed", names, registry=r).labels(*lv)
            self._success = Counter(p + "request_success", "Finished requests", names + ["finished_reason"], registry=r)
            self._lv = lv
            Counter(p + "num_preemptions", "Preemptions", names, registry=r).labels(*lv)
            self._g_running = Gauge(p + "num_requests_running", "Running requests", names, registry=r).labels(*lv)
            self._g_waiting = Gauge(p + "num_requests_waiting", "Waiting requests", names, registry=r).labels(*lv)
            # capacity: waiting for a slot; deferred: waiting on a transient constraint, here a KV
            # pull in flight (vllm/v1/metrics/loggers.py; the sum is num_requests_waiting)
            by_reason = Gauge(p + "num_requests_waiting_by_reason", "Number of waiting requests by reason.",
                              names + ["reason"], registry=r)
            self._g_waiting_by = {why: by_reason.labels(*lv, why) for why in ("capacity", "deferred")}
            # a KV consumer's requests by KV-load stage (loggers.py: kv_transfer_config.is_kv_consumer)
            self._g_kv_fetch = {}
            if role == "decode":
                by_stage = Gauge(p + "num_requests_kv_fetch_by_stage", "Number of waiting requests by async KV load stage.",
                                 names + ["stage"], registry=r)
                self._g_kv_fetch = {st: by_stage.labels(*lv, st) for st in ("waiting_to_start", "in_progress",
                                                                           "completed_waiting")}
            self._g_kv = Gauge(p + "kv_cache_usage_perc", "KV-cache usage, 0..1", names, registry=r).labels(*lv)
            self._g_extra = {}
            conn = {"NixlConnector": "nixl", "MooncakeConnector": "mooncake"}.get(kv_connector or "")
            self._kv_failed = None
            if conn:  # KVConnectorPromMetrics: created per engine, so present at 0
                failed = {"nixl": ("num_failed_transfers", "num_failed_notifications", "num_kv_expired_reqs"),
                          "mooncake": ("num_failed_transfers", "num_failed_recvs", "num_kv_expired_reqs")}[conn]
                made = {n: Counter(f"{p}{conn}_{n}", n.replace("_", " "), names, registry=r).labels(*lv) for n in failed}
                self._kv_failed = made["num_failed_transfers"]
            rej = Counter(p + "admission_rejections", "Admission attempts rejected by a queue limit, by reason",
                          ["model_name", "reason"], registry=r)
            self._rejections = {why: rej.labels(served_name, why) for why in ("max_num_queued_reqs", "max_num_queued_tokens")}
        else:
            names = ["model_name", "engine_type"]
            lv = (served_name, role)
            p = "sglang:"
            # a PD prefill worker never observes TTFT (managers/tokenizer_manager.py, collect_metrics);
            # SGLang labels it is_streaming and creates each series at its first observation
            # (observability/metrics_collector.py, observe_time_to_first_token): none on a prefill pod
            self._ttft = None
            self._ttft_family = (None if role == "prefill" else
                                 Histogram(p + "time_to_first_token_seconds", "Time to first token",
                                           names + ["is_streaming"], registry=r, buckets=SGLANG_TTFT_BUCKETS))
            self._itl = Histogram(p + "inter_token_latency_seconds", "Inter-token latency", names, registry=r,
                                  buckets=SGLANG_ITL_BUCKETS).labels(*lv)
            self._e2e = Histogram(p + "e2e_request_latency_seconds", "End-to-end latency", names, registry=r,
                                  buckets=SGLANG_E2E_BUCKETS).labels(*lv)
            self._tpot = self._decode = self._prompt_cached = None
            # every finished request's generated tokens, a PD worker's too; without
            # --generation-tokens-buckets the prompt histogram's default buckets (100, 300, ...:
            # outputs under 100 tokens all in the first; observability/metrics_collector.py)
            self._req_gen = Histogram(p + "generation_tokens_histogram", "Histogram of generation token length.", names,
                                      registry=r, buckets=SGLANG_PROMPT_BUCKETS).labels(*lv)
            # observed by the tokenizer manager of every server, a PD prefill worker's too, at a
            # request's end (observability/metrics_collector.py, managers/tokenizer_manager.py)
            self._req_prompt = Histogram(p + "prompt_tokens_histogram", "Histogram of prompt token length.", names,
                                         registry=r, buckets=SGLANG_PROMPT_BUCKETS).labels(*lv)
            self._req_computed = Histogram(p + "uncached_prompt_tokens_histogram", "Histogram of uncached (compute) prompt token length.",
                                           names, registry=r, buckets=SGLANG_PROMPT_BUCKETS).labels(*lv)
            self._prompt = Counter(p + "prompt_tokens", "Prefill tokens processed", names, registry=r).labels(*lv)
            # at a request's end (observe_one_finished_request): the tokenizer's, on node 0
            self._gen = Counter(p + "generation_tokens", "Generation tokens processed", names, registry=r).labels(*lv)
            self._success = None
            self._g_running = self._g_waiting = self._g_kv = None
            self._g_extra = {}
            # each attention-DP group's scheduler: its first TP rank logs the stats
            # (observability/metrics_collector.py, is_stats_logging_rank; labels tp_rank, pp_rank,
            # moe_ep_rank, and dp_rank with DP), from its node: tp_rank // (tp / nodes). The rank's
            # place in the MoE EP group: tp_rank = moe_dp_idx * ep * moe_tp + moe_ep_rank * moe_tp
            # + moe_tp_idx (distributed/parallel_state.py, initialize_model_parallel: _MOE_EP)
            moe_tp = max(1, tp // max(1, ep * moe_dp))
            names = names + ["tp_rank", "pp_rank", "moe_ep_rank"]

            def rank_labels(rank: int) -> tuple:
                return (served_name, role, str(rank), "0", str(rank % (ep * moe_tp) // moe_tp))

            per_node = max(1, tp // max(1, nodes))
            self._sched: list[dict] = []
            families: dict[int, dict] = {}
            for d in range(max(1, dp)):
                node = (d * (tp // dp if dp > 1 else tp)) // per_node if dp > 1 else 0
                reg = self.node_registries.setdefault(node, self.registry if node == 0 else CollectorRegistry())
                fam = families.get(node)
                if fam is None:
                    sn = names + (["dp_rank"] if dp > 1 else [])
                    fam = families[node] = {
                        "running": Gauge(p + "num_running_reqs", "Running requests", sn, registry=reg),
                        "waiting": Gauge(p + "num_queue_reqs", "Queued requests", sn, registry=reg),
                        "kv": Gauge(p + "token_usage", "KV-cache token usage, 0..1", sn, registry=reg),
                        "gen_throughput": Gauge(p + "gen_throughput", "Generation tokens/s", sn, registry=reg),
                        "cache_hit_rate": Gauge(p + "cache_hit_rate", "Prefix-cache hit rate", sn, registry=reg),
                        "prealloc": Gauge(p + "num_decode_prealloc_queue_reqs", "Decode requests waiting for KV", sn,
                                          registry=reg),
                        "transfer": Gauge(p + "num_decode_transfer_queue_reqs", "Decode requests receiving KV", sn,
                                          registry=reg),
                        # at a request's end the tokenizer's generation counter moves (above), with
                        # each decode batch this scheduler counter (metrics_reporter.report_decode_stats),
                        # created at its first increment (metrics_collector.increment_realtime_tokens)
                        "realtime": (Counter(p + "realtime_tokens", "Total number of tokens processed", sn + ["mode"],
                                             registry=reg) if role == "decode" else None),
                    }
                slv = rank_labels(d * (tp // dp) if dp > 1 else 0) + ((str(d),) if dp > 1 else ())
                self._sched.append({k: (f if k == "realtime" else f.labels(*slv)) for k, f in fam.items()}
                                   | {"lv": slv})
            # every rank of a group with metrics on observes its requests' queue time and stage
            # latencies (the scheduler collector is made on each rank: SchedulerMetricsCollectorContext
            # .init_new; req_time_stats.py set_forward_entry_time, observe_per_stage_req_latency) and
            # counts a failed transfer (disaggregation/decode.py _record_transfer_failure), each under
            # its own tp_rank, on its own node; these series appear at their first observation. The
            # sim reports the one stage the autoscaler reads: prefill_forward, a request's first
            # forward to its prefill done
            fn = names + (["dp_rank"] if dp > 1 else [])
            by_node: dict[int, dict] = {}
            for node in range(max(1, nodes)):
                reg = self.node_registries.setdefault(node, CollectorRegistry())
                by_node[node] = {
                    "failed": Counter(p + "num_transfer_failed_reqs_total", "The number of transfer failed requests.",
                                      fn, registry=reg),
                    "queue": Histogram(p + "queue_time_seconds", "Time waiting", fn, registry=reg, buckets=LAT_BUCKETS),
                    "prefill": Histogram(p + "per_stage_req_latency_seconds", "The latency of each stage of requests.",
                                         fn + ["stage"], registry=reg, buckets=STAGE_BUCKETS),
                }
                Counter(p + "num_bootstrap_failed_reqs_total", "The number of bootstrap failed requests.", fn, registry=reg)
            attn_tp = tp // dp if dp > 1 else tp
            self._sgl_ranks = [[(by_node[rank // per_node], rank_labels(rank) + ((str(d),) if dp > 1 else ()))
                                for rank in range(d * attn_tp, (d + 1) * attn_tp)] for d in range(max(1, dp))]
            self._sgl_lv = lv
            self._fail_turn = 0
            self._rejections = {}
        self._xfer = Histogram("pdsim_kv_transfer_seconds", "Simulated KV transfer (admission to KV ready)",
                               registry=r, buckets=XFER_BUCKETS)

    def bind(self, engine: Engine, fetching: Callable[[], int] = lambda: 0,
             gen_throughput: Callable[[], float] = lambda: 0.0) -> None:
        """Gauges read the engine's state at scrape time."""
        # a request whose KV is being pulled is neither running nor (in SGLang) in the waiting
        # queue: vLLM keeps it waiting, deferred (WAITING_FOR_REMOTE_KVS, scheduler.py); SGLang in
        # its transfer queue (num_decode_transfer_queue_reqs)
        if self.flavor == "sglang":
            self._bind_schedulers(engine, fetching, gen_throughput)
            return
        self._g_running.set_function(lambda: len(engine.running))
        if self.flavor == "vllm":
            self._g_waiting.set_function(lambda: engine.num_waiting + len(engine.transferring))
            self._g_waiting_by["capacity"].set_function(lambda: engine.num_waiting)
            self._g_waiting_by["deferred"].set_function(lambda: len(engine.transferring))
            if self._g_kv_fetch:
                # the sim admits a pull only into a free slot and runs it once its KV is in:
                # none waits for a seat after its pull (vLLM starts pulls past its free slots)
                self._g_kv_fetch["waiting_to_start"].set_function(lambda: engine.num_waiting)
                self._g_kv_fetch["in_progress"].set_function(lambda: len(engine.transferring))
                self._g_kv_fetch["completed_waiting"].set(0)
        self._g_kv.set_function(lambda: engine.kv_usage)

    def _bind_schedulers(self, engine: Engine, fetching: Callable[[], int], gen_throughput: Callable[[], float]) -> None:
        """SGLang: each DP group's gauges, of the requests the engine gave that group (its KV
        usage over its share of the pool). SGLang's order is prealloc (KV memory reserved),
        then the prefill and the pull (transfer queue), then running; the sim reserves after
        the prefill, and its requests waiting for a slot wait in the engine's queue
        (num_queue_reqs): prealloc stays 0."""
        dp = len(self._sched)

        def mine(reqs, d: int) -> list[SimRequest]:
            return [r for r in reqs if r.dp_rank == d] if dp > 1 else list(reqs)

        def share(n: int, d: int) -> int:  # the server's fetching requests, dealt in turn
            return n // dp + (d < n % dp)

        for d, g in enumerate(self._sched):
            g["running"].set_function(lambda d=d: len(mine(engine.running, d)))
            g["waiting"].set_function(lambda d=d: len(mine(engine.waiting, d)))
            g["kv"].set_function(lambda d=d: (sum(r.reserve for r in mine(engine.running + engine.transferring, d))
                                              / (engine.kv_capacity / dp) if engine.kv_capacity else 0.0))
            g["prealloc"].set(0)
            g["transfer"].set_function(lambda d=d: share(fetching(), d) + len(mine(engine.transferring, d)))
            g["gen_throughput"].set_function(lambda: gen_throughput() / dp)

    # ---- failures ----------------------------------------------------------------
    def kv_transfer_failed(self, group: int | None = None) -> None:
        """A failed KV transfer of a request of attention-DP group ``group`` (SGLang: on each of its
        TP ranks; None: the groups in turn, as the DP controller deals the requests)."""
        if self.flavor == "vllm":
            if self._kv_failed is not None:
                self._kv_failed.inc()
        else:
            if group is None:
                group, self._fail_turn = self._fail_turn, (self._fail_turn + 1) % len(self._sgl_ranks)
            for families, labels in self._sgl_ranks[group]:
                families["failed"].labels(*labels).inc()

    def admission_rejected(self, reason: str) -> None:
        if reason in self._rejections:
            self._rejections[reason].inc()

    # ---- Sink --------------------------------------------------------------------
    def ttft(self, v: float) -> None:
        self._observe_ttft(v, streamed=True)

    def ttft_batched(self, v: float) -> None:
        self._observe_ttft(v, streamed=False)

    def _observe_ttft(self, v: float, streamed: bool) -> None:
        if self._ttft is not None:
            self._ttft.observe(v)
        elif self._ttft_family is not None:
            self._ttft_family.labels(*self._sgl_lv, "true" if streamed else "false").observe(v)
        self.samples.ttft.append(v)

    def itl(self, v: float) -> None:
        self._itl.observe(v)
        self.samples.itl.append(v)

    def e2e(self, v: float) -> None:
        self._e2e.observe(v)
        self.samples.e2e.append(v)

    def queue(self, v: float, rank: int = 0) -> None:
        self._observe("queue", v, rank)

    def prefill_time(self, v: float, rank: int = 0) -> None:
        self._observe("prefill", v, rank, "prefill_forward")

    def _observe(self, key: str, v: float, rank: int, *extra: str) -> None:
        """vLLM: its engine's histogram; SGLang: every rank of the request's group (``rank``)."""
        if self.flavor == "vllm":
            (self._queue if key == "queue" else self._prefill).observe(v)
            return
        for families, labels in self._sgl_ranks[rank]:
            families[key].labels(*labels, *extra).observe(v)

    def decode_time(self, v: float) -> None:
        if self._decode is not None:
            self._decode.observe(v)

    def transfer(self, v: float) -> None:
        self._xfer.observe(v)
        self.samples.transfer.append(v)

    def prompt_tokens(self, n: int) -> None:
        self._prompt.inc(n)
        self.samples.prompt_tokens += n

    def prompt_external(self, n: int) -> None:
        # a decode pod's prompt counts in the total too: vLLM as external KV (PromptTokenStats,
        # v1/metrics/stats.py: computed + local_cache_hit + external_kv_transfer = total, and
        # cached = local + external); SGLang per finished request (observe_one_finished_request)
        self._prompt.inc(n)
        if self._prompt_cached is not None:
            self._prompt_cached.inc(n)

    def generation_tokens(self, n: int, rank: int = 0) -> None:
        if self.flavor == "vllm":
            self._gen.inc(n)  # each step's (IterationStats)
        elif self._sched[rank]["realtime"] is not None:
            g = self._sched[rank]
            g["realtime"].labels(*g["lv"], "decode").inc(n)
        self.samples.generation_tokens += n

    def finished(self, req: SimRequest) -> None:
        if self.flavor == "sglang":
            self._gen.inc(req.generated)  # SGLang counts a request's tokens when it finishes
        if self._success is not None:
            self._success.labels(*self._lv, "length").inc()
        if self._req_prompt is not None:
            self._req_prompt.observe(req.prompt_tokens)
            # vLLM: num_prompt_tokens - num_cached_tokens, the external ones cached (a decode pod's: 0)
            self._req_computed.observe(0 if req.kv_transfer and self.flavor == "vllm" else req.prompt_tokens)
        if self._req_gen is not None:
            self._req_gen.observe(req.generated)
            if self._tpot is not None and req.generated > 1 and req.first_token is not None:
                self._tpot.observe((req.finished - req.first_token) / (req.generated - 1))
