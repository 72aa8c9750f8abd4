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
