"""The benchmark's fast decode instance is the simulator's decode Engine, step-skipping:
same first-token and finish times, request by request."""

from __future__ import annotations

import random

from pd_operator_tools.autoscalesim.fleet import BenchFleet, DReq, FastDecode
from pd_operator_tools.enginesim.clock import VirtualClock
from pd_operator.perfmodel.costmodel import CostModel
from pd_operator_tools.enginesim.engine import Engine, SimRequest


def _arrivals(n=400, rate=40.0, seed=3):
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, rng.randint(100, 6000), rng.randint(1, 600)))
    return out


def test_fast_decode_matches_engine_request_by_request():
    arr = _arrivals()
    cost = CostModel()
    # reference: the simulator's engine, one step at a time
    clk = VirtualClock()
    eng = Engine(clk, cost, "decode", max_num_seqs=32)
    ref = []
    for t, isl, osl in arr:
        def go(isl=isl, osl=osl):
            ref.append(eng.add(SimRequest(isl, osl, kv_transfer=True)))
        clk.call_at(t, go)
    clk.run()
    # fast
    fleet = BenchFleet(cost=cost, max_num_seqs=32)
    done = {}
    fleet.finished = lambda r, itl: done.__setitem__(r.seq, (r.first_token, r.first_token + (itl or 0) * (r.max_tokens - 1)))
    fd = FastDecode(fleet, "d")
    for i, (t, isl, osl) in enumerate(arr):
        fleet.clock.call_at(t, fd.add, DReq(isl, osl, t, i))
    fleet.clock.run()
    assert len(done) == len(ref) == len(arr)
    for i, r in enumerate(ref):
        first, last = done[i]
        assert abs(first - r.first_token) < 1e-6, (i, first, r.first_token)
        assert abs(last - r.last_token) < 1e-6, (i, last, r.last_token)


def _scrape(t, waiting_by_pod, running):
    """A scrape of the prefill pool only: per-pod waiting (pod id -> count) and running counts."""
    return {"t": t, "waiting": {"prefill": list(waiting_by_pod.values()), "decode": []},
            "running": {"prefill": running, "decode": []},
            "waiting_by_pod": {"prefill": waiting_by_pod, "decode": {}}}


def test_scraper_backlog_growth_and_least_pod_queue_as_promql_reads_them():
    from pd_operator_tools.autoscalesim.fleet import Scraper

    prom = Scraper()
    prom.add(_scrape(0.0, {1: 10, 2: 10}, [4, 4]))
    assert prom.backlog_growth("prefill") is None  # no sample a window ago: no series
    prom.add(_scrape(15.0, {1: 20, 2: 20}, [4, 4]))
    prom.add(_scrape(30.0, {1: 30, 2: 30, 3: 0}, [4, 4, 1]))  # pod 3 joins, takes new arrivals only
    prom.add(_scrape(45.0, {1: 40, 2: 40, 3: 0}, [4, 4, 2]))
    prom.add(_scrape(60.0, {1: 50, 2: 50, 3: 1}, [4, 4, 2]))
    assert prom.backlog("prefill") == 111.0
    # (111 now - 28 at t=0) / 60 s: the sums of each moment, the pod added meanwhile included
    assert prom.backlog_growth("prefill") == (111.0 - 28.0) / 60.0
    # each pod's average over the scrapes of the window it appears in (t > 0: the left end
    # excluded), the least: pod 3's (0 + 0 + 1) / 3, though the pool's sum is 100 waiting
    assert prom.min_pod_avg_over_time("prefill") == 1.0 / 3.0
