"""The autoscaler loop: read signals, decide (pure), write replicas, report.

Thin: the PromQL is in autoscale/promql.py, the decisions in
autoscale/decide.py and plan.py. This module gathers what they need from the
cluster and Prometheus, and writes the result through the operator's single
replicas writer (the ``pd-operator-replicas`` field manager), an Event and
the status.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..api import SpecError, validate_service
from ..api.models import PDInferenceService
from ..autoscale.decide import History, PoolState
from ..autoscale.plan import PoolInput, plan_service
from ..autoscale.promql import Observation
from ..render.common import child_name, selector_labels
from .kube import AUTOSCALER_MANAGER, Kube
from .reconcile import LOCKS, EventFn, now_rfc3339
from .status import merge_conditions, pool_status

log = logging.getLogger(__name__)

# (url, engine, role, quantile) -> {(namespace, service): Observation}
SignalFn = Callable[[str, str, str, float], dict[tuple[str, str], Observation]]


def _ms(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return f"{seconds * 1000:.0f}ms" if seconds < 10 else f"{seconds:.1f}s"


class Autoscaler:
    """One loop for all services in scope; histories kept per (namespace, name, role)."""

    def __init__(self, kube: Kube, signals: SignalFn, event: EventFn, clock: Callable[[], float] = time.time):
        self.kube, self.signals, self.event, self.clock = kube, signals, event, clock
        self.histories: dict[tuple[str, str], dict[str, History]] = {}
        # applied every round (an apply that omits a field gives it up)
        self.last_scale: dict[tuple[str, str, str], tuple[str, str]] = {}

    def pool_state(self, namespace: str, svc: PDInferenceService, role: str) -> PoolState | None:
        sts = self.kube.get("StatefulSet", namespace, child_name(svc, role))
        if sts is None:
            return None
        pods = self.kube.pods(namespace, selector_labels(svc, role))
        ps = pool_status(sts, pods)
        starting = max(0, ps["replicas"] - ps["readyReplicas"] - ps["pendingReplicas"])
        return PoolState(replicas=ps["desiredReplicas"], ready=ps["readyReplicas"], starting=starting,
                         unschedulable=ps["pendingReplicas"])

    def run_once(self, bodies: list[dict]) -> None:
        now = self.clock()
        services = []
        for body in bodies:
            try:
                svc = validate_service(body)
            except SpecError:
                continue  # the reconciler reports it
            spec = svc.spec
            if not (spec.prefill.autoscaling.enabled or spec.decode.autoscaling.enabled):
                continue
            services.append((body, svc))
        # one query per (prometheus, engine, role, quantile) for all services
        wanted = set()
        for _, svc in services:
            url = svc.spec.autoscaling.prometheus.url if svc.spec.autoscaling.prometheus else None
            for role in ("prefill", "decode"):
                pool = svc.spec.prefill if role == "prefill" else svc.spec.decode
                if url and pool.autoscaling.enabled:
                    wanted.add((url, svc.spec.engine.kind, role, pool.autoscaling.target.quantile))
        results: dict[tuple, dict] = {}
        for key in sorted(wanted):
            try:
                results[key] = self.signals(*key)
            except Exception as err:  # Prometheus down: every pool that needs it holds
                log.warning("Prometheus query %s failed: %s", key, err)
                results[key] = None
        for body, svc in services:
            namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
            with LOCKS.get(namespace, name):
                self._service(body, svc, namespace, name, results, now)

    def _service(self, body, svc: PDInferenceService, namespace: str, name: str, results: dict, now: float) -> None:
        spec = svc.spec
        url = spec.autoscaling.prometheus.url if spec.autoscaling.prometheus else None
        inputs: dict[str, PoolInput] = {}
        errors = []
        for role in ("prefill", "decode"):
            pool = spec.prefill if role == "prefill" else spec.decode
            state = self.pool_state(namespace, svc, role)
            if state is None:
                return  # not created yet: the reconciler goes first
            obs = None
            if pool.autoscaling.enabled:
                res = results.get((url, spec.engine.kind, role, pool.autoscaling.target.quantile)) if url else None
                if res is None:
                    errors.append(role)
                else:
                    obs = res.get((namespace, name))
            inputs[role] = PoolInput(state, obs, now)
        histories = self.histories.setdefault((namespace, name), {})
        decisions = plan_service(svc, inputs, histories, now)
        status = body.get("status") or {}
        patch: dict = {}
        stamp = now_rfc3339()
        for role, d in decisions.items():
            current = inputs[role].state.replicas
            if d.replicas != current:
                self.kube.apply_replicas("StatefulSet", namespace, child_name(svc, role), d.replicas)
                self.event(body, "Normal", "Autoscaled", f"{role}: {d.reason}")
                self.last_scale[(namespace, name, role)] = (stamp, d.reason)
            if (namespace, name, role) in self.last_scale:
                at, why = self.last_scale[(namespace, name, role)]
                patch[role] = {"lastScaleTime": at, "lastScaleReason": why}
        metrics = dict(status.get("metrics") or {})
        for role, key in (("prefill", "ttftP99"), ("decode", "itlP99")):
            obs = inputs[role].observation
            if obs is not None and obs.observed is not None:
                metrics[key] = _ms(obs.observed)
        metrics["observedAt"] = stamp
        patch["metrics"] = metrics
        available = all(d.metrics_available for d in decisions.values()) and not errors
        why = "; ".join(f"{r}: {d.reason}" for r, d in decisions.items())
        if not url:
            why = "autoscaling.prometheus.url is not set: set it so the autoscaler can read TTFT/ITL"
        conds = [
            {"type": "AutoscalingActive", "status": "True" if url else "False",
             "reason": "Deciding" if url else "NoPrometheus", "message": why[:2000], "observedGeneration": body["metadata"].get("generation")},
            {"type": "MetricsAvailable", "status": "True" if available else "False",
             "reason": "Fresh" if available else ("PrometheusUnreachable" if errors else "NoData"),
             "message": ("latest signals read " + stamp) if available else why[:2000],
             "observedGeneration": body["metadata"].get("generation")},
        ]
        patch["conditions"] = merge_conditions(status.get("conditions", []), conds, stamp)
        self.kube.patch_status(namespace, name, patch, manager=AUTOSCALER_MANAGER)


def prometheus_signals() -> SignalFn:
    """The real signal source: one PrometheusSignals client per Prometheus URL."""
    from ..autoscale.signals import PrometheusSignals

    clients: dict[str, PrometheusSignals] = {}

    def fetch(url: str, engine: str, role: str, quantile: float):
        if url not in clients:
            clients[url] = PrometheusSignals(url)
        return clients[url].pool(engine, role, quantile)

    return fetch


def run_forever(autoscaler: Autoscaler, kube: Kube, namespaces: list[str], stop: threading.Event, interval: float = 30.0) -> None:
    while not stop.wait(interval):
        for namespace in namespaces or [None]:
            try:
                autoscaler.run_once(kube.list_services(namespace))
            except Exception:
                log.exception("autoscaling round for %s failed", namespace or "(all namespaces)")

