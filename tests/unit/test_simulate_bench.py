"""Smoke run of the autoscaling benchmark (30 simulated minutes around the evening surge,
rates x0.2): deterministic for a seed, and its basic orderings hold.  Not a timed test."""

from __future__ import annotations

from dataclasses import replace

from pd_operator_tools.autoscalesim import benchmark, policies, reference, runner
from pd_operator_tools.autoscalesim.trace import REFERENCE, TRACES, Surge

SMOKE = replace(REFERENCE, start_h=19.9, hours=0.5, rate_scale=0.2)


def test_trace_is_a_function_of_its_parameters():
    assert REFERENCE.rate(4 * 3600) == 5.0
    assert abs(REFERENCE.rate(12 * 3600) - 20.0) < 1e-9
    assert abs(REFERENCE.rate(21 * 3600) - 60.0) < 1e-9            # 3x surge, held
    assert abs(REFERENCE.rate((20 + 7.5 / 60) * 3600) - 40.0) < 1e-6  # half-way up the 15-min ramp
    assert abs(REFERENCE.rate((22 + 15 / 60) * 3600) - 40.0) < 1e-6   # half-way down the 30-min ramp
    a = list(SMOKE.arrivals())
    assert a == list(SMOKE.arrivals()) and a != list(replace(SMOKE, seed=1).arrivals())
    assert all(1 <= isl <= 8192 and 1 <= osl <= 4096 for _, isl, osl in a)
    flash = replace(REFERENCE, surges=(Surge(11.0, 1, 11.25, 1, 4.0),))
    assert abs(flash.rate(11.1 * 3600) - 80.0) < 1e-6 and set(TRACES) >= {"reference", "flash-crowd"}


def test_smoke_run_invariants():
    results = {r.name: r for r in benchmark.run_all(SMOKE, out=None, log=lambda s: None, jobs=1)}
    assert set(results) == {"oracle", "pd-operator", "static-peak", "static-mean", "hpa", "dynamo"}
    oracle, peak, mean = results["oracle"], results["static-peak"], results["static-mean"]
    assert oracle.goodput >= 0.99
    # static-peak holds the oracle's largest size all the time: it pays at least as much and serves as well
    assert peak.gpu_hours >= oracle.gpu_hours and peak.goodput >= oracle.goodput - 0.005
    # static-mean holds the oracle's mean size: never more than the peak, never better served
    assert mean.gpu_hours <= peak.gpu_hours and mean.goodput <= peak.goodput
    for r in results.values():
        assert r.requests > 1000 and 0.0 <= r.goodput <= 1.0 and r.gpu_hours > 0
        assert r.ratio == r.gpu_hours / oracle.gpu_hours


def test_deterministic_for_a_seed():
    init = {"prefill": 1, "decode": 1}
    a = runner.run_policy(SMOKE, policies.HPA(init))
    b = runner.run_policy(SMOKE, policies.HPA(init))
    assert (a.goodput, a.gpu_hours, a.actions, a.ttft_p99, a.per_min) == (b.goodput, b.gpu_hours, b.actions, b.ttft_p99, b.per_min)


def test_pd_operator_policy_is_the_operators_code_path():
    """The benchmark's pd-operator policy is plan_service on a validated PDInferenceService
    with the benchmark's settings (min 1, max 32 per pool, 48 GPUs, 30 s, default targets)."""
    svc = reference.reference_service()
    for pool in (svc.spec.prefill, svc.spec.decode):
        a = pool.autoscaling
        assert a.enabled and (a.min_replicas, a.max_replicas, a.tolerance) == (1, reference.MAX_PER_POOL, 0.1)
        assert pool.tensor_parallel_size == 1 and svc.spec.model.name == "Qwen/Qwen3-8B"
    assert svc.spec.autoscaling.max_total_gpus == reference.BUDGET and svc.spec.autoscaling.interval == "30s"
    policy = policies.make_policy("pd-operator", {"prefill": 1, "decode": 1}, None, None, 27_500.0, None, None, 6_120.0)
    assert isinstance(policy, policies.PdOperator) and policy.interval == 30.0
    r = runner.run_policy(replace(SMOKE, hours=0.25), policy)
    assert r.requests > 1000 and policy.reasons  # it scaled, through plan_service, with reasons
    assert all(role in ("prefill", "decode") and "->" in why for _, role, why in policy.reasons)


def test_oracle_without_lookahead_loses_a_flash_crowd_the_clairvoyant_oracle_serves():
    """The suite's ``oracle-now`` row (the oracle's sizes ordered when the minute comes, pods
    still 120 s to start) against the oracle (ordered a pod start ahead): on a step of the
    load, only the one that knows the future serves the first minutes."""
    from pd_operator.perfmodel.costmodel import CostModel
    from pd_operator_tools.autoscalesim import suite
    from pd_operator_tools.autoscalesim.oracle import oracle_need

    entry = next(e for e in suite.SUITE if e.name == "flash-crowd")
    trace = entry.window(1.0)
    trace = replace(trace, hours=0.5, rate_scale=trace.rate_scale * 0.25)  # 10:45-11:15, the step at 11:00
    need = oracle_need(trace, CostModel(), *suite.ORACLE_U)
    ahead = runner.run_policy(trace, policies.Scheduled(need), CostModel())
    now = runner.run_policy(trace, policies.Scheduled(need, lead=0.0), CostModel())
    assert ahead.goodput >= 0.99 and now.goodput < ahead.goodput - 0.03
