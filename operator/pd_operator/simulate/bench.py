"""``pdctl autoscale-bench``: autoscaling quality on a reference trace, against baselines.

Deterministic and accelerated (virtual time).  Every policy runs on the same
trace (same arrivals, same lengths), the same simulated PD fleet
(:mod:`.fleet`: H200 cost model, TP 1, RDMA 50 GB/s + 1 ms), the same pod
start delay (120 s), the same control interval (30 s) and sees the fleet as
Prometheus would (15-s scrapes, quantiles of a 1-minute rate window).
pd-operator's policy is the operator's own code path: a PDInferenceService
and :func:`~pd_operator.autoscale.plan.plan_service`.
Method, definitions and results: tests/benchmarks/README.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, replace

from ..api import validate_service
from ..api.models import PDInferenceService, duration_seconds
from ..autoscale.capacity import decode_mean_context, decode_streams, decode_tokens_per_s, prefill_tokens_per_s
from ..autoscale.decide import Event, History, PoolState
from ..autoscale.plan import ROLES, PoolInput, plan_service
from ..autoscale.promql import Observation
from ..sim.clock import VirtualClock
from ..sim.costmodel import LINKS, CostModel
from ..sim.engine import Engine, SimRequest
from .fleet import ITL_SLO, TTFT_SLO, BenchFleet, Scraper
from .trace import TRACES, Trace

SCRAPE = 15.0
INTERVAL = 30.0
START_DELAY = 120.0
MAX_PER_POOL = 32
BUDGET = 48  # GPUs, for every policy that has a budget


def reference_manifest(max_per_pool: int = MAX_PER_POOL, budget: int = BUDGET) -> dict:
    """The benchmark's service as a PDInferenceService manifest: Qwen3-8B on H200, TP 1, both
    pools autoscaled with the default targets and behaviour (p99 TTFT 1 s, p99 ITL 50 ms,
    tolerance 0.1, HPA's defaults), min 1, max ``max_per_pool``, ``maxTotalGPUs`` =
    ``budget``, interval 30 s."""
    pool = {"tensorParallelSize": 1, "gpuProduct": "NVIDIA-H200",
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": max_per_pool}}
    return {
        "apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService",
        "metadata": {"name": "autoscale-bench", "namespace": "bench"},
        "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "engine": {"kind": "vllm"},
                 "prefill": json.loads(json.dumps(pool)), "decode": json.loads(json.dumps(pool)),
                 "autoscaling": {"prometheus": {"url": "http://prometheus.monitoring.svc:9090"},
                                 "interval": f"{INTERVAL:g}s", "maxTotalGPUs": budget}},
    }


def reference_service(max_per_pool: int = MAX_PER_POOL, budget: int = BUDGET) -> PDInferenceService:
    """:func:`reference_manifest`, validated as the operator does."""
    return validate_service(reference_manifest(max_per_pool, budget))


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
    return Observation(observed, demand,
                       mean_isl=prom.ratio("prompt_tokens", "ttft_count"),
                       mean_osl=prom.ratio("gen_tokens", "decoded"),
                       queue=prom.gauge_avg_over_time("waiting", role) if "queueDepth" in secondaries else None,
                       kv_usage=prom.gauge_avg_over_time("kv_usage", role) if "kvCacheUsage" in secondaries else None)


# --------------------------------------------------------------------------- policies
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
    tolerance keeps the current size.  Then the behaviour: stabilization
    (up 0 s: min of recommendations in window; down 300 s: max), rate limits
    (up: max(100 %, 4 pods) per 15 s; down: 100 % per 15 s), min/max."""

    name = "hpa"

    def __init__(self, init: dict, target: float = 5.0, tolerance: float = 0.1):
        self.init, self.target, self.tol = init, target, tolerance
        self.recs = {r: [(0.0, init[r])] for r in ("prefill", "decode")}  # (t, replicas); warm start
        self.changes = {"prefill": [], "decode": []}   # (t, before, after)

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
        for role in ("prefill", "decode"):
            current = fleet.replicas(role)
            vals = [float(v) for v in last["waiting"][role]]
            rec = max(1, min(MAX_PER_POOL, self._calc(current, vals, fleet.starting(role))))
            recs = self.recs[role]
            recs.append((now, rec))
            recs[:] = [x for x in recs if now - x[0] <= 300]
            up = min(r for t, r in recs if now - t <= 0)
            down = max(r for t, r in recs if now - t <= 300)
            desired = current
            if current < up:
                desired = up
            elif current > down:
                desired = down
            ch = [c for c in self.changes[role] if now - c[0] < 15]
            if desired > current:
                start = current - sum(max(0, a - b) for _, b, a in ch)
                desired = min(desired, max(start * 2, start + 4))
            elif desired < current:
                start = current + sum(max(0, b - a) for _, b, a in ch)
                desired = max(desired, 0)
            desired = max(1, min(MAX_PER_POOL, desired))
            if desired != current:
                self.changes[role].append((now, current, desired))
                self.changes[role][:] = [c for c in self.changes[role] if now - c[0] < 60]
            out[role] = desired
        return out


def dynamo_profile(cost: CostModel, itl_target: float = ITL_SLO, max_num_seqs: int = 256):
    """Profile the simulated engine as Dynamo's profiler does a real one.

    prefill: one request of ISL tokens on an idle prefill instance -> TTFT;
    throughput/GPU = ISL / TTFT.  decode: B requests of context ctx on a decode
    instance -> ITL; the largest B (<= max_num_seqs) with ITL <= target gives
    throughput/GPU = B / ITL.  Both measured on :class:`~pd_operator.sim.engine.Engine`."""
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
    pre = [(i, i / ttft(i)) for i in isls]
    ctxs = [500, 1000, 2000, 3000, 4000, 6000, 8000]
    dec = []
    for c in ctxs:
        lo, hi = 1, max_num_seqs
        if itl(hi, c) <= itl_target:
            lo = hi
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if itl(mid, c) <= itl_target:
                    lo = mid
                else:
                    hi = mid
        dec.append((c, lo / itl(lo, c)))
    return pre, dec, {i: ttft(i) for i in isls}


def _interp(table, x):
    if x <= table[0][0]:
        return table[0][1]
    for (x0, y0), (x1, y1) in zip(table, table[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return table[-1][1]


class Dynamo(Policy):
    """Dynamo-style SLA planner (throughput-based), every 180 s, constant (last-value) predictor:
    prefill = ceil(req*ISL/interval * min(1, ttft_obs/ttft_expected) / prefill_thpt_per_gpu(ISL)),
    decode  = ceil(req*OSL/interval / decode_thpt_per_gpu(ctx = ISL + OSL/2) at the ITL target),
    min 1, scaled down proportionally to the GPU budget."""

    name = "dynamo"
    interval = 180.0

    def __init__(self, init: dict, profile):
        self.init = init
        self.pre, self.dec, self.ttft_exp = profile
        self.prev = None

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
        # predictor: constant (next interval = last interval)
        p = math.ceil(req * isl / dt * corr / _interp(self.pre, isl))
        d = math.ceil(req * osl / dt / _interp(self.dec, isl + osl / 2))
        p, d = max(1, p), max(1, d)
        if p + d > BUDGET:
            s = BUDGET / (p + d)
            p, d = max(1, int(p * s)), max(1, int(d * s))
        return {"prefill": p, "decode": d}


# --------------------------------------------------------------------------- runner
@dataclass
class Result:
    name: str
    goodput: float
    ttft_p99: float
    itl_p99: float
    itl_req_p99: float
    gpu_hours: float
    goodput_per_gpu_hour: float
    actions: int
    requests: int
    timeline: dict
    per_min: dict
    wall_s: float
    ratio: float = float("nan")


def run_policy(trace: Trace, policy: Policy, cost: CostModel | None = None, keep_samples: bool = False,
               progress=None, start_delay: float = START_DELAY, fleet_kw: dict | None = None) -> Result:
    """Run ``policy`` on ``trace`` (a :class:`Trace` or a recorded one) and measure it.
    ``fleet_kw``: more :class:`~.fleet.BenchFleet` settings (per-pool cost models and limits,
    GPUs per replica, the SLO)."""
    t_wall = time.time()
    fleet = BenchFleet(cost=cost, start_delay=start_delay, keep_samples=keep_samples, **(fleet_kw or {}))
    init = policy.initial()
    for role, n in init.items():
        fleet.scale_to(role, n, ready_now=True)
    fleet.actions = {"prefill": 0, "decode": 0}
    prom = Scraper()
    clock = fleet.clock
    end = trace.duration
    timeline = {"t": [], "prefill": [], "decode": [], "rate": []}
    nxt_scrape, nxt_tick = 0.0, policy.interval
    arr = trace.arrivals()
    pending = next(arr, None)
    horizon = 0.0
    while True:
        horizon = min(nxt_scrape, nxt_tick)
        if horizon > end:
            break
        # feed arrivals up to the horizon, then run the clock to it
        while pending is not None and pending[0] <= horizon:
            clock.call_at(pending[0], fleet.submit, pending[1], pending[2])
            pending = next(arr, None)
        clock.run(until=horizon)
        if horizon == nxt_scrape:
            prom.add(fleet.scrape())
            fleet.account()
            timeline["t"].append(horizon)
            timeline["prefill"].append(fleet.replicas("prefill"))
            timeline["decode"].append(fleet.replicas("decode"))
            timeline["rate"].append(trace.rate(horizon))
            nxt_scrape += SCRAPE
        if horizon == nxt_tick:
            want = policy.tick(horizon, fleet, prom)
            if want:
                for role, n in want.items():
                    fleet.scale_to(role, max(1, int(n)))
            nxt_tick += policy.interval
            if progress and int(horizon) % 3600 == 0:
                progress(policy.name, horizon)
    # the trace ends: let in-flight requests finish at the last sizes (no new arrivals)
    clock.run()
    fleet.finish()
    st = fleet.stats
    n = st.n
    gpu_h = fleet.gpu_seconds / 3600
    good = st.good / n if n else float("nan")
    return Result(policy.name, good, st.ttft.quantile(0.99), st.itl_tok.quantile(0.99), st.itl_req.quantile(0.99),
                  gpu_h, (st.good / gpu_h) if gpu_h else float("nan"), sum(fleet.actions.values()), n,
                  timeline, {k: v for k, v in sorted(st.per_min.items())}, time.time() - t_wall)


# --------------------------------------------------------------------------- oracle
def future_load(trace: Trace, itl_est: float = 0.035) -> tuple[list[float], list[float]]:
    """Per minute: prompt tokens/s arriving, and the peak decode streams (known in advance)."""
    mins = int(math.ceil(trace.duration / 60)) + 1
    tok = [0.0] * mins
    secs = int(trace.duration) + 4200
    diff = [0] * (secs + 1)
    for t, isl, osl in trace.arrivals():
        tok[int(t // 60)] += isl / 60
        s, e = int(t), int(t + osl * itl_est) + 1
        diff[s] += 1
        diff[min(e, secs)] -= 1
    streams = [0.0] * mins
    cur = 0
    for s in range(secs):
        cur += diff[s]
        m = s // 60
        if m < mins and cur > streams[m]:
            streams[m] = cur
    return tok, streams


def oracle_need(trace: Trace, cost: CostModel, u_p: float, u_d: float, load=None) -> dict:
    tok, streams = load or future_load(trace)
    cp = prefill_tokens_per_s(cost, trace.isl.mean, utilization=u_p)
    cd = decode_streams(cost, decode_mean_context(trace.isl.mean, trace.osl.mean, trace.osl.spread), utilization=u_d)
    p = [max(1, math.ceil(x / cp)) for x in tok]
    d = [max(1, math.ceil(x / cd)) for x in streams]
    # a minute's size must also cover the next minute's first seconds
    p = [max(p[i], p[i + 1] if i + 1 < len(p) else 0) for i in range(len(p))]
    d = [max(d[i], d[i + 1] if i + 1 < len(d) else 0) for i in range(len(d))]
    return {"prefill": p, "decode": d}


def search_window(trace: Trace, hours: float = 3.5) -> Trace:
    """The busiest ``hours`` of the trace (from 1 h before its peak), where the search is done."""
    if trace.hours <= hours:
        return trace
    step = 60.0
    n = int(trace.duration / step)
    t_peak = max(range(n), key=lambda i: (trace.rate(i * step), -i)) * step
    t0 = max(0.0, min(t_peak - 3600 / trace.speed, trace.duration - hours * 3600 / trace.speed))
    return replace(trace, start_h=trace.hour_at(t0), hours=hours)


U_DECODE = (1.4, 1.3, 1.2, 1.1, 1.0, 0.9, 0.8, 0.7)
U_PREFILL = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6)


def find_oracle(trace: Trace, cost: CostModel, goal: float = 0.99, log=print) -> tuple[Result, dict, list]:
    """Clairvoyant schedule, found by search with the simulator (tests/benchmarks/README.md).

    The oracle knows every future arrival: per minute, the prompt tokens/s and the
    peak number of concurrent decode streams.  Its replicas for a minute are
    ``ceil(load / (u x per-replica capacity))`` (max with the next minute), pods
    ordered ``START_DELAY + INTERVAL`` ahead so they are Ready in time (and paid
    for from the order).  The two utilizations ``(u_prefill, u_decode)`` are
    searched by bisection on the busiest 3.5 h of the trace -- the highest
    (cheapest) that keeps goodput >= ``goal`` overall and >= goal - 0.05 in
    every minute with 20+ requests -- decode first (prefill generous), then
    prefill; then the schedule is run on the whole trace (stepping both
    down if it fails there)."""
    tried = []

    def attempt(tr, up, ud):
        need = oracle_need(tr, cost, up, ud)
        r = run_policy(tr, Scheduled(need), cost)
        tried.append({"window": [tr.start_h, tr.hours], "u_prefill": up, "u_decode": ud, "goodput": r.goodput,
                      "gpu_hours": r.gpu_hours, "ok": ok(r)})
        log(f"  oracle search {tr.start_h:.2f}h+{tr.hours:g}h u_p={up:.2f} u_d={ud:.2f}: goodput {r.goodput:.4f}, "
            f"{r.gpu_hours:.1f} GPU-h, {'ok' if ok(r) else 'fails'} ({r.wall_s:.0f}s)")
        return r, need

    def ok(r):
        worst = min((g / n for n, g in r.per_min.values() if n >= 20), default=1.0)
        return r.goodput >= goal and worst >= goal - 0.05

    def bisect(grid, run):
        """Index of the first grid value (highest u) that passes; grid sorted high -> low."""
        lo, hi = 0, len(grid) - 1   # answer in [lo, hi]; hi assumed to pass
        while lo < hi:
            mid = (lo + hi) // 2
            if run(grid[mid]):
                hi = mid
            else:
                lo = mid + 1
        return grid[lo]

    win = search_window(trace)
    ud = bisect(U_DECODE, lambda u: ok(attempt(win, U_PREFILL[-1], u)[0]))
    up = bisect(U_PREFILL, lambda u: ok(attempt(win, u, ud)[0]))
    for k in range(4):
        r, need = attempt(trace, up, ud)
        if r.goodput >= goal or win is trace:  # the whole trace: overall goal (the per-minute one was the window's)
            break
        up, ud = max(0.5, up - 0.05), max(0.5, ud - 0.1)
    return r, need, tried


# --------------------------------------------------------------------------- report
COLUMNS = ("goodput", "ttft_p99", "itl_p99", "gpu_hours", "goodput_per_gpu_hour", "actions", "ratio")


def table_md(results: list[Result]) -> str:
    lines = ["| policy | goodput | TTFT p99 (s) | ITL p99 (ms, per token) | mean-ITL p99 (ms, per request) | GPU-hours | "
             "good requests per GPU-hour | scaling actions | GPU-hours / oracle |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.name} | {r.goodput:.4f} | {r.ttft_p99:.3f} | {r.itl_p99 * 1e3:.1f} | {r.itl_req_p99 * 1e3:.1f} | "
                     f"{r.gpu_hours:.1f} | {r.goodput_per_gpu_hour:.0f} | {r.actions} | {r.ratio:.3f} |")
    return "\n".join(lines)


def write_png(path: str, trace: Trace, results: list[Result], title: str = "AUTOSCALING BENCHMARK") -> None:
    from ..bench.plot import BLACK, GREY, Canvas

    colors = {"oracle": (0, 0, 0), "pd-operator": (31, 119, 180), "hpa": (214, 39, 40), "dynamo": (44, 160, 44),
              "static-peak": (148, 103, 189), "static-mean": (255, 127, 14)}
    extra = [(23, 190, 207), (140, 86, 75), (227, 119, 194), (127, 127, 127)]
    for r in results:
        if r.name not in colors:
            colors[r.name] = extra[len([n for n in colors if n not in ("oracle", "pd-operator", "hpa", "dynamo", "static-peak", "static-mean")]) % len(extra)]
    W, left, right = 1200, 70, 1180
    panels = [("REQUEST RATE (REQ/S)", 120), ("PREFILL REPLICAS", 140), ("DECODE REPLICAS", 140),
              ("SLO ATTAINMENT PER MINUTE (0.8-1)", 160)]
    H = 60 + sum(h + 60 for _, h in panels) + 40
    cv = Canvas(W, H)
    t_max = trace.duration

    def X(t):
        return left + int(t / t_max * (right - left))

    def axes(top, h, title, y_lo, y_hi):
        cv.text(left, top - 18, title)
        cv.vline(left, top, top + h, BLACK)
        cv.hline(left, right, top + h, BLACK)
        for k in range(5):
            v = y_lo + (y_hi - y_lo) * k / 4
            y = top + h - int((v - y_lo) / (y_hi - y_lo) * h)
            cv.hline(left + 1, right, y, GREY, dash=4)
            cv.text(5, y - 5, f"{v:.0f}" if y_hi - y_lo >= 4 else f"{v:.2f}")
        hours = trace.hours
        step = 2 if hours > 6 else (0.5 if hours > 1 else 0.25)
        k = 0.0
        while k <= hours + 1e-9:
            x = X(k * 3600 / trace.speed)
            cv.vline(x, top + h, top + h + 4, BLACK)
            h_of_day = (trace.start_h + k) % 24
            cv.text(x - 12, top + h + 8, f"{int(h_of_day):02d}:{int(round((h_of_day % 1) * 60)) % 60:02d}")
            k += step

    def line(top, h, y_lo, y_hi, pts, c, off=0):
        prev = None
        for t, v in pts:
            x = X(t)
            y = top + h - int((min(max(v, y_lo), y_hi) - y_lo) / (y_hi - y_lo) * h) + off
            if prev:
                px, py = prev
                cv.hline(min(px, x), max(px, x), py, c)
                cv.vline(x, min(py, y), max(py, y), c)
            prev = (x, y)

    top = 60
    cv.text(left, 10, f"{title}: {trace.hours:g} H FROM {trace.start_h:g}H - SPEED {trace.speed:g}")
    x = left
    for r in results:
        c = colors.get(r.name, BLACK)
        cv.rect(x, 30, x + 10, 38, c)
        cv.text(x + 14, 30, r.name)
        x += 40 + 8 * len(r.name)
    # rate (from the trace's definition, every minute)
    ts = [i * 60.0 for i in range(int(t_max // 60) + 1)]
    rates = [trace.rate(t) for t in ts]
    rmax = max(rates + [1]) * 1.1
    h = panels[0][1]
    axes(top, h, panels[0][0], 0, rmax)
    line(top, h, 0, rmax, list(zip(ts, rates)), (0, 0, 0))
    top += h + 60
    for key, (title, h) in zip(("prefill", "decode"), panels[1:3]):
        ymax = max(max(r.timeline[key] or [1]) for r in results) + 1
        axes(top, h, title, 0, ymax)
        for i, r in enumerate(results):
            line(top, h, 0, ymax, list(zip(r.timeline["t"], r.timeline[key])), colors.get(r.name, BLACK), off=i % 3 - 1)
        top += h + 60
    title, h = panels[3]
    axes(top, h, title, 0.8, 1.0)
    for r in results:
        pts = [((m + 0.5) * 60, g / n) for m, (n, g) in r.per_min.items() if n]
        line(top, h, 0.8, 1.0, pts, colors.get(r.name, BLACK))
    with open(path, "wb") as fh:
        fh.write(cv.png())


def make_policy(name: str, init, peak, mean, cap_p, cap_d, prof, cap_d_tok=None) -> Policy:
    if name == "pd-operator":  # as shipped: decode demand = generation tokens/s (promql.demand_query)
        return PdOperator(init, {"prefill": cap_p, "decode": cap_d_tok})
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
    raise ValueError(f"unknown policy {name!r}")


def _run_named(spec) -> Result:
    trace, name, *rest = spec
    if name == "oracle":
        return run_policy(trace, Scheduled(rest[0]))
    return run_policy(trace, make_policy(name, *rest))


def run_all(trace: Trace, out: str | None = None, policies: list[str] | None = None, goal: float = 0.99,
            log=print, jobs: int = 1, oracle_json: str | None = None, tag: str = "autoscale-bench",
            oracle_u: tuple[float, float] | None = None) -> list[Result]:
    cost = CostModel()
    t0 = time.time()
    log(f"trace: {trace.hours:g} h from {trace.start_h:g}:00, speed {trace.speed:g}, rate x{trace.rate_scale:g}, "
        f"seed {trace.seed}")
    if oracle_json:
        with open(oracle_json) as fh:
            prev = json.load(fh)
        need, tried = prev["oracle"]["need"], prev["oracle"]["search"]
        row = next(x for x in prev["results"] if x["name"] == "oracle")
        oracle = Result("oracle", row["goodput"], row["ttft_p99"], row["itl_p99"], row["itl_req_p99"], row["gpu_hours"],
                        row["goodput_per_gpu_hour"], row["actions"], row["requests"],
                        dict(prev["timeline"]["oracle"]),
                        {int(m): tuple(v) for m, v in prev["slo_per_minute"]["oracle"].items()}, row["wall_s"])
        log(f"  oracle from {oracle_json}: {oracle.gpu_hours:.1f} GPU-h")
    elif oracle_u:
        # the oracle's utilizations given (e.g. from an earlier search): its run is one more job below
        need, tried, oracle = oracle_need(trace, cost, *oracle_u), [{"u_prefill": oracle_u[0], "u_decode": oracle_u[1],
                                                                     "given": True}], None
    else:
        oracle, need, tried = find_oracle(trace, cost, goal, log)
    peak = {r: max(need[r]) for r in need}
    mean = {r: max(1, round(sum(need[r]) / len(need[r]))) for r in need}
    init = {r: need[r][0] for r in need}
    isl, osl = trace.isl.mean, trace.osl.mean
    cap_p = prefill_tokens_per_s(cost, isl)
    cap_d = decode_streams(cost, decode_mean_context(isl, osl, trace.osl.spread))
    prof = dynamo_profile(cost)
    names = policies or ["pd-operator", "static-peak", "static-mean", "hpa", "dynamo"]
    cap_d_tok = decode_tokens_per_s(cost, decode_mean_context(isl, osl, trace.osl.spread))
    specs = [(trace, n, init, peak, mean, cap_p, cap_d, prof, cap_d_tok) for n in names]
    if oracle is None:
        specs.insert(0, (trace, "oracle", need))
    if jobs > 1 and len(specs) > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(min(jobs, len(specs))) as pool:
            rs = pool.map(_run_named, specs)
    else:
        rs = [_run_named(x) for x in specs]
    if oracle is None:
        oracle, rs = rs[0], rs[1:]
    oracle.name = "oracle"
    results = [oracle]
    for r in rs:
        log(f"  {r.name}: goodput {r.goodput:.4f}, {r.gpu_hours:.1f} GPU-h ({r.wall_s:.0f}s)")
        results.append(r)
    for r in results:
        r.ratio = r.gpu_hours / oracle.gpu_hours if oracle.gpu_hours else float("nan")
    md = table_md(results)
    log(md)
    log(f"total {time.time() - t0:.0f}s")
    if out:
        os.makedirs(out, exist_ok=True)
        meta = {
            "trace": {"knots": trace.knots, "surges": [s.__dict__ for s in trace.surges], "isl": trace.isl.__dict__,
                      "osl": trace.osl.__dict__, "seed": trace.seed, "start_h": trace.start_h, "hours": trace.hours,
                      "speed": trace.speed, "rate_scale": trace.rate_scale},
            "service": {"model": "Qwen3-8B shape, fused efficiency", "tp": 1, "link": "rdma 50 GB/s + 1 ms",
                        "start_delay_s": START_DELAY, "interval_s": INTERVAL, "scrape_s": SCRAPE, "window_s": 60,
                        "slo": {"ttft_s": TTFT_SLO, "mean_itl_s": ITL_SLO}, "max_per_pool": MAX_PER_POOL,
                        "gpu_budget": BUDGET},
            "pd_operator_capacity": {"prefill_tokens_per_s": cap_p, "decode_streams": cap_d,
                                     "decode_tokens_per_s": cap_d_tok},
            # pd-operator's rows: plan_service() on this PDInferenceService (defaults filled in by validation)
            "pd_operator_spec": reference_manifest()["spec"],
            "oracle": {"goal": goal, "search": tried, "peak": peak, "mean": mean, "need": need},
            "dynamo_profile": {"prefill_tokens_per_s_per_gpu": prof[0], "decode_tokens_per_s_per_gpu": prof[1]},
            "results": [{k: getattr(r, k) for k in ("name", "goodput", "ttft_p99", "itl_p99", "itl_req_p99", "gpu_hours",
                                                     "goodput_per_gpu_hour", "actions", "requests", "ratio", "wall_s")}
                        for r in results],
            # every 4th scrape (1 min); an oracle loaded from --oracle-json is already so
            "timeline": {r.name: (r.timeline if oracle_json and r.name == "oracle" else
                                  {k: r.timeline[k][::4] for k in ("t", "prefill", "decode")}) for r in results},
            "slo_per_minute": {r.name: {str(m): [n, g] for m, (n, g) in r.per_min.items()} for r in results},
        }
        with open(os.path.join(out, tag + ".json"), "w") as fh:
            json.dump(meta, fh, indent=1, default=float)
        with open(os.path.join(out, tag + ".md"), "w") as fh:
            fh.write(f"# Autoscaling benchmark ({trace.hours:g} h from {trace.start_h:g}:00, speed {trace.speed:g}, "
                     f"rates x{trace.rate_scale:g}, seed {trace.seed})\n\n{md}\n")
        write_png(os.path.join(out, tag + ".png"), trace, results)
    return results


def add_parser(sub) -> None:
    p = sub.add_parser("autoscale-bench", help="autoscaling quality on a reference trace vs baselines (simulated, virtual time)")
    p.add_argument("--trace", default="reference", choices=sorted(TRACES))
    p.add_argument("--out", help="write autoscale-bench.json/.md/.png here (e.g. tests/benchmarks/results/)")
    p.add_argument("--hours", type=float, help="simulate this many hours of the day (default: 24)")
    p.add_argument("--start-hour", type=float, help="hour of day the run starts at (default 0)")
    p.add_argument("--speed", type=float, default=1.0, help="compress the day's shape by this factor (delays unchanged)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply every rate (a quick smoke run)")
    p.add_argument("--seed", type=int)
    p.add_argument("--policies", help="comma-separated subset of pd-operator,static-peak,static-mean,hpa,dynamo "
                   "(default: all five); also pd-operator-estimated (capacity left to plan_service's own estimate), "
                   "pd-operator-streams, pd-operator-waiting, pd-operator-tokens (earlier variants)")
    p.add_argument("--goal", type=float, default=0.99, help="oracle goodput goal (default 0.99)")
    p.add_argument("--jobs", type=int, default=2, help="policies simulated in parallel (processes; default 2)")
    p.add_argument("--oracle-json", help="reuse the oracle (schedule and row) of an earlier run's JSON")
    p.add_argument("--tag", default="autoscale-bench", help="output file name stem")
    p.add_argument("--oracle-u", help="U_PREFILL,U_DECODE: skip the oracle's search, use these utilizations")
    p.set_defaults(func=main)


def main(args) -> int:
    tr = TRACES[args.trace]
    kw = {"speed": args.speed, "rate_scale": args.rate_scale}
    if args.hours is not None:
        kw["hours"] = args.hours
    if args.start_hour is not None:
        kw["start_h"] = args.start_hour
    if args.seed is not None:
        kw["seed"] = args.seed
    tr = replace(tr, **kw)
    run_all(tr, args.out, args.policies.split(",") if args.policies else None, args.goal,
            log=lambda s: print(s, flush=True), jobs=args.jobs, oracle_json=args.oracle_json, tag=args.tag,
            oracle_u=tuple(float(x) for x in args.oracle_u.split(",")) if args.oracle_u else None)
    return 0
