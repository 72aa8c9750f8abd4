"""The behaviour rules against HPA's own code (k8s.io/kubernetes v1.37.2,
pkg/controller/podautoscaler/horizontal.go): the rate limits' base, their rounding
and direction, and the stabilization windows."""

from __future__ import annotations

from pd_operator.api.models import ScalingRules
from pd_operator.autoscale.decide import DEFAULT_DOWN, DEFAULT_UP, Change, Event, History, apply_behavior


def rules(*policies, window=0, select="Max"):
    return ScalingRules(stabilization_window_seconds=window, select_policy=select,
                        policies=[{"type": t, "value": v, "period_seconds": p} for t, v, p in policies])


def test_a_rate_limit_never_moves_the_pool_against_the_recommendation():
    # 10 -> 20 ten seconds ago; scale-up allows 4 pods per minute: the limit (10 + 4 = 14) is
    # below the current 20. HPA holds at the current size (horizontal.go:1327-1330, "We
    # shouldn't scale up further until the scaleUpEvents will be cleaned up"), never scales down
    h = History(changes=[Change(990.0, 10, 20)])
    desired, _ = apply_behavior(25, 20, h, 1000.0, up_rules=rules(("Pods", 4, 60)), down_rules=DEFAULT_DOWN)
    assert desired == 20
    # and the mirror image (horizontal.go:1350-1353): 10 -> 4 ten seconds ago, 1 pod down per minute
    h = History(changes=[Change(990.0, 10, 4)])
    desired, _ = apply_behavior(2, 4, h, 1000.0, up_rules=DEFAULT_UP, down_rules=rules(("Pods", 1, 60)))
    assert desired == 4


def test_the_rate_limit_counts_from_the_size_at_the_start_of_the_period():
    # HPA's base is the replicas periodSeconds ago: current - added + deleted, both directions
    # (horizontal.go:1447-1449 and 1476-1478). 10 -> 5 ten seconds ago, now 20 wanted: the
    # period began at 10, so the default max(+100 %, +4) per 15 s allows 20 (not 2 x 5 = 10)
    h = History(changes=[Change(990.0, 10, 5)])
    assert apply_behavior(20, 5, h, 1000.0, DEFAULT_UP, DEFAULT_DOWN)[0] == 20
    # 5 -> 10 ten seconds ago, 1 pod down per 60 s: the period began at 5, limit 4
    h = History(changes=[Change(990.0, 5, 10)])
    assert apply_behavior(2, 10, h, 1000.0, DEFAULT_UP, rules(("Pods", 1, 60)))[0] == 4


def test_a_percent_scale_down_limit_is_rounded_down():
    # HPA: int32(periodStartReplicas x (1 - value/100)), a truncation (horizontal.go:1482):
    # 50 % of 3 may go down to 1; the scale-up limit alone is rounded up (horizontal.go:1453)
    assert apply_behavior(1, 3, History(), 1000.0, DEFAULT_UP, rules(("Percent", 50, 60)))[0] == 1
    assert apply_behavior(1, 5, History(), 1000.0, DEFAULT_UP, rules(("Percent", 10, 60)))[0] == 4
    assert apply_behavior(9, 3, History(), 1000.0, rules(("Percent", 50, 60)), DEFAULT_DOWN)[0] == 5


def test_the_stabilization_window_excludes_a_recommendation_exactly_window_seconds_old():
    # HPA keeps a recommendation while rec.timestamp.After(now - window) (horizontal.go:1275,
    # 1278): one exactly 300 s old is out. At 30 s rounds on a steady clock the 11th round
    # back was still holding a scale-down
    h = History(recommendations=[Event(700.0, 8)])
    assert apply_behavior(2, 8, h, 1000.0, DEFAULT_UP, rules(("Percent", 100, 15), window=300))[0] == 2
    h = History(recommendations=[Event(700.0, 2)])
    assert apply_behavior(8, 2, h, 1000.0, rules(("Percent", 1000, 15), window=300), DEFAULT_DOWN)[0] == 8
    h = History(recommendations=[Event(701.0, 2)])
    assert apply_behavior(8, 2, h, 1000.0, rules(("Percent", 1000, 15), window=300), DEFAULT_DOWN)[0] == 2


def test_the_first_round_seeds_the_scale_down_window_with_the_current_size():
    # HPA records the target's current replicas as a recommendation the first time it sees it
    # (recordInitialRecommendation, horizontal.go:802-808, called at :883 before the metrics
    # are read), so a new autoscaler (or one that restarted with no memory) does not scale
    # down within its first stabilization window
    from pd_operator.api.models import PrefillAutoscaling
    from pd_operator.autoscale.decide import PoolState, Signal, decide

    pol = PrefillAutoscaling(enabled=True, min_replicas=1, max_replicas=10)
    h = History()
    d = decide(pol, PoolState(replicas=8, ready=8), Signal(0.1, 1000.0), h, now=1000.0)
    assert d.replicas == 8 and "window" in d.reason
    assert decide(pol, PoolState(replicas=8, ready=8), Signal(0.1, 1299.0), h, now=1299.0).replicas == 8
    assert decide(pol, PoolState(replicas=8, ready=8), Signal(0.1, 1300.0), h, now=1300.0).replicas == 1
    # seeded even when the first rounds have no data (HPA seeds before reading metrics)
    h = History()
    decide(pol, PoolState(replicas=8, ready=8), Signal(None, None), h, now=1000.0)
    assert decide(pol, PoolState(replicas=8, ready=8), Signal(0.1, 1300.0), h, now=1300.0).replicas == 1
    # no window: down at once
    pol0 = PrefillAutoscaling(enabled=True, min_replicas=1, max_replicas=10,
                              behavior={"scale_down": {"stabilization_window_seconds": 0}})
    assert decide(pol0, PoolState(replicas=8, ready=8), Signal(0.1, 1000.0), History(), now=1000.0).replicas == 1


def test_a_long_stabilization_window_survives_a_failover_in_status():
    # scaleDown.stabilizationWindowSeconds may be 3600 (the CRD's maximum): at 30 s rounds that
    # is 120 recommendations, and status keeps 64 (its maxItems). The high one that holds the
    # window must be what survives, not the newest 64 of a run of equal low ones
    from pd_operator.controller.autoscaler import MEMORY_ITEMS, histories_from_status, history_to_status

    recs = [Event(0.0, 10)] + [Event(30.0 * i, 2) for i in range(1, 71)]
    h = History(recommendations=list(recs))
    now, down = 2130.0, rules(("Percent", 100, 15), window=3600)
    assert apply_behavior(2, 10, History(recommendations=list(recs)), now, DEFAULT_UP, down)[0] == 10
    mem = history_to_status(h)
    assert len(mem["recommendations"]) <= MEMORY_ITEMS
    restored = histories_from_status({"decode": {"autoscaler": mem}})["decode"]
    assert apply_behavior(2, 10, restored, now, DEFAULT_UP, down)[0] == 10
    # the scale-up window alike: the lowest recent recommendation survives
    recs = [Event(0.0, 2)] + [Event(30.0 * i, 10) for i in range(1, 71)]
    restored = histories_from_status({"decode": {"autoscaler": history_to_status(History(recommendations=recs))}})["decode"]
    up = rules(("Percent", 1000, 15), window=3600)
    assert apply_behavior(10, 2, restored, now, up, DEFAULT_DOWN)[0] == 2


def test_the_recommendations_left_out_of_status_change_no_window():
    import random

    from pd_operator.controller.autoscaler import stabilizing

    rnd = random.Random(7)
    for _ in range(300):
        recs = [Event(30.0 * i, rnd.randint(1, 12)) for i in range(rnd.randint(1, 80))]
        kept = stabilizing(recs)
        assert kept[-1] == recs[-1]
        for _ in range(5):
            now, w = recs[-1].at + rnd.choice([0.0, 15.0, 30.0]), rnd.choice([0, 30, 300, 900, 3600])
            full = [e.replicas for e in recs if now - e.at < w]
            part = [e.replicas for e in kept if now - e.at < w]
            assert (max(full, default=None), min(full, default=None)) == (max(part, default=None), min(part, default=None))


def test_a_signal_above_target_never_recommends_fewer_replicas():
    # 6 replicas, 2 Ready, 4 Pending (Unschedulable): TTFT 1.5x the target. ceil(2 x 1.5) = 3
    # took the pool from 6 down to 3 with its latency above target. HPA counts Pending pods as
    # unready, at 0 usage on a scale-up, and keeps the current size when the count would go
    # against the metric's direction (replica_calculator.go:214, 240-259)
    from pd_operator.api.models import PrefillAutoscaling
    from pd_operator.autoscale.decide import PoolState, Signal, decide

    pol = PrefillAutoscaling(enabled=True, min_replicas=1, max_replicas=10,
                             behavior={"scale_down": {"stabilization_window_seconds": 0}})
    h = History(recommendations=[Event(0.0, 6)])
    d = decide(pol, PoolState(replicas=6, ready=2, unschedulable=4), Signal(1.5, 1000.0), h, now=1000.0)
    assert d.replicas == 6 and d.recommendation >= 6, d.reason
    # and below target never more (ready above the desired size: pods of a scale-down still terminating)
    d = decide(pol, PoolState(replicas=4, ready=8), Signal(0.8, 1030.0), h, now=1030.0)
    assert d.replicas == 4 and d.recommendation <= 4, d.reason
    # the secondary signals alike
    pol2 = PrefillAutoscaling(enabled=True, min_replicas=1, max_replicas=10,
                              behavior={"scale_down": {"stabilization_window_seconds": 0}},
                              secondary_targets=[{"metric": "queueDepth", "average_value": 4}])
    d = decide(pol2, PoolState(replicas=6, ready=2, unschedulable=4), Signal(0.2, 1060.0, secondaries={"queueDepth": 6.0}),
               History(recommendations=[Event(0.0, 6)]), now=1060.0)
    assert d.replicas == 6, d.reason


def test_a_zero_latency_target_is_refused_at_validation_not_a_division_by_zero_each_round():
    # target value "0ms" matched the Duration pattern; decide() then divided by it
    # (ZeroDivisionError every round: the pool never autoscaled and status never said why)
    import pytest
    from pydantic import ValidationError

    from pd_operator.api.models import DecodeAutoscaling, PrefillAutoscaling

    for zero in ("0ms", "0s", "0.0s", "00ms"):
        with pytest.raises(ValidationError):
            PrefillAutoscaling(enabled=True, max_replicas=3, target={"value": zero})
        with pytest.raises(ValidationError):
            DecodeAutoscaling(enabled=True, max_replicas=3, target={"value": zero})
    for ok in ("0.5s", "50ms", "1s", "1.0s", "10ms", "0.05s"):
        assert PrefillAutoscaling(enabled=True, max_replicas=3, target={"value": ok}).target.value == ok


def test_a_stalled_pool_is_not_read_as_a_pool_of_no_capacity():
    # decode pods with requests waiting at every pod and nothing generated in the window (a
    # hung engine, a KV transfer that never completes): 'saturated', and produced 0 made the
    # capacity correction halve every 90 s, doubling the floor each time up to maxReplicas,
    # and the factor (kept in status) stayed near 0 after the stall
    from pd_operator.api.models import DecodeAutoscaling
    from pd_operator.autoscale.decide import PoolState, Signal, decide

    pol = DecodeAutoscaling(enabled=True, min_replicas=1, max_replicas=32)
    h, n = History(recommendations=[Event(0.0, 4)]), 4
    for i in range(14):
        now = 1000.0 + 30 * i
        s = Signal(observed=0.0, observed_at=now, demand=8000.0, capacity=2000.0, produced=0.0, utilization=0.85,
                   waiting=40.0, waiting_min=10.0, latency_saturates=True)
        n = decide(pol, PoolState(n, n), s, h, now).replicas
    assert n == 4 and h.capacity_factor == 1.0


def test_the_windows_remember_the_recommendation_before_min_and_max():
    # HPA records the metrics' recommendation before minReplicas/maxReplicas
    # (prenormalizedDesiredReplicas, horizontal.go:1298-1300) and applies the bounds after the
    # windows (convertDesiredReplicasWithBehaviorRate, :1317-1368). Recording the clamped value
    # made an edit of the bounds wait for the windows: minReplicas lowered from 5 to 1 on a quiet
    # pool held 5 for the 300 s scale-down window; maxReplicas raised with a scale-up window held
    # the old maximum for that window
    from pd_operator.api.models import PrefillAutoscaling
    from pd_operator.autoscale.decide import PoolState, Signal, decide

    h = History()
    for t in (1000.0, 1030.0, 1060.0, 1090.0, 1120.0, 1150.0, 1180.0, 1210.0, 1240.0, 1270.0, 1300.0, 1330.0):
        d = decide(PrefillAutoscaling(enabled=True, min_replicas=5, max_replicas=10), PoolState(5, 5), Signal(0.1, t), h, t)
        assert d.replicas == 5
    d = decide(PrefillAutoscaling(enabled=True, min_replicas=1, max_replicas=10), PoolState(5, 5), Signal(0.1, 1360.0), h, 1360.0)
    assert d.replicas == 1, d.reason

    up = {"scale_up": {"stabilization_window_seconds": 120}}
    h = History()
    for t in (1000.0, 1030.0, 1060.0, 1090.0, 1120.0, 1150.0):
        d = decide(PrefillAutoscaling(enabled=True, max_replicas=5, behavior=up), PoolState(5, 5),
                   Signal(2.0, t), h, t)
        assert d.replicas == 5
    d = decide(PrefillAutoscaling(enabled=True, max_replicas=10, behavior=up), PoolState(5, 5), Signal(2.0, 1180.0), h, 1180.0)
    assert d.replicas == 10, d.reason
