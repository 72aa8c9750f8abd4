"""Both pools of one service in one round: enabled pools only, GPU budget with
the fixed pool's GPUs counted, history amended when the budget cuts; the
capacity and the secondary signals each pool is decided on; and the policy
fields behind them (secondaryTargets, capacityPerReplica), validated alike by
the API server's CEL and by pydantic."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pd_operator.api import SpecError, validate_service
from pd_operator.autoscale.capacity import estimate_capacity, prefill_tokens_per_s, replica_cost_model
from pd_operator.autoscale.decide import PoolState
from pd_operator.autoscale.plan import PoolInput, plan_service
from pd_operator.autoscale.promql import Observation
from tests.conftest import minimal
from tests.unit.test_cel_equivalence import cel_failures, pydantic_failures

AUTO = {"enabled": True, "minReplicas": 1, "maxReplicas": 20}


def svc(**spec):
    return validate_service(minimal(autoscaling={"prometheus": {"url": "http://prom:9090"}, **spec.pop("autoscaling", {})}, **spec))


def test_only_enabled_pools_are_decided():
    s = svc(decode={"autoscaling": AUTO})
    inputs = {"prefill": PoolInput(PoolState(2, 2), Observation(5.0, None), 100.0),
              "decode": PoolInput(PoolState(2, 2), Observation(0.1, None), 100.0)}
    out = plan_service(s, inputs, {}, now=100.0)
    assert list(out) == ["decode"] and out["decode"].replicas == 4


def test_budget_counts_fixed_pool_and_cuts_with_reason():
    s = svc(prefill={"replicas": 6}, decode={"autoscaling": AUTO, "tensorParallelSize": 2},
            autoscaling={"maxTotalGPUs": 14})
    histories: dict = {}
    inputs = {"prefill": PoolInput(PoolState(6, 6), None, 100.0),
              "decode": PoolInput(PoolState(2, 2), Observation(0.2, None), 100.0)}  # 4x over ITL target
    out = plan_service(s, inputs, histories, now=100.0)
    # 6 prefill GPUs fixed; 8 left for decode at 2 GPUs each -> 4 replicas
    assert out["decode"].replicas == 4 and "maxTotalGPUs=14" in out["decode"].reason
    assert histories["decode"].changes[-1].after == 4
    assert histories["decode"].scaled_up == (100.0, 4)  # the start time is awaited for the size granted


def test_missing_observation_holds():
    s = svc(prefill={"autoscaling": AUTO})
    out = plan_service(s, {"prefill": PoolInput(PoolState(3, 3), None, 100.0), "decode": PoolInput(PoolState(1, 1), None, 100.0)}, {}, now=100.0)
    assert out["prefill"].replicas == 3 and not out["prefill"].metrics_available


# ---- capacity and secondary signals in the live loop ----

def test_cost_model_floor_from_observed_lengths():
    s = svc(prefill={"autoscaling": AUTO})
    cap = estimate_capacity(s, "prefill", 2000.0, None)
    # TTFT in band, but the prompt tokens need 5 replicas of the estimated capacity
    obs = Observation(1.0, 4.5 * cap, mean_isl=2000.0)
    out = plan_service(s, {"prefill": PoolInput(PoolState(2, 2), obs, 100.0), "decode": PoolInput(PoolState(1, 1), None, 100.0)}, {}, now=100.0)
    assert out["prefill"].replicas == 5 and out["prefill"].reason.count("(cost model)") == 1
    assert "sized by demand" in out["prefill"].reason


def test_prompt_tokens_served_from_a_prefix_cache_are_not_counted_as_prefill_work():
    """The demand (prompt_tokens_total) counts every prompt token, the cached ones too; a
    replica computes only the others. Found by a review: with half of each prompt cached the
    floor asked for twice the replicas the computed tokens need, and the saturation
    correction (a factor <= 1) could never bring it down."""
    s = svc(prefill={"autoscaling": AUTO})
    uncached = estimate_capacity(s, "prefill", 2000.0, None)
    demand = 4.5 * uncached
    sizes = {}
    for share in (0.0, 0.5):
        obs = Observation(1.0, demand, mean_isl=2000.0, cached_share=share)
        out = plan_service(s, {"prefill": PoolInput(PoolState(2, 2), obs, 100.0),
                               "decode": PoolInput(PoolState(1, 1), None, 100.0)}, {}, now=100.0)
        sizes[share] = out["prefill"].replicas
    assert sizes[0.0] == 5
    # half the tokens computed, each attending over its cached half: more than 1x, under 2x the prompts
    assert 3 <= sizes[0.5] < 5
    cost = replica_cost_model(s.spec, "prefill")
    for isl in (500.0, 2000.0, 12000.0):
        base = prefill_tokens_per_s(cost, isl)
        assert prefill_tokens_per_s(cost, isl, cached_share=0.0) == base
        cached = [prefill_tokens_per_s(cost, isl, cached_share=x) for x in (0.25, 0.5, 0.75)]
        assert base < cached[0] < cached[1] < cached[2]
        assert all(c < base / (1 - x) for c, x in zip(cached, (0.25, 0.5, 0.75)))


def test_no_lengths_no_floor():
    # idle window for the lengths: no estimate, the latency alone decides (in band: keep)
    s = svc(prefill={"autoscaling": AUTO})
    obs = Observation(1.0, 1e9)
    out = plan_service(s, {"prefill": PoolInput(PoolState(2, 2), obs, 100.0)}, {}, now=100.0)
    assert out["prefill"].replicas == 2 and "demand" not in out["prefill"].reason


def test_capacity_per_replica_and_given_capacity():
    s = svc(decode={"autoscaling": {**AUTO, "capacityPerReplica": 1000.0}})
    obs = Observation(0.05, 7000.0, mean_isl=2000.0, mean_osl=500.0)
    spec_cap = plan_service(s, {"decode": PoolInput(PoolState(2, 2), obs, 100.0)}, {}, now=100.0)["decode"]
    assert spec_cap.replicas == 6 and "(capacityPerReplica)" in spec_cap.reason  # 7000 / 1000 = 7, rate limit: 2 -> 6
    given = plan_service(s, {"decode": PoolInput(PoolState(2, 2), obs, 100.0, capacity=3500.0)}, {}, now=100.0)["decode"]
    assert given.replicas == 2 and "(given)" in given.reason


def test_secondaries_flow_from_the_observation():
    s = svc(decode={"autoscaling": {**AUTO, "secondaryTargets": [{"metric": "queueDepth", "averageValue": 2}]}})
    obs = Observation(0.05, None, queue=6.0, kv_usage=0.99)  # kv_usage not asked for: ignored
    out = plan_service(s, {"decode": PoolInput(PoolState(2, 2), obs, 100.0)}, {}, now=100.0)["decode"]
    assert out.replicas == 6 and out.reason.endswith("sized by queueDepth") and "kvCacheUsage" not in out.reason
    assert s.spec.decode.autoscaling.secondary_metrics() == {"queueDepth"}


# ---- the new fields: bounds, and the same verdict from CEL (API server) and pydantic (pdctl) ----

def spec_with(**autoscaling):
    return minimal(prefill={"autoscaling": {**AUTO, **autoscaling}})


@pytest.mark.parametrize("autoscaling, message", [
    ({"secondaryTargets": [{"metric": "queueDepth", "averageValue": 5}, {"metric": "kvCacheUsage", "averageValue": 1}]}, None),
    ({"secondaryTargets": [{"metric": "kvCacheUsage", "averageValue": 1.2}]}, "kvCacheUsage averageValue is a fraction"),
    ({"secondaryTargets": [{"metric": "queueDepth", "averageValue": 5}, {"metric": "queueDepth", "averageValue": 3}]},
     "at most one entry per metric"),
    ({"secondaryTargets": [{"metric": "kvCacheUsage", "averageValue": 0.5}, {"metric": "kvCacheUsage", "averageValue": 2}]},
     "at most one entry per metric"),
])
def test_secondary_rules_agree_in_cel_and_pydantic(autoscaling, message):
    obj = spec_with(**autoscaling)
    cel, py = cel_failures(obj), pydantic_failures(obj)
    if message is None:
        assert cel == set() and py is None
    else:  # pydantic stops at the first object that fails (here the item before the list)
        assert any(message in m for m in cel) and py and py <= cel


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({"metric": st.sampled_from(["queueDepth", "kvCacheUsage"]),
                                       "averageValue": st.sampled_from([0.3, 1, 1.0, 1.5, 4])}), max_size=2))
def test_secondary_rules_agree_on_generated_lists(targets):
    obj = spec_with(secondaryTargets=targets)
    cel, py = cel_failures(obj), pydantic_failures(obj)
    assert (py is None) == (cel == set()) and (py or set()) <= cel


@pytest.mark.parametrize("autoscaling", [
    {"secondaryTargets": [{"metric": "queueDepth", "averageValue": 0}]},
    {"secondaryTargets": [{"metric": "waiting", "averageValue": 1}]},
    {"secondaryTargets": [{"metric": "queueDepth", "averageValue": 1}] * 3},
    {"capacityPerReplica": 0},
    {"capacityPerReplica": -5.0},
])
def test_secondary_and_capacity_bounds(autoscaling):
    with pytest.raises(SpecError):
        validate_service(spec_with(**autoscaling))


class Book:
    """plan.Room over a plain count of free single-GPU slots."""

    def __init__(self, free: int):
        self.free, self.taken = free, {}

    def room(self, role):
        return self.free

    def take(self, role, count):
        self.free -= count
        self.taken[role] = count


def test_scale_ups_fit_the_free_gpus_most_pressed_pool_first():
    from pd_operator.api import validate_service
    from pd_operator.autoscale.decide import History, PoolState
    from pd_operator.autoscale.plan import PoolInput, plan_service
    from pd_operator.autoscale.promql import Observation
    from tests.conftest import minimal

    auto = {"enabled": True, "minReplicas": 1, "maxReplicas": 10}
    svc = validate_service(minimal(prefill={"replicas": 1, "autoscaling": auto},
                                   decode={"replicas": 1, "autoscaling": dict(auto)}))
    inputs = {"prefill": PoolInput(PoolState(1, 1), Observation(2.0, None), 100.0),      # 2x its target
              "decode": PoolInput(PoolState(1, 1), Observation(0.2, None), 100.0)}       # 4x its target
    histories = {}
    book = Book(free=3)
    d = plan_service(svc, inputs, histories, 100.0, book)
    # decode (more pressure) gets its 3 more first; prefill, which wanted 1 more, gets none and is told why
    assert (d["decode"].replicas, d["prefill"].replicas) == (4, 1)
    assert "the free GPUs fit 0 more" in d["prefill"].reason and book.free == 0
    assert histories["prefill"].changes == []  # the cut change is not remembered as made
    # unknown room: no cap
    free = plan_service(svc, inputs, {}, 100.0, None)
    assert (free["decode"].replicas, free["prefill"].replicas) == (4, 2)


# ---- issue 14: offered load ------------------------------------------------------------------
from pd_operator.autoscale.capacity import length_bias  # noqa: E402
from pd_operator.autoscale.plan import decode_offered_from_prefill, offered_load  # noqa: E402


def test_decode_demand_is_offered_load_not_produced_tokens():
    # a saturated decode pool produces 10k tok/s with 200 running and 200 waiting: offered is 20k
    obs = Observation(0.05, 10000.0, mean_isl=2000, mean_osl=1000, waiting_total=200, running_total=200)
    assert offered_load("decode", obs) == 20000.0
    # prefill: processed 40k tok/s plus 120 waiting and 30 running prompts of 2000 tokens over
    # the 60 s window (a prefill engine admits up to max-num-seqs prompts: its backlog runs)
    pre = Observation(5.0, 40000.0, mean_isl=2000, waiting_total=120, running_total=30)
    assert offered_load("prefill", pre) == 45000.0
    assert offered_load("prefill", Observation(5.0, 40000.0, mean_isl=2000, waiting_total=0, running_total=30)) == 41000.0



def test_prefill_offered_load_is_arrivals_plus_the_backlog_as_it_is_now():
    # a flash crowd's first minute: 2 saturated replicas produce 40k tok/s; the backlog averaged
    # 150 prompts over the minute but is 300 now, and grew by 5 prompts/s: arrivals are
    # 40k + 5 x 2000 = 50k tok/s, and the 300 prompts now are 10k tok/s more over a minute
    obs = Observation(5.0, 40000.0, mean_isl=2000, waiting_total=120, running_total=30,
                      backlog_now=300, backlog_growth=5.0)
    assert offered_load("prefill", obs) == 40000.0 + 10000.0 + 10000.0
    # a shrinking backlog does not lower the demand below what the pool produced and still holds
    drain = Observation(5.0, 40000.0, mean_isl=2000, backlog_now=300, backlog_growth=-5.0)
    assert offered_load("prefill", drain) == 50000.0
    # without the instant figures (an older Prometheus answer): the window's averages
    assert offered_load("prefill", Observation(5.0, 40000.0, mean_isl=2000, waiting_total=120,
                                               running_total=30)) == 45000.0


def test_decode_sized_from_what_prefill_is_offered():
    # prefill has a backlog decode has not seen yet: 44k prompt tok/s / 2000 x 1000 = 22k gen tok/s
    pre = Observation(5.0, 40000.0, mean_isl=2000, waiting_total=120, running_total=0)
    dec = Observation(0.03, 10000.0, mean_isl=2000, mean_osl=1000, waiting_total=0, running_total=200)
    assert decode_offered_from_prefill(pre, dec) == 22000.0
    s = svc(prefill={"autoscaling": AUTO}, decode={"autoscaling": AUTO})
    inputs = {"prefill": PoolInput(PoolState(2, 2), pre, 100.0, capacity=22000),
              "decode": PoolInput(PoolState(2, 2), dec, 100.0, capacity=2000)}
    out = plan_service(s, inputs, {}, now=100.0)
    assert out["decode"].recommendation == 11  # 22k / 2k; produced tokens alone would say 5


def test_osl_spread_from_the_histogram_lowers_decode_capacity():
    # same mean OSL 1000; a wide spread (long streams dominate the running batch) means a longer
    # mean context, so fewer streams per replica at the ITL target
    narrow = [(500, 0), (1000, 50), (2000, 100), (float("inf"), 100)]
    wide = [(100, 20), (200, 35), (500, 55), (1000, 70), (2000, 82), (5000, 96), (10000, 100), (float("inf"), 100)]
    assert length_bias(wide) > 2 * length_bias(narrow)
    s = svc(decode={"autoscaling": AUTO})
    a = estimate_capacity(s, "decode", 2000, 1000, length_bias(narrow))
    b = estimate_capacity(s, "decode", 2000, 1000, length_bias(wide))
    assert b < a


# ---- the cost model checked against the engines' measured step time (decode) ----

from pd_operator.autoscale.capacity import replica_cost_model, step_time_ratio  # noqa: E402
from pd_operator.autoscale.decide import SETTLE_S, Change, History  # noqa: E402


def _decode_running(s, speed: float, replicas: int, per_replica: int = 200, isl=2000.0, osl=1000.0):
    """A decode pool whose engines step ``speed`` x the cost model's time, as Prometheus shows it."""
    ctx = isl + osl  # osl_bias 2 x OSL (no histogram): E[ctx] = ISL + OSL
    step = replica_cost_model(s.spec, "decode").decode_uniform_ms(per_replica, int(ctx)) / 1e3 * speed
    produced = replicas * per_replica / step
    return Observation(step, produced, mean_isl=isl, mean_osl=osl, running_total=replicas * per_replica,
                       waiting_total=0.0, mean_itl=step)


def test_step_time_ratio_reads_the_engines_speed():
    s = svc(decode={"autoscaling": AUTO})
    for speed in (0.8, 1.0, 1.25):
        obs = _decode_running(s, speed, 4)
        got = step_time_ratio(s, obs.mean_isl, obs.mean_osl, None, obs.running_total / 4, obs.mean_itl)
        assert got == pytest.approx(speed, rel=1e-3)
    assert step_time_ratio(s, 2000.0, 1000.0, None, 0.5, 0.01) is None  # less than one request per engine
    assert step_time_ratio(s, 2000.0, 1000.0, None, 100.0, None) is None  # no ITL samples


def test_the_measured_decode_step_time_moves_the_floor_either_way():
    s = svc(decode={"autoscaling": AUTO, "maxRunningRequests": 256})  # the slots bind: rule 3e applies
    model = replica_cost_model(s.spec, "decode")
    plans = {}
    for speed in (0.8, 1.0, 1.3):
        history, n = History(), 10
        for t in range(100, 100 + 120 * 30, 30):  # an hour of rounds; the pool follows its decisions
            # 50k generated tokens/s offered, spread over the pool: each replica runs the batch
            # whose tokens/s at the engines' true step time carry its share
            b = next(b for b in range(1, 10_000) if b / (model.decode_uniform_ms(b, 3000) / 1e3 * speed) >= 50_000 / n)
            step = model.decode_uniform_ms(b, 3000) / 1e3 * speed
            obs = Observation(step, 50_000.0, mean_isl=2000.0, mean_osl=1000.0, running_total=float(n * b),
                              waiting_total=0.0, mean_itl=step)
            out = plan_service(s, {"decode": PoolInput(PoolState(n, n), obs, float(t))}, {"decode": history}, now=float(t))
            if t == 100:  # one round moves the estimate a tenth of the way from the model
                assert history.step_ratio == pytest.approx(1 - 0.1 * (1 - speed), rel=1e-3)
            n = out["decode"].replicas
        plans[speed] = (n, out["decode"].reason, history.step_ratio)
    (fast, why, ratio), (same, _, one), (slow, why_slow, slower) = plans[0.8], plans[1.0], plans[1.3]
    assert ratio == pytest.approx(0.8, rel=0.01) and one == pytest.approx(1.0, rel=1e-3)
    assert slower == pytest.approx(1.3, rel=0.01)
    # the measured step time moves decode's floor either way (its reading is the mean step itself)
    assert fast < same < slow, plans
    assert "step time x 0.80 as measured" in why and "step time x 1.30 as measured" in why_slow
    # and the steady capacity (rule 3e) with it
    steady = re.compile(r"steady: ([0-9.]+)k tok/s/replica")
    figures = [float(steady.search(plans[v][1]).group(1)) for v in (0.8, 1.0, 1.3)]
    assert figures[0] > figures[1] > figures[2], plans


def test_step_time_is_measured_only_on_a_settled_pool():
    s = svc(decode={"autoscaling": AUTO})
    obs = _decode_running(s, 0.8, 10)
    starting = History()
    plan_service(s, {"decode": PoolInput(PoolState(10, 8, starting=2), obs, 100.0)}, {"decode": starting}, now=100.0)
    resized = History(changes=[Change(100.0 - SETTLE_S / 2, 9, 10)])
    plan_service(s, {"decode": PoolInput(PoolState(10, 10), obs, 100.0)}, {"decode": resized}, now=100.0)
    # a rising demand: young streams step faster than the model at the steady-state context
    ramp = History(demands=[(100.0 - 180 + 30 * i, obs.demand * (0.7 + 0.05 * i)) for i in range(7)])  # 3 min, +7 %/min
    plan_service(s, {"decode": PoolInput(PoolState(10, 10), obs, 100.0)}, {"decode": ramp}, now=100.0)
    settled = History()
    plan_service(s, {"decode": PoolInput(PoolState(10, 10), obs, 100.0)}, {"decode": settled}, now=100.0)
    assert starting.step_ratio is None and resized.step_ratio is None and ramp.step_ratio is None
    assert settled.step_ratio == pytest.approx(0.98)  # a tenth of the way from 1 to 0.8


def test_readings_around_the_model_do_not_average_to_faster_engines():
    # engines exactly as fast as the model read a little faster or slower window by window;
    # an average of readings cut at 1 would drift below 1 and take capacity that is not there
    s = svc(decode={"autoscaling": AUTO})
    history = History()
    for i, t in enumerate(range(100, 100 + 60 * 30, 30)):
        obs = _decode_running(s, 0.9 if i % 2 else 1.1, 10)
        plan_service(s, {"decode": PoolInput(PoolState(10, 10), obs, float(t))}, {"decode": history}, now=float(t))
    assert history.step_ratio == pytest.approx(1.0, abs=0.01)


# ---- the cost model checked against the engines' measured prefill time (prefill) ----

import random  # noqa: E402

from pd_operator.autoscale.capacity import prefill_time_ratio, prefill_tokens_per_s  # noqa: E402
from pd_operator_tools.enginesim.clock import VirtualClock  # noqa: E402
from pd_operator_tools.enginesim.engine import Engine, SimRequest, Sink  # noqa: E402


class _PrefillTimes(Sink):
    def __init__(self):
        self.total, self.count = 0.0, 0

    def prefill_time(self, v: float, rank: int = 0) -> None:
        self.total += v
        self.count += 1


def _simulated_prefill(model, speed: float, load: float, isl: int, sigma: float, seconds: float = 300.0):
    """A prefill engine ``speed`` x the cost model's step time (the simulated engine: vLLM's
    scheduler with an 8192-token step budget), Poisson prompts at ``load`` of what it carries,
    lognormal lengths of spread ``sigma``: (time-averaged running requests, mean prefill time)."""
    clock, sink = VirtualClock(), _PrefillTimes()
    engine = Engine(clock, model.scaled(speed), "prefill", sink=sink)
    rng = random.Random(7)
    rate = load * prefill_tokens_per_s(model, isl, utilization=1.0) / speed / isl
    t = rng.expovariate(rate)
    while t < seconds:
        n = max(16, int(isl * rng.lognormvariate(-sigma * sigma / 2, sigma)))
        clock.call_at(t, lambda n=n: engine.add(SimRequest(n, 1, prefill_only=True)))
        t += rng.expovariate(rate)
    area, dt = 0.0, 0.05
    for k in range(1, int(seconds / dt) + 1):
        clock.run(until=k * dt)
        area += engine.num_running * dt
    return area / seconds, sink.total / sink.count


@pytest.mark.parametrize("isl,sigma", [(2000, 0.0), (2000, 0.6), (600, 0.6)])
def test_prefill_time_ratio_orders_the_engines_and_never_reads_them_faster(isl, sigma):
    s = svc(prefill={"autoscaling": AUTO})
    model = replica_cost_model(s.spec, "prefill")
    for load in (0.2, 0.5, 0.8):
        got = {speed: prefill_time_ratio(s, isl, *_simulated_prefill(model, speed, load, isl, sigma))
               for speed in (0.8, 1.0, 1.25)}
        assert got[0.8] < got[1.0] < got[1.25], (load, got)
        for speed, ratio in got.items():  # the step model errs towards slower engines, not faster
            assert ratio >= 0.97 * speed, (load, got)
    # one prompt at a time of one length: the model's own case, read as it is
    assert prefill_time_ratio(s, isl, *_simulated_prefill(model, 0.8, 0.05, isl, 0.0)) == pytest.approx(0.8, rel=0.05)
    assert prefill_time_ratio(s, isl, 0.5, None) is None  # no prefill-time samples
    assert prefill_time_ratio(s, 0.25, 0.25, 0.25) is None  # a prompt shorter than a token (bad data): no crash


def test_prefix_cache_hits_do_not_read_as_faster_prefill_engines():
    # engines at the model's speed, half of every 4000-token prompt served from the prefix cache:
    # each step computes 2000 tokens after a 2000-token cached prefix
    s = svc(prefill={"autoscaling": AUTO})
    model = replica_cost_model(s.spec, "prefill")
    step = (model.prefill_fixed_ms() + 2 * model.prefill_chunk_ms(2000, 2000)) / 1e3  # two prompts a step
    assert prefill_time_ratio(s, 4000.0, 2.0, step, cached_share=0.5) == pytest.approx(1.0, rel=1e-3)
    assert prefill_time_ratio(s, 4000.0, 2.0, step) < 0.7  # the cache ignored: a speed-up that is not there
    assert prefill_time_ratio(s, 4000.0, 2.0, step, cached_share=1.0) is None  # nothing computed: nothing timed


def test_faster_prefill_engines_lower_the_prefill_floor_slower_do_not_raise_it():
    s = svc(prefill={"autoscaling": AUTO})
    model = replica_cost_model(s.spec, "prefill")
    plans = {}
    for speed in (0.8, 1.0, 1.3):
        history, n = History(), 10
        for t in range(100, 100 + 120 * 30, 30):
            # 150k prompt tokens/s of 2000-token prompts; each replica runs its share one step
            # at a time (the running requests, by Little's law, arrivals x prefill time)
            per_replica = 150_000 / 2000 / n
            step = model.prefill_ms(2000) / 1e3 * speed
            running = per_replica * step
            obs = Observation(step, 150_000.0, mean_isl=2000.0, running_total=n * running, waiting_total=0.0,
                              mean_prefill_time=step)
            out = plan_service(s, {"prefill": PoolInput(PoolState(n, n), obs, float(t))}, {"prefill": history},
                               now=float(t))
            n = out["prefill"].replicas
        plans[speed] = (n, out["prefill"].reason, history.step_ratio)
    (fast, why, ratio), (same, same_why, one), (slow, why_slow, high) = plans[0.8], plans[1.0], plans[1.3]
    assert ratio == pytest.approx(0.8, rel=0.02) and one == pytest.approx(1.0, rel=0.02) and high > 1.2
    assert fast < same, plans
    assert "step time x 0.80 as measured" in why
    capacity = re.compile(r"capacity [0-9.]+k tok/s/replica \(cost model\)")
    assert capacity.search(why_slow).group(0) == capacity.search(same_why).group(0)


def test_a_new_engine_forgets_what_was_learned_on_the_old_one():
    s = svc(decode={"autoscaling": AUTO})
    obs = _decode_running(s, 0.8, 10)
    history = History()
    for t in range(100, 100 + 30 * 30, 30):
        plan_service(s, {"decode": PoolInput(PoolState(10, 10), obs, float(t))}, {"decode": history}, now=float(t))
    learned = history.step_ratio
    assert learned < 0.99
    # a policy edit keeps it
    edited = svc(decode={"autoscaling": {**AUTO, "maxReplicas": 30}})
    plan_service(edited, {"decode": PoolInput(PoolState(10, 10), obs, 1000.0)}, {"decode": history}, now=1000.0)
    assert history.step_ratio <= learned * 1.01
    # another tensor-parallel size (the step time is another one): relearned from the model
    other = svc(decode={"autoscaling": AUTO, "tensorParallelSize": 2})
    plan_service(other, {"decode": PoolInput(PoolState(10, 10), None, 1030.0)}, {"decode": history}, now=1030.0)
    assert history.step_ratio is None and history.capacity_factor == 1.0


def test_the_measured_speed_scales_the_prefill_latency_floor():
    # the feedback sizes the pool on the TTFT above the no-load floor; faster engines have a lower one
    from pd_operator.autoscale.capacity import latency_floor

    s = svc(prefill={"autoscaling": AUTO})
    model = latency_floor(s, "prefill", 2000.0, None)
    assert latency_floor(s, "prefill", 2000.0, None, step_ratio=0.8) == pytest.approx(0.8 * model)
    assert latency_floor(s, "prefill", 2000.0, None, step_ratio=None) == model


# ---- 2c: prompts that no replica prefills within the target ----

from pd_operator.autoscale.capacity import longest_prompt_in_time, share_longer  # noqa: E402
from pd_operator.autoscale.promql import histogram_quantile  # noqa: E402


def _alone_ms(cost, tokens: int, budget: int = 8192) -> float:
    """One prompt alone: a step (fixed cost + its chunk) per ``budget`` tokens."""
    done, ms = 0, 0.0
    while done < tokens:
        n = min(budget, tokens - done)
        ms += cost.prefill_fixed_ms() + cost.prefill_chunk_ms(done, n)
        done += n
    return ms


def test_the_longest_prompt_one_replica_prefills_within_the_target():
    s = svc(prefill={"autoscaling": AUTO})
    cost = replica_cost_model(s.spec, "prefill")
    longest = longest_prompt_in_time(s, 1.0)
    assert _alone_ms(cost, longest) <= 1000.0 < _alone_ms(cost, longest + 1)
    assert 8192 < longest < cost.shape.max_model_len  # more than one chunk, less than the context
    # faster engines (as measured) and a looser target fit longer prompts; a smaller step budget
    # (more fixed costs) fits shorter ones
    assert longest_prompt_in_time(s, 1.0, step_ratio=0.8) > longest
    assert longest_prompt_in_time(s, 0.5) < longest
    small = svc(prefill={"autoscaling": AUTO, "maxBatchedTokens": 2048})
    assert longest_prompt_in_time(small, 1.0) < longest
    # never past the context length: every prompt the engines accept fits a loose target
    capped = svc(prefill={"autoscaling": AUTO}, model={"name": minimal()["spec"]["model"]["name"], "maxModelLen": 16384})
    assert longest_prompt_in_time(capped, 60.0) == 16384
    # no cost model (another GPU): unknown
    other = svc(prefill={"autoscaling": AUTO, "gpuProduct": "NVIDIA-A100-SXM4-80GB"})
    assert longest_prompt_in_time(other, 1.0) is None


def test_share_of_requests_longer_than_a_length_from_the_histogram():
    b = [(1000.0, 50.0), (2000.0, 80.0), (5000.0, 95.0), (math.inf, 100.0)]
    assert share_longer(b, 2000) == pytest.approx(0.20)                 # a bucket edge
    assert share_longer(b, 3500) == pytest.approx(1 - (80 + 15 * 0.5) / 100)  # linear inside the bucket
    assert share_longer(b, 500) == pytest.approx(1 - 25 / 100)           # the first bucket starts at 0
    # the +Inf bucket ends at the longest prompt the engines accept; unknown: all of it is longer
    assert share_longer(b, 6000, longest=10000) == pytest.approx(1 - (95 + 5 * 0.2) / 100)
    assert share_longer(b, 6000) == pytest.approx(0.05)
    assert share_longer(b, 10000, longest=10000) == 0.0
    assert share_longer([(1000.0, 0.0), (math.inf, 0.0)], 10) is None


def test_histogram_quantile_as_prometheus_computes_it():
    b = [(0.1, 1.0), (0.5, 4.0), (1.0, 6.0), (math.inf, 6.0)]
    assert histogram_quantile(0.99, b) == pytest.approx(0.5 + 0.5 * (5.94 - 4) / 2)
    assert histogram_quantile(0.1, b) == pytest.approx(0.1 * 0.6)      # the first bucket from 0
    assert histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 2.0)]) == 1.0  # in +Inf: its lower edge
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


def _long_prompts(s, ttft):
    """A prefill pool whose prompts are 2 % longer than one replica prefills within 1 s."""
    longest = longest_prompt_in_time(s, 1.0)
    prompts = ((longest / 2, 90.0), (float(longest), 98.0), (math.inf, 100.0))
    return Observation(histogram_quantile(0.99, ttft), None, mean_isl=3000.0, prompt_buckets=prompts,
                       latency_buckets=ttft)


def test_prompts_too_long_for_the_target_are_left_out_of_the_quantile():
    s = svc(prefill={"autoscaling": AUTO})
    # p99 of all: rank 99 in (1, 2.5]: 2.125 s; the 2 % too long are all above 1 s, so the p99
    # of the others is the p(99 x 0.98) of all: rank 97.02 in (0.5, 1]: 0.968 s, within the band
    ttft = ((0.5, 90.0), (1.0, 97.5), (2.5, 99.5), (math.inf, 100.0))
    obs = _long_prompts(s, ttft)
    assert obs.observed == pytest.approx(2.125)
    out = plan_service(s, {"prefill": PoolInput(PoolState(10, 10), obs, 100.0)}, {}, now=100.0)["prefill"]
    assert out.replicas == 10, out.reason
    assert re.search(r"ttft p99 of the prompts that can make it \(p97 of all: 2\.00% are longer than [0-9.]+k tokens",
                     out.reason), out.reason
    assert "968ms within 10% of target" in out.reason
    # the same TTFTs without the prompt lengths: the p99 of all, above the target
    plain = Observation(obs.observed, None, mean_isl=3000.0, latency_buckets=ttft)
    out = plan_service(s, {"prefill": PoolInput(PoolState(10, 10), plain, 100.0)}, {}, now=100.0)["prefill"]
    assert out.replicas > 10 and "of the prompts" not in out.reason
    # the others above the target too: still scales up, on their quantile
    slow = _long_prompts(s, ((0.5, 50.0), (1.0, 90.0), (2.5, 99.5), (math.inf, 100.0)))
    out = plan_service(s, {"prefill": PoolInput(PoolState(10, 10), slow, 100.0)}, {}, now=100.0)["prefill"]
    assert out.replicas > 10 and "of the prompts that can make it" in out.reason


def test_no_prompt_is_longer_than_the_engines_accept():
    # SGLang's (30000, 35000] bucket with a 32,768-token context: it ends at the context length
    b = [(30000.0, 90.0), (35000.0, 100.0), (math.inf, 100.0)]
    assert share_longer(b, 32000, longest=32768) == pytest.approx(0.10 * 768 / 2768)
    assert share_longer(b, 32768, longest=32768) == 0.0
    assert share_longer(b, 40000, longest=32768) == 0.0


def test_no_quantile_of_the_others_when_every_prompt_is_too_long():
    s = svc(prefill={"autoscaling": AUTO})
    longest = longest_prompt_in_time(s, 1.0)
    ttft = ((1.0, 0.0), (2.5, 99.0), (math.inf, 100.0))
    obs = Observation(histogram_quantile(0.99, ttft), None, mean_isl=30000.0,
                      prompt_buckets=((float(longest), 0.0), (math.inf, 100.0)), latency_buckets=ttft)
    out = plan_service(s, {"prefill": PoolInput(PoolState(4, 4), obs, 100.0)}, {}, now=100.0)["prefill"]
    # judged on the quantile of all (2b decides whether the feedback helps)
    assert "of the prompts" not in out.reason and "ttft p99 2500ms above target" in out.reason


def test_a_pool_without_a_start_of_its_own_leads_a_ramp_with_the_other_pools():
    """Rule 3d extrapolates a rising demand over the pool's observed start time; prefill that
    has not scaled up yet takes decode's (the same model and image), and only until its own."""
    from pd_operator.autoscale.decide import History
    s = svc(prefill={"autoscaling": {**AUTO, "maxReplicas": 40}})
    cap = estimate_capacity(s, "prefill", 2000.0, None)
    reasons = {}
    for decode_start in (None, 120.0):
        histories = {"decode": History(start_seconds=decode_start)}
        for i in range(7):  # the prompt tokens rise 5 % of the start a round
            now = 100.0 + 30 * i
            obs = Observation(0.5, 4.0 * cap * (1 + 0.05 * i), mean_isl=2000.0)
            out = plan_service(s, {"prefill": PoolInput(PoolState(5, 5), obs, now),
                                   "decode": PoolInput(PoolState(1, 1), None, now)}, histories, now=now)
        reasons[decode_start] = out["prefill"].reason
        assert histories["prefill"].start_seconds is None  # borrowed, not recorded as its own
    assert "rising" not in reasons[None]
    assert re.search(r"rising [^)]* in 1[45]0s, when pods ordered now serve", reasons[120.0]), reasons[120.0]
