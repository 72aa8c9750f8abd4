"""kopf handlers. Thin: each one asks for a reconcile of one service.

- create/update/resume of a PDInferenceService: reconcile now;
- one resync loop for all services every RESYNC_SECONDS: the drift and
  status backstop (one loop, not a kopf timer per object: kopf would put a
  finalizer on every service to stop its timer, and nothing here needs one);
- events of the children (StatefulSets, Deployments, Services, pods, ...):
  reconcile the owning service, so a child edited or deleted by hand is
  restored within seconds and status follows the pods.
Reconciles of one service are coalesced: while one runs, further requests
collapse into one more run that reads the service afresh.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import kopf

from ..api.constants import GROUP, LABEL_MANAGED_BY, LABEL_SERVICE, PLURAL, VERSION
from .health import HEALTH
from .kube import FIELD_MANAGER, Kube
from .loop import every
from .reconcile import LOCKS, reconcile

# Drift backstop; child events restore hand edits within seconds already.
RESYNC_SECONDS = float(os.environ.get("PD_OPERATOR_RESYNC_SECONDS", "60"))
CHILD_SETTLE_SECONDS = 0.5
STATE: dict = {"kube": None}
_guard = threading.Lock()
_runs: dict[tuple[str, str], dict] = {}


def kube() -> Kube:
    if STATE["kube"] is None:
        STATE["kube"] = Kube()
    return STATE["kube"]


def post_event(body: dict, type_: str, reason: str, message: str) -> None:
    try:
        kopf.event(body, type=type_, reason=reason, message=message[:1024])
        return
    except Exception:  # noqa: BLE001 - outside kopf's own tasks (the autoscaler's thread) there is no event queue
        pass
    try:
        kube().create_event(body, type_, reason, message)
    except Exception:  # events are best effort; never fail a reconcile on them
        logging.getLogger(__name__).warning("event %s not posted", reason, exc_info=True)


def reconcile_service(namespace: str, name: str, settle: float = 0.0) -> None:
    """Reconcile the latest version of one service, coalescing concurrent requests.

    ``settle``: wait this long before reading, so a burst of child events
    (a rollout touches many pods) collapses into one reconcile.
    """
    key = (namespace, name)
    with _guard:
        run = _runs.setdefault(key, {"running": False, "dirty": False})
        if run["running"]:
            run["dirty"] = True
            return
        run["running"] = True
    try:
        if settle:
            time.sleep(settle)
        while True:
            body = kube().get_service(namespace, name)
            if body is not None and not body["metadata"].get("deletionTimestamp"):
                reconcile(kube(), body, post_event)
            with _guard:
                if not run["dirty"]:
                    run["running"] = False
                    return
                run["dirty"] = False
    except BaseException:
        with _guard:
            run["running"] = False
        raise


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    """All operator settings in one place."""
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    # Our own events are posted explicitly; kopf's per-handler chatter is not.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.execution.max_workers = 8
    settings.batching.error_delays = [1, 2, 5, 10, 30]


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def on_service(namespace: str, name: str, **_) -> None:
    reconcile_service(namespace, name)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def on_service_deleted(namespace: str, name: str, **_) -> None:
    """Forget a deleted service: its metric series and the loops' memory of it
    (optional: no finalizer, best effort; a missed deletion leaves one series)."""
    forget_service(namespace, name)


def forget_service(namespace: str, name: str) -> None:
    from . import metrics

    metrics.forget_service(namespace, name)
    LOCKS.forget(namespace, name)
    if STATE.get("autoscaler") is not None:
        STATE["autoscaler"].forget(namespace, name)
    with _guard:
        run = _runs.get((namespace, name))
        if run is not None and not run["running"]:
            del _runs[(namespace, name)]


def resync(namespace: str | None) -> None:
    """Reconcile every service in ``namespace`` (None: all in scope)."""
    for body in kube().list_services(namespace):
        reconcile_service(body["metadata"]["namespace"], body["metadata"]["name"])


# How often the autoscaler looks for services due for a round; each service is
# decided every spec.autoscaling.interval (default 30 s).
AUTOSCALE_TICK_SECONDS = float(os.environ.get("PD_OPERATOR_AUTOSCALE_TICK_SECONDS", "5"))


@kopf.on.startup()
def start_resync(memo: kopf.Memo, **_) -> None:
    from .autoscaler import Autoscaler, prometheus_diagnosis, prometheus_signals, run_forever

    stop = threading.Event()
    memo["resync_stop"] = stop
    namespaces = STATE.get("namespaces", [])
    threading.Thread(target=every, args=(RESYNC_SECONDS, stop, namespaces, resync, "resync"),
                     kwargs={"health": HEALTH, "max_age": 3 * RESYNC_SECONDS + 600},  # a round reconciles every service
                     name="resync", daemon=True).start()
    autoscaler = Autoscaler(kube(), prometheus_signals(), post_event, token_urls=STATE.get("token_urls", ()),
                            diagnosis=prometheus_diagnosis())
    STATE["autoscaler"] = autoscaler
    threading.Thread(target=run_forever, args=(autoscaler, kube(), namespaces, stop, AUTOSCALE_TICK_SECONDS),
                     name="autoscaler", daemon=True).start()


@kopf.on.cleanup()
def stop_resync(memo: kopf.Memo, **_) -> None:
    if "resync_stop" in memo:
        memo["resync_stop"].set()


CHILDREN = {LABEL_MANAGED_BY: FIELD_MANAGER, LABEL_SERVICE: kopf.PRESENT}


@kopf.on.event("apps", "v1", "statefulsets", labels=CHILDREN)
@kopf.on.event("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", labels=CHILDREN)
@kopf.on.event("apps", "v1", "deployments", labels=CHILDREN)
@kopf.on.event("", "v1", "services", labels=CHILDREN)
@kopf.on.event("", "v1", "configmaps", labels=CHILDREN)
@kopf.on.event("", "v1", "serviceaccounts", labels=CHILDREN)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=CHILDREN)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "roles", labels=CHILDREN)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "rolebindings", labels=CHILDREN)
@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=CHILDREN)
@kopf.on.event("", "v1", "pods", labels={LABEL_SERVICE: kopf.PRESENT})
def on_child(namespace: str, labels: dict, **_) -> None:
    reconcile_service(namespace, labels[LABEL_SERVICE], settle=CHILD_SETTLE_SECONDS)
