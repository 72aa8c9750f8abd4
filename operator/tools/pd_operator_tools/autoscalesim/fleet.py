"""A simulated PD fleet fast enough for a day of traffic (``pdctl autoscale-bench``, ``pdctl simulate``).

Prefill instances are the simulator's own :class:`~pd_operator_tools.enginesim.engine.Engine`
(role ``prefill``; a few steps per request).  Decode instances are
:class:`FastDecode`: the same scheduler as ``Engine`` in the decode role
(FIFO admission while running+transferring < max_num_seqs and the KV reserve
fits, KV pulled over the link, joins the next step, one token per running
request per step, step time ``CostModel.decode_ms``), but it jumps over the
steps in which nothing changes: between two events (a request joins or
finishes, a new request arrives) every step adds one token to each running
request, so the step times form an arithmetic series
``A + c*B*i`` and ``m`` steps take ``m*A + c*B*m(m-1)/2``.  An event that
happens in the middle of a step takes effect at the next step boundary, as in
``Engine``.  A test checks it against ``Engine`` request by request.

What the benchmark measures:

* client side, per request: TTFT (client arrival -> first token from the
  decode instance, so it includes prefill queueing, the transfer and decode
  admission), mean ITL = (last - first token) / (tokens - 1); good when
  TTFT < the TTFT SLO and mean ITL < the ITL SLO (default 1 s and 50 ms);
  per-token ITLs into a fine histogram;
* Prometheus side (:class:`Scraper`): every 15 s, per pool, the cumulative
  histogram buckets of the engines' own ``time_to_first_token_seconds``
  (prefill) and ``inter_token_latency_seconds`` (decode) with vLLM's buckets,
  ``prompt_tokens_total``, ``generation_tokens_total``, the count of requests
  finished on decode (``e2e_request_latency_seconds_count``), and the gauges
  ``num_requests_running`` / ``num_requests_waiting`` / ``kv_cache_usage_perc``
  per pod.  ``histogram_quantile(q, rate(..[1m]))``
  is computed as Prometheus does (linear interpolation in the bucket).

The two pools may have different cost models (model shape and tensor
parallelism per pool) and engine limits (``max_num_seqs``,
``max_batched_tokens``); GPU-seconds count ``gpus_per_replica`` per pod.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import math
from dataclasses import dataclass, field

from ..enginesim.clock import VirtualClock
from pd_operator.autoscale.promql import histogram_quantile as prom_quantile
from pd_operator.perfmodel.costmodel import LINKS, CostModel, Link
from ..enginesim.engine import Engine, SimRequest, Sink
from ..enginesim.metrics import ITL_BUCKETS, TTFT_BUCKETS

TTFT_SLO = 1.0
ITL_SLO = 0.05
# vllm:request_generation_tokens buckets: 1-2-5 up to max_model_len (vllm/v1/metrics/buckets.py)
OSL_BUCKETS = [m * 10 ** k for k in range(6) for m in (1, 2, 5) if m * 10 ** k <= 131072]


def request_tokens_buckets(max_model_len: int) -> list[int]:
    """vLLM's request_tokens histogram family: 1-2-5 edges up to max_model_len
    (vllm/v1/metrics/buckets.py, build_1_2_5_buckets)."""
    return [m * 10 ** k for k in range(10) for m in (1, 2, 5) if m * 10 ** k <= max_model_len]


class FineHist:
    """Fixed-width histogram (for exact-enough p99 of the reported figures)."""

    def __init__(self, width: float, n: int):
        self.width, self.c = width, [0.0] * (n + 1)

    def add(self, v: float, k: float = 1.0) -> None:
        i = int(v / self.width)
        self.c[min(i, len(self.c) - 1)] += k

    def add_linear(self, lo: float, hi: float, k: float) -> None:
        """``k`` observations spread evenly over [lo, hi]."""
        if hi - lo < self.width:
            self.add((lo + hi) / 2, k)
            return
        i0, i1 = int(lo / self.width), int(hi / self.width)
        n = len(self.c) - 1
        span = hi - lo
        for i in range(i0, i1 + 1):
            a, b = max(lo, i * self.width), min(hi, (i + 1) * self.width)
            if b > a:
                self.c[min(i, n)] += k * (b - a) / span

    def quantile(self, q: float) -> float:
        tot = sum(self.c)
        if tot <= 0:
            return float("nan")
        rank, acc = q * tot, 0.0
        for i, x in enumerate(self.c):
            if acc + x >= rank:
                return (i + ((rank - acc) / x if x else 0)) * self.width
            acc += x
        return len(self.c) * self.width


class PromHist:
    """Cumulative-by-bucket counters (non-cumulative storage), vLLM bucket bounds."""

    def __init__(self, bounds):
        self.bounds = list(bounds)
        self.c = [0.0] * (len(self.bounds) + 1)  # last: +Inf
        self.sum = 0.0
        self.count = 0.0

    def observe(self, v: float, k: float = 1.0) -> None:
        self.c[bisect.bisect_left(self.bounds, v)] += k
        self.sum += v * k
        self.count += k

    def observe_linear(self, lo: float, hi: float, k: float) -> None:
        if k <= 0:
            return
        self.sum += (lo + hi) / 2 * k
        self.count += k
        if hi - lo <= 1e-12:
            self.c[bisect.bisect_left(self.bounds, lo)] += k
            return
        i0, i1 = bisect.bisect_left(self.bounds, lo), bisect.bisect_left(self.bounds, hi)
        if i0 == i1:
            self.c[i0] += k
            return
        span = hi - lo
        prev = lo
        for i in range(i0, i1 + 1):
            ub = self.bounds[i] if i < len(self.bounds) else hi
            ub = min(ub, hi)
            self.c[i] += k * (ub - prev) / span
            prev = ub

    def snapshot(self) -> tuple:
        return (tuple(self.c), self.sum, self.count)


def histogram_quantile(q: float, bounds, delta: list[float]) -> float:
    """Prometheus' histogram_quantile on per-bucket increases (non-cumulative, +Inf last): the
    operator's own (:func:`pd_operator.autoscale.promql.histogram_quantile`) on their
    cumulative sums; NaN where Prometheus answers NaN."""
    value = prom_quantile(q, list(zip([*bounds, math.inf], itertools.accumulate(delta))))
    return math.nan if value is None else value


class ClientStats:
    """What clients see, aggregated (a day has ~1.7 M requests: no per-request list)."""

    def __init__(self, t0: float = 0.0, ttft_slo: float = TTFT_SLO, itl_slo: float = ITL_SLO):
        self.ttft_slo, self.itl_slo = ttft_slo, itl_slo
        self.n = 0
        self.good = 0
        self.ttft = FineHist(0.001, 200_000)      # 1 ms bins to 200 s
        self.itl_tok = FineHist(0.0001, 20_000)   # 0.1 ms bins to 2 s, per token
        self.itl_req = FineHist(0.0001, 20_000)   # per-request mean ITL
        self.per_min = collections.defaultdict(lambda: [0, 0])  # arrival minute -> [done, good]
        self.samples: list = []  # (arrival, ttft, mean_itl) when keep_samples

    def record(self, arrival: float, ttft: float, mean_itl: float | None, keep: bool = False) -> None:
        self.n += 1
        ok = ttft < self.ttft_slo and (mean_itl is None or mean_itl < self.itl_slo)
        self.good += ok
        c = self.ttft.c
        c[min(int(ttft * 1000), 200_000)] += 1
        if mean_itl is not None:
            c = self.itl_req.c
            c[min(int(mean_itl * 10000), 20_000)] += 1
        m = self.per_min[int(arrival // 60)]
        m[0] += 1
        m[1] += ok
        if keep:
            self.samples.append((round(arrival, 6), round(ttft, 6), None if mean_itl is None else round(mean_itl, 7)))


class DReq:
    __slots__ = ("prompt", "max_tokens", "arrival", "reserve", "join_step", "first_token", "seq")

    def __init__(self, prompt: int, max_tokens: int, arrival: float, seq: int):
        self.prompt, self.max_tokens, self.arrival, self.seq = prompt, max_tokens, arrival, seq
        self.reserve = prompt + max_tokens
        self.join_step = 0
        self.first_token = 0.0


class FastDecode:
    """A decode instance (vLLM kv_consumer) that skips uneventful steps; see the module doc."""

    def __init__(self, fleet: "BenchFleet", name: str):
        self.fleet = fleet
        self.clock: VirtualClock = fleet.clock
        cost: CostModel = fleet.costs["decode"]
        self.cost = cost
        self.name = name
        self.a = cost.decode_fixed_ms() / 1e3
        self.b = cost.eff.decode_per_seq_ms / 1e3
        self.c = cost.eff.decode_kv_ms_per_token * cost._kv / 1e3
        self.max_num_seqs = fleet.limits["decode"][0]
        self.kv_capacity = cost.kv_capacity_tokens()
        self.link = fleet.link
        self.waiting: collections.deque = collections.deque()
        self.n_transfer = 0
        self.joiners: list[DReq] = []
        self.heap: list = []          # (finish_step, seq, req)
        self.B = 0
        self.sum_base = 0             # sum(prompt + 1 - join_step) over running
        self.steps = 0
        self.kv_used = 0
        self.busy = False
        self.kick_pending = False
        self.seg_start = 0.0
        self.seg_A = 0.0
        self.seg_B = 0
        self.seg_new = 0
        self.seg_m = 0
        self.gen = 0
        self.itl_hist = PromHist(ITL_BUCKETS)

    # observable
    @property
    def num_running(self) -> int:
        return self.B + len(self.joiners) + self.n_transfer

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def idle(self) -> bool:
        return not (self.B or self.joiners or self.n_transfer or self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.kv_capacity if self.kv_capacity else 0.0

    def add(self, r: DReq) -> None:
        if r.reserve > self.kv_capacity:
            raise ValueError("request larger than the KV cache")
        self.waiting.append(r)
        self._external()

    # scheduling
    def _external(self) -> None:
        if not self.busy:
            if not self.kick_pending:
                self.kick_pending = True
                self.clock.call_later(0.0, self._kick)
            return
        # takes effect at the next step boundary
        el = self.clock.now() - self.seg_start
        A, cB = self.seg_A, self.c * self.seg_B
        # smallest m >= 1 with m*A + cB*m(m-1)/2 > el
        if cB > 0:
            # solve cB/2 m^2 + (A - cB/2) m - el = 0
            p = A - cB / 2
            m = int(math.floor((-p + math.sqrt(p * p + 2 * cB * el)) / cB)) if el > 0 else 0
        else:
            m = int(el // A)
        m = max(1, m - 1)
        while m * A + cB * m * (m - 1) / 2 <= el:
            m += 1
        if m < self.seg_m:
            self.seg_m = m
            self.gen += 1
            self.clock.call_at(self.seg_start + m * A + cB * m * (m - 1) / 2, self._boundary, self.gen)

    def _kv_arrived(self, r: DReq) -> None:
        self.n_transfer -= 1
        self.joiners.append(r)
        self._external()

    def _kick(self) -> None:
        self.kick_pending = False
        if not self.busy:
            self._start(self.clock.now())

    def _boundary(self, gen: int) -> None:
        if gen != self.gen:
            return
        now = self.clock.now()
        m, A, B, cB = self.seg_m, self.seg_A, self.seg_B, self.c * self.seg_B
        # per-token ITLs of the segment: step i lasts A + cB*i; step 0 is a first token for the new joiners
        stats = self.fleet.stats
        old0 = B - self.seg_new
        if old0 > 0:
            self.itl_hist.observe(A, old0)
            stats.itl_tok.add(A, old0)
        if m > 1:
            self.itl_hist.observe_linear(A + cB, A + cB * (m - 1), B * (m - 1))
            stats.itl_tok.add_linear(A + cB, A + cB * (m - 1), B * (m - 1))
        self.fleet.gen_tokens += B * m
        self.steps += m
        self.busy = False
        heap = self.heap
        while heap and heap[0][0] <= self.steps:
            _, _, r = heapq.heappop(heap)
            self.B -= 1
            self.sum_base -= r.prompt + 1 - r.join_step
            self.kv_used -= r.reserve
            itl = (now - r.first_token) / (r.max_tokens - 1) if r.max_tokens > 1 else None
            self.fleet.finished(r, itl)
        self._start(now)

    def _start(self, now: float) -> None:
        # admission (FIFO), as Engine._admit
        while self.waiting and self.num_running < self.max_num_seqs:
            r = self.waiting[0]
            if self.kv_used + r.reserve > self.kv_capacity:
                break
            self.waiting.popleft()
            self.kv_used += r.reserve
            self.n_transfer += 1
            self.clock.call_later(self.cost.transfer_ms(r.prompt, self.link) / 1e3, self._kv_arrived, r)
        new = self.joiners
        self.joiners = []
        for r in new:
            r.join_step = self.steps
            self.sum_base += r.prompt + 1 - self.steps
            self.B += 1
            heapq.heappush(self.heap, (self.steps + r.max_tokens, r.seq, r))
        if self.B == 0:
            return
        B = self.B
        A = self.a + self.b * B + self.c * (self.sum_base + B * self.steps)
        for r in new:
            r.first_token = now + A
            self.fleet.first_token(r)
        k = self.heap[0][0] - self.steps
        cB = self.c * B
        self.seg_start, self.seg_A, self.seg_B, self.seg_new, self.seg_m = now, A, B, len(new), k
        self.busy = True
        self.gen += 1
        self.clock.call_at(now + k * A + cB * k * (k - 1) / 2, self._boundary, self.gen)


class PrefillSink(Sink):
    def __init__(self):
        self.ttft_hist = PromHist(TTFT_BUCKETS)
        self.prompt_total = 0
        self.prefill_sum, self.prefill_count = 0.0, 0  # vllm:request_prefill_time_seconds _sum, _count

    def ttft(self, v: float) -> None:
        self.ttft_hist.observe(v)

    def prefill_time(self, v: float, rank: int = 0) -> None:
        self.prefill_sum += v
        self.prefill_count += 1

    def prompt_tokens(self, n: int) -> None:
        self.prompt_total += n


@dataclass
class Pod:
    role: str
    ordered: float
    ready_at: float
    engine: object = None
    removed: float | None = None


class BenchFleet:
    """PD fleet with pods that take ``start_delay`` to become Ready and drain on removal.

    ``cost`` is both pools' cost model unless ``decode_cost`` is given (a decode
    pool with another tensor-parallel size); ``max_num_seqs`` /
    ``max_batched_tokens`` apply to both pools unless ``limits`` gives them per
    role (``{"prefill": (seqs, tokens), "decode": (seqs, tokens)}``);
    ``gpus_per_replica`` per role (default 1) weighs the GPU-seconds."""

    def __init__(self, cost: CostModel | None = None, link: Link = LINKS["rdma"], start_delay: float = 120.0,
                 max_num_seqs: int = 256, max_batched_tokens: int = 8192, keep_samples: bool = False,
                 decode_cost: CostModel | None = None, limits: dict | None = None,
                 gpus_per_replica: dict | None = None, ttft_slo: float = TTFT_SLO, itl_slo: float = ITL_SLO):
        self.clock = VirtualClock()
        self.cost = cost or CostModel()
        self.costs = {"prefill": self.cost, "decode": decode_cost or self.cost}
        self.link = link
        self.start_delay = start_delay
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.limits = {"prefill": (max_num_seqs, max_batched_tokens), "decode": (max_num_seqs, max_batched_tokens)}
        self.limits.update(limits or {})
        self.gpus = {"prefill": 1, "decode": 1}
        self.gpus.update(gpus_per_replica or {})
        self.keep_samples = keep_samples
        self.stats = ClientStats(ttft_slo=ttft_slo, itl_slo=itl_slo)
        self.pods: dict[str, list[Pod]] = {"prefill": [], "decode": []}   # ready or starting, in order
        self.draining: list[Pod] = []
        self.gpu_seconds = 0.0
        self.actions = {"prefill": 0, "decode": 0}
        self.gen_tokens = 0
        self.arrived = 0
        self.arrived_prompt = 0
        self.arrived_output = 0
        self.decoded = 0  # requests finished on decode (the count of its e2e_request_latency_seconds)
        self.osl_hist = PromHist(OSL_BUCKETS)  # generated tokens per finished request
        # prompt tokens per request finished on prefill (vllm:request_prompt_tokens, the prefill pods')
        self.isl_hist = PromHist(request_tokens_buckets(self.costs["prefill"].shape.max_model_len))
        self._seq = itertools.count()
        self._series_seq = itertools.count()  # pods' series identities (scrape)
        # dead pools' counters stay in the pool totals (Prometheus sum(rate()) over pods, ignoring resets)
        self.dead_ttft = PromHist(TTFT_BUCKETS)
        self.dead_prompt = 0
        self.dead_prefill = (0.0, 0)
        self.dead_itl = PromHist(ITL_BUCKETS)

    # ---- pods -------------------------------------------------------------------
    def ready(self, role: str) -> list:
        return [p.engine for p in self.pods[role] if p.engine is not None]

    def starting(self, role: str) -> int:
        return sum(1 for p in self.pods[role] if p.engine is None)

    def replicas(self, role: str) -> int:
        return len(self.pods[role])

    def _make_engine(self, pod: Pod) -> None:
        if pod.removed is not None:
            return
        if pod.role == "prefill":
            seqs, tokens = self.limits["prefill"]
            pod.engine = Engine(self.clock, self.costs["prefill"], "prefill", max_num_seqs=seqs,
                                max_batched_tokens=tokens, link=self.link, sink=PrefillSink())
        else:
            pod.engine = FastDecode(self, f"decode-{next(self._seq)}")

    def _pay(self, pod: Pod, now: float) -> None:
        self.gpu_seconds += (now - pod.ordered) * self.gpus[pod.role]

    def scale_to(self, role: str, n: int, ready_now: bool = False) -> None:
        now = self.clock.now()
        pods = self.pods[role]
        if n != len(pods):
            self.actions[role] += 1
        while len(pods) < n:
            pod = Pod(role, now, now if ready_now else now + self.start_delay)
            pods.append(pod)
            if ready_now:
                self._make_engine(pod)
            else:
                self.clock.call_at(pod.ready_at, self._make_engine, pod)
        while len(pods) > n:
            # StatefulSet: the highest ordinal goes first (a starting pod if any)
            pod = pods.pop()
            pod.removed = now
            if pod.engine is None:
                self._pay(pod, now)
            else:
                self.draining.append(pod)

    def account(self) -> None:
        """Charge drained pods (called every control tick)."""
        now = self.clock.now()
        keep = []
        for pod in self.draining:
            e = pod.engine
            empty = (e.idle if isinstance(e, FastDecode) else not (e.running or e.waiting or e.transferring))
            if empty:
                self._pay(pod, now)
                if isinstance(e, FastDecode):
                    self.dead_itl = _merge(self.dead_itl, e.itl_hist)
                else:
                    self.dead_ttft = _merge(self.dead_ttft, e.sink.ttft_hist)
                    self.dead_prompt += e.sink.prompt_total
                    self.dead_prefill = (self.dead_prefill[0] + e.sink.prefill_sum,
                                         self.dead_prefill[1] + e.sink.prefill_count)
            else:
                keep.append(pod)
        self.draining = keep

    def finish(self) -> None:
        now = self.clock.now()
        for role in self.pods:
            for pod in self.pods[role]:
                self._pay(pod, now)
        for pod in self.draining:
            self._pay(pod, now)
        self.draining = []

    def gpus_now(self) -> int:
        return sum(self.gpus[p.role] for p in self.pods["prefill"] + self.pods["decode"] + self.draining)

    # ---- requests -----------------------------------------------------------------
    def submit(self, isl: int, osl: int) -> None:
        self.arrived += 1
        self.arrived_prompt += isl
        self.arrived_output += osl
        engines = self.ready("prefill")
        if not engines:
            engines = [p.engine for p in self.draining if p.role == "prefill"]  # never happens with min 1
        e = min(engines, key=lambda x: x.num_running + x.num_waiting)
        req = SimRequest(isl, 1, prefill_only=True, on_finish=self._prefill_done)
        req.tag = (self.clock.now(), osl)
        e.add(req)

    def _prefill_done(self, r: SimRequest, t: float) -> None:
        arrival, osl = r.tag
        self.isl_hist.observe(r.prompt_tokens)
        engines = self.ready("decode")
        e = min(engines, key=lambda x: x.num_running + x.num_waiting)
        e.add(DReq(r.prompt_tokens, osl, arrival, next(self._seq)))

    def first_token(self, r: DReq) -> None:
        if r.max_tokens == 1:
            pass

    def finished(self, r: DReq, mean_itl: float | None) -> None:
        self.decoded += 1
        self.osl_hist.observe(r.max_tokens)
        self.stats.record(r.arrival, r.first_token - r.arrival, mean_itl, self.keep_samples)

    # ---- Prometheus view -------------------------------------------------------------
    def _series(self, engine) -> int:
        """The engine's own series identity (a pod's), never reused by a later engine."""
        if getattr(engine, "series_id", None) is None:
            engine.series_id = next(self._series_seq)
        return engine.series_id

    def scrape(self) -> dict:
        """One 15-s scrape: pool totals (counters) and per-pod gauges."""
        pre = [p.engine for p in self.pods["prefill"] if p.engine is not None] + \
              [p.engine for p in self.draining if p.role == "prefill"]
        dec = [p.engine for p in self.pods["decode"] if p.engine is not None] + \
              [p.engine for p in self.draining if p.role == "decode"]
        ttft = [x for x in self.dead_ttft.c]
        ttft_sum, ttft_cnt = self.dead_ttft.sum, self.dead_ttft.count
        prompt = self.dead_prompt
        prefill_sum, prefill_cnt = self.dead_prefill
        for e in pre:
            h = e.sink.ttft_hist
            ttft = [a + b for a, b in zip(ttft, h.c)]
            ttft_sum += h.sum
            ttft_cnt += h.count
            prompt += e.sink.prompt_total
            prefill_sum += e.sink.prefill_sum
            prefill_cnt += e.sink.prefill_count
        itl = list(self.dead_itl.c)
        itl_sum, itl_cnt = self.dead_itl.sum, self.dead_itl.count
        for e in dec:
            itl = [a + b for a, b in zip(itl, e.itl_hist.c)]
            itl_sum += e.itl_hist.sum
            itl_cnt += e.itl_hist.count
        ready_p = self.ready("prefill")
        ready_d = self.ready("decode")
        return {
            "t": self.clock.now(),
            "ttft": ttft, "ttft_sum": ttft_sum, "ttft_count": ttft_cnt, "prompt_tokens": prompt,
            "prefill_sum": prefill_sum, "prefill_count": prefill_cnt,
            "itl": itl, "itl_sum": itl_sum, "itl_count": itl_cnt,
            "waiting": {"prefill": [e.num_waiting for e in ready_p], "decode": [e.num_waiting for e in ready_d]},
            "running": {"prefill": [e.num_running for e in ready_p], "decode": [e.num_running for e in ready_d]},
            # the same gauge by pod, for per-pod functions over a window (min of avg_over_time)
            "waiting_by_pod": {"prefill": {self._series(e): e.num_waiting for e in ready_p},
                               "decode": {self._series(e): e.num_waiting for e in ready_d}},
            "kv_usage": {"prefill": [e.kv_usage for e in ready_p], "decode": [e.kv_usage for e in ready_d]},
            "gen_tokens": self.gen_tokens,
            "arrived": self.arrived, "arrived_prompt": self.arrived_prompt, "arrived_output": self.arrived_output,
            "decoded": self.decoded, "osl_hist": tuple(self.osl_hist.c),
            "isl_hist": tuple(self.isl_hist.c), "isl_bounds": tuple(self.isl_hist.bounds),
        }


def slowed(cost: CostModel, factor: float) -> CostModel:
    """``cost`` with every step-time term multiplied by ``factor`` (1.2: engines 20 % slower
    than the cost model, 0.8: 20 % faster); memory and transfers unchanged. The benchmark's
    stress traces give this to the simulated fleet only: the policies keep the cost model."""
    return cost.scaled(factor)


def _merge(a: PromHist, b: PromHist) -> PromHist:
    out = PromHist(a.bounds)
    out.c = [x + y for x, y in zip(a.c, b.c)]
    out.sum, out.count = a.sum + b.sum, a.count + b.count
    return out


@dataclass
class Scraper:
    """The last scrapes (every 15 s), and the PromQL the policies ask."""

    keep: int = 16
    scrapes: collections.deque = field(default_factory=collections.deque)

    def add(self, s: dict) -> None:
        self.scrapes.append(s)
        while len(self.scrapes) > self.keep:
            self.scrapes.popleft()

    @property
    def last(self) -> dict | None:
        return self.scrapes[-1] if self.scrapes else None

    def ago(self, seconds: float) -> dict | None:
        """The scrape ``seconds`` before the last one (or the oldest kept)."""
        if not self.scrapes:
            return None
        t = self.scrapes[-1]["t"] - seconds
        for s in self.scrapes:
            if s["t"] >= t - 1e-6:
                return s
        return self.scrapes[0]

    def quantile(self, key: str, q: float, window: float = 60.0) -> float | None:
        """histogram_quantile(q, sum(rate(key_bucket[window]))); 0.0 when idle; None without two scrapes."""
        s1, s0 = self.last, self.ago(window)
        if s1 is None or s0 is None or s0 is s1:
            return None
        delta = [a - b for a, b in zip(s1[key], s0[key])]
        if sum(delta) <= 0:
            return 0.0
        return histogram_quantile(q, TTFT_BUCKETS if key == "ttft" else ITL_BUCKETS, delta)

    def rate(self, key: str, window: float = 60.0) -> float | None:
        s1, s0 = self.last, self.ago(window)
        if s1 is None or s0 is None or s0 is s1:
            return None
        return (s1[key] - s0[key]) / (s1["t"] - s0["t"])

    def ratio(self, num: str, den: str, window: float = 60.0) -> float | None:
        """``rate(num[window]) / rate(den[window])`` (e.g. a histogram's sum / count: a mean); None when
        ``den`` did not move (PromQL's NaN)."""
        s1, s0 = self.last, self.ago(window)
        if s1 is None or s0 is None or s0 is s1:
            return None
        d = s1[den] - s0[den]
        return (s1[num] - s0[num]) / d if d > 0 else None

    def buckets(self, key: str, bounds, window: float = 60.0) -> list[tuple[float, float]] | None:
        """``sum by (le) (rate(key_bucket[window]))`` as cumulative (le, rate) pairs."""
        s1, s0 = self.last, self.ago(window)
        if s1 is None or s0 is None or s0 is s1:
            return None
        dt = s1["t"] - s0["t"]
        out, acc = [], 0.0
        for le, a, b in zip(list(bounds) + [float("inf")], s1[key], s0[key]):
            acc += (a - b) / dt
            out.append((float(le), acc))
        return out

    def gauge_sum_avg_over_time(self, key: str, role: str, window: float = 60.0) -> float | None:
        """``sum(avg_over_time(gauge{role}[window]))`` (pods summed, averaged over the window's scrapes)."""
        if not self.scrapes:
            return None
        t1 = self.scrapes[-1]["t"]
        per = [sum(s[key][role]) for s in self.scrapes if s["t"] > t1 - window + 1e-6]
        return sum(per) / len(per) if per else None

    def gauge_sum(self, key: str, role: str) -> float | None:
        """``sum(gauge{role})`` at the last scrape (None without a scrape)."""
        return float(sum(self.last[key][role])) if self.last else None

    def backlog(self, role: str, scrape: dict | None = None) -> float | None:
        """``sum(waiting{role}) + sum(running{role})`` at a scrape (default: the last)."""
        s = self.last if scrape is None else scrape
        return float(sum(s["waiting"][role]) + sum(s["running"][role])) if s else None

    def backlog_growth(self, role: str, window: float = 60.0) -> float | None:
        """``(backlog - backlog offset window) / window`` (promql.backlog_queries); None without a
        scrape a window before the last (no sample there: no series)."""
        s1 = self.last
        if s1 is None:
            return None
        s0 = next((s for s in reversed(self.scrapes) if s["t"] <= s1["t"] - window + 1e-6), None)
        return None if s0 is None else (self.backlog(role) - self.backlog(role, s0)) / window

    def min_pod_avg_over_time(self, role: str, key: str = "waiting_by_pod", window: float = 60.0) -> float | None:
        """``min(avg_over_time(gauge{role}[window]))``: each pod's average over the scrapes of the
        window it appears in, the least of them (promql.waiting_min_query); None without a pod."""
        if not self.scrapes:
            return None
        t1 = self.scrapes[-1]["t"]
        per_pod: dict[int, list[float]] = {}
        for s in self.scrapes:
            if s["t"] > t1 - window + 1e-6:
                for pod, v in s[key][role].items():
                    per_pod.setdefault(pod, []).append(v)
        return min(sum(v) / len(v) for v in per_pod.values()) if per_pod else None

    def gauge_avg_over_time(self, key: str, role: str, window: float = 60.0) -> float | None:
        """``avg(avg_over_time(gauge{role}[window]))``: the pods' average over the scrapes of the
        window (the left end excluded, as Prometheus' range selectors do); None without a pod."""
        if not self.scrapes:
            return None
        t1 = self.scrapes[-1]["t"]
        per_scrape = [sum(s[key][role]) / len(s[key][role]) for s in self.scrapes
                      if s["t"] > t1 - window + 1e-6 and s[key][role]]
        return sum(per_scrape) / len(per_scrape) if per_scrape else None
