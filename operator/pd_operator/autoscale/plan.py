"""One autoscaling round for one service: both pools' decisions within the
GPU budget. Pure: the caller brings state, observations, histories and time.

Each pool's signal is built here from its observation: the latency quantile,
the demand, the secondary signals, and the capacity of one replica (given by
the caller, else the pool's ``capacityPerReplica``, else the cost model's
estimate at the observed mean ISL/OSL: :mod:`.capacity`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Protocol

from ..api.constants import ROLES
from ..api.models import PDInferenceService, duration_seconds
from .capacity import (Capacity, latency_floor, longest_prompt_in_time, max_prompt_tokens, pool_capacity,
                       prefill_time_ratio, share_longer, si, step_time_ratio)
from .decide import Change, Decision, History, PoolClaim, PoolState, Signal, decide, is_settled, rising, share_budget
from .promql import SECONDARY, Observation, histogram_quantile



@dataclass(frozen=True)
class PoolInput:
    state: PoolState
    observation: Observation | None
    observed_at: float | None
    # one replica's capacity at the target (model floor); None: capacityPerReplica or the cost model's estimate
    capacity: float | None = None


# The prefill queue is offered load to be served within one rate window (seconds).
QUEUE_DRAIN_S = 60.0


# Online check of the cost model's step time: weight of a new measurement. The engines'
# speed is a property of the hardware, learned over ~10 settled rounds; a ramp's young
# decode streams (a shorter context than the steady-state mean) read faster for a round or two.
STEP_RATIO_WEIGHT = 0.1
# A measured step time below half the model's is taken as half, above twice as twice: one
# window cannot double the capacity, or outweigh ten others.
MIN_STEP_RATIO, MAX_STEP_RATIO = 0.5, 2.0


def step_ratio(svc: PDInferenceService, role: str, inp: PoolInput, history: History, now: float) -> float | None:
    """The pool's engines' step time over the cost model's (decode: capacity.step_time_ratio,
    from the mean ITL; prefill: capacity.prefill_time_ratio, from the mean prefill time),
    measured on a settled pool only (decide.is_settled: the window then holds the pool as it
    is), smoothed (each reading as it is: an average of readings cut at 1 would read engines
    as fast as the model as faster). Decode takes it either way: the mean ITL is the mean step
    at the batch the engines ran, a direct reading (0.98-1.0 where the engines are the model,
    0.82 where they are 0.8 of it, on the benchmark), and engines slower than the model have
    less capacity than it says, which the narrow headroom of a steady demand (decide's rule
    3e) cannot absorb. Prefill takes it only below 1: its reading errs towards slower engines
    by design (capacity.prefill_time_ratio: 1.0-1.6x the truth on the simulated engine), so a
    step time above the model's is left to the saturation correction (rule 3b), which reads
    what a full pool produces and needs no step model. A passing slowdown (a noisy neighbour)
    is forgotten as it was learned, over ~10 settled rounds. The latency feedback still guards
    the target either way."""
    obs, state = inp.observation, inp.state
    if obs is None:
        return None
    # not on a rising demand: young streams (a context shorter than the steady-state mean)
    # step faster than the model there, and would read as faster engines
    ramp = rising(history, obs.demand, svc.spec.pool(role).autoscaling.tolerance)
    if obs.running_total and is_settled(state, history, now) and ramp is None:
        per_replica = obs.running_total / state.ready
        if role == "decode":
            r = step_time_ratio(svc, obs.mean_isl, obs.mean_osl, obs.osl_bias, per_replica, obs.mean_itl)
        else:
            r = prefill_time_ratio(svc, obs.mean_isl, per_replica, obs.mean_prefill_time, obs.cached_share)
        if r is not None:
            r = min(MAX_STEP_RATIO, max(MIN_STEP_RATIO, r))
            prior = 1.0 if history.step_ratio is None else history.step_ratio  # the model until measured
            history.step_ratio = (1 - STEP_RATIO_WEIGHT) * prior + STEP_RATIO_WEIGHT * r
    if history.step_ratio is None:
        return None
    return history.step_ratio if role == "decode" else min(1.0, history.step_ratio)


def learning_basis(svc: PDInferenceService, role: str) -> str:
    """A digest of what the learned capacity correction (rule 3b), step time (3b') and the sizes
    seen too small (2d) depend on:
    the model, the engine (kind, image, its settings) and the pool's settings but its size and
    its autoscaling policy. A change of it (a new engine image, another TP, another GPU, other
    flags) forgets what was learned on the old one."""
    spec = svc.spec
    pool = spec.pool(role).model_dump(mode="json", exclude={"replicas", "autoscaling"})
    basis = {"model": spec.model.model_dump(mode="json"), "engine": spec.engine.model_dump(mode="json"), "pool": pool}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def _relearn_on_change(svc: PDInferenceService, role: str, history: History) -> None:
    basis = learning_basis(svc, role)
    if history.basis != basis:
        if history.basis is not None or history.step_ratio is not None or history.capacity_factor < 1.0:
            history.capacity_factor, history.step_ratio = 1.0, None
            history.overloads = []
        history.basis = basis


def _capacity(svc: PDInferenceService, role: str, inp: PoolInput, ratio: float | None = None) -> Capacity | None:
    if inp.capacity is not None:
        return Capacity(inp.capacity, "given")
    obs = inp.observation
    return pool_capacity(svc, role, obs.mean_isl if obs else None, obs.mean_osl if obs else None,
                         obs.osl_bias if obs else None, ratio,
                         obs.cached_share if obs and role == "prefill" else None)


def offered_load(role: str, obs: Observation | None) -> float | None:
    """The pool's demand as offered load, not only what it produced (a saturated pool
    produces its capacity, whatever is offered): decode, generated tokens/s x (running +
    waiting) / running (each waiting stream would generate as a running one does);
    prefill, the arrivals (prompt tokens/s produced plus the backlog's growth: a fluid
    queue's balance) and the backlog (waiting and running prompts) to clear within
    ``QUEUE_DRAIN_S``, both x the mean ISL (a prefill engine admits up to max-num-seqs
    prompts and shares its chunked steps among them: its backlog shows as running; found by
    the closed-loop test). The backlog as it is now, not averaged over the window, which
    lags a growing one by half the window (found by the flash-crowd trace). Without the
    queue gauges: what the pool produced."""
    if obs is None or obs.demand is None:
        return None
    produced, waiting = obs.demand, obs.waiting_total or 0.0
    if role == "decode":
        if waiting <= 0:
            return produced
        running = obs.running_total or 0.0
        return produced * (running + waiting) / running if running > 0 and produced > 0 else produced
    # prefill: a running prompt is not prefilled yet either (an engine admits up to max-num-seqs
    # prompts and shares its chunked steps among them: a backlog shows as running, not waiting)
    backlog = obs.backlog_now if obs.backlog_now is not None else waiting + (obs.running_total or 0.0)
    growth = max(0.0, obs.backlog_growth or 0.0)  # a shrinking backlog: arrivals below what was produced
    return produced + (growth + backlog / QUEUE_DRAIN_S) * (obs.mean_isl or 0.0)


def decode_offered_from_prefill(prefill: Observation | None, decode: Observation | None) -> float | None:
    """Generated tokens/s the requests offered to prefill will ask of decode: prefill's offered
    prompt tokens/s / mean ISL (requests/s, its queue included) x mean OSL. A backlog in front of
    prefill is decode's load a prefill step later; without this, decode sees it only once prefill
    has caught up (found by the flash-crowd trace)."""
    offered = offered_load("prefill", prefill)
    if offered is None or decode is None or not decode.mean_isl or not decode.mean_osl:
        return None
    return offered / decode.mean_isl * decode.mean_osl


def feasible_quantile(svc: PDInferenceService, role: str, obs: Observation | None,
                      ratio: float | None = None) -> tuple[float, str] | None:
    """The TTFT quantile of the prompts that can meet the target, and what it is (rule 2c):
    a prompt whose prefill alone takes longer than the target on an idle replica
    (capacity.longest_prompt_in_time, at the engines' measured speed ``ratio``) misses it
    whatever the pool's size. With a share ``f`` of such prompts (the prompt-length
    histogram, capacity.share_longer), the quantile q of the others is the quantile
    q x (1 - f) of all the pool's TTFTs, at the target: every prompt too long takes longer
    than the target, so below it the two distributions count the same requests: the value is
    exact at and below the target, and above it a lower bound (a scale-up is sized on less
    than the others' own quantile; the demand floor and the next rounds make up for it). An
    error of ``f`` (its bucket is interpolated) moves the quantile judged; it never takes the
    pool below the demand floor, which 2c needs anyway (both come from the cost model). None
    (judge the quantile of all) where the cost model does not apply, without both
    histograms, with no prompt too long or all of them, or an idle pool."""
    policy = svc.spec.pool(role).autoscaling
    if (role != "prefill" or policy.target.metric != "ttft" or obs is None or not obs.observed
            or not obs.prompt_buckets or not obs.latency_buckets):
        return None
    target = duration_seconds(policy.target.value)
    longest = longest_prompt_in_time(svc, target, ratio)
    if longest is None:
        return None
    share = share_longer(obs.prompt_buckets, longest, max_prompt_tokens(svc))
    if not share or share >= 1:
        return None  # none too long; or all of them: no quantile of the others to judge
    q = policy.target.quantile * (1 - share)
    observed = histogram_quantile(q, obs.latency_buckets)
    if observed is None:
        return None
    return observed, (f"of the prompts that can make it (p{q * 100:.3g} of all: {share:.2%} are longer than "
                      f"{si(longest)} tokens, which one replica alone prefills in more than {target * 1000:.0f}ms)")


def _signal(svc: PDInferenceService, role: str, inp: PoolInput, upstream: float | None = None,
            ratio: float | None = None) -> Signal:
    obs = inp.observation
    capacity = _capacity(svc, role, inp, ratio)
    observed, note = feasible_quantile(svc, role, obs, ratio) or (obs.observed if obs else None, None)
    # secondary signals by metric, those with data only
    secondaries = {metric: getattr(obs, name) for metric, (_, name) in SECONDARY.items()
                   if obs is not None and getattr(obs, name) is not None}
    return Signal(
        observed=observed,
        observed_note=note,
        observed_at=inp.observed_at if obs and obs.observed is not None else None,
        demand=_max(offered_load(role, obs), upstream),
        capacity=capacity.per_replica if capacity else None,
        capacity_steady=capacity.steady if capacity else None,
        capacity_note=capacity.describe() if capacity else None,
        secondaries=secondaries,
        floor=latency_floor(svc, role, obs.mean_isl, obs.mean_osl, obs.osl_bias, ratio) if obs else None,
        produced=obs.demand if obs else None,
        utilization=capacity.utilization if capacity else 1.0,
        waiting=obs.waiting_total if obs else None,
        waiting_min=obs.waiting_min if obs else None,
        latency_saturates=role == "decode",
    )


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


class Room(Protocol):
    """The GPUs free now, as the caller sees the cluster (fit.py on its nodes and pods)."""

    def room(self, role: str) -> int | None:
        """More replicas of the pool that fit on the free GPUs; None: unknown."""

    def take(self, role: str, count: int) -> None:
        """Book ``count`` more replicas of the pool."""


def plan_service(svc: PDInferenceService, inputs: dict[str, PoolInput], histories: dict[str, History], now: float,
                 room: Room | None = None) -> dict[str, Decision]:
    """Decisions for the pools whose autoscaling is enabled: each pool's own
    (decide), fitted into ``maxTotalGPUs`` (share_budget), then into the GPUs
    free now (``room``): scale-ups are granted to the pool under the most
    pressure first, so a pool never grows into GPUs that do not exist."""
    spec = svc.spec
    interval = duration_seconds(spec.autoscaling.interval)
    decisions: dict[str, Decision] = {}
    claims = []
    for role in ROLES:
        pool = spec.pool(role)
        if not pool.autoscaling.enabled or role not in inputs:
            continue
        inp = inputs[role]
        upstream = None
        if role == "decode" and "prefill" in inputs:
            upstream = decode_offered_from_prefill(inputs["prefill"].observation, inp.observation)
        history = histories.setdefault(role, History())
        _relearn_on_change(svc, role, history)
        signal = _signal(svc, role, inp, upstream, step_ratio(svc, role, inp, history, now))
        sibling = histories.get(next(r for r in ROLES if r != role))
        if sibling is not None and sibling.start_seconds is not None:
            signal = replace(signal, sibling_start_seconds=sibling.start_seconds)
        d = decide(pool.autoscaling, inp.state, signal, history, now, interval)
        decisions[role] = d
        target = duration_seconds(pool.autoscaling.target.value)
        pressure = (signal.observed / target) if signal.observed is not None else 0.0
        claims.append(PoolClaim(role, inp.state.replicas, d.replicas, pool.gpus_per_replica(), pressure))
    budget = spec.autoscaling.max_total_gpus
    if budget is not None and claims:
        # pools that do not autoscale still use their GPUs
        fixed = sum(spec.pool(r).gpus_per_replica() * inputs[r].state.replicas
                    for r in ROLES if r in inputs and r not in decisions)
        shared = share_budget(claims, budget, reserved=fixed)
        for role, (replicas, cut) in shared.items():
            if cut:
                _cut(decisions, histories, inputs, role, replicas, cut, now)
    if room is not None:
        for claim in sorted(claims, key=lambda c: -c.pressure):
            role, current = claim.role, claim.current
            if decisions[role].replicas <= current:
                continue
            fits = room.room(role)
            if fits is not None and decisions[role].replicas > current + fits:
                _cut(decisions, histories, inputs, role, current + fits,
                     f"capped at {current + fits}: the free GPUs fit {fits} more replica(s)", now)
            room.take(role, decisions[role].replicas - current)
    return decisions


def _cut(decisions: dict[str, Decision], histories: dict[str, History], inputs: dict[str, PoolInput], role: str,
         replicas: int, why: str, now: float) -> None:
    """Lower a pool's scale-up to ``replicas`` for ``why``; its reason and history follow."""
    d = decisions[role]
    current = inputs[role].state.replicas
    body = d.reason.split(": ", 1)[1] if d.reason.startswith(f"{current} -> ") else d.reason
    prefix = f"{current} -> {replicas}: " if replicas != current else ""
    decisions[role] = Decision(replicas, f"{prefix}{body}; {why}", d.metrics_available, d.recommendation)
    _amend_last_change(histories[role], now, current, replicas)


def _amend_last_change(history: History, now: float, before: int, after: int) -> None:
    """A cut of a change decide() recorded: remember what really happened."""
    if history.changes and history.changes[-1].at == now:
        history.changes.pop()
    if after != before:
        history.changes.append(Change(now, before, after))
    if history.scaled_up is not None and history.scaled_up[0] == now:
        history.scaled_up = (now, after) if after > before else None
