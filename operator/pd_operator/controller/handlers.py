"""kopf handlers. Thin: each one records what a watch saw and queues a reconcile.

- every event of a PDInferenceService, of its children (StatefulSets,
  Deployments, Services, ...) and of its pods lands in the in-process cache
  (``cache.py``): the reconciler and the autoscaler read from it, not from
  the API server;
- a service whose spec (generation), labels or annotations changed, or a
  child that changed or went, queues a reconcile of that service in the one
  keyed work queue (``workqueue.py``: coalesced, per-key backoff); a pod
  event queues it after CHILD_SETTLE_SECONDS so a rollout's burst is one run;
- one resync loop queues every cached service every RESYNC_SECONDS (600 s: the
  watches drive everything, this is the backstop; it sends no request); a
  service missing a Secret (Secrets are not watched) is looked at every 10 s;
- a deleted service is forgotten everywhere (queue, cache, locks, the
  autoscaler's memory, metric series).
The handlers are ``on.event`` only: kopf writes nothing on the services (no
finalizer, no progress annotations), so replicas on standby never write.
Only the replica holding the leader Lease (``leader.py``) takes keys off the
queue, resyncs and autoscales.
"""

from __future__ import annotations

import logging
import os
import threading

import kopf

from ..api.constants import GROUP, LABEL_MANAGED_BY, LABEL_SERVICE, PLURAL, VERSION
from .cache import POD_KIND, SERVICE_KIND, SERVICE_METADATA_WATCHED, Cache, CachedKube
from .health import HEALTH
from .kube import FIELD_MANAGER, Kube
from .loop import every
from .reconcile import LOCKS, OWNED, REFUSALS, reconcile
from .workqueue import WorkQueue

# Drift backstop; child events restore hand edits within seconds already.
RESYNC_SECONDS = float(os.environ.get("PD_OPERATOR_RESYNC_SECONDS", "600"))
SECRET_RECHECK_SECONDS = 10.0
RESYNC_SPREAD_SECONDS = 60.0
CHILD_SETTLE_SECONDS = 0.5
WARMUP_SECONDS = float(os.environ.get("PD_OPERATOR_WARMUP_SECONDS", "2"))
WORKERS = int(os.environ.get("PD_OPERATOR_WORKERS", "4"))
STATE: dict = {"kube": None}
CACHE = Cache()
# Set while this replica may write (it holds the lease; always, without leader election).
ACTIVE = threading.Event()
ACTIVE.set()


def may_write() -> bool:
    """This replica writes only while it is the active one and, with leader election, within
    its Lease's renew deadline (``LeaderElector.holds``): checked before every write."""
    elector = STATE.get("elector")
    return ACTIVE.is_set() and (elector is None or elector.holds())


def kube() -> CachedKube:
    if STATE["kube"] is None:
        STATE["kube"] = CachedKube(Kube(), CACHE, may_write=may_write)
    return STATE["kube"]


def post_event(body: dict, type_: str, reason: str, message: str) -> None:
    """An Event on the service (reconciles run on the queue's threads, outside
    kopf's handler context, so this posts it itself)."""
    try:
        kube().post_event(body, type_, reason, message)
    except Exception:  # events are best effort; never fail a reconcile on them
        logging.getLogger(__name__).warning("event %s not posted", reason, exc_info=True)


def process(key: tuple[str, str]) -> None:
    """Reconcile the newest cached version of one service (the queue's work function)."""
    namespace, name = key
    body = kube().get_service(namespace, name)
    if body is not None and not body["metadata"].get("deletionTimestamp"):
        status = reconcile(kube(), body, post_event)
        if CACHE.get(SERVICE_KIND, namespace, name) is None:
            # deleted while it was reconciled: what the run put back (owned fields, refusals,
            # its metric series) goes too, or it would stay for ever
            forget_service(namespace, name)
            return
        if any(c.get("reason") == "SecretNotFound" for c in status.get("conditions") or []):
            # Secrets are not watched (no cluster-wide Secret reads): look again soon
            QUEUE.add(key, delay=SECRET_RECHECK_SECONDS)


QUEUE = WorkQueue(process, active=ACTIVE)


def reconcile_service(namespace: str, name: str, settle: float = 0.0) -> None:
    """Queue a reconcile of one service (coalesced with any already queued)."""
    QUEUE.add((namespace, name), delay=settle)


class NoEssence(kopf.DiffBaseStorage):
    """kopf diffs each watched object's "essence" (a deep copy of the body, copied
    again) on every event, for on.create/on.update handlers and their
    last-handled-configuration annotation. This operator has only on.event
    handlers: the diff has no reader, and while 400 services were created its deep
    copies took more of the operator's samples (py-spy) than rendering and hashing
    their children together."""

    def build(self, *, body, extra_fields=None):
        return {}

    def fetch(self, *, body):
        return None

    def store(self, *, body, patch, essence) -> None:
        return None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    """All operator settings in one place."""
    settings.persistence.diffbase_storage = NoEssence()
    # Our own events are posted explicitly; kopf's per-handler chatter is not.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.execution.max_workers = 8
    settings.batching.error_delays = [1, 2, 5, 10, 30]


def _spec_changed(old: dict | None, new: dict) -> bool:
    if old is None:
        return True
    a, b = old.get("metadata") or {}, new.get("metadata") or {}
    return any(a.get(k) != b.get(k) for k in SERVICE_METADATA_WATCHED)


def on_service_event(event: dict) -> None:
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if not namespace or not name:
        return
    if event.get("type") == "DELETED":
        forget_service(namespace, name)
        return
    old = CACHE.get(SERVICE_KIND, namespace, name)
    if event.get("type") == "ADDED" and old is None and ACTIVE.is_set():
        # created while this replica writes (kopf's initial listing has no type): no
        # pool of it can exist that this replica did not write
        CACHE.mark_born_here(namespace, name)
    CACHE.put(SERVICE_KIND, obj)
    if _spec_changed(old, obj):
        reconcile_service(namespace, name)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_service(event: dict, **_) -> None:
    on_service_event(event)


def forget_service(namespace: str, name: str) -> None:
    from . import metrics

    metrics.forget_service(namespace, name)
    LOCKS.forget(namespace, name)
    REFUSALS.forget(namespace, name)
    OWNED.forget(namespace, name)
    QUEUE.forget((namespace, name))
    CACHE.forget_service(namespace, name)
    if STATE.get("kube") is not None and hasattr(STATE["kube"], "forget_service"):
        STATE["kube"].forget_service(namespace, name)
    if STATE.get("autoscaler") is not None:
        STATE["autoscaler"].forget(namespace, name)


def sweep(namespace: str | None) -> int:
    """Drop from the cache what no longer exists: after a watch is restarted on 410 Gone,
    kopf lists again and delivers what it finds, but sends no DELETED for what went in the
    gap (an API server restarted during an upgrade), so a deleted NetworkPolicy looked
    present (never restored) and a deleted service kept being reconciled. One metadata-only
    LIST per watched kind (paged), against a snapshot taken before it: what the snapshot
    holds and the list does not was deleted before the list, unless a newer copy (another
    uid) arrived since. Returns how many objects were dropped."""
    from .kube import KINDS

    api = kube()
    managed = f"{LABEL_MANAGED_BY}={FIELD_MANAGER},{LABEL_SERVICE}"
    scans = [(SERVICE_KIND, f"{GROUP}/{VERSION}", PLURAL, ""), (POD_KIND, "v1", "pods", LABEL_SERVICE)]
    scans += [(kind, *KINDS[kind], managed) for kind in CHILD_KINDS.values() if kind in KINDS]
    dropped = 0
    for kind, api_version, plural, selector in scans:
        before = CACHE.uids(kind, namespace)
        if not before:
            continue
        listed = api.list_names(api_version, plural, namespace, selector)
        if listed is None:
            continue  # the kind is not served (no LWS CRD): nothing of it can be cached either
        present = {(ns, name) for ns, name, _ in listed}
        for (ns, name), uid in before.items():
            if (ns, name) in present:
                continue
            if kind == SERVICE_KIND:
                if CACHE.get(SERVICE_KIND, ns, name) is not None and \
                        (CACHE.get(SERVICE_KIND, ns, name)["metadata"].get("uid") or "") == uid:
                    forget_service(ns, name)
                    dropped += 1
            elif CACHE.remove_if(kind, ns, name, uid):
                dropped += 1
    if dropped:
        logging.getLogger(__name__).warning("%d cached objects no longer exist (a watch restarted after a "
                                            "gap): dropped", dropped)
    return dropped


def resync(namespace: str | None) -> None:
    """Drop what no longer exists from the cache (``sweep``), then queue every cached
    service in ``namespace`` (None: all in scope)."""
    try:
        sweep(namespace)
    except Exception:  # noqa: BLE001 - the next resync sweeps again
        logging.getLogger(__name__).warning("cache sweep failed", exc_info=True)
    if not ACTIVE.is_set():
        return
    services = CACHE.select(SERVICE_KIND, namespace, {})
    # spread over a while, so an edit queued meanwhile waits behind a few of them, not all
    spread = min(RESYNC_SPREAD_SECONDS, RESYNC_SECONDS / 2)
    for i, body in enumerate(services):
        reconcile_service(body["metadata"]["namespace"], body["metadata"]["name"], settle=spread * i / len(services))


# How often the autoscaler looks for services due for a round; each service is
# decided every spec.autoscaling.interval (default 30 s).
AUTOSCALE_TICK_SECONDS = float(os.environ.get("PD_OPERATOR_AUTOSCALE_TICK_SECONDS", "5"))


@kopf.on.startup()
def start_loops(memo: kopf.Memo, **_) -> None:
    from .autoscaler import Autoscaler, prometheus_diagnosis, prometheus_signals, run_forever

    stop = threading.Event()
    memo["resync_stop"] = stop
    namespaces = STATE.get("namespaces", [])
    QUEUE.start(WORKERS)
    elector = STATE.get("elector")
    # The first seconds fill the cache from the watches' initial listings, so
    # the first reconciles do not report pods missing that are only unseen.
    ACTIVE.clear()
    if elector is None:
        threading.Timer(WARMUP_SECONDS, ACTIVE.set).start()
    else:

        def changed(leading: bool) -> None:
            from . import metrics

            metrics.LEADER.set(1 if leading else 0)
            if leading:
                if STATE.get("autoscaler") is not None:
                    STATE["autoscaler"].reset()  # a new term starts from status, not an old term's memory
                ACTIVE.set()
                services = CACHE.select(SERVICE_KIND, None, {})
                for body in services:  # take over: look at every service once
                    reconcile_service(body["metadata"]["namespace"], body["metadata"]["name"])
                logging.getLogger(__name__).info("leading: %d cached services queued", len(services))
                QUEUE.wake()
            else:
                ACTIVE.clear()
                CACHE.forget_born_here()

        elector.on_change = changed
        elector_stop = threading.Event()  # its own: the Lease is given up only after the writes end
        memo["elector_stop"] = elector_stop
        threading.Timer(WARMUP_SECONDS, lambda: threading.Thread(
            target=elector.run, args=(elector_stop,), name="leader", daemon=True).start()).start()
    threading.Thread(target=every, args=(RESYNC_SECONDS, stop, namespaces, resync, "resync"),
                     kwargs={"health": HEALTH, "max_age": 3 * RESYNC_SECONDS + 600},
                     name="resync", daemon=True).start()
    autoscaler = Autoscaler(kube(), prometheus_signals(), post_event, token_urls=STATE.get("token_urls", ()),
                            free_gpu_cap=STATE.get("free_gpu_cap", True),
                            diagnosis=prometheus_diagnosis())
    STATE["autoscaler"] = autoscaler
    threading.Thread(target=run_forever, args=(autoscaler, kube(), namespaces, stop, AUTOSCALE_TICK_SECONDS),
                     kwargs={"active": ACTIVE}, name="autoscaler", daemon=True).start()


# How long a clean shutdown waits for the reconciles in progress before it gives the Lease up.
SHUTDOWN_DRAIN_SECONDS = 10.0


@kopf.on.cleanup()
def stop_loops(memo: kopf.Memo, **_) -> None:
    """Stop writing first, let the reconciles in progress end, then give the Lease up: the
    standby takes over at once, and no write of this replica lands after it started."""
    if "resync_stop" in memo:
        memo["resync_stop"].set()
    ACTIVE.clear()
    QUEUE.stop()
    QUEUE.wait_idle(SHUTDOWN_DRAIN_SECONDS)
    if "elector_stop" in memo:
        memo["elector_stop"].set()
    elector = STATE.get("elector")
    if elector is not None:
        elector.release()


CHILDREN = {LABEL_MANAGED_BY: FIELD_MANAGER, LABEL_SERVICE: kopf.PRESENT}
CHILD_KINDS = {"statefulsets": "StatefulSet", "leaderworkersets": "LeaderWorkerSet", "deployments": "Deployment", "services": "Service",
               "configmaps": "ConfigMap", "serviceaccounts": "ServiceAccount",
               "poddisruptionbudgets": "PodDisruptionBudget", "roles": "Role", "rolebindings": "RoleBinding",
               "networkpolicies": "NetworkPolicy", "pods": POD_KIND}


def on_child_event(kind: str, event: dict) -> None:
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    service = (meta.get("labels") or {}).get(LABEL_SERVICE)
    if not namespace or not name:
        return
    if event.get("type") == "DELETED":
        CACHE.remove(kind, namespace, name)
    else:
        old = CACHE.get(kind, namespace, name)
        if old is not None and old["metadata"].get("resourceVersion") == meta.get("resourceVersion"):
            return  # the echo of the operator's own write (its response is cached): nothing new
        CACHE.put(kind, obj)
    if service and CACHE.has(SERVICE_KIND, namespace, service):
        # pods: let a burst settle; a child edited or deleted by hand: restore it
        reconcile_service(namespace, service, settle=CHILD_SETTLE_SECONDS)


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
async def on_child(event: dict, resource: kopf.Resource, **_) -> None:
    on_child_event(CHILD_KINDS[resource.plural], event)
