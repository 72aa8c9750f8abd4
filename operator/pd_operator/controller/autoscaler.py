"""The autoscaler loop: read signals, decide (pure), write replicas, report.

Thin: the PromQL is in autoscale/promql.py, the decisions in
autoscale/decide.py and plan.py. This module gathers what they need from the
cluster and Prometheus, and writes the result through the operator's single
replicas writer (the ``pd-operator-replicas`` field manager), an Event and
the status.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..api import SpecError, validate_service
from ..api.models import SCALE_REASON_MAX, PDInferenceService, duration_seconds
from ..autoscale import fit
from ..autoscale.decide import Change, History, Overload, PoolState
from ..autoscale.decide import Event as Recommendation
from ..autoscale.diagnose import REASONS, Verdict, diagnose, ready_pod_ips
from ..autoscale.plan import PoolInput, plan_service
from ..autoscale.promql import Observation
from ..render.common import child_name, selector_labels
from ..render.pools import pool_kind
from .health import HEALTH, Health
from .loop import every
from .kube import AUTOSCALER_MANAGER, DIAGNOSIS_MANAGER, Kube
from .reconcile import LOCKS, EventFn, now_rfc3339
from .status import merge_conditions, pool_status

log = logging.getLogger(__name__)

# (prometheus, engine, role, quantile, secondaries=frozenset of secondary metrics)
#   -> {(namespace, service): Observation}
SignalFn = Callable[..., dict[tuple[str, str], Observation]]
# (prometheus, engine, router) -> {(namespace, service): diagnose.Signals}
DiagnosisFn = Callable[..., dict]


@dataclass(frozen=True)
class Prometheus:
    """Where a service's signals come from. Services with the same URL and
    token share one query per signal."""

    url: str
    token: str | None = field(default=None, repr=False)  # never logged

    def __str__(self) -> str:
        return self.url + (" (bearer token)" if self.token else "")


class GPUView:
    """The free GPUs of the cluster in one round (autoscale/fit.py on listed objects)."""

    def __init__(self, nodes: list[dict], pods: list[dict]):
        self.nodes, self.pods = nodes, pods
        self.free: dict[str, dict[str, int]] = {}  # by GPU resource name

    def free_gpus(self, resource: str) -> dict[str, int]:
        if resource not in self.free:
            self.free[resource] = fit.free_gpus(self.nodes, self.pods, resource)
        return self.free[resource]

    def for_pools(self, statefulsets: dict[str, dict], resource: str) -> "PoolRoom":
        """The plan's view (plan.Room) for one service's pools; what it books
        stays booked for the services decided after it in the round."""
        return PoolRoom(self, {role: fit.workload_template(sts) for role, sts in statefulsets.items()}, resource)


class PoolRoom:
    """Room in whole replicas: a LeaderWorkerSet pool's replica is a group of pods."""

    def __init__(self, view: GPUView, templates: dict[str, tuple[dict, int]], resource: str):
        self.view, self.templates, self.resource = view, templates, resource

    def room(self, role: str) -> int | None:
        template, size = self.templates[role]
        return fit.room(self.view.free_gpus(self.resource), self.view.nodes, template, self.resource, size)

    def take(self, role: str, count: int) -> None:
        template, size = self.templates[role]
        fit.take(self.view.free_gpus(self.resource), self.view.nodes, template, self.resource, count, size)


# How long a round waits for a Prometheus before the services reading from it
# hold (their queries keep running on their own threads, bounded by the
# client's connect and read timeouts in autoscale/signals.py).
QUERY_DEADLINE_SECONDS = float(os.environ.get("PD_OPERATOR_QUERY_DEADLINE_SECONDS", "20"))


class Queries:
    """Signal queries, each on its own daemon thread, at most one in flight per
    (Prometheus, engine, role, quantile, secondaries): a Prometheus that never
    answers holds one thread per query it was asked, not the loop, and is not
    asked again until that query returns or times out."""

    def __init__(self, signals: SignalFn):
        self.signals = signals
        self.inflight: dict[tuple, Future] = {}
        self._lock = threading.Lock()

    def submit(self, key: tuple, secondaries: frozenset[str]) -> Future:
        with self._lock:
            running = self.inflight.get((key, secondaries))
            if running is not None and not running.done():
                return running
            future: Future = Future()
            self.inflight[(key, secondaries)] = future

        def run() -> None:
            try:
                future.set_result(self.signals(*key, secondaries=secondaries))
            except BaseException as err:  # noqa: BLE001 - handed to the round that reads it
                future.set_exception(err)

        threading.Thread(target=run, name=f"prometheus-query {key[0].url}", daemon=True).start()
        return future

    def prune(self) -> None:
        """Forget finished queries (services deleted, tokens rotated)."""
        with self._lock:
            for k in [k for k, f in self.inflight.items() if f.done()]:
                del self.inflight[k]


def _origin(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of an http(s) URL; None when it has user info or is not http(s)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        return None
    return parts.scheme, parts.hostname.lower().rstrip("."), port or (443 if parts.scheme == "https" else 80), parts.path


def token_url_allowed(url: str, allowed: list[str] | tuple[str, ...]) -> bool:
    """Whether a bearer token may be sent to ``url``: it has the scheme, host and
    port of one of the administrator's ``allowed`` endpoints and a path under
    that endpoint's path. Compared on parsed parts, never as strings
    (``http://prom:9090@evil`` is host ``evil``)."""
    target = _origin(url)
    if target is None:
        return False
    for entry in allowed:
        base = _origin(entry)
        if base is None or base[:3] != target[:3]:
            continue
        prefix = base[3].rstrip("/")
        if not prefix or target[3] == prefix or target[3].startswith(prefix + "/"):
            return True
    return False


class PrometheusAuthError(Exception):
    """The bearer token Secret cannot be used; the message says how to fix it."""


def _ms(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return f"{seconds * 1000:.0f}ms" if seconds < 10 else f"{seconds:.1f}s"


class Autoscaler:
    """One loop for all services in scope; histories kept per (namespace, name, role).

    The loop ticks often (``handlers.AUTOSCALE_TICK_SECONDS``); each service is decided
    when its own ``spec.autoscaling.interval`` has passed since its last round,
    so an edit of the interval, like any policy edit, takes effect at the next
    round without a restart."""

    def __init__(self, kube: Kube, signals: SignalFn, event: EventFn, clock: Callable[[], float] = time.time,
                 query_deadline: float = QUERY_DEADLINE_SECONDS, token_urls: list[str] | tuple[str, ...] = (),
                 diagnosis: DiagnosisFn | None = None, free_gpu_cap: bool = True):
        self.kube, self.signals, self.event, self.clock = kube, signals, event, clock
        self.free_gpu_cap = free_gpu_cap  # off: nodes are added on demand (cluster autoscaler, Karpenter)
        # the Serving condition (autoscale/diagnose.py): one query per signal and
        # (Prometheus, engine, router) for every service that names a Prometheus
        self.diagnosis = Queries(lambda prom, engine, router, secondaries=frozenset(): diagnosis(prom, engine, router)) \
            if diagnosis else None
        # Prometheus endpoints the administrator lets receive a tenant's bearer
        # token (operator flag --prometheus-token-url); none: no token is sent
        self.token_urls = tuple(token_urls)
        self.queries = Queries(signals)
        self.query_deadline = query_deadline
        self.histories: dict[tuple[str, str], dict[str, History]] = {}
        self.last_round: dict[tuple[str, str], float] = {}
        self.warned_rbac = False
        # applied every round (an apply that omits a field gives it up)
        self.last_scale: dict[tuple[str, str, str], tuple[str, str]] = {}
        self.last_diagnosis: dict[tuple[str, str], float] = {}

    def reset(self) -> None:
        """Forget every service's memory (this replica starts leading): each term starts from
        what status remembers, which the other replica may have written since (a replica that
        led before would otherwise decide on its old history, and overwrite status with it)."""
        self.histories.clear()
        self.last_round.clear()
        self.last_diagnosis.clear()
        self.last_scale.clear()

    def forget(self, namespace: str, name: str) -> None:
        """Drop what the loop keeps of a deleted service."""
        self.histories.pop((namespace, name), None)
        self.last_round.pop((namespace, name), None)
        self.last_diagnosis.pop((namespace, name), None)
        for role in ("prefill", "decode"):
            self.last_scale.pop((namespace, name, role), None)

    def pool_state(self, namespace: str, svc: PDInferenceService, role: str) -> tuple[PoolState, dict] | None:
        """The pool's state and its StatefulSet."""
        sts = self.kube.get(pool_kind(svc, role), namespace, child_name(svc, role))
        if sts is None:
            return None
        pods = self.kube.pods(namespace, selector_labels(svc, role))
        ps = pool_status(sts, pods)
        starting = max(0, ps["replicas"] - ps["readyReplicas"] - ps["pendingReplicas"])
        # replicas the workload has seen (observedGeneration) but has no pod for: its controller
        # could not create them (a ResourceQuota, Pod Security); no Pending pod shows them
        generation = (sts.get("metadata") or {}).get("generation")
        observed = (sts.get("status") or {}).get("observedGeneration")
        seen = generation is not None and observed is not None and observed >= generation
        uncreated = max(0, ps["desiredReplicas"] - ps["replicas"]) if seen else 0
        return PoolState(replicas=ps["desiredReplicas"], ready=ps["readyReplicas"], starting=starting,
                         unschedulable=ps["pendingReplicas"], uncreated=uncreated), sts

    def gpu_view(self) -> GPUView | None:
        """The cluster's free GPUs for this round; None when the operator may not
        list nodes and all pods (a namespace-scoped install): no cap then, the
        Unschedulable guard still holds. None too when the cap is off (--no-free-gpu-cap)."""
        if not self.free_gpu_cap:
            return None
        try:
            view = self.kube.cluster_gpu_view()
        except Exception as err:  # noqa: BLE001 - the cap is an extra, never a reason to stop deciding
            log.warning("cannot read nodes and pods for the free-GPU cap: %s", err)
            return None
        if view is None and not self.warned_rbac:
            log.info("no RBAC to list nodes and all pods: scale-ups are not capped by free GPUs")
            self.warned_rbac = True
        return GPUView(*view) if view else None

    def prometheus(self, namespace: str, svc: PDInferenceService) -> Prometheus | None:
        """The service's Prometheus, its bearer token read from the Secret (raises
        PrometheusAuthError with the fix when it cannot be)."""
        spec = svc.spec.autoscaling.prometheus
        if spec is None:
            return None
        ref = spec.bearer_token_secret_ref
        if ref is None:
            return Prometheus(spec.url)
        field_path = "spec.autoscaling.prometheus.bearerTokenSecretRef"
        if not token_url_allowed(spec.url, self.token_urls):
            # checked before the Secret is read: a spec cannot make the operator
            # read a Secret and hand it to an endpoint of the spec's choosing
            allowed = ", ".join(self.token_urls) or "none"
            raise PrometheusAuthError(
                f"spec.autoscaling.prometheus.url: {spec.url} may not receive the token of {field_path} "
                f"(allowed endpoints: {allowed}); the token was not read or sent. Point the url at an allowed "
                "endpoint, or ask the operator's administrator to add it to the chart value "
                "autoscaling.prometheusTokenURLs (operator flag --prometheus-token-url)")
        try:
            token = self.kube.secret_value(namespace, ref.name, ref.key)
        except PermissionError:
            raise PrometheusAuthError(
                f"{field_path}: the operator may not read Secret {namespace}/{ref.name}; "
                f"install the chart with rbac.secretReads=true and {namespace} in watchNamespaces "
                "(or grant it get on that Secret)") from None
        except LookupError as err:
            raise PrometheusAuthError(f"{field_path}: {err}") from None
        return Prometheus(spec.url, token.strip())

    def due(self, namespace: str, name: str, svc: PDInferenceService, now: float) -> bool:
        last = self.last_round.get((namespace, name))
        interval = duration_seconds(svc.spec.autoscaling.interval)
        # a little slack (timer jitter) so a round is not put off by a whole tick
        return last is None or now - last >= interval - min(1.0, 0.1 * interval)

    def run_once(self, bodies: list[dict], force: bool = False) -> None:
        """Decide every autoscaled service that is due (``force``: all of them)."""
        now = self.clock()
        services = []
        diagnosed = []
        for body in bodies:
            try:
                svc = validate_service(body)
            except SpecError:
                continue  # the reconciler reports it
            spec = svc.spec
            if self.diagnosis is not None and spec.autoscaling.prometheus is not None:
                key = (body["metadata"]["namespace"], body["metadata"]["name"])
                last = self.last_diagnosis.get(key)
                interval = duration_seconds(spec.autoscaling.interval)
                if force or last is None or now - last >= interval - min(1.0, 0.1 * interval):
                    diagnosed.append((body, svc))
            if not (spec.prefill.autoscaling.enabled or spec.decode.autoscaling.enabled):
                continue
            namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
            if not force and not self.due(namespace, name, svc, now):
                continue
            try:
                prom, auth_error = self.prometheus(namespace, svc), None
            except PrometheusAuthError as err:
                prom, auth_error = None, str(err)
            services.append((body, svc, prom, auth_error))
        # one query per (prometheus, engine, role, quantile) and signal for all
        # services; a secondary signal only when some service asks for it
        wanted: dict[tuple, frozenset[str]] = {}
        needs: list[set[tuple]] = []
        for _, svc, prom, _ in services:
            keys = set()
            for role in ("prefill", "decode"):
                pool = svc.spec.pool(role)
                if prom and pool.autoscaling.enabled:
                    key = (prom, svc.spec.engine.kind, role, pool.autoscaling.target.quantile)
                    wanted[key] = wanted.get(key, frozenset()) | pool.autoscaling.secondary_metrics()
                    keys.add(key)
            needs.append(keys)
        # Each query runs on its own thread; a service is decided as soon as its
        # own queries are answered, so a slow or hanging Prometheus delays only
        # the services that read from it, and those hold once the deadline passes.
        futures = {key: self.queries.submit(key, wanted[key]) for key in wanted}
        gpus = self.gpu_view() if services else None
        deadline = time.monotonic() + self.query_deadline
        pending = list(range(len(services)))
        results: dict[tuple, dict | None] = {}
        while pending:
            ready = [i for i in pending if all(futures[k].done() for k in needs[i])]
            if not ready and time.monotonic() >= deadline:
                ready = pending  # the rest hold: their Prometheus did not answer in time
            for i in ready:
                (body, svc, prom, auth_error), keys = services[i], needs[i]
                for key in keys:
                    if key not in results:
                        results[key] = self._result(key, futures[key])
                namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
                self.last_round[(namespace, name)] = now
                with LOCKS.get(namespace, name):
                    if not self._unchanged(body):
                        continue  # edited or deleted while its queries ran: the next round decides
                    try:
                        self._service(body, svc, namespace, name, prom, auth_error, results, now, gpus)
                    except Exception:  # noqa: BLE001 - one service's failure holds only that service
                        log.exception("autoscaling %s/%s failed; it holds until the next round", namespace, name)
            pending = [i for i in pending if i not in ready]
            waiting = [futures[k] for i in pending for k in needs[i] if not futures[k].done()]
            if waiting:
                wait(waiting, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
        self.queries.prune()
        if diagnosed:
            self.diagnose_services(diagnosed, now)

    def _unchanged(self, body: dict) -> bool:
        """Whether the service is still the one this round read (same object, same spec): a
        round waits up to the query deadline for Prometheus, and a spec edited meanwhile (a
        lower maxReplicas, autoscaling off) or a deleted service must not be scaled on the
        old one."""
        meta = body["metadata"]
        now = self.kube.get_service(meta["namespace"], meta["name"])
        return now is not None and all((now.get("metadata") or {}).get(k) == meta.get(k)
                                       for k in ("uid", "generation")) \
            and not (now.get("metadata") or {}).get("deletionTimestamp")

    def diagnose_services(self, items: list[tuple[dict, PDInferenceService]], now: float) -> None:
        """The Serving condition of each service (its own field manager), and an
        Event when a failure starts or clears."""
        assert self.diagnosis is not None
        todo = []
        for body, svc in items:
            try:
                prom = self.prometheus(body["metadata"]["namespace"], svc)
            except PrometheusAuthError:
                continue  # MetricsAvailable says why
            if prom is not None:
                todo.append((body, svc, (prom, svc.spec.engine.kind, svc.spec.router_kind())))
        futures = {key: self.diagnosis.submit(key, frozenset()) for _, _, key in todo}
        if futures:
            wait(list(futures.values()), timeout=self.query_deadline)
        for body, svc, key in todo:
            namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
            self.last_diagnosis[(namespace, name)] = now
            result = self._result(key, futures[key])
            spec = svc.spec
            if result is None:
                verdict = Verdict("Unknown", "PrometheusUnreachable", f"Prometheus {key[0].url} did not answer")
            else:
                from ..render.engines import engine_for

                from ..render.pools import serving_selector

                key_ref = spec.engine.api_key_secret_ref
                # the pods the router discovers (its selectors), from the watch cache
                ips = ready_pod_ips([p for role in ("prefill", "decode")
                                     for p in self.kube.pods(namespace, serving_selector(svc, role))])
                verdict = diagnose(result.get((namespace, name)), served_name=spec.served_model_name(),
                                   ready_workers=len(ips), ready_ips=ips,
                                   engine=spec.engine.kind, router=key[2], backend=spec.backend(),
                                   engine_port=engine_for(svc).http_port,
                                   key_ref=f"Secret {key_ref.name} key {key_ref.key}" if key_ref else None)
            with LOCKS.get(namespace, name):
                self._write_serving(body, verdict)
        self.diagnosis.prune()

    def _write_serving(self, body: dict, verdict: Verdict) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        previous = [c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "Serving"]
        before = previous[0] if previous else {}
        stamp = now_rfc3339()
        cond = verdict.condition(body["metadata"].get("generation"))
        self.kube.patch_status(namespace, name, {"conditions": merge_conditions(previous, [cond], stamp)},
                               manager=DIAGNOSIS_MANAGER)
        old = before.get("reason")
        if verdict.reason != old:
            if verdict.reason in REASONS:
                self.event(body, "Warning", verdict.reason, verdict.message[:1000])
            if old in REASONS:
                self.event(body, "Normal", "ServingRecovered",
                           f"{old} cleared: " + (verdict.message if verdict.status == "True" else verdict.reason)[:900])

    def _result(self, key: tuple, future: Future) -> dict | None:
        """A query's answer; None (every pool that needs it holds) when it failed or is still running."""
        if not future.done():
            log.warning("Prometheus query %s %s did not answer within %gs", key[0], key[1:], self.query_deadline)
            return None
        err = future.exception()
        if err is not None:  # Prometheus down: every pool that needs it holds
            log.warning("Prometheus query %s %s failed: %s", key[0], key[1:], err)
            return None
        return future.result()

    def _service(self, body, svc: PDInferenceService, namespace: str, name: str, prom: Prometheus | None,
                 auth_error: str | None, results: dict, now: float, gpus: GPUView | None = None) -> None:
        spec = svc.spec
        inputs: dict[str, PoolInput] = {}
        templates: dict[str, dict] = {}
        unreachable = []
        for role in ("prefill", "decode"):
            pool = spec.pool(role)
            found = self.pool_state(namespace, svc, role)
            if found is None:
                return  # not created yet: the reconciler goes first
            state, templates[role] = found
            obs = None
            if pool.autoscaling.enabled and prom is not None:
                res = results.get((prom, spec.engine.kind, role, pool.autoscaling.target.quantile))
                if res is None:
                    unreachable.append(role)
                else:
                    obs = res.get((namespace, name))
            inputs[role] = PoolInput(state, obs, now)
        if (namespace, name) not in self.histories:  # after a restart or a failover: what status remembers
            self.histories[(namespace, name)] = histories_from_status(body.get("status") or {})
            for role in ("prefill", "decode"):  # kept too: the status apply would drop what it omits
                last = (body.get("status") or {}).get(role) or {}
                if last.get("lastScaleTime") and (namespace, name, role) not in self.last_scale:
                    self.last_scale[(namespace, name, role)] = (last["lastScaleTime"], last.get("lastScaleReason", ""))
        histories = self.histories[(namespace, name)]
        room = gpus.for_pools(templates, spec.gpu_resource_name()) if gpus else None
        decisions = plan_service(svc, inputs, histories, now, room)
        status = body.get("status") or {}
        patch: dict = {}
        stamp = now_rfc3339()
        for role, d in decisions.items():
            current = inputs[role].state.replicas
            if d.replicas != current:
                self.kube.apply_replicas(pool_kind(svc, role), namespace, child_name(svc, role), d.replicas)
                log.info("%s/%s %s: %s", namespace, name, role, d.reason)
                self.event(body, "Normal", "Autoscaled", f"{role}: {d.reason}")
                # the CRD caps the status field: a longer reason would have the whole patch refused
                why = d.reason if len(d.reason) <= SCALE_REASON_MAX else d.reason[:SCALE_REASON_MAX - 3] + "..."
                self.last_scale[(namespace, name, role)] = (stamp, why)
            if (namespace, name, role) in self.last_scale:
                at, why = self.last_scale[(namespace, name, role)]
                patch[role] = {"lastScaleTime": at, "lastScaleReason": why}
            if role in histories:
                patch.setdefault(role, {})["autoscaler"] = history_to_status(histories[role])
        # the figures read this round, stamped with it: a figure not read now (Prometheus down, no
        # series) is left out, never shown as current under a new observedAt
        metrics = {}
        for role, key in (("prefill", "ttft"), ("decode", "itl")):
            obs = inputs[role].observation
            if obs is not None and obs.observed is not None:  # "420ms p99": the quantile the pool is sized on
                metrics[key] = f"{_ms(obs.observed)} p{spec.pool(role).autoscaling.target.quantile * 100:g}"
        if metrics:
            metrics["observedAt"] = stamp
        patch["metrics"] = metrics
        why = "; ".join(f"{r}: {d.reason}" for r, d in decisions.items())
        available = all(d.metrics_available for d in decisions.values()) and not unreachable and prom is not None
        if auth_error:
            active, reason, why = "False", "PrometheusAuth", auth_error + "; holding: " + why
        elif prom is None:
            active, reason, why = "False", "NoPrometheus", "spec.autoscaling.prometheus.url is not set: set it so the autoscaler can read TTFT/ITL"
        else:
            active, reason = "True", "Deciding"
        if available:
            metrics_reason = "Fresh"
        elif auth_error or prom is None:
            metrics_reason = reason
        else:
            metrics_reason = "PrometheusUnreachable" if unreachable else "NoData"
            if unreachable:
                why = f"Prometheus {prom.url} did not answer; holding: " + why
        generation = body["metadata"].get("generation")
        conds = [
            {"type": "AutoscalingActive", "status": active, "reason": reason, "message": why[:2000],
             "observedGeneration": generation},
            {"type": "MetricsAvailable", "status": "True" if available else "False", "reason": metrics_reason,
             "message": ("latest signals read " + stamp) if available else why[:2000], "observedGeneration": generation},
        ]
        patch["conditions"] = merge_conditions(status.get("conditions", []), conds, stamp)
        self.kube.patch_status(namespace, name, patch, manager=AUTOSCALER_MANAGER)


MEMORY_ITEMS = 64  # status.<pool>.autoscaler lists (the CRD's maxItems)


def stabilizing(recs: list[Recommendation]) -> list[Recommendation]:
    """The recommendations that can still decide a stabilization window, in order: one with a
    later one at least as high never sets the scale-down window's highest (the later one is in
    every window it is in), nor one with a later one at least as low the scale-up window's
    lowest. Leaving those out changes no window's result; status keeps only MEMORY_ITEMS, and a
    window of up to 3600 s holds 120 rounds of 30 s."""
    kept, hi, lo = [], None, None
    for e in reversed(recs):
        if hi is None or e.replicas > hi or e.replicas < lo:
            kept.append(e)
        hi = e.replicas if hi is None else max(hi, e.replicas)
        lo = e.replicas if lo is None else min(lo, e.replicas)
    return kept[::-1]


def history_to_status(history: History) -> dict:
    """A pool's History as status keeps it: the stabilization windows' recommendations and
    resizes (the newest MEMORY_ITEMS of each), and what the law learned -- the capacity
    correction (rule 3b), the engines' step time (3b'), what those were learned on, the pods'
    start time and the demand of the trend window (3d), since when the pool has been saturated
    (3b), the latency the feedback was shown futile at (2b) and the sizes seen too small (2d) --
    so that a failover does not relearn them."""
    recs = stabilizing(history.recommendations)
    out: dict = {"recommendations": [[round(e.at, 3), e.replicas] for e in recs[-MEMORY_ITEMS:]],
                 "changes": [[round(c.at, 3), c.before, c.after] for c in history.changes[-MEMORY_ITEMS:]],
                 "demands": [[round(at, 3), round(d, 3)] for at, d in history.demands[-MEMORY_ITEMS:]]}
    if history.capacity_factor < 1.0:
        out["capacityFactor"] = round(history.capacity_factor, 4)
    if history.step_ratio is not None:
        out["stepRatio"] = round(history.step_ratio, 4)
    if history.start_seconds is not None:
        out["startSeconds"] = round(max(0.0, history.start_seconds), 1)  # the schema's minimum
    if history.basis is not None:
        out["basis"] = history.basis
    if history.saturated_since is not None and history.saturated_since >= 0:
        out["saturatedSince"] = round(history.saturated_since, 3)
    if history.futile is not None:
        out["futile"] = round(max(0.0, history.futile), 6)
    if history.overloads:
        out["overloads"] = [[round(x.at, 3), x.ready, round(x.load, 3), round(x.observed, 6)]
                            for x in history.overloads[-MEMORY_ITEMS:]]
    return out


def histories_from_status(status: dict) -> dict[str, History]:
    """The pools' Histories from status (empty where it has none or it is unreadable)."""
    out: dict[str, History] = {}
    for role in ("prefill", "decode"):
        mem = ((status.get(role) or {}).get("autoscaler")) or {}
        try:
            factor, ratio, start = mem.get("capacityFactor"), mem.get("stepRatio"), mem.get("startSeconds")
            since, futile = mem.get("saturatedSince"), mem.get("futile")
            out[role] = History(recommendations=[Recommendation(at=float(a), replicas=int(r)) for a, r in mem.get("recommendations") or []],
                                changes=[Change(at=float(a), before=int(b), after=int(c)) for a, b, c in mem.get("changes") or []],
                                demands=[(float(a), float(d)) for a, d in mem.get("demands") or []],
                                capacity_factor=min(1.0, float(factor)) if factor is not None else 1.0,
                                step_ratio=float(ratio) if ratio is not None else None,
                                start_seconds=float(start) if start is not None else None,
                                basis=str(mem["basis"]) if mem.get("basis") is not None else None,
                                saturated_since=float(since) if since is not None else None,
                                futile=float(futile) if futile is not None else None,
                                overloads=_overloads(mem.get("overloads") or []))
        except (TypeError, ValueError):
            out[role] = History()
    return out


def _overloads(items: list) -> list[Overload]:
    """Rule 2d's records as status keeps them, less any a hand edit made meaningless (a size
    under 1 or not whole, a load or latency not above 0): each would hold a scale-down on
    nothing the pool showed."""
    out = []
    for at, ready, load, observed in items:
        x = Overload(at=float(at), ready=int(ready), load=float(load), observed=float(observed))
        if (x.ready == ready and x.ready >= 1 and math.isfinite(x.load) and x.load > 0
                and math.isfinite(x.observed) and x.observed > 0):
            out.append(x)
    return out


def prometheus_signals() -> SignalFn:
    """The real signal source: one PrometheusSignals client per Prometheus URL."""
    from ..autoscale.signals import PrometheusSignals

    clients: dict[Prometheus, PrometheusSignals] = {}

    def fetch(prom: Prometheus, engine: str, role: str, quantile: float, secondaries: frozenset[str] = frozenset()):
        if prom not in clients:
            if len(clients) > 64:  # rotated tokens, removed services: start afresh
                clients.clear()
            clients[prom] = PrometheusSignals(prom.url, token=prom.token)
        return clients[prom].pool(engine, role, quantile, secondaries=sorted(secondaries))

    return fetch


def prometheus_diagnosis() -> DiagnosisFn:
    """The real source of the Serving signals: one PrometheusSignals client per Prometheus."""
    from ..autoscale.signals import PrometheusSignals

    clients: dict[Prometheus, PrometheusSignals] = {}

    def fetch(prom: Prometheus, engine: str, router: str):
        if prom not in clients:
            if len(clients) > 64:
                clients.clear()
            clients[prom] = PrometheusSignals(prom.url, token=prom.token)
        return clients[prom].diagnosis(engine, router)

    return fetch


def run_forever(autoscaler: Autoscaler, kube: Kube, namespaces: list[str], stop: threading.Event, tick: float = 5.0,
                health: Health = HEALTH, max_age: float | None = None, active: threading.Event | None = None) -> None:
    """Every ``tick`` seconds, decide the services whose interval has passed.

    Liveness (controller/health.py) follows this loop: a turn that takes far
    longer than its query deadline (a hung call to the API server) turns
    ``/healthz`` to 503."""
    if max_age is None:
        max_age = 3 * (tick + autoscaler.query_deadline) + 60
    def round_(ns: str | None) -> None:
        if active is None or active.is_set():  # only the replica holding the lease decides
            autoscaler.run_once(kube.list_services(ns))

    every(tick, stop, namespaces, round_, "autoscaler",
          health=health, max_age=max_age)
