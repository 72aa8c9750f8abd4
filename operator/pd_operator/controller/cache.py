"""What the watches have seen: the operator's reads come from here, not from requests.

kopf already watches the PDInferenceServices, every child kind and the pods
(``handlers.py``); each event lands in a ``Cache``. ``CachedKube`` answers
the reads of the reconciler and the autoscaler from it (a GET only for a pool not seen
yet) and forwards the
writes, keeping their responses, so with nothing changing a reconcile sends
no request at all (``reconcile.py`` writes only what differs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..api.constants import LABEL_MANAGED_BY, LABEL_SERVICE
from .kube import FIELD_MANAGER, KINDS, Kube, content_hash

SERVICE_KIND = "PDInferenceService"
POOL_KINDS = ("StatefulSet", "LeaderWorkerSet")
# The children whose spec and status the operator reads (status, autoscaler, GPU fit).
WORKLOAD_KINDS = (*POOL_KINDS, "Deployment")
POD_KIND = "Pod"
# A Secret found usable is trusted this long before it is read again (a
# missing one is read again at every reconcile, so the fix is seen at once).
SECRET_OK_TTL_SECONDS = 600.0


def _rv(obj: dict) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


# Kept on a cached child instead of its managed fields' field sets (fieldsV1, as
# large as the object itself): the fingerprint of the fields the operator's apply
# owns (reconcile.Owned). In memory only; a cached object is never written back.
OUR_FIELDS = "__pdOurFields"


def fields_fingerprint(managed_fields: list[dict]) -> str | None:
    """A fingerprint of the field sets the operator's main apply owns (None: it owns none)."""
    entries = [e for e in managed_fields if e.get("manager") == FIELD_MANAGER and not e.get("subresource")]
    if not entries:
        return None
    return content_hash({"fields": [e.get("fieldsV1") for e in entries]})


# What nobody reads from a cached pod or pod template (the engines' command lines and
# env are the largest part of them): status reads the pods' state, the GPU fit a
# template's scheduling fields and resources.
_UNREAD_CONTAINER_FIELDS = ("command", "args", "env")


def _slim_pod_spec(spec: dict | None) -> dict | None:
    if not spec:
        return spec
    out = dict(spec)
    for key in ("containers", "initContainers"):
        if spec.get(key):
            out[key] = [{k: v for k, v in c.items() if k not in _UNREAD_CONTAINER_FIELDS} for c in spec[key]]
    return out


# What is read of a workload's pod template: the GPU fit (autoscale/fit.py) reads
# the containers' resources and the scheduling fields; nothing else.
_READ_TEMPLATE_FIELDS = ("containers", "initContainers", "nodeSelector", "affinity", "tolerations", "overhead")


def _slim_template(template: dict | None) -> dict | None:
    if not template:
        return template
    spec = template.get("spec") or {}
    kept = {k: spec[k] for k in _READ_TEMPLATE_FIELDS if k in spec}
    for key in ("containers", "initContainers"):
        if kept.get(key):
            # restartPolicy: a sidecar's GPUs add to the containers' (fit.template_gpus)
            kept[key] = [{k: c[k] for k in ("name", "resources", "restartPolicy") if k in c} for c in kept[key]]
    return {"metadata": template.get("metadata") or {}, "spec": kept}


def _slim_workload(kind: str, spec: dict | None) -> dict | None:
    if not spec:
        return spec
    if kind in ("StatefulSet", "Deployment") and spec.get("template"):
        return {**spec, "template": _slim_template(spec["template"])}
    if kind == "LeaderWorkerSet" and spec.get("leaderWorkerTemplate"):
        lwt = spec["leaderWorkerTemplate"]
        return {**spec, "leaderWorkerTemplate": {**lwt, **{k: _slim_template(lwt[k]) for k in ("leaderTemplate", "workerTemplate")
                                                           if lwt.get(k)}}}
    return spec


def _compact(kind: str, obj: dict) -> dict:
    """What the cache keeps of an object: pods without managed fields and without their
    containers' command lines and env (nothing reads them), the operator's children
    with their managers and times but not the field sets, whose fingerprint is kept
    instead, the pools' and router's pod templates cut to what the GPU fit reads,
    and of the other children (Services, RBAC, policies: read for their hash
    annotation, owners and managers only) their metadata alone."""
    meta = obj.get("metadata") or {}
    managed = meta.get("managedFields")
    if kind == POD_KIND:
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
                "spec": _slim_pod_spec(obj.get("spec"))}
    if kind == SERVICE_KIND:
        return obj
    if kind in WORKLOAD_KINDS:
        obj = {**obj, "spec": _slim_workload(kind, obj.get("spec"))}
    else:  # nothing reads more of the other children than their metadata
        obj = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    if not managed:
        return obj
    return {**obj, OUR_FIELDS: fields_fingerprint(managed),
            "metadata": {**meta, "managedFields": [{k: v for k, v in e.items() if k != "fieldsV1"} for e in managed]}}


def _service_of(obj: dict | None) -> str | None:
    return (((obj or {}).get("metadata") or {}).get("labels") or {}).get(LABEL_SERVICE)


class Cache:
    """kind -> (namespace, name) -> object, fed by watch events and write responses;
    indexed by the service label, so that what a reconcile selects (its children,
    its pods) costs the size of that service, not of the fleet."""

    def __init__(self):
        self._lock = threading.Lock()
        self._objects: dict[str, dict[tuple[str, str], dict]] = {}
        # kind -> (namespace, service label) -> keys of the objects carrying it
        self._by_service: dict[str, dict[tuple[str, str], set[tuple[str, str]]]] = {}
        # services created while this replica was the writer: every pool of theirs
        # is one it wrote, and so cached (handlers.on_service_event)
        self._born_here: set[tuple[str, str]] = set()

    def mark_born_here(self, namespace: str, service: str) -> None:
        with self._lock:
            self._born_here.add((namespace, service))

    def born_here(self, namespace: str, service: str) -> bool:
        with self._lock:
            return (namespace, service) in self._born_here

    def forget_born_here(self) -> None:
        """Another replica may write from now on (this one lost the lead)."""
        with self._lock:
            self._born_here.clear()

    def _index(self, kind: str, key: tuple[str, str], old: dict | None, new: dict | None) -> None:
        before, after = _service_of(old), _service_of(new)
        if before == after:
            return
        index = self._by_service.setdefault(kind, {})
        if before is not None:
            keys = index.get((key[0], before))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[(key[0], before)]
        if after is not None:
            index.setdefault((key[0], after), set()).add(key)

    def put(self, kind: str, obj: dict) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        obj = _compact(kind, obj)
        with self._lock:
            table = self._objects.setdefault(kind, {})
            old = table.get(key)
            # a watch event older than a write response already kept is stale
            if old is not None and _rv(old) is not None and _rv(obj) is not None and _rv(obj) < _rv(old):
                return
            table[key] = obj
            self._index(kind, key, old, obj)

    def remove(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            old = self._objects.get(kind, {}).pop((namespace, name), None)
            self._index(kind, (namespace, name), old, None)
            if kind in POOL_KINDS:
                # a pool gone from the cache may still exist (its labels no longer match the
                # watch, a late DELETED of an older copy): ask before taking it for absent, or
                # it would be created again at its initial size over an autoscaled one
                self._born_here.discard((namespace, name.rsplit("-", 1)[0]))

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        with self._lock:
            return self._objects.get(kind, {}).get((namespace, name))

    def has(self, kind: str, namespace: str, name: str) -> bool:
        with self._lock:
            return (namespace, name) in self._objects.get(kind, {})

    def select(self, kind: str, namespace: str | None, selector: dict[str, str]) -> list[dict]:
        with self._lock:
            table = self._objects.get(kind, {})
            service = selector.get(LABEL_SERVICE)
            if namespace is not None and service is not None:
                keys = self._by_service.get(kind, {}).get((namespace, service), ())
                objs = [(k, table[k]) for k in keys]
            else:
                objs = list(table.items())
        return [o for (ns, _), o in objs if namespace in (None, ns)
                and selector.items() <= ((o.get("metadata") or {}).get("labels") or {}).items()]

    def uids(self, kind: str, namespace: str | None) -> dict[tuple[str, str], str]:
        """(namespace, name) -> uid of the cached objects of a kind (a sweep's snapshot)."""
        with self._lock:
            return {k: ((o.get("metadata") or {}).get("uid") or "") for k, o in self._objects.get(kind, {}).items()
                    if namespace in (None, k[0])}

    def remove_if(self, kind: str, namespace: str, name: str, uid: str) -> bool:
        """Remove the cached object only if it is still the one with ``uid`` (not a newer copy
        a watch event brought meanwhile)."""
        with self._lock:
            obj = self._objects.get(kind, {}).get((namespace, name))
            if obj is None or ((obj.get("metadata") or {}).get("uid") or "") != uid:
                return False
        self.remove(kind, namespace, name)
        return True

    def forget_service(self, namespace: str, name: str) -> None:
        """Drop a deleted service and everything labelled as its child."""
        with self._lock:
            self._objects.get(SERVICE_KIND, {}).pop((namespace, name), None)
            self._born_here.discard((namespace, name))
            for kind, table in self._objects.items():
                for key in self._by_service.get(kind, {}).pop((namespace, name), ()):
                    table.pop(key, None)

    def size(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._objects.values())


# The service metadata whose change queues a reconcile (handlers._spec_changed).
SERVICE_METADATA_WATCHED = ("generation", "labels", "annotations", "uid", "deletionTimestamp")


class NotLeading(RuntimeError):
    """A write attempted while this replica may not write (see ``CachedKube._writing``)."""


class CachedKube:
    """``Kube``'s interface; reads from a ``Cache``, writes through to the API server."""

    def __init__(self, kube: Kube, cache: Cache, clock: Callable[[], float] = time.monotonic,
                 may_write: Callable[[], bool] | None = None):
        self.kube, self.cache, self.clock = kube, cache, clock
        self.may_write = may_write  # None: always (one replica, tests)
        self._secrets_ok: dict[tuple[str, str, str], float] = {}

    def _writing(self, what: str) -> None:
        """Refuse a write unless this replica may write now (it holds the leader Lease within
        its renew deadline): a replica whose lease lapsed, or a reconcile still running when it
        stepped down, must not write next to the new leader. The reconcile fails and is retried
        by whoever leads then."""
        if self.may_write is not None and not self.may_write():
            raise NotLeading(f"{what}: this replica does not hold the leader Lease now")

    def __getattr__(self, name: str) -> Any:  # everything not read from the cache
        return getattr(self.kube, name)

    # -- reads ---------------------------------------------------------------------
    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        """The cached object; None when the watches have not seen it. Reconciles start
        after the warm-up that fills the cache, and a child wrongly taken for absent
        is only applied again (server-side apply of the same object changes nothing).
        A pool is the exception: taken for absent, it would be created at its initial
        size over an autoscaled one, so a pool not seen is asked for (once per new pool),
        unless its service was created while this replica was the writer (then the only
        writer of its pools, and it caches what it writes)."""
        obj = self.cache.get(kind, namespace, name)
        if obj is not None or kind not in POOL_KINDS:
            return obj
        if self.cache.born_here(namespace, name.rsplit("-", 1)[0]):
            return None
        obj = self.kube.get(kind, namespace, name)
        if obj is not None:
            self.cache.put(kind, obj)
        return obj

    def list(self, kind: str, namespace: str, selector: dict[str, str]) -> list[dict]:
        return self.cache.select(kind if kind in KINDS else POD_KIND, namespace, selector)

    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict]:
        return self.cache.select(POD_KIND, namespace, selector)

    def get_service(self, namespace: str, name: str) -> dict | None:
        return self.cache.get(SERVICE_KIND, namespace, name)

    def list_services(self, namespace: str | None) -> list[dict]:
        return self.cache.select(SERVICE_KIND, namespace, {})

    def create_failures(self, namespace: str, kind: str, name: str) -> list[dict]:
        """Only asked while the StatefulSet has fewer pods than it wants after its
        controller acted on it (a refused pod create is the one thing that reads events)."""
        sts = self.cache.get(kind, namespace, name)
        if sts is not None:
            want = (sts.get("spec") or {}).get("replicas")
            status = sts.get("status") or {}
            have = status.get("replicas") or 0
            if want is not None and have >= want:
                return []
            if (status.get("observedGeneration") or 0) < ((sts.get("metadata") or {}).get("generation") or 0):
                return []  # its controller has not yet acted on this version (a pool just created or edited)
        return self.kube.create_failures(namespace, kind, name)

    def secret_problem(self, namespace: str, name: str, key: str) -> str | None:
        k = (namespace, name, key)
        now = self.clock()
        if now - self._secrets_ok.get(k, -1e18) < SECRET_OK_TTL_SECONDS:
            return None
        problem = self.kube.secret_problem(namespace, name, key)
        if problem is None:
            self._secrets_ok[k] = now
        else:
            self._secrets_ok.pop(k, None)
        return problem

    # -- writes --------------------------------------------------------------------
    def apply(self, obj: dict, manager: str = FIELD_MANAGER, dry_run: bool = False) -> dict:
        if dry_run:
            return self.kube.apply(obj, manager=manager, dry_run=True)
        self._writing(f"apply {obj['kind']}/{obj['metadata']['name']}")
        out = self.kube.apply(obj, manager=manager)
        if out:
            self.cache.put(obj["kind"], out)
        return out

    def apply_replicas(self, kind: str, namespace: str, name: str, replicas: int) -> dict:
        self._writing(f"scale {kind}/{name}")
        out = self.kube.apply_replicas(kind, namespace, name, replicas)
        if out:
            self.cache.put(kind, out)
        return out

    def patch_status(self, namespace: str, name: str, status: dict, manager: str = FIELD_MANAGER) -> dict | None:
        """Written through; the response is cached, so a reconcile that runs before
        the watch brings this write back compares with it (and writes nothing again).
        Not when the response's metadata differs from the cached service's: an edit
        the watch has not delivered yet would then look already seen, and the
        service event handler (which compares with the cache) would not queue it."""
        self._writing(f"status of {namespace}/{name}")
        out = self.kube.patch_status(namespace, name, status, manager=manager)
        cached = self.cache.get(SERVICE_KIND, namespace, name)
        if out and cached and all((out.get("metadata") or {}).get(k) == (cached.get("metadata") or {}).get(k)
                                  for k in SERVICE_METADATA_WATCHED):
            self.cache.put(SERVICE_KIND, out)
        return out

    def post_event(self, body: dict, type_: str, reason: str, message: str) -> None:
        self._writing(f"event {reason}")
        self.kube.post_event(body, type_, reason, message)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self._writing(f"delete {kind}/{name}")
        self.kube.delete(kind, namespace, name)
        self.cache.remove(kind, namespace, name)

    def prune(self, namespace: str, service: str, keep: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """Delete the children the watches saw that the current spec no longer renders."""
        removed = []
        selector = {LABEL_SERVICE: service, LABEL_MANAGED_BY: FIELD_MANAGER}
        for kind in KINDS:
            for obj in self.cache.select(kind, namespace, selector):
                key = (kind, obj["metadata"]["name"])
                if key not in keep:
                    self.delete(kind, namespace, key[1])
                    removed.append(key)
        return removed

    def forget_service(self, namespace: str, name: str) -> None:
        self.cache.forget_service(namespace, name)
        for k in [k for k in self._secrets_ok if k[0] == namespace]:
            self._secrets_ok.pop(k, None)
