"""The autoscaling decision: pure, deterministic, clock passed in.

One call decides one pool: given what the pool is (replicas, ready, starting,
unschedulable), what Prometheus saw (the latency quantile the pool is sized
on, its age, and optionally the demand), the policy (HPA-shaped) and the
history of earlier decisions, it returns the replica count and why.
:func:`share_budget` then fits both pools' decisions into the GPU budget.

The control law (docs: autoscale/README.md):

1. No or stale data -> hold (never down, never to zero), MetricsAvailable=False.
2. Feedback on the observed quantile, as HPA does on its metric:
   ``ratio = observed / target``; inside the tolerance band -> keep;
   otherwise ``ceil(ready * ratio)``.
   2b. Futility guard: when a smaller pool carrying more load per replica saw
   (nearly) the same latency, the replicas added did not lower it; the
   feedback is left out until the latency is back in the band.
   2d. A size seen above the band, settled, is not scaled back to while the
   load per replica it would carry is within the tolerance of (or above) the
   load it failed at, until it is seen within the target at such a load, a
   bigger pool reads the same latency, or an hour has passed.
3. A model-based floor when demand is known: ``ceil(demand / capacity)``,
   where ``demand`` is the offered load (plan.py: queue included);
   3b. ``capacity`` corrected online from what a saturated, settled pool
   produced per replica (and, for decode, from the step time the engines
   were measured at, either way; prefill's only when faster than the cost
   model: plan.step_ratio);
   3c. the feedback bounded by twice the floor; 3d. a demand rising by more
   than the tolerance over 3 minutes extrapolated over the pool's observed
   start time (the floor is for when the pods ordered now serve).
   3e. Under a steady demand (its 3-minute trend within the tolerance), with
   the latency not above target and no request waiting at every pod, the
   floor takes the decode capacity with its headroom on the batch
   (``Signal.capacity_steady``) instead of on the throughput: a ramp is led
   with the wide headroom, a plateau held with the narrow one.
   where ``capacity`` is what one replica serves at the target (the pool's
   ``capacityPerReplica``, or the calibrated cost model: capacity.py). Scale-up takes the larger of feedback and model;
   scale-down never goes below the model's need.
   Secondary signals (the pool's ``secondaryTargets``: waiting requests or
   KV-cache usage per replica), as HPA does with several metrics: each
   recommends ``ceil(ready * observed / averageValue)`` (the current size
   inside the tolerance band) and the pool takes the largest recommendation.
   A secondary without data is left out: it never holds back the latency
   target and never scales down. The reason names the signal that sized the
   pool whenever more than the latency fed the decision.
4. Guards: no scale-up while pods are Unschedulable (they would only add
   Pending pods); no scale-down while pods are starting (their capacity is not
   observed yet); min/max bounds. (plan.py then caps scale-ups at what the
   free GPUs fit, fit.py, when the caller can see the nodes.)
5. HPA behaviour: stabilization windows (up: lowest recommendation in the
   window, down: highest) and rate-limit policies per period, selectPolicy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..api.models import PoolAutoscaling, ScalingRules, duration_seconds
from .capacity import si

# HPA's defaults (autoscaling/v2): up: max(100%, 4 pods) per 15 s, no window;
# down: 100% per 15 s, 300 s window.
DEFAULT_UP = ScalingRules(stabilization_window_seconds=0, select_policy="Max",
                          policies=[{"type": "Percent", "value": 100, "period_seconds": 15},
                                    {"type": "Pods", "value": 4, "period_seconds": 15}])
DEFAULT_DOWN = ScalingRules(stabilization_window_seconds=300, select_policy="Max",
                            policies=[{"type": "Percent", "value": 100, "period_seconds": 15}])


@dataclass(frozen=True)
class PoolState:
    """What the pool is right now."""

    replicas: int          # desired replicas currently set on the StatefulSet
    ready: int             # pods Ready
    starting: int = 0      # pods scheduled but not Ready yet
    unschedulable: int = 0  # pods Pending with PodScheduled=False
    # replicas the workload has seen but has no pod for (its controller could not create them:
    # a ResourceQuota, Pod Security): no Pending pod shows them
    uncreated: int = 0


@dataclass(frozen=True)
class Signal:
    """What Prometheus saw for the pool."""

    observed: float | None          # the target quantile of the pool's latency, seconds (None: no data)
    observed_at: float | None       # when (seconds, same clock as ``now``)
    # what ``observed`` is when not the policy's quantile of every request (rule 2c), for the reason
    observed_note: str | None = None
    demand: float | None = None     # load in the unit of ``capacity`` (e.g. prompt tokens/s, running streams)
    capacity: float | None = None   # what one replica serves at the target, same unit
    # what one replica serves at the target under a steady demand (rule 3e), same unit; None: ``capacity``
    capacity_steady: float | None = None
    capacity_note: str | None = None  # where ``capacity`` comes from, for the reason (e.g. "capacity 41k tok/s/replica (cost model)")
    # secondary signals by metric (``queueDepth``, ``kvCacheUsage``): the observed average per replica;
    # a metric missing here has no data
    secondaries: Mapping[str, float] = field(default_factory=dict)
    # the pool's latency with no load (seconds; capacity.latency_floor), None: unknown (taken as 0)
    floor: float | None = None
    # what the pool produced (same unit as ``demand``; demand = produced + the queue's offered load),
    # for the online capacity correction; None: unknown (no correction)
    produced: float | None = None
    # the headroom ``capacity`` carries (capacity = utilization x what one replica sustains at the
    # target): a saturated replica is compared with capacity / utilization
    utilization: float = 1.0
    # requests waiting in the pool's queues (sum over its pods); None: unknown
    waiting: float | None = None
    # the least of the pods' waiting requests (each averaged over the window); None: unknown
    waiting_min: float | None = None
    # the latency alone shows saturation (decode: one step is shared by the whole batch, so an
    # ITL above target is load); False: saturation also needs a queue (prefill: a few long
    # prompts raise the TTFT quantile of a pool that is not full)
    latency_saturates: bool = False
    # seconds from a scale-up to Ready last observed on the service's other pool (the same model
    # and image), rule 3d's lead until this pool's own start has been observed; None: unknown
    sibling_start_seconds: float | None = None


@dataclass(frozen=True)
class Event:
    """One past recommendation of the pool."""

    at: float
    replicas: int


@dataclass(frozen=True)
class Change:
    """One past resize of the pool."""

    at: float
    before: int
    after: int


@dataclass(frozen=True)
class Sample:
    """The pool's latency quantile at a size (for the futility guard)."""

    at: float
    ready: int
    observed: float
    load: float | None = None  # demand per Ready replica


@dataclass(frozen=True)
class Overload:
    """A size the pool was seen above its latency band at, settled (rule 2d)."""

    at: float
    ready: int
    load: float  # what the pool produced per Ready replica (the demand where that is unknown)
    observed: float  # the latency quantile then


@dataclass
class History:
    """What the decision remembers between calls (kept by the caller)."""

    recommendations: list[Event] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    # online correction of the per-replica capacity (rule 3b): observed / modelled, <= 1
    capacity_factor: float = 1.0
    # latency above target at each size (futility guard, rule 2b); futile: the latency level at
    # which adding replicas was found not to lower it (None: feedback trusted)
    samples: list[Sample] = field(default_factory=list)
    futile: float | None = None
    # the sizes seen above the latency band, settled, the newest per size (rule 2d)
    overloads: list[Overload] = field(default_factory=list)
    saturated_since: float | None = None  # since when the pool has been saturated without a break
    # the pool's engines' step time over the cost model's, measured on a settled pool and
    # smoothed (plan.step_ratio: decode either way, prefill only below 1); None: not measured yet
    step_ratio: float | None = None
    # the offered demand of the last TREND_S (rule 3d), (at, demand)
    demands: list[tuple[float, float]] = field(default_factory=list)
    # seconds from a scale-up to its pods Ready, as last observed (rule 3d); None: not yet
    start_seconds: float | None = None
    scaled_up: tuple[float, int] | None = None  # (when, to how many) of the scale-up awaited, for start_seconds
    # what capacity_factor and step_ratio were learned on (plan.learning_basis: the engine, model and
    # pool settings they depend on); None: not recorded yet
    basis: str | None = None

    def not_after(self, now: float) -> None:
        """Recommendations and resizes stamped after ``now`` (written by a replica whose clock
        runs ahead of this one's, or before this clock stepped back) count as made now: kept,
        they would stay in every window until this clock caught up with them. Demand and
        latency readings from after ``now`` are dropped: a reading belongs at its time, and
        stacked at ``now`` they would bend the trend (rule 3d) and the futility check."""
        self.recommendations = [e if e.at <= now else Event(now, e.replicas) for e in self.recommendations]
        self.changes = [c if c.at <= now else Change(now, c.before, c.after) for c in self.changes]
        self.demands = [x for x in self.demands if x[0] <= now]
        self.samples = [x for x in self.samples if x.at <= now]
        self.overloads = [x if x.at <= now else replace(x, at=now) for x in self.overloads]
        if self.saturated_since is not None and self.saturated_since > now:
            self.saturated_since = now

    def prune(self, now: float, keep_seconds: float) -> None:
        self.recommendations = [e for e in self.recommendations if now - e.at <= keep_seconds]
        self.changes = [c for c in self.changes if now - c.at <= keep_seconds]
        self.samples = [x for x in self.samples if now - x.at <= FUTILITY_MEMORY_S]
        self.demands = [x for x in self.demands if now - x[0] <= TREND_S]

    def demand_slope(self) -> float | None:
        """Least-squares slope of the demand over the last TREND_S (per second); None with fewer
        than 3 samples or a span under TREND_MIN_SPAN_S."""
        pts = self.demands
        if len(pts) < 3 or pts[-1][0] - pts[0][0] < TREND_MIN_SPAN_S:
            return None
        mt = sum(t for t, _ in pts) / len(pts)
        md = sum(d for _, d in pts) / len(pts)
        var = sum((t - mt) ** 2 for t, _ in pts)
        return sum((t - mt) * (d - md) for t, d in pts) / var if var > 0 else None


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    metrics_available: bool
    recommendation: int  # before behaviour/guards, for status and debugging

    @property
    def message(self) -> str:
        return self.reason


def _rules(rules: ScalingRules | None, default: ScalingRules) -> ScalingRules:
    if rules is None:
        return default
    return ScalingRules(
        stabilization_window_seconds=(rules.stabilization_window_seconds
                                      if rules.stabilization_window_seconds is not None else default.stabilization_window_seconds),
        select_policy=rules.select_policy or default.select_policy,
        policies=rules.policies or default.policies,
    )


def _rate_limit(rules: ScalingRules, current: int, history: History, now: float, up: bool) -> int:
    """The furthest the pool may move from ``current`` now, as HPA computes it:
    each policy allows ``value`` pods (or percent) per ``periodSeconds``,
    counted from the size at the start of the period (the current size less what
    was added plus what was removed within it, both directions: HPA
    horizontal.go:1447-1449, 1476-1478); selectPolicy Max picks
    the most permissive policy, Min the least, Disabled forbids the direction."""
    if rules.select_policy == "Disabled":
        return current
    limits = []
    for p in rules.policies:
        recent = [c for c in history.changes if now - c.at < p.period_seconds]
        start = current - sum(c.after - c.before for c in recent)
        if up:
            limits.append(start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100)))
        else:
            # truncated, as HPA's int32() (horizontal.go:1482): rounded up, 10 % of a pool under 10
            # replicas would never allow a scale-down at all
            limits.append(start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100)))
    if not limits:
        return current
    most_permissive = max if up else min
    least_permissive = min if up else max
    return (most_permissive if rules.select_policy == "Max" else least_permissive)(limits)


def apply_behavior(rec: int, current: int, history: History, now: float,
                   up_rules: ScalingRules = DEFAULT_UP, down_rules: ScalingRules = DEFAULT_DOWN,
                   lo: int | None = None) -> tuple[int, str]:
    """HPA's behaviour on a recommendation: the stabilization windows (up: the
    lowest recommendation in the window, down: the highest), then the rate
    limits. Records ``rec`` in ``history.recommendations``; the caller records
    the resize it makes (``history.changes``) and applies min/max after (``rec`` is
    the recommendation before them, as HPA records it; ``lo``: minReplicas, for the
    note only). Returns the size and a note for the reason ("" when the windows did
    not hold the pool back)."""
    window_up = up_rules.stabilization_window_seconds or 0
    window_down = down_rules.stabilization_window_seconds or 0
    # HPA's windows: this recommendation and those younger than the window (a strict cutoff,
    # rec.timestamp.After(now - window): horizontal.go:1275-1281)
    in_up = [rec] + [e.replicas for e in history.recommendations if now - e.at < window_up]
    in_down = [rec] + [e.replicas for e in history.recommendations if now - e.at < window_down]
    history.recommendations.append(Event(now, rec))
    desired, note = current, ""
    if rec > current:
        desired = max(current, min(in_up))
    elif rec < current:
        desired = min(current, max(in_down))
        if desired > max(rec, lo or 0):
            note = f"; scale-down held at {desired} by the {window_down}s stabilization window"
    # a limit past the current size (the period's earlier changes used it up) holds the pool
    # where it is, never moves it against the recommendation (HPA horizontal.go:1327-1330, 1350-1353)
    if desired > current:
        desired = max(current, min(desired, _rate_limit(up_rules, current, history, now, up=True)))
    elif desired < current:
        desired = min(current, max(desired, _rate_limit(down_rules, current, history, now, up=False)))
    return desired, note


# Futility guard (rule 2b): a latency above target that did not fall by at least
# FUTILITY_GAIN after the pool grew (the new pods Ready) is not one replicas fix
# (e.g. prompts whose prefill alone exceeds the TTFT target); samples kept this long.
FUTILITY_GAIN = 0.10
FUTILITY_MEMORY_S = 900.0
# Rule 2d: a record of a size seen too small is kept this long unless refuted. The hold keeps
# the pool off that size, so the record's own refutation (the size within the band at that
# load) cannot come while the load stays: a record of one stray minute would cost a replica
# for as long. After this long the size is tried again, at most once per this period at the
# same load: a round trip an hour where slow-ramp's prefill made one every 12 minutes.
OVERLOAD_MEMORY_S = 3600.0
# The latency feedback is bounded by this multiple of the demand floor (rule 3c): a backlog's
# latency (a queue of minutes) is not proportional to the replicas that clear it.
FEEDBACK_CAP = 2.0
# Demand trend (rule 3d): the window its slope is fitted over, and the least span it needs
# (a slope from two noisy 1-minute rates a round apart would be noise).
TREND_S = 180.0
TREND_MIN_SPAN_S = 60.0
RATE_WINDOW_S = 60.0  # the window of the demand's rate (promql.py queries: "1m")
# Online capacity correction (rule 3b): weight of a new saturated sample.
CORRECTION_WEIGHT = 0.5
SETTLE_S = 90.0  # the 1-minute rate window plus a scrape after the last resize
SATURATED_S = 60.0  # saturated this long: the 1-minute rate window holds only saturated time


def is_settled(state: PoolState, history: History, now: float) -> bool:
    """All pods Ready and no resize for SETTLE_S: the 1-minute rate window then covers the
    pool as it is."""
    return (state.starting == 0 and state.ready == state.replicas and state.ready > 0
            and not any(now - c.at < SETTLE_S for c in history.changes))


def _futile(state: PoolState, observed: float, target: float, tolerance: float, history: History,
            now: float, demand: float | None = None) -> str | None:
    """Whether the latency feedback has been shown not to help (rule 2b), and why.
    Records the sample. Futility ends when the latency falls into the band (or below)."""
    above = observed > target * (1 + tolerance)
    if not above:
        history.futile = None
        history.samples.clear()
        return None
    why = None
    load = demand / state.ready if demand is not None and state.ready else None
    if history.futile is None and state.starting == 0 and load is not None:
        # a smaller pool that carried FUTILITY_GAIN more load per replica (a ramp that outgrew the
        # new replicas is not evidence: the load per replica must have fallen)
        # the smaller pool's sample at least SETTLE_S old: the latency window now holds only
        # the bigger pool's time (a burst's first rounds still read the smaller pool's queue)
        smaller = [x for x in history.samples if x.ready < state.ready and x.load is not None
                   and x.load >= load * (1 + FUTILITY_GAIN) and now - x.at >= SETTLE_S]
        if smaller:
            before = min(smaller, key=lambda x: x.ready)
            if observed >= before.observed * (1 - FUTILITY_GAIN):
                history.futile = observed
                why = (f"adding replicas ({before.ready} -> {state.ready} ready) did not lower it "
                       f"({before.observed * 1000:.0f}ms -> {observed * 1000:.0f}ms)")
    elif history.futile is not None:
        why = f"adding replicas did not lower it below {history.futile * 1000:.0f}ms"
    if state.starting == 0:
        history.samples.append(Sample(now, state.ready, observed, load))
    return why


def _overloads(state: PoolState, signal: Signal, target: float, tolerance: float, history: History,
               now: float, futile: bool) -> None:
    """Rule 2d's memory (each record kept OVERLOAD_MEMORY_S), on settled pools. Above the
    latency band: the size and the load per replica it failed at are recorded (the newest per
    size), and a smaller size's record is refuted when this one carries FUTILITY_GAIN less per
    replica and reads about the same latency (the replicas added did not lower it: 2b's
    evidence, for ITL too); no record while the feedback is shown futile (2b: then the latency
    is not the pool's size). Within the band: the record of this size is refuted when it
    carries at least the recorded load (less the tolerance). The load is what the pool
    produced (``Signal.produced``, else the demand): the offered demand of an overloaded
    prefill pool carries its backlog to clear, which the bigger pool that is compared with it
    later has not, and a record read high would let go too soon."""
    history.overloads = [x for x in history.overloads if now - x.at <= OVERLOAD_MEMORY_S]
    measured = signal.produced if signal.produced is not None else signal.demand
    if not measured or measured <= 0 or not state.ready or not is_settled(state, history, now):
        return
    load = measured / state.ready
    if signal.observed > target * (1 + tolerance):
        history.overloads = [x for x in history.overloads if x.ready != state.ready and not (
            x.ready < state.ready and load <= x.load * (1 - FUTILITY_GAIN)
            and signal.observed >= x.observed * (1 - FUTILITY_GAIN))]
        if not futile:
            history.overloads.append(Overload(now, state.ready, load, signal.observed))
    else:
        history.overloads = [x for x in history.overloads
                             if not (x.ready == state.ready and load >= x.load * (1 - tolerance))]


def _held_by_overload(rec: int, state: PoolState, demand: float | None, target: float, tolerance: float,
                      history: History) -> tuple[int, str] | None:
    """Rule 2d: the least size a scale-down to ``rec`` may go to, and why, where a size between
    was seen above the latency band at a load per replica that the demand would now put on it
    (within the tolerance); None when no record holds. Latency feedback assumes latency
    proportional to the load per replica; a queue's grows faster than that as a pool shrinks
    (found by slow-ramp: prefill went 1 -> 2 -> 1 -> 2 -> 1 -> 2 in 30 minutes, its TTFT p99
    2.2 s at 1 replica, 0.34 s at 2, where feedback read 1 as enough)."""
    if rec >= state.replicas or not demand or demand <= 0:
        return None
    held = [x for x in history.overloads if rec <= x.ready < state.replicas
            and x.observed > target * (1 + tolerance) and demand / x.ready >= x.load * (1 - tolerance)]
    if not held:
        return None
    worst = max(held, key=lambda x: x.ready)
    replicas = "replica" if worst.ready == 1 else "replicas"
    return worst.ready + 1, (f"not below {worst.ready + 1}: {worst.ready} {replicas} read "
                             f"{worst.observed * 1000:.0f}ms at {si(worst.load)} tok/s each "
                             f"({si(demand / worst.ready)} now)")


def _corrected_capacity(signal: Signal, state: PoolState, target: float, tolerance: float,
                        history: History, now: float) -> tuple[float | None, str]:
    """The per-replica capacity corrected online (rule 3b). Decode (``latency_saturates``) is
    saturated when requests queue (at least one waiting at every pod: every slot is
    taken) or its ITL is above the target (not only above the band: a decode pool at 52 ms
    is inside a 10 % band and misses a 50 ms SLO on every request; one step is shared by
    the whole batch, so an ITL above target is load). Prefill needs both a queue and a TTFT
    above target: a TTFT above target alone can be a few prompts too long for it, and a
    short queue during a ramp reads low (prompt tokens are counted when a prompt finishes,
    so work in progress that grows is not counted yet). Saturated for
    SATURATED_S (the rate window then holds no unsaturated time: a burst's first seconds
    would read as a slow engine), each Ready replica sustains at most what it produced,
    ``produced / ready``; a model (or setting) above that is scaled down by the ratio
    (smoothed, never above 1: a faster engine only ever leaves headroom). Not saturated, a
    replica sustains at least what it produced: the factor never stays below that. Sampled
    only on a settled pool (all pods Ready, no resize for SETTLE_S: the rate window then
    covers the pool as it is)."""
    cap = signal.capacity
    if not cap:
        return cap, ""
    # every pod with a queue (a summed queue can sit on a few pods: an engine keeps what was
    # routed to it, so after a scale-up the old pods hold the backlog and the new ones, taking
    # only new arrivals, produce less than they could); without the per-pod figure, >= 1
    # waiting per replica
    if signal.waiting_min is not None:
        queued = signal.waiting_min >= 1
    else:
        queued = signal.waiting is not None and signal.waiting >= state.ready
    above = signal.observed is not None and signal.observed > target
    saturated = (queued or above) if signal.latency_saturates else (queued and above)
    if not saturated:
        history.saturated_since = None
    elif history.saturated_since is None:
        history.saturated_since = now
    settled = is_settled(state, history, now)
    if settled and signal.produced is not None:
        sample = min(1.0, signal.produced / state.ready / (cap / max(signal.utilization, 1e-9)))
        # nothing produced in a whole window is a stall (a hung engine, a KV transfer that never
        # completes), not a capacity: read as one, the factor fell to 0 and the floor to maxReplicas
        if saturated and now - history.saturated_since >= SATURATED_S and signal.produced > 0:
            # saturated for a whole rate window: a replica sustains what it produced, no more
            history.capacity_factor = ((1 - CORRECTION_WEIGHT) * history.capacity_factor
                                       + CORRECTION_WEIGHT * sample)
        elif not saturated:
            # not saturated: it sustains at least what it produced
            history.capacity_factor = max(history.capacity_factor, sample)
    f = history.capacity_factor
    if f < 0.999:
        return cap * f, f" x {f:.2f} observed at saturation"
    return cap, ""


def _feedback(observed: float, target: float, current: int, ready: int, tolerance: float,
              floor: float = 0.0) -> tuple[int, str]:
    """HPA's rule on one metric: the current size inside the tolerance band,
    else ``ceil(ready x observed / target)``; and how the metric stands.

    A latency has a floor that no number of replicas lowers (one decode step,
    one prompt's prefill), and only the part above it scales with the load per
    replica; so with a known ``floor`` (< target) the ratio is taken above it:
    ``(observed - floor) / (target - floor)``. Without it, a pool whose latency
    sits at half the target could never go from 2 replicas to 1 (HPA's ratio
    0.5 x 2 = 1 needs an observed value of exactly half the target), and with
    vLLM's ITL buckets (the first ends at 10 ms) a quiet pool reads half the
    bucket edge, not its real step time. The band is on the plain ratio."""
    ratio = observed / target
    if abs(ratio - 1) <= tolerance:
        return current, f"within {tolerance:.0%} of"
    scale = ratio
    if 0 < floor < target:
        scale = max(0.0, observed - floor) / (target - floor)
    rec = math.ceil(max(ready, 1) * scale)
    # never against the signal: with fewer Ready than desired (pods Pending or starting) a signal
    # above target would otherwise recommend fewer replicas, and with more (a scale-down's pods
    # still terminating) one below it more; HPA keeps the current size then
    # (replica_calculator.go:250-259)
    if ratio > 1:
        return max(rec, current), "above"
    return min(rec, current), "below"


def rising(history: History, demand: float | None, tolerance: float) -> float | None:
    """The demand's slope (per second) when it rose by more than ``tolerance`` of the demand
    over the last TREND_S (less is the 1-minute rate's noise: HPA's tolerance, on the trend),
    and rose in each rate window of it (by a third of that each): a step of the demand reads,
    through the 1-minute rate, as a one-minute ramp that then stops, and extrapolating it
    overshoots (a 0.5k -> 16k tok/s step, as the closed-loop test's flash crowd, would have
    been forecast past 16k for a minute: tests/unit/test_autoscale_decide.py). None otherwise."""
    slope = history.demand_slope()
    if slope is None or not demand or demand <= 0 or slope * TREND_S <= tolerance * demand:
        return None
    pts = history.demands
    now = pts[-1][0]
    if pts[0][0] > now - TREND_S + RATE_WINDOW_S / 2:
        return None  # too short a history to tell a trend from a step

    def near(t: float) -> float:
        return min(pts, key=lambda x: abs(x[0] - t))[1]

    marks = [near(now - TREND_S + i * RATE_WINDOW_S) for i in range(int(TREND_S // RATE_WINDOW_S) + 1)]
    if any(b - a <= tolerance / 3 * demand for a, b in zip(marks, marks[1:])):
        return None
    return slope


def _expected_demand(demand: float, history: History, now: float, interval: float,
                     tolerance: float, sibling_start: float | None = None) -> tuple[float, str]:
    """Rule 3d: the demand when pods ordered now will serve. Records the sample; a rising
    trend (:func:`rising`) is extrapolated over the pool's observed start time plus one
    interval (the next decision); a falling one is not (no scale-down on a forecast).
    Before the pool's own start is observed (no scale-up of it has completed yet), the other
    pool's (``sibling_start``); with neither: the demand as it is."""
    history.demands.append((now, demand))
    history.demands = [x for x in history.demands if now - x[0] <= TREND_S]
    slope = rising(history, demand, tolerance)
    start = history.start_seconds if history.start_seconds is not None else sibling_start
    if slope is None or start is None:
        return demand, ""
    lead = start + interval
    expected = demand + slope * lead
    return expected, f" (rising {slope * 60:.3g}/min: {expected:.3g} in {lead:.0f}s, when pods ordered now serve)"


def _steady_capacity(signal: Signal, capacity: float, target: float, state: PoolState, history: History,
                     tolerance: float) -> float | None:
    """Rule 3e: under a steady demand a pool is held with its headroom on the batch
    (``Signal.capacity_steady``) rather than on the throughput, when the demand is not rising
    (a ramp is led with the throughput headroom: the pods ordered now serve a minute or two
    later), the latency is not above the target and not every pod has a request waiting for a
    slot (as rule 3b reads saturation: a queue on some pods only is where the router sent it).
    The online correction of ``capacity`` (rule 3b) carries over. None: ``capacity`` holds
    (also when the steady figure is not above it: engines measured slower than the model)."""
    if not signal.capacity_steady or not signal.capacity or not signal.demand:
        return None
    slope = history.demand_slope()
    if slope is None or slope * TREND_S > tolerance * signal.demand:
        return None
    if signal.observed is not None and signal.observed > target:
        return None
    if signal.waiting_min is not None:
        queued = signal.waiting_min >= 1
    else:
        queued = signal.waiting is not None and signal.waiting >= max(state.ready, 1)
    if queued:
        return None
    steady = signal.capacity_steady * capacity / signal.capacity
    return steady if steady > capacity else None


def _recommend(policy: PoolAutoscaling, state: PoolState, signal: Signal, history: History,
               now: float, interval: float = 30.0) -> tuple[int, str]:
    """The pool's recommendation and its reason: the largest of the latency
    feedback (unless shown futile), the demand floor (offered load over the
    corrected capacity) and the secondary signals with data."""
    target = duration_seconds(policy.target.value)
    rec, stands = _feedback(signal.observed, target, state.replicas, state.ready, policy.tolerance, signal.floor or 0.0)
    of = f" {signal.observed_note}" if signal.observed_note else ""
    clauses = [f"{policy.target.metric} p{policy.target.quantile * 100:g}{of} {signal.observed * 1000:.0f}ms "
               f"{stands} target {target * 1000:.0f}ms"]
    # Only TTFT: a prompt whose prefill alone exceeds the target is what replicas cannot
    # fix. ITL is read from coarse histogram buckets (vLLM: 10, 25, 50 ms) whose
    # interpolated quantile barely moves as replicas are added, which would look futile.
    futile = (_futile(state, signal.observed, target, policy.tolerance, history, now, signal.demand)
              if policy.target.metric == "ttft" else None)
    capacity, corrected = _corrected_capacity(signal, state, target, policy.tolerance, history, now)
    model, needs, trend = None, "needs", ""
    if signal.demand is not None and capacity:
        demand, trend = _expected_demand(signal.demand, history, now, interval, policy.tolerance,
                                         signal.sibling_start_seconds)
        now_need = math.ceil(signal.demand / capacity) if signal.demand > 0 else policy.min_replicas
        steady = _steady_capacity(signal, capacity, target, state, history, policy.tolerance)
        if steady:
            capacity, corrected = steady, corrected + f"; steady: {si(steady)} tok/s/replica with the headroom on the batch"
        # also inside the latency band: a histogram bucket edge can sit in the band while the pool is full
        model = math.ceil(demand / capacity) if demand > 0 else policy.min_replicas
        # HPA's tolerance on this signal too: a demand within it of what the current size carries
        # keeps that size (the 1-minute rate's noise would add and remove a replica at a boundary);
        # under 3e not from above with the latency in the band: past the batch headroom with the
        # latency at the target, the batch is full (the plateau's room is spent)
        if (model != state.replicas and state.replicas > 0 and demand > 0
                and not (steady and demand > state.replicas * capacity
                         and signal.observed > target * (1 - policy.tolerance))
                and abs(demand / (state.replicas * capacity) - 1) <= policy.tolerance):
            model, needs = state.replicas, f"within {policy.tolerance:.0%} of what"
    candidates = []
    if futile and model is not None:
        # 2b: the latency is not one replicas lower; the demand floor sizes the pool
        clauses[0] += f" but {futile}: latency feedback left out"
    else:
        # the bound never freezes a saturated pool whose latency is above target: while the
        # demand's 1-minute window still lags a burst (it reads the quiet minute before),
        # feedback may add one replica a round beyond it. Saturated is a queue of its own of
        # at least one request per Ready replica (every replica has the next one waiting).
        # A stray request in the queue is not that: a TTFT window still holding a burst
        # that has cleared, or a TTFT inflated by the wait for a decode slot, leaves the
        # bound in place.
        # On the demand now, not its extrapolation (3d): a forecast raises the floor, it does not
        # widen what the latency feedback may add (found by long-prompts: prefill, whose TTFT
        # p99 stays above target whatever its size, grew with the forecast to 1.46x the oracle).
        bound = math.ceil(FEEDBACK_CAP * now_need) if model is not None else None
        queued = (signal.waiting or 0) >= max(state.ready, 1)
        floor = state.replicas + (1 if stands == "above" and queued else 0)
        if bound is not None and rec > max(bound, floor):
            clauses[0] += f" (feedback {rec} bounded by {FEEDBACK_CAP:g}x the demand's need)"
            rec = max(bound, floor)
        candidates.append((rec, policy.target.metric))
    if model is not None:
        candidates.append((model, "demand"))
        clauses.append(f"demand{trend} {needs} {model}" + (" carry" if needs != "needs" else "")
                       + (f" at {signal.capacity_note}" if signal.capacity_note else "") + corrected)
    for t in policy.secondary_targets:
        observed = signal.secondaries.get(t.metric)
        if observed is None:
            continue  # no data: left out, never holds back the latency target nor scales down
        need, stands = _feedback(observed, t.average_value, state.replicas, state.ready, policy.tolerance)
        candidates.append((need, t.metric))
        clauses.append(f"{t.metric} {observed:.3g}/replica {stands} target {t.average_value:g} (needs {need})")
    best = max(n for n, _ in candidates)
    _overloads(state, signal, target, policy.tolerance, history, now, bool(futile))
    # not while futile: the latency is then not the pool's size (2b)
    held = None if futile else _held_by_overload(best, state, signal.demand, target, policy.tolerance, history)
    if held:
        best = held[0]
        candidates.append((best, "a size seen too small"))
        clauses.append(held[1])
    if len(candidates) > 1:
        clauses.append(f"sized by {next(name for n, name in candidates if n == best)}")
    return best, "; ".join(clauses)


def decide(policy: PoolAutoscaling, state: PoolState, signal: Signal, history: History, now: float,
           interval_seconds: float = 30.0) -> Decision:
    """Replicas for one pool. ``history`` is updated in place."""
    lo = policy.min_replicas
    hi = policy.max_replicas if policy.max_replicas is not None else max(state.replicas, lo)
    current = state.replicas
    stale_after = 3 * interval_seconds
    history.not_after(now)
    if not history.recommendations:
        # HPA's first sight of a target records its current size as a recommendation, before
        # any metric is read (recordInitialRecommendation, horizontal.go:802-808, :883): a new
        # autoscaler (or one with no memory) does not scale down within the first window
        history.recommendations.append(Event(now, current))

    # 1. no or stale data: hold
    if signal.observed is None or signal.observed_at is None:
        return Decision(max(lo, min(current, hi)), "no latency data from Prometheus: holding", False, current)
    if now - signal.observed_at > stale_after:
        age = now - signal.observed_at
        return Decision(max(lo, min(current, hi)), f"latency data is {age:.0f}s old (> {stale_after:.0f}s): holding", False, current)

    # 3d: how long a scale-up takes to serve (all pods Ready), the demand trend's lead
    if (history.scaled_up is not None and state.starting == 0 and state.replicas >= history.scaled_up[1]
            and 0 < state.replicas <= state.ready):
        history.start_seconds = max(0.0, now - history.scaled_up[0])  # a clock stepped back: no lead
        history.scaled_up = None

    # 2./3. recommendation: the largest of the signals'
    raw, why = _recommend(policy, state, signal, history, now, interval_seconds)
    rec = max(lo, min(raw, hi))

    # 5. HPA behaviour: stabilization windows, rate limits; the windows remember the
    # recommendation before min/max, which apply after them (horizontal.go:1298-1300,
    # 1317-1368): an edit of the bounds takes effect at once, not after a window
    up_rules = _rules(policy.behavior.scale_up, DEFAULT_UP)
    down_rules = _rules(policy.behavior.scale_down, DEFAULT_DOWN)
    desired, note = apply_behavior(raw, current, history, now, up_rules, down_rules, lo)
    why += note

    # 4. guards
    if desired > current and state.unschedulable:
        desired = current
        why += f"; not scaling up: {state.unschedulable} pod(s) Unschedulable (no free GPUs for more)"
    if desired > current and state.uncreated:
        desired = current
        why += (f"; not scaling up: {state.uncreated} replica(s) not created (the workload cannot create "
                "their pods: see its events, e.g. a ResourceQuota)")
    if desired < current and state.starting:
        desired = current
        why += f"; not scaling down: {state.starting} pod(s) still starting"

    desired = max(lo, min(desired, hi))
    if desired != current:
        history.changes.append(Change(now, current, desired))
        why = f"{current} -> {desired}: " + why
    if desired > current:
        history.scaled_up = (now, desired)
    history.prune(now, max(up_rules.stabilization_window_seconds or 0,
                           down_rules.stabilization_window_seconds or 0, 1800) + interval_seconds)
    return Decision(desired, why, True, rec)


@dataclass(frozen=True)
class PoolClaim:
    """One pool's decision, for the shared GPU budget."""

    role: str
    current: int
    desired: int
    gpus_per_replica: int
    pressure: float  # observed / target (how badly it needs capacity)


def share_budget(claims: list[PoolClaim], max_total_gpus: int | None, reserved: int = 0) -> dict[str, tuple[int, str | None]]:
    """Fit the pools' desired sizes into the GPU budget.

    Scale-downs always happen. Scale-ups are granted one replica at a time to
    the pool under the most pressure (observed/target) while GPUs remain;
    never below a pool's current size. ``reserved``: GPUs of pools that do
    not autoscale. Returns role -> (replicas, why cut).
    """
    out = {c.role: (c.desired, None) for c in claims}
    if max_total_gpus is None:
        return out
    sizes = {c.role: min(c.current, c.desired) for c in claims}
    used = reserved + sum(sizes[c.role] * c.gpus_per_replica for c in claims)
    wanting = sorted(claims, key=lambda c: -c.pressure)
    progress = True
    while progress:
        progress = False
        for c in wanting:
            if sizes[c.role] < c.desired and used + c.gpus_per_replica <= max_total_gpus:
                sizes[c.role] += 1
                used += c.gpus_per_replica
                progress = True
                break
    for c in claims:
        if sizes[c.role] < c.desired:
            held = f" ({reserved} used by pools that do not autoscale)" if reserved else ""
            out[c.role] = (sizes[c.role], f"GPU budget autoscaling.maxTotalGPUs={max_total_gpus}{held} reached: "
                                          f"{c.role} held at {sizes[c.role]} instead of {c.desired}")
        else:
            out[c.role] = (c.desired, None)
    return out
