"""One policy on one trace: the simulated fleet in virtual time, scraped every
``SCRAPE`` seconds, the policy ticked every interval, and the figures the
benchmark reports (:class:`Result`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pd_operator.perfmodel.costmodel import CostModel

from .fleet import BenchFleet, Scraper
from .policies import Policy
from .reference import SCRAPE, START_DELAY
from .trace import Trace


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
