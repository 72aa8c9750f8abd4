"""Both pools of one service in one round: enabled pools only, GPU budget with
the fixed pool's GPUs counted, history amended when the budget cuts."""

from __future__ import annotations

from pd_operator.api import validate_service
from pd_operator.autoscale.decide import PoolState
from pd_operator.autoscale.plan import PoolInput, plan_service
from pd_operator.autoscale.promql import Observation
from tests.conftest import minimal

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


def test_missing_observation_holds():
    s = svc(prefill={"autoscaling": AUTO})
    out = plan_service(s, {"prefill": PoolInput(PoolState(3, 3), None, 100.0), "decode": PoolInput(PoolState(1, 1), None, 100.0)}, {}, now=100.0)
    assert out["prefill"].replicas == 3 and not out["prefill"].metrics_available
