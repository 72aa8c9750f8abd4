"""The behaviour rules against HPA's own code (k8s.io/kubernetes v1.37.2,
pkg/controller/podautoscaler/horizontal.go): the rate limits' base, their rounding
and direction, and the stabilization windows."""

from __future__ import annotations

from pd_operator.api.models import ScalingRules
from pd_operator.autoscale.decide import DEFAULT_DOWN, DEFAULT_UP, Change, History, apply_behavior


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
