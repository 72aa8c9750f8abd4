"""What the autoscaler's queries return from real Prometheus, on series whose
values the test writes.

Each "pod" is an :class:`~tests.sim.conftest.Exporter` serving engine metrics
(vLLM or SGLang names) whose counters grow at rates fixed below; Prometheus
scrapes them with the pod labels the engine scrape job gives
(``namespace``, ``pdserving_io_service``, ``pdserving_io_role``), and
:class:`PrometheusSignals` runs the autoscaler's PromQL. The expected numbers
are worked out by hand from those rates (the arithmetic is in the asserts), so
a query that groups, filters, aggregates or divides the wrong series gives a
different number. The PromQL strings themselves are not pinned: any query
that returns the right numbers is right.
"""

from __future__ import annotations

import json
import math
import signal
import time

import pytest

from pd_operator.autoscale.promql import histogram_quantile
from pd_operator.autoscale.signals import PrometheusSignals
from tests.conftest import prometheus_binary
from tests.sim.conftest import Exporter, Procs, start_prometheus

pytestmark = pytest.mark.skipif(prometheus_binary() is None, reason="needs prometheus (tests/run.sh builds it)")

WINDOW = "8s"
INF = math.inf


def histogram(name: str, rates: dict[float, float], elapsed: float, labels: str = "") -> dict[str, float]:
    """``name`` as a classic histogram whose buckets grow at ``rates`` (per
    bucket, not cumulative; observations per second) since the exporter started,
    with more ``labels`` (``a="x",b="y"``). A constant offset keeps the counters far
    from zero (no rate() extrapolation to zero)."""
    out, cum = {}, 0.0
    more = f"{labels}," if labels else ""
    for le in sorted(rates):
        cum += rates[le]
        out[f'{name}_bucket{{{more}le="{"+Inf" if le == INF else le}"}}'] = 1000.0 + cum * elapsed
    out[f"{name}_count{{{labels}}}" if labels else f"{name}_count"] = 1000.0 + cum * elapsed
    out[f"{name}_sum{{{labels}}}" if labels else f"{name}_sum"] = 500.0 + cum * elapsed * 0.1
    return out


def counter(name: str, rate: float, elapsed: float) -> dict[str, float]:
    return {name: 1000.0 + rate * elapsed}


def pod(engine: str, *, ttft=None, itl=None, prompt=0.0, generated=0.0, finished=0.0, waiting=0.0, kv=0.0,
        running=0.0, decoded=None, more: dict[str, float] | None = None,
        hists: dict[str, dict[float, float]] | None = None):
    """The metrics page of one engine pod: latency histograms (bucket rates),
    token counters and finished requests (per second; SGLang's decode batches' ``decoded``,
    False: not exported), gauges, ``hists`` (more histograms by
    name: bucket rates) and ``more`` series as written. ``ttft=False``: no TTFT series at all
    (an SGLang PD prefill worker's)."""
    waiting_gauge, kv_gauge = {"vllm": ("num_requests_waiting", "kv_cache_usage_perc"),
                               "sglang": ("num_queue_reqs", "token_usage")}[engine]
    running_gauge = {"vllm": "num_requests_running", "sglang": "num_running_reqs"}[engine]

    def page(_scrape: int, elapsed: float) -> dict[str, float]:
        out: dict[str, float] = {}
        if ttft is not False:
            out.update(histogram(f"{engine}:time_to_first_token_seconds", ttft or {INF: 0.0}, elapsed))
        out.update(histogram(f"{engine}:inter_token_latency_seconds", itl or {INF: 0.0}, elapsed))
        out.update(histogram(f"{engine}:e2e_request_latency_seconds", {INF: finished}, elapsed))
        out.update(counter(f"{engine}:prompt_tokens_total", prompt, elapsed))
        out.update(counter(f"{engine}:generation_tokens_total", generated, elapsed))
        if engine == "sglang" and decoded is not False:
            # SGLang's generation counter moves at a request's end, this one with each decode batch
            # (``decoded``, default ``generated``), besides its prefill modes
            for stage in ("0", "1"):  # a second pipeline stage counts the same tokens
                out.update(counter(f'sglang:realtime_tokens_total{{mode="decode",pp_rank="{stage}"}}',
                                   generated if decoded is None else decoded, elapsed))
            out.update(counter('sglang:realtime_tokens_total{mode="prefill_compute"}', prompt, elapsed))
        out[f"{engine}:{waiting_gauge}"] = waiting
        out[f"{engine}:{running_gauge}"] = running
        out[f"{engine}:{kv_gauge}"] = kv
        for name, rates in (hists or {}).items():
            name, _, labels = name.partition("|")  # "metric|a=\"x\"": with labels
            out.update(histogram(name, rates, elapsed, labels))
        out.update(more or {})
        return out

    return page


def scheduler_page(decoded: float, waiting: dict[str, float], running: dict[str, float], kv: dict[str, float]):
    """The page of an SGLang node of rank >= 1: its schedulers' series only, by ``dp_rank``."""
    def page(_scrape: int, elapsed: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for rank in waiting:
            out.update(counter(f'sglang:realtime_tokens_total{{mode="decode",dp_rank="{rank}"}}',
                               decoded / len(waiting), elapsed))
            out[f'sglang:num_queue_reqs{{dp_rank="{rank}"}}'] = waiting[rank]
            out[f'sglang:num_running_reqs{{dp_rank="{rank}"}}'] = running[rank]
            out[f'sglang:token_usage{{dp_rank="{rank}"}}'] = kv[rank]
        return out

    return page


# the label LWS's group key becomes (promql.GROUP_KEY), on the pods of two groups
GROUP_A, GROUP_B = ({"leaderworkerset_sigs_k8s_io_group_key": key} for key in ("3f9a", "c04e"))

# (namespace, service, role) -> pages of its pods (a page, or a page and more target labels)
PODS = {
    # vLLM, two prefill pods and one decode pod of team-a/busy
    ("team-a", "busy", "prefill"): [
        # prompt lengths: all the prompts, and those computed (a prefix-cache hit is not)
        pod("vllm", ttft={0.1: 1, 0.5: 2, 1.0: 1, INF: 0}, prompt=4000, waiting=2, kv=0.25, running=3,
            hists={"vllm:request_prompt_tokens": {1000: 1, 20000: 2, INF: 1},
                   "vllm:request_prefill_kv_computed_tokens": {1000: 2, 20000: 2, INF: 0}}),
        pod("vllm", ttft={0.1: 0, 0.5: 1, 1.0: 1, INF: 0}, prompt=2000, waiting=6, kv=0.75, running=4,
            hists={"vllm:request_prompt_tokens": {1000: 0, 20000: 1, INF: 1},
                   "vllm:request_prefill_kv_computed_tokens": {1000: 0, 20000: 1, INF: 1}}),
    ],
    ("team-a", "busy", "decode"): [
        # A decode pod reports TTFTs and prompt tokens too (its own view of the
        # requests): they must not enter the prefill quantile nor the ISL. Of its 1 waiting
        # request, none waits for a slot: it is deferred on its KV pull (vLLM's by-reason gauge).
        pod("vllm", ttft={0.1: 50, 0.5: 0, 1.0: 0, INF: 0}, itl={0.025: 0, 0.05: 10, 0.1: 10, INF: 0},
            prompt=9999, generated=500, finished=2, waiting=1, kv=0.5, running=7,
            hists={"vllm:request_prompt_tokens": {1000: 0, 20000: 0, INF: 50},
                   "vllm:request_prefill_kv_computed_tokens": {1000: 0, 20000: 0, INF: 50}},
            more={'vllm:num_requests_waiting_by_reason{reason="capacity"}': 0.0,
                  'vllm:num_requests_waiting_by_reason{reason="deferred"}': 1.0}),
        # a second decode pod: 4 waiting for a slot, and of its 3 deferred, 2 whose KV pull is
        # done and that wait for a seat (a KV consumer's fetch stages), 1 still pulling
        pod("vllm", itl={INF: 0}, waiting=7, running=8,
            more={'vllm:num_requests_waiting_by_reason{reason="capacity"}': 4.0,
                  'vllm:num_requests_waiting_by_reason{reason="deferred"}': 3.0,
                  'vllm:num_requests_kv_fetch_by_stage{stage="waiting_to_start"}': 0.0,
                  'vllm:num_requests_kv_fetch_by_stage{stage="in_progress"}': 1.0,
                  'vllm:num_requests_kv_fetch_by_stage{stage="completed_waiting"}': 2.0}),
    ],
    # vLLM, idle: every counter flat
    ("team-a", "idle", "prefill"): [pod("vllm", ttft={0.1: 0, 0.5: 0, 1.0: 0, INF: 0})],
    # the same service name in another namespace is another service
    # an engine without the computed-tokens histogram: all its prompts
    ("team-b", "busy", "prefill"): [pod("vllm", ttft={0.1: 5, 0.5: 0, 1.0: 0, INF: 0}, prompt=500, waiting=9, kv=0.1,
                                        hists={"vllm:request_prompt_tokens": {100: 4, 200: 1, INF: 0}})],
    # SGLang: its PD prefill workers report no TTFT, its decode workers the request's
    ("team-a", "sg", "prefill"): [pod("sglang", ttft=False, prompt=8000, waiting=5, kv=0.3,
                                      hists={"sglang:prompt_tokens_histogram": {2000: 3, 20000: 1, INF: 0},
                                             "sglang:uncached_prompt_tokens_histogram": {2000: 4, 20000: 0, INF: 0}})],
    # no request streamed: the TTFTs there are
    ("team-a", "sg-batch", "prefill"): [pod("sglang", ttft=False, prompt=1000,
                                            hists={"sglang:prompt_tokens_histogram": {2000: 1, INF: 0}})],
    ("team-a", "sg-batch", "decode"): [pod("sglang", ttft=False, hists={
        'sglang:time_to_first_token_seconds|is_streaming="true"': {2.5: 0, INF: 0},
        'sglang:time_to_first_token_seconds|is_streaming="false"': {2.5: 0, 5.0: 2, INF: 0}})],
    # with priority scheduling: the total under priority="" and a breakdown by priority besides;
    # in PD, a decode pod's requests waiting for KV memory (a slot) are in its prealloc queue
    # its TTFTs labelled is_streaming: a request not streamed reads its first batched output
    # (50 tokens in), so the streamed ones count where there are any
    ("team-a", "sg", "decode"): [pod("sglang", ttft=False, itl={0.02: 4, 0.04: 4, INF: 0},
                                     hists={'sglang:time_to_first_token_seconds|is_streaming="true"':
                                            {0.25: 0, 0.5: 3, 1.0: 1, INF: 0},
                                            'sglang:time_to_first_token_seconds|is_streaming="false"':
                                            {2.5: 0, 5.0: 6, INF: 0}},
                                     generated=300, finished=1.5, decoded=450,
                                     waiting=3, kv=0.9, running=12,
                                     more={'sglang:num_queue_reqs{priority="0"}': 1.0,
                                           'sglang:num_queue_reqs{priority="5"}': 2.0,
                                           'sglang:num_running_reqs{priority="0"}': 12.0,
                                           'sglang:num_decode_prealloc_queue_reqs': 4.0,
                                           'sglang:num_decode_prealloc_queue_reqs{priority="0"}': 4.0,
                                           # a second pipeline stage reports the same requests
                                           'sglang:num_queue_reqs{pp_rank="1"}': 3.0,
                                           'sglang:num_running_reqs{pp_rank="1"}': 12.0,
                                           'sglang:num_decode_prealloc_queue_reqs{pp_rank="1"}': 4.0})],
    # SGLang decode replicas spanning nodes: the batches' counter covers the first node's ranks
    # only (100/s), the finished requests' all of them (300/s); and an engine without the former
    ("team-a", "sg-nodes", "decode"): [pod("sglang", ttft=False, generated=300, finished=1.5, decoded=100)],
    ("team-a", "sg-old", "decode"): [pod("sglang", ttft=False, generated=300, finished=1.5, decoded=False)],
    # SGLang decode replicas over two nodes each (LWS groups a and b), attention DP 4: each node
    # reports its own DP groups (dp_rank), the worker only its schedulers' series (no tokenizer:
    # no latency, no request counters); the scrape copies LWS's group key onto every pod's series
    ("team-a", "sg-lws", "decode"): [
        (pod("sglang", ttft=False, itl={0.02: 4, INF: 0}, generated=300, finished=1.5, decoded=100,
             waiting=2, running=10, kv=0.5, more={'sglang:num_queue_reqs{dp_rank="1"}': 3.0,
                                                   'sglang:num_running_reqs{dp_rank="1"}': 10.0,
                                                   'sglang:token_usage{dp_rank="1"}': 0.5}), GROUP_A),
        (scheduler_page(decoded=250, waiting={"2": 1.0, "3": 0.0}, running={"2": 9.0, "3": 8.0},
                        kv={"2": 0.3, "3": 0.1}), GROUP_A),
        (pod("sglang", ttft=False, itl={0.02: 4, INF: 0}, generated=100, finished=0.5, decoded=50,
             waiting=4, running=12, kv=0.9, more={'sglang:num_queue_reqs{dp_rank="1"}': 4.0,
                                                   'sglang:num_running_reqs{dp_rank="1"}': 12.0,
                                                   'sglang:token_usage{dp_rank="1"}': 0.9}), GROUP_B),
        (scheduler_page(decoded=50, waiting={"2": 0.0, "3": 0.0}, running={"2": 2.0, "3": 2.0},
                        kv={"2": 0.1, "3": 0.1}), GROUP_B),
    ],
    # one decode pod of two data-parallel vLLM engines, each its own series (label engine)
    ("team-a", "dp", "decode"): [lambda scrape, elapsed: {
        **{k: v for k, v in pod("vllm", itl={INF: 0})(scrape, elapsed).items()
           if not k.startswith(("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"))},
        'vllm:num_requests_waiting{engine="0"}': 2.0, 'vllm:num_requests_waiting{engine="1"}': 4.0,
        'vllm:kv_cache_usage_perc{engine="0"}': 0.2, 'vllm:kv_cache_usage_perc{engine="1"}': 0.4}],
}


class FreshlyScraped:
    """Queries just after every exporter was scraped: when the newest sample is over 1.1
    scrape intervals old (a scrape late on a loaded machine), rate() extrapolates the window's
    end by half an interval only (promql/functions.go, extrapolatedRate) and reads ~6 % low."""

    def __init__(self, signals: PrometheusSignals, exporters: list):
        self.signals, self.exporters = signals, exporters

    def pool(self, *args, **kwargs):
        seen = [e.scrapes for e in self.exporters]
        deadline = time.monotonic() + 10
        while any(e.scrapes <= n for e, n in zip(self.exporters, seen)) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # the scrape's samples appended
        return self.signals.pool(*args, **kwargs)


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    procs, exporters = Procs(), []
    try:
        targets = []
        for (ns, svc, role), pages in PODS.items():
            for page in pages:
                page, more = page if isinstance(page, tuple) else (page, {})
                e = Exporter(page)
                exporters.append(e)
                targets.append((e.host, e.port, {"namespace": ns, "pdserving_io_service": svc, "pdserving_io_role": role,
                                                 **more}))
        url = start_prometheus(procs, tmp_path_factory.mktemp("prom"), {"engines": targets})
        # rate() over WINDOW is the written rate once the samples cover the whole window
        covered = max(e.first_scrape for e in exporters) + float(WINDOW[:-1]) + 2.0
        time.sleep(max(0.0, covered - time.monotonic()))
        yield FreshlyScraped(PrometheusSignals(url), exporters)
    finally:
        procs.stop()
        for e in exporters:
            e.close()


SECONDARIES = {"queueDepth", "kvCacheUsage"}
approx = lambda x: pytest.approx(x, rel=0.02)  # noqa: E731 - scrape timing jitter only


def test_vllm_prefill(prom):
    obs = prom.pool("vllm", "prefill", 0.99, window=WINDOW, secondaries=SECONDARIES)
    busy, other = obs[("team-a", "busy")], obs[("team-b", "busy")]
    # both prefill pods' buckets summed: (0,0.1] 1/s, (0.1,0.5] 3/s, (0.5,1] 2/s; 6/s in all.
    # rank 0.99 x 6 = 5.94 lies in (0.5,1], 4 below it, 2 in it.
    assert busy.observed == approx(0.5 + (1.0 - 0.5) * (0.99 * 6 - 4) / 2)
    assert busy.demand == approx(4000 + 2000)              # prompt tokens/s of the prefill pods
    assert busy.mean_isl == approx((4000 + 2000) / (4 + 2))  # prompt tokens per prefill request
    assert busy.mean_osl is None                           # prefill capacity does not need it: not asked
    assert busy.queue == approx((2 + 6) / 2)               # per replica
    # no by-reason gauge on these pods (another vLLM version): the plain waiting gauge
    assert (busy.waiting_total, busy.waiting_min, busy.running_total) == (approx(8), approx(2), approx(7))
    # the backlog now, waiting + running over the pods, and its growth: flat pages, none
    assert busy.backlog_now == approx(2 + 6 + 3 + 4) and busy.backlog_growth == 0.0
    assert busy.kv_usage == approx((0.25 + 0.75) / 2)
    # team-b/busy: its own pod only. (0,0.1] holds all 5/s: 0.1 x 0.99.
    assert other.observed == approx(0.1 * 0.99)
    assert (other.demand, other.mean_isl, other.queue, other.kv_usage) == (approx(500), approx(100), approx(9), approx(0.1))
    # by bucket, cumulative: the TTFT histogram of the prefill pods (its quantile at any level,
    # computed as Prometheus does), and the prompts' computed tokens (not the cache hits, not
    # the decode pod's view)
    assert busy.latency_buckets == tuple((le, approx(n)) for le, n in ((0.1, 1), (0.5, 4), (1.0, 6), (INF, 6)))
    assert histogram_quantile(0.99, busy.latency_buckets) == approx(busy.observed)
    assert busy.prompt_buckets == tuple((le, approx(n)) for le, n in ((1000, 2), (20000, 5), (INF, 6)))
    assert other.prompt_buckets == tuple((le, approx(n)) for le, n in ((100, 4), (200, 5), (INF, 5)))
    # idle: the request rate is 0, so latency 0 (a real signal); a length over no requests is no data
    idle = obs[("team-a", "idle")]
    assert (idle.observed, idle.demand, idle.mean_isl, idle.queue, idle.kv_usage) == (0.0, 0.0, None, 0.0, 0.0)
    # a service with no series has no observation at all (hold), and only prefill pods count here
    assert set(obs) == {("team-a", "busy"), ("team-b", "busy"), ("team-a", "idle")}


def test_the_quantile_asked_for(prom):
    busy = prom.pool("vllm", "prefill", 0.5, window=WINDOW)[("team-a", "busy")]
    # rank 0.5 x 6 = 3 lies in (0.1,0.5], 1 below it, 3 in it
    assert busy.observed == approx(0.1 + (0.5 - 0.1) * (0.5 * 6 - 1) / 3)
    # the same from the buckets, as the autoscaler computes a quantile whose level depends on
    # other signals (rule 2c)
    assert histogram_quantile(0.5, busy.latency_buckets) == approx(busy.observed)


def test_vllm_decode(prom):
    obs = prom.pool("vllm", "decode", 0.99, window=WINDOW, secondaries=SECONDARIES)
    busy = obs[("team-a", "busy")]
    # ITL buckets (0.025,0.05] 10/s, (0.05,0.1] 10/s: rank 19.8 lies in (0.05,0.1], 10 below it
    assert busy.observed == approx(0.05 + (0.1 - 0.05) * (0.99 * 20 - 10) / 10)
    assert busy.demand == approx(500)            # generated tokens/s of the decode pods
    assert busy.mean_osl == approx(500 / 2)      # generated tokens per finished request
    assert busy.mean_isl == approx(6000 / 6)     # ISL from the prefill pods, not the decode pod's 9999/s
    # queueDepth: vLLM's waiting gauge as documented, (1 + 7) / 2 pods
    assert (busy.queue, busy.kv_usage) == (approx(4), approx((0.5 + 0.0) / 2))
    assert set(obs) == {("team-a", "busy"), ("team-a", "dp")}
    # waiting for a slot: capacity, plus the pulled ones waiting for a seat where the pod has
    # the fetch stages; not the pulls in flight: 0 + (4 + 2); the least pod's: 0
    assert (busy.waiting_total, busy.waiting_min, busy.running_total) == (approx(6), 0.0, approx(15))
    assert busy.backlog_now is None and busy.backlog_growth is None  # prefill pools only


def test_a_replica_of_data_parallel_engines_is_one_replica(prom):
    """queueDepth is waiting requests per replica: a pod's engines summed (2 + 4), not
    averaged as if each engine were a replica; its KV-cache usage is their mean."""
    dp = prom.pool("vllm", "decode", 0.99, window=WINDOW, secondaries=SECONDARIES)[("team-a", "dp")]
    assert (dp.queue, dp.kv_usage) == (approx(6), approx(0.3))


def test_without_secondaries_they_are_not_read(prom):
    busy = prom.pool("vllm", "decode", 0.99, window=WINDOW)[("team-a", "busy")]
    assert busy.observed is not None and (busy.queue, busy.kv_usage) == (None, None)


def test_sglang(prom):
    pre = prom.pool("sglang", "prefill", 0.99, window=WINDOW, secondaries=SECONDARIES)[("team-a", "sg")]
    # the TTFT of the decode pods (the prefill pods have none), of the streamed requests:
    # (0.25,0.5] 3/s, (0.5,1] 1/s: rank 3.96 lies in (0.5,1], 3 below it; the ISL over the
    # prompt histogram's count, 4/s
    assert pre.observed == approx(0.5 + 0.5 * (0.99 * 4 - 3) / 1)
    assert histogram_quantile(0.5, pre.latency_buckets) == approx(0.25 + 0.25 * (2 - 0) / 3)
    # none streamed (the streamed series flat): all the requests, (2.5,5] 2/s
    batch = prom.pool("sglang", "prefill", 0.99, window=WINDOW)[("team-a", "sg-batch")]
    assert batch.observed == approx(2.5 + 2.5 * 0.99) and batch.mean_isl == approx(1000 / 1)
    assert histogram_quantile(0.99, batch.latency_buckets) == approx(batch.observed)
    assert (pre.demand, pre.mean_isl, pre.queue, pre.kv_usage) == (approx(8000), approx(8000 / 4), approx(5), approx(0.3))
    dec = prom.pool("sglang", "decode", 0.99, window=WINDOW, secondaries=SECONDARIES)[("team-a", "sg")]
    # (0,0.02] 4/s, (0.02,0.04] 4/s: rank 7.92 lies in (0.02,0.04], 4 below it
    assert dec.observed == approx(0.02 + 0.02 * (0.99 * 8 - 4) / 4)
    # demand: the tokens the decode batches produce (450/s, once for the pipeline stages), not
    # the 300/s of the requests that finished; the mean OSL from the finished ones
    assert (dec.demand, dec.mean_osl, dec.mean_isl) == (approx(450), approx(300 / 1.5), approx(2000))
    assert (dec.queue, dec.kv_usage) == (approx(3), approx(0.9))  # the total, not the breakdown too
    decs = prom.pool("sglang", "decode", 0.99, window=WINDOW)
    assert (decs[("team-a", "sg-nodes")].demand, decs[("team-a", "sg-old")].demand) == (approx(300), approx(300))
    # waiting for a slot: the waiting queue and the prealloc queue, each its total once, once
    # for the pod's pipeline stages
    assert (dec.waiting_total, dec.waiting_min, dec.running_total) == (approx(3 + 4), approx(7), approx(12))
    assert (pre.waiting_total, pre.backlog_now) == (approx(5), approx(5))
    # prompt lengths: the uncached ones
    assert pre.prompt_buckets == tuple((le, approx(n)) for le, n in ((2000, 4), (20000, 4), (INF, 4)))
    assert histogram_quantile(0.99, pre.latency_buckets) == approx(pre.observed)
    # vLLM's series are not SGLang's
    assert ("team-a", "busy") not in prom.pool("sglang", "prefill", 0.99, window=WINDOW)


def test_a_replica_over_nodes_is_one_replica_with_every_nodes_series(prom):
    """SGLang with attention DP across nodes: each node reports its own DP groups. queueDepth is
    per replica, its pods' series summed (a: 2 + 3 + 1 + 0, b: 4 + 4 + 0 + 0; per pod it would
    read (5 + 1 + 8 + 0) / 4); the loads, the KV usage and the decode batches' tokens take
    every node's series, not only the leaders'."""
    dec = prom.pool("sglang", "decode", 0.99, window=WINDOW, secondaries=SECONDARIES)[("team-a", "sg-lws")]
    assert dec.queue == approx((6 + 8) / 2)
    assert (dec.waiting_total, dec.running_total) == (approx(6 + 8), approx(10 + 10 + 9 + 8 + 12 + 12 + 2 + 2))
    assert dec.kv_usage == approx((0.5 + 0.5 + 0.3 + 0.1 + 0.9 + 0.9 + 0.1 + 0.1) / 8)
    # the batches' tokens of all four nodes (450/s) over the finished requests' (400/s)
    assert (dec.demand, dec.mean_osl) == (approx(100 + 250 + 50 + 50), approx(400 / 2))
    # every DP group had a queue but two of b's: the least is 0
    assert dec.waiting_min == 0.0


def test_a_counter_created_at_its_first_increment_counts_whole(tmp_path):
    # sglang-router creates smg_worker_errors_total at its first error (2 at once here,
    # then none: its circuit breaker opened); increase() alone reads 0, as its first
    # sample has no predecessor. A counter there from the start at a flat 5 counts 0.
    def router(appears_at: int, value: float):
        def page(scrape: int, _elapsed: float) -> dict[str, float]:
            out = {'smg_worker_errors_total{worker_type="decode",connection_mode="http",error_type="backend_error"}': 5.0}
            if scrape >= appears_at:
                out['smg_worker_errors_total{worker_type="prefill",connection_mode="http",error_type="backend_error"}'] = value
            return out
        return page

    procs, exporters = Procs(), [Exporter(router(4, 2.0)), Exporter(router(10**9, 0.0))]
    try:
        url = start_prometheus(procs, tmp_path, {"router": [
            (exporters[0].host, exporters[0].port, {"namespace": "a", "pdserving_io_service": "new", "pdserving_io_role": "router"}),
            (exporters[1].host, exporters[1].port, {"namespace": "a", "pdserving_io_service": "old", "pdserving_io_role": "router"})]})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and exporters[0].scrapes < 6:
            time.sleep(0.5)
        time.sleep(1.5)
        got = PrometheusSignals(url).diagnosis("sglang", "sglang-router", window="30s")
        assert got[("a", "new")].worker_errors == 2.0, got.get(("a", "new"))
        assert got[("a", "old")].worker_errors == 0.0, got.get(("a", "old"))
    finally:
        procs.stop()
        for e in exporters:
            e.close()


def test_a_counter_on_a_pod_started_within_the_window_counts_whole(tmp_path):
    # A new router pod refuses its first requests before Prometheus first scrapes it, so
    # its error counter is there, at 3, from the pod's first sample on (then its breaker
    # opens: no more). Its pod started within the window: the 3 count. The target scraped
    # since Prometheus started, whose counter is there at 5 from its first sample, counts
    # only its increase (0): as after a restart of Prometheus, nothing says when its 5 came.
    def router(value: float):
        def page(_scrape: int, _elapsed: float) -> dict[str, float]:
            return {'smg_worker_errors_total{worker_type="decode",connection_mode="http",error_type="backend_error"}': value}
        return page

    procs, old, new = Procs(), Exporter(router(5.0)), Exporter(router(3.0))
    labels = lambda svc: {"namespace": "a", "pdserving_io_service": svc, "pdserving_io_role": "router"}  # noqa: E731
    try:
        url = start_prometheus(procs, tmp_path, {"router": [(old.host, old.port, labels("old"))]})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and old.scrapes < 8:
            time.sleep(0.5)
        # the new pod joins the job (as service discovery adds it): config reloaded on SIGHUP
        config = json.loads((tmp_path / "prometheus.yml").read_text())
        config["scrape_configs"][0]["static_configs"].append({"targets": [f"{new.host}:{new.port}"], "labels": labels("new")})
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))
        procs.procs[-1].send_signal(signal.SIGHUP)
        while time.monotonic() < deadline + 30 and new.scrapes < 3:
            time.sleep(0.5)
        time.sleep(1.5)
        got = PrometheusSignals(url).diagnosis("sglang", "sglang-router", window="30s")
        assert new.scrapes >= 3 and got[("a", "new")].worker_errors == 3.0, got.get(("a", "new"))
        assert got[("a", "old")].worker_errors == 0.0, got.get(("a", "old"))
    finally:
        procs.stop()
        for e in (old, new):
            e.close()


def test_a_pod_ip_reused_within_the_window_does_not_break_the_diagnosis(tmp_path):
    # A new pod gets the IP of one that just went: within the window, two `up` series share
    # instance and job and differ by `pod` (seen in CI: kwok reuses a loopback IP in
    # seconds). Joined on (instance, job) alone Prometheus refuses the whole query (422
    # "found duplicate series for the match group"), and with it every service's diagnosis.
    # Two targets on one address, differing by pod, give Prometheus the same two series.
    def router(_scrape: int, _elapsed: float) -> dict[str, float]:
        return {'smg_worker_errors_total{worker_type="decode",connection_mode="http",error_type="backend_error"}': 5.0}

    procs, exporter = Procs(), Exporter(router)
    labels = lambda pod: {"namespace": "a", "pdserving_io_service": "svc", "pdserving_io_role": "router", "pod": pod}  # noqa: E731
    try:
        url = start_prometheus(procs, tmp_path, {"router": [(exporter.host, exporter.port, labels("router-old")),
                                                            (exporter.host, exporter.port, labels("router-new"))]})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and exporter.scrapes < 8:
            time.sleep(0.5)
        got = PrometheusSignals(url).diagnosis("sglang", "sglang-router", window="30s")
        assert got[("a", "svc")].worker_errors == 0.0, got.get(("a", "svc"))  # a flat counter: no errors
    finally:
        procs.stop()
        exporter.close()
