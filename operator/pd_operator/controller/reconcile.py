"""One reconcile of one PDInferenceService: validate, render, apply, prune,
observe, report. Idempotent: run it any number of times, from any handler, or
after a crash at any point, and it converges to the same objects."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from kubernetes.client.rest import ApiException

from ..api import SpecError, validate_service
from ..api.constants import API_VERSION, GROUP, KIND, LABEL_MANAGED_BY, LABEL_SERVICE
from ..render import render
from ..render.common import child_name, selector_labels
from ..render.pools import pool_kind
from . import metrics
from .cache import OUR_FIELDS, fields_fingerprint
from .kube import AUTOSCALER_MANAGER, FIELD_MANAGER, REPLICAS_MANAGER, Kube, content_hash, refusal
from .status import Observed, compute_status

log = logging.getLogger(__name__)

# An event sink: (body, type, reason, message).
EventFn = Callable[[dict, str, str, str], None]


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Locks:
    """One lock per service: handlers and child events never reconcile the
    same service at the same time."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}

    def get(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted service's lock (kept while a reconcile still holds it:
        one lock per service ever seen would otherwise grow without bound)."""
        with self._guard:
            lock = self._locks.get((namespace, name))
            if lock is not None and not lock.locked():
                del self._locks[(namespace, name)]


LOCKS = Locks()


def _secret_refs(svc) -> list[tuple[str, object]]:
    refs = [("spec.engine.apiKeySecretRef", svc.spec.engine.api_key_secret_ref),
            ("spec.model.source.tokenSecretRef", svc.spec.model.source.token_secret_ref)]
    return [(f, r) for f, r in refs if r is not None]


def reconcile(kube: Kube, body: dict, event: EventFn) -> dict:
    """Bring the children of ``body`` to the rendered state and write status."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    with LOCKS.get(namespace, name):
        started = time.monotonic()
        outcome = "ok"
        try:
            status = _reconcile(kube, body, event)
            if status["conditions"][0]["reason"] == "InvalidSpec":
                outcome = "invalid"
            metrics.READY.labels(namespace, name).set(1 if status["conditions"][0]["status"] == "True" else 0)
            return status
        except Exception as err:
            outcome = "error"
            metrics.ERRORS.labels(type(err).__name__).inc()
            raise
        finally:
            metrics.RECONCILES.labels(outcome).inc()
            metrics.DURATION.labels(outcome).observe(time.monotonic() - started)


Plan = list[tuple[dict, str | None, bool, int | None]]


def plan_children(kube: Kube, body: dict) -> tuple[object, dict[str, int], Plan]:
    """The service, its pools' current replicas, and what a reconcile would write:
    (object to apply, pool role or None, stale, desired replicas of a pool) per child.
    Raises SpecError for a spec the operator refuses."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    svc = validate_service(body)
    svc.metadata.namespace = namespace
    existing_pools = {role: kube.get(pool_kind(svc, role), namespace, child_name(svc, role)) for role in ("prefill", "decode")}
    current = {role: ((pool or {}).get("spec") or {}).get("replicas") for role, pool in existing_pools.items()}
    current = {k: v for k, v in current.items() if v is not None}
    owner = {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": meta["uid"]}
    objs = render(svc, owner=owner, current_replicas=current)

    pools = {child_name(svc, role): role for role in ("prefill", "decode")}
    # What to write: a child whose rendering (its hash, kept in an annotation)
    # is already there and that nobody else wrote since is left alone, so an
    # idle reconcile sends no request.
    plan: Plan = []
    for obj in objs:
        role = pools.get(obj["metadata"]["name"]) if obj["kind"] in ("StatefulSet", "LeaderWorkerSet") else None
        # an existing pool's main apply leaves replicas to the replicas writer
        # (and the hash never covers them: they are not the main apply's to keep)
        main = obj if role is None else {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "replicas"}}
        applied = with_hash(main)
        if role is not None and current.get(role) is None:
            applied = {**applied, "spec": obj["spec"]}
        m = applied["metadata"]
        existing = existing_pools[role] if role is not None else kube.get(applied["kind"], m["namespace"], m["name"])
        stale = not up_to_date(existing, m["annotations"][HASH_ANNOTATION], OWNED.get(namespace, name, applied["kind"], m["name"]))
        if not stale:
            OWNED.put(namespace, name, existing)
        plan.append((applied, role, stale, obj["spec"].get("replicas") if role else None))
    return svc, current, plan


def refused_children(kube: Kube, body: dict) -> list[tuple[str, str]] | None:
    """What the API server refuses of the children ``body`` renders to, as
    (child and field, message), by a dry-run of each (the admission webhook's check);
    None when the dry-runs could not say (the API server unreachable, RBAC)."""
    meta = body["metadata"]
    svc, current, plan = plan_children(kube, body)
    refused, error = _dry_run(kube, meta["namespace"], meta["name"], [o for o, _, stale, _ in plan if stale],
                              verdict_keys(svc, current, plan))
    if error:
        return None
    return _as_problems(refused)


def _as_problems(refused: list[tuple[str, str, str, str]]) -> list[tuple[str, str]]:
    """(kind, name, field path, message) -> ("Kind/name field.path", message)."""
    return [(f"{kind}/{obj_name} {path}".rstrip(), msg) for kind, obj_name, path, msg in refused]


def _reconcile(kube: Kube, body: dict, event: EventFn) -> dict:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    generation = meta.get("generation")
    previous = body.get("status") or {}

    try:
        svc, current, plan = plan_children(kube, body)
    except SpecError as err:
        if previous.get("observedGeneration") != generation:
            event(body, "Warning", "InvalidSpec", str(err).replace("\n", " "))
        status = compute_status(None, Observed({}, None, {}, spec_error=err.problems), generation, previous, now_rfc3339())
        if _changed(previous, status):
            kube.patch_status(namespace, name, status)
        return status
    objs = [o for o, _, _, _ in plan]

    # All or nothing: the API server validates (and admits) every child that
    # would be written before any is, so a spec it refuses creates nothing.
    refused, apply_error = _dry_run(kube, namespace, name, [o for o, _, stale, _ in plan if stale],
                                    verdict_keys(svc, current, plan))
    if refused:
        problems = _as_problems(refused)
        if previous.get("observedGeneration") != generation:
            event(body, "Warning", "InvalidSpec", "the API server refuses the rendered children (nothing was written): "
                  + "; ".join(f"{f}: {m}" for f, m in problems))
        status = compute_status(None, Observed({}, None, {}, spec_error=problems), generation, previous, now_rfc3339())
        if _changed(previous, status):
            kube.patch_status(namespace, name, status)
        return status

    scaled: dict[str, str] = {}
    # a service that has no pool yet: the children this pass creates (absent before it) are
    # undone if a later write is refused (_undo_creation); none when a pool exists
    created: list[tuple[str, str]] = []
    absent = set() if current else {(o["kind"], o["metadata"]["name"]) for o, role, stale, _ in plan
                                    if stale and (role is not None  # a pool: none exists (current)
                                                  or kube.get(o["kind"], namespace, o["metadata"]["name"]) is None)}
    for obj, role, stale, desired in plan if apply_error is None else []:
        try:
            if role is None:
                if stale:
                    OWNED.put(namespace, name, kube.apply(obj))
                    _applied(obj)
            else:
                reason = _apply_pool(kube, svc, obj, role, current.get(role), stale, desired)
                if reason:
                    scaled[role] = reason
                    event(body, "Normal", "Scaled", reason)
            if (obj["kind"], obj["metadata"]["name"]) in absent:
                created.append((obj["kind"], obj["metadata"]["name"]))
        except ApiException as err:
            apply_error = f"applying {obj['kind']}/{obj['metadata']['name']} failed: {err.status} {err.reason}: {_api_message(err)}"
            # what the dry-runs accepted no longer holds (a quota filled, a policy added): the
            # namespace's kept verdicts are dropped, so the next pass asks the API server again
            ACCEPTED.forget(namespace)
            # a 5xx (a 504 "may still be processing the request", an etcd timeout) may follow a
            # write that landed: an object absent before the pass is undone with the others
            landed = _landed(kube, namespace, name, obj, absent) if (err.status or 0) >= 500 else []
            if created or landed:
                apply_error += _undo_creation(kube, namespace, name, created, landed)
            event(body, "Warning", "ApplyFailed", apply_error)
            break
        except Exception as err:  # a timeout or a dropped connection: the write's fate is unknown
            # the children this pass created are deleted all the same, and this one too when its
            # write landed before the answer was lost (_landed), or the retry would find a pool,
            # take the service as an existing one and no longer undo; the error is raised again
            # for the retry (the undo's own deletes fail too when the API server is gone)
            landed = _landed(kube, namespace, name, obj, absent)
            if created or landed:
                event(body, "Warning", "ApplyFailed", f"applying {obj['kind']}/{obj['metadata']['name']} failed: {err}"
                      + _undo_creation(kube, namespace, name, created, landed))
            raise
    if not current and apply_error is None:
        event(body, "Normal", "Created", f"created {len(objs)} objects: " + ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in objs))
    if apply_error is None:
        keep = {(o["kind"], o["metadata"]["name"]) for o in objs}
        for kind, obj_name in kube.prune(namespace, name, keep):
            metrics.PRUNED.labels(kind).inc()
            event(body, "Normal", "Pruned", f"deleted {kind}/{obj_name}: the spec no longer needs it")
    if previous.get("observedGeneration") not in (None, generation) and apply_error is None:
        event(body, "Normal", "Updated", f"applied generation {generation}")

    missing = []
    for field, ref in _secret_refs(svc):
        problem = kube.secret_problem(namespace, ref.name, ref.key)
        if problem:
            missing.append((field, problem))
    observed = Observed(
        statefulsets={role: kube.get(pool_kind(svc, role), namespace, child_name(svc, role)) for role in ("prefill", "decode")},
        router=kube.get("Deployment", namespace, child_name(svc, "router")),
        pods={role: kube.pods(namespace, selector_labels(svc, role)) for role in ("prefill", "decode", "router")},
        missing_secrets=missing,
        # a LeaderWorkerSet's leaders come from a StatefulSet of the same name
        # (LWS makes one for the leaders, one per group for the workers)
        create_failures={role: kube.create_failures(namespace, "StatefulSet", child_name(svc, role))
                         for role in ("prefill", "decode")},
        apply_error=apply_error,
        scaled=scaled,
    )
    status = compute_status(svc, observed, generation, previous, now_rfc3339())
    if _changed(previous, status):
        kube.patch_status(namespace, name, status)
        _log_readiness(namespace, name, previous, status)
    if apply_error:
        raise RuntimeError(apply_error)
    return status


def _landed(kube: Kube, namespace: str, service: str, obj: dict, absent: set) -> list[tuple[str, str]]:
    """The child whose write failed with its fate unknown (a timeout, a 5xx), as a list of one
    to undo when that write landed: absent before the pass, and now there with this service's
    labels and written by this operator's managers alone. Read from the API server, not the
    cache (which holds only objects with the operator's labels, so an object of someone
    else's of that name reads absent there; an apply that landed on it adds the labels, and
    its other managers then tell it apart, unless the apply took over every field they had).
    Nothing when the read fails too."""
    key = (obj["kind"], obj["metadata"]["name"])
    if key not in absent:
        return []
    try:
        there = getattr(kube, "kube", kube).get(key[0], namespace, key[1])  # CachedKube: the API server's
    except Exception:  # noqa: BLE001 - the API server still unreachable: leave it to the retry
        return []
    meta = (there or {}).get("metadata") or {}
    labels = meta.get("labels") or {}
    managers = {e.get("manager") for e in meta.get("managedFields") or [] if e.get("subresource") != "status"}
    ours = labels.get(LABEL_SERVICE) == service and labels.get(LABEL_MANAGED_BY) == FIELD_MANAGER
    return [key] if there and ours and managers <= {FIELD_MANAGER, REPLICAS_MANAGER} else []


def _undo_creation(kube: Kube, namespace: str, service: str, created: list[tuple[str, str]],
                   landed: list[tuple[str, str]] = ()) -> str:
    """All or nothing for a service created now (it had no pool): the children this pass
    created before an apply failed are deleted, so the service is not left half-created (its
    dry-runs passed, or their verdicts were kept, and the API server refused a later write
    anyway), and ``landed``, the one whose write failed after it landed (``_landed``). Only
    children absent before the pass: nothing that served before is touched. Returns what to
    add to the failure's message."""
    left = []
    for kind, obj_name in reversed([*created, *landed]):
        try:
            kube.delete(kind, namespace, obj_name)
        except Exception:  # noqa: BLE001 - the API server unreachable, or this replica no longer leads
            left.append(f"{kind}/{obj_name}")
    OWNED.forget(namespace, service)
    if left:
        return f"; of the children it created, these could not be deleted: {', '.join(left)}"
    also = f" and {', '.join(f'{k}/{n}' for k, n in landed)}, whose write landed" if landed else ""
    return f"; the {len(created)} children it created before{also} were deleted (nothing of the service is left)"


def _apply_pool(kube: Kube, svc, sts: dict, role: str, current: int | None, stale: bool, desired: int) -> str | None:
    """Apply a pool's StatefulSet; write its replicas only when they are ours to set.

    The main apply never carries replicas once the pool exists, so it cannot
    undo a scale it did not decide. It creates the pool at its initial size (one
    request); the replicas writer shares the size before the main apply first
    leaves it out (server-side apply would otherwise drop it, and the pool fall
    to 1), and sets it when the spec names a size (autoscaling off) and to keep
    an autoscaled pool within minReplicas..maxReplicas. Returns why the pool was
    resized, if it was.
    """
    namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
    pool = svc.spec.pool(role)
    service = svc.metadata.name
    if current is None:
        OWNED.put(namespace, service, kube.apply(sts))
        _applied(sts)
        return None
    if stale:
        if not _replicas_writer_owns(kube.get(sts["kind"], namespace, name)):
            kube.apply_replicas(sts["kind"], namespace, name, current)
        OWNED.put(namespace, service, kube.apply(sts))  # rendered without replicas (see _reconcile)
        _applied(sts)
    if desired == current:
        return None
    if pool.autoscaling.enabled:
        why = f"kept within autoscaling.minReplicas..maxReplicas ({pool.autoscaling.min_replicas}..{pool.autoscaling.max_replicas})"
    elif pool.replicas is not None:
        why = f"spec.{role}.replicas is {desired}"
    else:
        return None
    kube.apply_replicas(sts["kind"], namespace, name, desired)
    return f"{role} pool scaled from {current} to {desired} replicas: {why}" if desired != current else None


def _replicas_writer_owns(pool: dict | None) -> bool:
    """Whether the replicas writer owns the pool's size: it applies nothing else, and a
    manager that owns no field has no managedFields entry."""
    return any(e.get("manager") == REPLICAS_MANAGER and not e.get("subresource")
               for e in ((pool or {}).get("metadata") or {}).get("managedFields") or [])


# The hash of the rendering a child was last applied from.
HASH_ANNOTATION = f"{GROUP}/rendered-hash"
OUR_MANAGERS = (FIELD_MANAGER, REPLICAS_MANAGER, AUTOSCALER_MANAGER)



def with_hash(obj: dict) -> dict:
    """``obj`` with the hash of itself in an annotation."""
    meta = obj["metadata"]
    clean = {**obj, "metadata": {**meta, "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                                          if k != HASH_ANNOTATION}}}
    if not clean["metadata"]["annotations"]:
        del clean["metadata"]["annotations"]
    h = content_hash(clean)
    return {**obj, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), HASH_ANNOTATION: h}}}


def _time(entry: dict) -> str:
    return entry.get("time") or ""


def _our_fields(existing: dict) -> str | None:
    """A fingerprint of the fields the operator's apply owns in ``existing`` (None: it owns none);
    a cached object carries it (the cache keeps no field sets)."""
    if OUR_FIELDS in existing:
        return existing[OUR_FIELDS]
    return fields_fingerprint((existing.get("metadata") or {}).get("managedFields") or [])


class Owned:
    """The fields each child's apply owned right after the operator wrote or
    checked it, per service. Another client writing one of those fields takes
    it over (server-side apply), so the set shrinks: that is a hand edit to
    undo. A write to fields the operator does not own (an annotation of
    someone's) leaves it alone and costs no re-apply."""

    def __init__(self):
        self._guard = threading.Lock()
        self._fields: dict[tuple[str, str], dict[tuple[str, str], str]] = {}

    def get(self, namespace: str, service: str, kind: str, name: str) -> str | None:
        with self._guard:
            return self._fields.get((namespace, service), {}).get((kind, name))

    def put(self, namespace: str, service: str, obj: dict | None) -> None:
        fp = _our_fields(obj) if obj else None
        if fp is None:
            return
        with self._guard:
            self._fields.setdefault((namespace, service), {})[(obj["kind"], obj["metadata"]["name"])] = fp

    def forget(self, namespace: str, service: str) -> None:
        with self._guard:
            self._fields.pop((namespace, service), None)

    def __len__(self) -> int:
        return len(self._fields)


OWNED = Owned()


def up_to_date(existing: dict | None, want_hash: str, owned: str | None = None) -> bool:
    """Whether ``existing`` is what the operator applied from the rendering hashed ``want_hash``
    and nobody has changed what it applied since.

    ``owned``: the fingerprint of the fields the operator owned when it last
    wrote or checked the object (``Owned``); a hand edit of one of them moves
    it to the editor. Without one (a new process), a write by another manager
    to the main resource no older than the operator's apply counts as an edit;
    the cluster's controllers (kube-*) and writes to subresources (status,
    scale) never do."""
    if existing is None:
        return False
    meta = existing.get("metadata") or {}
    if (meta.get("annotations") or {}).get(HASH_ANNOTATION) != want_hash:
        return False
    entries = meta.get("managedFields") or []
    ours = [e for e in entries if e.get("manager") == FIELD_MANAGER and not e.get("subresource")]
    if not ours:
        return False
    if owned is not None:
        return _our_fields(existing) == owned
    applied_at = max(_time(e) for e in ours)
    for e in entries:
        manager = e.get("manager") or ""
        if manager in OUR_MANAGERS or manager.startswith("kube-") or e.get("subresource"):
            continue
        if _time(e) >= applied_at:
            return False
    return True


class Refusals:
    """The last dry-run refusal of each service, so an unchanged bad spec is
    not sent to the API server again at every resync (re-checked after a while:
    what admission allows can change)."""

    RECHECK_SECONDS = 600.0

    def __init__(self):
        self._guard = threading.Lock()
        self._last: dict[tuple[str, str], tuple[frozenset, list, float]] = {}

    def get(self, key: tuple[str, str], hashes: frozenset) -> list | None:
        with self._guard:
            found = self._last.get(key)
        if found and found[0] == hashes and time.monotonic() - found[2] < self.RECHECK_SECONDS:
            return found[1]
        return None

    def put(self, key: tuple[str, str], hashes: frozenset, refused: list) -> None:
        with self._guard:
            if refused:
                self._last[key] = (hashes, refused, time.monotonic())
            else:
                self._last.pop(key, None)

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._last.pop((namespace, name), None)

    def clear(self) -> None:
        with self._guard:
            self._last.clear()

    def __len__(self) -> int:
        return len(self._last)


REFUSALS = Refusals()


class Accepted:
    """Dry-run verdicts that carry over. A child the API server accepted is
    accepted again for another service of the same spec in the same namespace:
    the two differ only in what the service's name contributes (child names,
    labels, DNS names in arguments), and the CRD bounds the name (a DNS label of
    at most 40 characters) so that every such field stays valid. Kept for
    TTL_SECONDS (what admission allows can change); a later apply that fails
    anyway is reported as ApplyFailed with the object and field."""

    TTL_SECONDS = 300.0
    MAX_ENTRIES = 50_000

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._guard = threading.Lock()
        self._seen: dict[tuple[str, str], float] = {}  # (namespace, key) -> when accepted

    def has(self, namespace: str, key: str) -> bool:
        with self._guard:
            at = self._seen.get((namespace, key))
        return at is not None and self.clock() - at < self.TTL_SECONDS

    def put(self, namespace: str, key: str) -> None:
        now = self.clock()
        with self._guard:
            if len(self._seen) >= self.MAX_ENTRIES:
                self._seen = {k: t for k, t in self._seen.items() if now - t < self.TTL_SECONDS}
                if len(self._seen) >= self.MAX_ENTRIES:
                    self._seen.clear()
            self._seen[(namespace, key)] = now

    def clear(self) -> None:
        with self._guard:
            self._seen.clear()

    def forget(self, namespace: str) -> None:
        """Drop the verdicts kept for ``namespace``."""
        with self._guard:
            self._seen = {k: t for k, t in self._seen.items() if k[0] != namespace}

    def __len__(self) -> int:
        return len(self._seen)


ACCEPTED = Accepted()
# The name a service's spec is rendered under to key the verdicts (40 characters: the longest allowed).
CANONICAL_NAME = "pd" + "x" * 38
CANONICAL_UID = "00000000-0000-0000-0000-00000000cafe"


def verdict_keys(svc, current: dict[str, int], plan: "Plan") -> dict[tuple[str, str], str]:
    """(kind, name) of each child about to be written -> the key its dry-run verdict is
    kept under: the child as rendered for the same spec under CANONICAL_NAME."""
    if not any(stale for _, _, stale, _ in plan):
        return {}
    canon = svc.model_copy(deep=True)
    canon.metadata.name = CANONICAL_NAME
    objs = render(canon, owner={"apiVersion": API_VERSION, "kind": KIND, "name": CANONICAL_NAME, "uid": CANONICAL_UID},
                  current_replicas=current)
    if [o["kind"] for o in objs] != [o["kind"] for o, _, _, _ in plan]:
        return {}
    keys = {}
    for (obj, role, stale, _), c in zip(plan, objs):
        if stale:
            with_replicas = role is None or "replicas" in obj["spec"]
            form = c if with_replicas else {**c, "spec": {k: v for k, v in c["spec"].items() if k != "replicas"}}
            keys[(obj["kind"], obj["metadata"]["name"])] = f"{obj['kind']}:{content_hash(form)}"
    return keys


_DRY_RUNS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="dry-run")


def _dry_run_one(kube: Kube, obj: dict) -> ApiException | None:
    try:
        kube.apply(obj, dry_run=True)
    except ApiException as err:
        return err
    return None


def _dry_run(kube: Kube, namespace: str, name: str, objs: list[dict],
             keys: dict[tuple[str, str], str] | None = None) -> tuple[list[tuple[str, str, str, str]], str | None]:
    """Server-side dry-run of every object about to be written (``keys``: verdict
    keys, see ``Accepted``; a child accepted under its key is not sent again).

    Returns (refusals as (kind, name, field path, message), another failure):
    a 400/422 is the spec's fault and is reported as such; anything else (the
    API server down, RBAC) is an apply failure. Either way nothing is written."""
    if not objs:
        return [], None
    hashes = frozenset(o["metadata"]["annotations"][HASH_ANNOTATION] for o in objs)
    known = REFUSALS.get((namespace, name), hashes)
    if known is not None:
        return known, None
    keys = keys or {}
    key_of = [keys.get((o["kind"], o["metadata"]["name"])) for o in objs]
    todo = [(o, k) for o, k in zip(objs, key_of) if k is None or not ACCEPTED.has(namespace, k)]
    refused: list[tuple[str, str, str, str]] = []
    # the dry-runs write nothing and do not depend on each other: sent at once
    errors = list(_DRY_RUNS.map(lambda o: _dry_run_one(kube, o), [o for o, _ in todo]))
    for (obj, key), err in zip(todo, errors):
        kind, obj_name = obj["kind"], obj["metadata"]["name"]
        if err is None and key is not None:
            ACCEPTED.put(namespace, key)
        if err is not None:
            if kind == "RoleBinding" and err.status == 404:
                continue  # its Role is created in the same apply; a RoleBinding has no fields to refuse
            message, causes = refusal(err)
            if err.status in (400, 422):
                refused += [(kind, obj_name, f, m) for f, m in causes] or [(kind, obj_name, "", message)]
                continue
            if err.status == 403 and _policy_denial(message):
                # an admission webhook or ValidatingAdmissionPolicy of the cluster refuses the child
                # (controller-runtime webhooks deny with 403): the spec's to change, as a 422 is
                refused.append((kind, obj_name, "", message))
                continue
            if err.status == 500 and TYPED_PATCH_ERROR in message:
                # a value of the wrong JSON type, which only the spec can put there (the CRD keeps
                # podTemplate whole): server-side apply cannot type the body and says so as a 500
                refused += [(kind, obj_name, f, m) for f, m in _type_mismatches(message)]
                continue
            return [], f"dry-run of {kind}/{obj_name} failed: {err.status} {err.reason}: {message}"
    REFUSALS.put((namespace, name), hashes, refused)
    return refused, None


def _policy_denial(message: str) -> bool:
    """Whether a 403 is an admission policy's verdict on the object rather than authorization's
    on the operator: the API server words a webhook's denial "admission webhook "NAME" denied the
    request" (apiserver pkg/admission/plugin/webhook/errors/statuserror.go) and a
    ValidatingAdmissionPolicy's "ValidatingAdmissionPolicy 'NAME' ... denied request"
    (pkg/admission/plugin/policy/validating/dispatcher.go)."""
    return (("admission webhook " in message and " denied the request" in message)
            or ("ValidatingAdmissionPolicy '" in message and " denied request" in message))


# What server-side apply answers (a plain error, so HTTP 500) when the body does not fit the
# kind's schema (apimachinery pkg/util/managedfields/internal/structuredmerge.go).
TYPED_PATCH_ERROR = "failed to create typed patch object"


def _type_mismatches(message: str) -> list[tuple[str, str]]:
    """(field path, what is wrong) in a typed-patch error: "... (GVK; ns/name): .a.b: expected
    string, got ..." or, for several, "errors:" and one "  .path: message" line each
    (structured-merge-diff typed/helpers.go)."""
    rest = message.split("): ", 1)[1] if "): " in message else message
    out = []
    for line in (x.strip() for x in rest.splitlines()):
        if not line or line == "errors:":
            continue
        path, sep, what = line.partition(": ")
        out.append((path[1:], what) if sep and path.startswith(".") else ("", line))
    return out or [("", message)]


def _applied(obj: dict) -> None:
    metrics.APPLIED.labels(obj["kind"]).inc()
    log.info("%s/%s: applied %s", obj["metadata"]["namespace"], obj["metadata"]["name"], obj["kind"])


def _ready(status: dict) -> tuple | None:
    c = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return (c.get("status"), c.get("reason"), c.get("message")) if c else None


def _log_readiness(namespace: str, name: str, previous: dict, status: dict) -> None:
    """One log line each time the Ready condition's status or reason changes."""
    now, before = _ready(status), _ready(previous)
    if now is not None and (before is None or now[:2] != before[:2]):
        log.info("%s/%s: Ready=%s %s: %s", namespace, name, *now)


def _changed(previous: dict, status: dict) -> bool:
    """Whether writing ``status`` would change what is there. Only this
    writer's part counts: the autoscaler's conditions and pool fields live
    beside it (server-side apply keeps both), so they are left out of the comparison."""
    for key, value in status.items():
        before = previous.get(key)
        if key == "conditions" and isinstance(before, list):
            mine = {c.get("type") for c in value}
            before = [c for c in before if c.get("type") in mine]
        elif isinstance(value, dict) and isinstance(before, dict):
            before = {k: v for k, v in before.items() if k in value}
        if before != value:
            return True
    return False


def _api_message(err: ApiException) -> str:
    import json

    try:
        return json.loads(err.body).get("message", "")
    except Exception:
        return str(err.body)[:500]
