"""Autoscaling policies on the simulated fleet: pd-operator's own code path
(:class:`PdOperator`, through :func:`~pd_operator.autoscale.plan.plan_service`)
and the baselines (static, HPA on queue depth, a Dynamo-style planner, the
clairvoyant schedule). Each sees the fleet as Prometheus would
(:class:`~.fleet.Scraper`)."""

from __future__ import annotations

import math

from pd_operator.api.constants import ROLES
from pd_operator.api.models import PDInferenceService, duration_seconds
from pd_operator.autoscale.decide import Change, Event, History, PoolState, apply_behavior
from pd_operator.autoscale.plan import PoolInput, plan_service
from pd_operator.autoscale.promql import Observation
from pd_operator.perfmodel.costmodel import LINKS, CostModel

from ..enginesim.clock import VirtualClock
from ..enginesim.engine import Engine, SimRequest
from pd_operator.autoscale.capacity import length_bias

from .fleet import ITL_SLO, OSL_BUCKETS, TTFT_BUCKETS, BenchFleet, Scraper
from .reference import BUDGET, INTERVAL, MAX_PER_POOL, START_DELAY, reference_service


def observe(prom: Scraper, role: str, quantile: float, decode_demand: str = "tokens",
            secondaries=("queueDepth", "kvCacheUsage")) -> Observation:
    """What the operator's queries (``autoscale/promql.py``, window 1 min) return for one pool,
    from the scrapes: the pool's latency quantile (0 when idle); demand (prefill: prompt
    tokens/s; decode: generated tokens/s); the mean ISL (prompt tokens / prefill requests)
    and OSL (generated tokens / requests finished on decode), None when idle; and the
    secondary signals in ``secondaries`` (per-replica waiting requests ``queue`` and KV-cache
    usage ``kv_usage``, averaged over the pods and the window), None otherwise.
    ``decode_demand`` = ``running`` / ``running+waiting``: the benchmark's historical variants."""
    observed = prom.quantile("ttft" if role == "prefill" else "itl", quantile)
    if role == "prefill":
        demand = prom.rate("prompt_tokens")
    elif decode_demand == "tokens":
        demand = prom.rate("gen_tokens")
    else:
        demand = prom.gauge_sum("running", "decode")
        if decode_demand == "running+waiting":
            demand += prom.gauge_sum("waiting", "decode")
    bias = prompts = latencies = None
    if role == "decode":
        hist = prom.buckets("osl_hist", OSL_BUCKETS)
        bias = length_bias(hist) if hist else None
    elif prom.last is not None:
        prompts = prom.buckets("isl_hist", prom.last["isl_bounds"])
        latencies = prom.buckets("ttft", TTFT_BUCKETS)
    return Observation(observed, demand,
                       mean_isl=prom.ratio("prompt_tokens", "ttft_count"),
                       mean_osl=prom.ratio("gen_tokens", "decoded"),
                       waiting_total=prom.gauge_sum_avg_over_time("waiting", role),
                       running_total=prom.gauge_sum_avg_over_time("running", role),
                       waiting_min=prom.min_pod_avg_over_time(role),
                       osl_bias=bias,
                       mean_itl=prom.ratio("itl_sum", "itl_count") if role == "decode" else None,
                       mean_prefill_time=prom.ratio("prefill_sum", "prefill_count") if role == "prefill" else None,
                       backlog_now=prom.backlog(role) if role == "prefill" else None,
                       backlog_growth=prom.backlog_growth(role) if role == "prefill" else None,
                       prompt_buckets=tuple(prompts) if prompts else None,
                       latency_buckets=tuple(latencies) if latencies else None,
                       queue=prom.gauge_avg_over_time("waiting", role) if "queueDepth" in secondaries else None,
                       kv_usage=prom.gauge_avg_over_time("kv_usage", role) if "kvCacheUsage" in secondaries else None)


class Policy:
    name = "policy"
    interval = INTERVAL

    def initial(self) -> dict:
        raise NotImplementedError

    def tick(self, now: float, fleet: BenchFleet, prom: Scraper) -> dict | None:
        return None


class Static(Policy):
    def __init__(self, name: str, p: int, d: int):
        self.name, self.p, self.d = name, p, d

    def initial(self) -> dict:
        return {"prefill": self.p, "decode": self.d}


class Scheduled(Policy):
    """The oracle: replicas per minute known in advance; pods ordered ``START_DELAY`` early."""

    name = "oracle"

    def __init__(self, need: dict[str, list[int]], lead: float = START_DELAY + INTERVAL):
        self.need, self.lead = need, lead

    def at(self, role: str, t: float) -> int:
        n = self.need[role]
        return n[min(len(n) - 1, max(0, int(t // 60)))]

    def initial(self) -> dict:
        return {r: max(self.at(r, t) for t in range(0, int(self.lead) + 60, 30)) for r in self.need}

    def tick(self, now, fleet, prom):
        return {r: max(self.at(r, now + s) for s in range(0, int(self.lead) + 1, 15)) for r in self.need}


class PdOperator(Policy):
    """pd-operator's policy: the operator's own code path, ``plan_service(svc, inputs, histories, now)``
    every ``spec.autoscaling.interval``, on what Prometheus would return (:func:`observe`).

    ``capacity`` (role -> one replica's capacity in the unit of the demand, or None) goes into
    ``PoolInput.capacity``; None leaves it to ``plan_service`` (the operator's estimate from the
    service's model and TP and the observed mean ISL/OSL).  Pools whose autoscaling is off keep
    their size.  Warm start: the histories hold the initial sizes, as if the autoscaler had been
    holding them."""

    name = "pd-operator"

    def __init__(self, init: dict, capacity: dict | None = None, decode_demand: str = "tokens",
                 name: str = "pd-operator", svc: PDInferenceService | None = None):
        self.init, self.name = init, name
        self.svc = svc or reference_service()
        self.decode_demand = decode_demand
        self.capacity = capacity or {}
        self.interval = duration_seconds(self.svc.spec.autoscaling.interval)
        self.hist = {r: History(recommendations=[Event(0.0, init[r])]) for r in ROLES}
        self.last_reasons: dict = {}
        self.reasons: list = []  # (t, role, reason) of every resize

    def initial(self):
        return dict(self.init)

    def pool(self, role: str):
        return self.svc.spec.pool(role)

    def tick(self, now, fleet, prom):
        last = prom.last
        if last is None:
            return None
        inputs = {}
        for role in ROLES:
            pool = self.pool(role)
            state = PoolState(replicas=fleet.replicas(role), ready=len(fleet.ready(role)), starting=fleet.starting(role))
            obs = None
            if pool.autoscaling.enabled:  # as the operator: only the secondary signals the pool asks for
                obs = observe(prom, role, pool.autoscaling.target.quantile, self.decode_demand,
                              pool.autoscaling.secondary_metrics())
            inputs[role] = PoolInput(state, obs, last["t"], capacity=self.capacity.get(role))
        decisions = plan_service(self.svc, inputs, self.hist, now)
        self.last_reasons = {r: d.reason for r, d in decisions.items()}
        for r, d in decisions.items():
            if d.replicas != inputs[r].state.replicas:
                self.reasons.append((now, r, d.reason))
        return {r: d.replicas for r, d in decisions.items()}


class HPA(Policy):
    """Kubernetes HPA v2 on vllm:num_requests_waiting (Pods metric, average target 5), per pool.

    replica_calculator (custom metric, plain): pods with metrics = Ready pods
    (starting pods serve no /metrics yet: "missing"); usageRatio = mean / target;
    with no missing pods: within tolerance -> current, else ceil(ratio * ready);
    with missing pods: they count as 0 (ratio > 1) or as the target (ratio < 1),
    the ratio is recomputed, and a change of direction or a result inside the
    tolerance keeps the current size.  Then HPA's default behaviour, the
    operator's own implementation (:func:`~pd_operator.autoscale.decide.apply_behavior`:
    up no window, max(100 %, 4 pods) per 15 s; down 300 s window, 100 % per 15 s), min/max."""

    name = "hpa"

    def __init__(self, init: dict, target: float = 5.0, tolerance: float = 0.1):
        self.init, self.target, self.tol = init, target, tolerance
        self.hist = {r: History(recommendations=[Event(0.0, init[r])]) for r in ROLES}  # warm start

    def initial(self):
        return dict(self.init)

    def _calc(self, current: int, values: list[float], missing: int) -> int:
        if not values:
            return current
        ready = len(values)
        ratio = sum(values) / ready / self.target
        if missing == 0:
            if abs(1 - ratio) <= self.tol:
                return current
            return math.ceil(ratio * ready)
        fill = self.target if ratio < 1 else 0.0
        vals = values + [fill] * missing
        new_ratio = sum(vals) / len(vals) / self.target
        if abs(1 - new_ratio) <= self.tol or (ratio < 1 < new_ratio) or (ratio > 1 > new_ratio):
            return current
        n = math.ceil(new_ratio * len(vals))
        if (new_ratio < 1 and n > current) or (new_ratio > 1 and n < current):
            return current
        return n

    def tick(self, now, fleet, prom):
        last = prom.last
        if last is None:
            return None
        out = {}
        for role in ROLES:
            current = fleet.replicas(role)
            vals = [float(v) for v in last["waiting"][role]]
            rec = max(1, min(MAX_PER_POOL, self._calc(current, vals, fleet.starting(role))))
            desired, _ = apply_behavior(rec, current, self.hist[role], now)
            desired = max(1, min(MAX_PER_POOL, desired))
            if desired != current:
                self.hist[role].changes.append(Change(now, current, desired))
            self.hist[role].prune(now, 300)
            out[role] = desired
        return out


DYNAMO_HEADROOM = {"prefill": 0.8, "decode": 0.85}  # the same headroom pd-operator's capacity carries


def dynamo_profile(cost: CostModel, itl_target: float = ITL_SLO, max_num_seqs: int = 256,
                   headroom: dict | None = None, decode_headroom_on: str = "throughput"):
    """Profile the simulated engine as Dynamo's profiler does a real one.

    prefill: one request of ISL tokens on an idle prefill instance -> TTFT;
    throughput/GPU = ISL / TTFT.  decode: B requests of context ctx on a decode
    instance -> ITL; the largest B (<= max_num_seqs, and <= what the KV cache holds at
    that context) with ITL <= target gives throughput/GPU = B / ITL.  Both measured on
    :class:`~pd_operator_tools.enginesim.engine.Engine` with ``cost`` (the fleet's true
    engines: Dynamo profiles the hardware it runs on), then multiplied by ``headroom``
    (default: pd-operator's 0.8 / 0.85, so both policies load a replica alike).
    ``decode_headroom_on="batch"``: decode's headroom taken on the batch instead,
    ``h / ITL(h)`` at ``h = 0.85 B`` (what pd-operator's rule 3e does on a steady demand;
    the baseline ``dynamo-batch``, Dynamo's planner having no steady/rising distinction)."""
    head = headroom or DYNAMO_HEADROOM
    kv = cost.kv_capacity_tokens()

    def ttft(isl: int) -> float:
        clk = VirtualClock()
        e = Engine(clk, cost, "prefill")
        r = e.add(SimRequest(isl, 1, prefill_only=True))
        clk.run()
        return r.ttft

    def itl(b: int, ctx: int) -> float:
        clk = VirtualClock()
        e = Engine(clk, cost, "decode", max_num_seqs=max(b, 1), link=LINKS["rdma"])
        rs = [e.add(SimRequest(ctx, 3, kv_transfer=True)) for _ in range(b)]
        clk.run()
        return sum(sum(r.itls) / len(r.itls) for r in rs) / b

    isls = [256, 512, 1024, 2048, 4096, 8192]
    pre = [(i, head["prefill"] * i / ttft(i)) for i in isls]
    ctxs = [500, 1000, 2000, 3000, 4000, 6000, 8000]
    dec = []
    for c in ctxs:
        lo, hi = 1, max(1, min(max_num_seqs, kv // (c + 3)))
        if itl(hi, c) <= itl_target:
            lo = hi
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if itl(mid, c) <= itl_target:
                    lo = mid
                else:
                    hi = mid
        if decode_headroom_on == "batch":
            b = max(1, int(head["decode"] * lo))
            dec.append((c, b / itl(b, c)))
        else:
            dec.append((c, head["decode"] * lo / itl(lo, c)))
    return pre, dec, {i: ttft(i) for i in isls}


class Arima110:
    """ARIMA(1,1,0) one-step forecast: x' = x_t + phi (x_t - x_{t-1}), phi fitted by least
    squares on the last ``keep`` differences (clipped to [-1, 1]); the last value until
    three observations exist. Dynamo's planner offers constant, ARIMA and Prophet load
    predictors; ARIMA is the one the issue names as its default (its ``auto_arima`` order
    selection is not reproduced here: this is the smallest ARIMA with a trend)."""

    def __init__(self, keep: int = 20):
        self.xs: list[float] = []
        self.keep = keep

    def add(self, x: float) -> None:
        self.xs.append(x)
        self.xs = self.xs[-(self.keep + 1):]

    def predict(self) -> float:
        xs = self.xs
        if len(xs) < 3:
            return xs[-1] if xs else 0.0
        d = [b - a for a, b in zip(xs, xs[1:])]
        num = sum(a * b for a, b in zip(d, d[1:]))
        den = sum(a * a for a in d[:-1])
        phi = max(-1.0, min(1.0, num / den)) if den > 0 else 0.0
        return max(0.0, xs[-1] + phi * d[-1])


def _interp(table, x):
    if x <= table[0][0]:
        return table[0][1]
    for (x0, y0), (x1, y1) in zip(table, table[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return table[-1][1]


class Dynamo(Policy):
    """Dynamo-style SLA planner (throughput-based), every 180 s, ARIMA(1,1,0) predictor of the
    request count, mean ISL and mean OSL (:class:`Arima110`), profile with pd-operator's headroom:
    prefill = ceil(req*ISL/interval * min(1, ttft_obs/ttft_expected) / prefill_thpt_per_gpu(ISL)),
    decode  = ceil(req*OSL/interval / decode_thpt_per_gpu(ctx = ISL + OSL/2) at the ITL target),
    min 1, scaled down proportionally to the GPU budget."""

    name = "dynamo"
    interval = 180.0

    def __init__(self, init: dict, profile):
        self.init = init
        self.pre, self.dec, self.ttft_exp = profile
        self.prev = None
        self.pred = {k: Arima110() for k in ("req", "isl", "osl")}

    def initial(self):
        return dict(self.init)

    def tick(self, now, fleet, prom):
        last = prom.last
        if last is None:
            return None
        prev, self.prev = self.prev, last
        if prev is None:
            return None
        dt = last["t"] - prev["t"]
        req = last["arrived"] - prev["arrived"]
        if req <= 0 or dt <= 0:
            return None
        isl = (last["arrived_prompt"] - prev["arrived_prompt"]) / req
        osl = (last["arrived_output"] - prev["arrived_output"]) / req
        n_t = last["ttft_count"] - prev["ttft_count"]
        ttft_obs = (last["ttft_sum"] - prev["ttft_sum"]) / n_t if n_t > 0 else 0.0
        ttft_exp = _interp(sorted(self.ttft_exp.items()), isl)
        corr = min(1.0, ttft_obs / ttft_exp) if ttft_exp > 0 else 1.0
        for k, v in (("req", req), ("isl", isl), ("osl", osl)):
            self.pred[k].add(v)
        req, isl, osl = (self.pred[k].predict() for k in ("req", "isl", "osl"))
        isl, osl = max(isl, 1.0), max(osl, 1.0)
        p = math.ceil(req * isl / dt * corr / _interp(self.pre, isl))
        d = math.ceil(req * osl / dt / _interp(self.dec, isl + osl / 2))
        p, d = max(1, p), max(1, d)
        if p + d > BUDGET:
            s = BUDGET / (p + d)
            p, d = max(1, int(p * s)), max(1, int(d * s))
        return {"prefill": p, "decode": d}


def make_policy(name: str, init, peak, mean, cap_p, cap_d, prof, cap_d_tok=None, prof_batch=None) -> Policy:
    if name == "pd-operator":  # as shipped: the operator's own capacity estimate and signals (plan_service)
        return PdOperator(init, None)
    if name == "pd-operator-given":  # capacity given from the trace's parameters (the first benchmark's setting)
        return PdOperator(init, {"prefill": cap_p, "decode": cap_d_tok}, name=name)
    if name == "pd-operator-streams":  # the first version: decode demand = running streams
        return PdOperator(init, {"prefill": cap_p, "decode": cap_d}, decode_demand="running", name=name)
    if name == "pd-operator-waiting":  # decode demand = running + waiting (not what promql.demand_query sends)
        return PdOperator(init, {"prefill": cap_p, "decode": cap_d}, decode_demand="running+waiting", name=name)
    if name == "pd-operator-tokens":  # decode demand = generation tokens/s, capacity tokens/s per replica
        return PdOperator(init, {"prefill": cap_p, "decode": cap_d_tok}, name=name)
    if name == "pd-operator-estimated":  # capacity left to plan_service's own estimate (PoolInput.capacity None)
        return PdOperator(init, None, name=name)
    if name == "static-peak":
        return Static(name, peak["prefill"], peak["decode"])
    if name == "static-mean":
        return Static(name, mean["prefill"], mean["decode"])
    if name == "hpa":
        return HPA(init)
    if name == "dynamo":
        return Dynamo(init, prof)
    if name == "dynamo-batch":  # decode's headroom on the batch (dynamo_profile(decode_headroom_on="batch"))
        pol = Dynamo(init, prof_batch)
        pol.name = name
        return pol
    raise ValueError(f"unknown policy {name!r}")
