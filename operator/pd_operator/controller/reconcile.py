"""One reconcile of one PDInferenceService: validate, render, apply, prune,
observe, report. Idempotent: run it any number of times, from any handler, or
after a crash at any point, and it converges to the same objects."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

from kubernetes.client.rest import ApiException

from ..api import SpecError, validate_service
from ..api.constants import API_VERSION, KIND
from ..render import render
from ..render.common import child_name, selector_labels
from ..render.pools import pool_kind
from . import metrics
from .kube import Kube
from .status import Observed, compute_status

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


def _reconcile(kube: Kube, body: dict, event: EventFn) -> dict:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    generation = meta.get("generation")
    previous = body.get("status") or {}

    try:
        svc = validate_service(body)
        svc.metadata.namespace = namespace
        current = {role: ((kube.get(pool_kind(svc, role), namespace, child_name(svc, role)) or {}).get("spec") or {}).get("replicas")
                   for role in ("prefill", "decode")}
        current = {k: v for k, v in current.items() if v is not None}
        owner = {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": meta["uid"]}
        objs = render(svc, owner=owner, current_replicas=current)
    except SpecError as err:
        if previous.get("observedGeneration") != generation:
            event(body, "Warning", "InvalidSpec", str(err).replace("\n", " "))
        status = compute_status(None, Observed({}, None, {}, spec_error=err.problems), generation, previous, now_rfc3339())
        if _changed(previous, status):
            kube.patch_status(namespace, name, status)
        return status

    apply_error = None
    scaled: dict[str, str] = {}
    pools = {child_name(svc, role): role for role in ("prefill", "decode")}
    for obj in objs:
        role = pools.get(obj["metadata"]["name"]) if obj["kind"] in ("StatefulSet", "LeaderWorkerSet") else None
        try:
            if role is None:
                kube.apply(obj)
            else:
                reason = _apply_pool(kube, svc, obj, role, current.get(role))
                if reason:
                    scaled[role] = reason
                    event(body, "Normal", "Scaled", reason)
        except ApiException as err:
            apply_error = f"applying {obj['kind']}/{obj['metadata']['name']} failed: {err.status} {err.reason}: {_api_message(err)}"
            event(body, "Warning", "ApplyFailed", apply_error)
            break
        metrics.APPLIED.labels(obj["kind"]).inc()
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
    if apply_error:
        raise RuntimeError(apply_error)
    return status


def _apply_pool(kube: Kube, svc, sts: dict, role: str, current: int | None) -> str | None:
    """Apply a pool's StatefulSet; write its replicas only when they are ours to set.

    The main apply never carries replicas once the pool exists, so it cannot
    undo a scale it did not decide. The replicas writer sets them at creation,
    when the spec names a size (autoscaling off), and to keep an autoscaled
    pool within minReplicas..maxReplicas. Returns why the pool was resized, if it was.
    """
    namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
    desired = sts["spec"]["replicas"]
    pool = svc.spec.pool(role)
    if current is None:
        kube.apply(sts)
        kube.apply_replicas(sts["kind"], namespace, name, desired)
        return None
    main = {**sts, "spec": {k: v for k, v in sts["spec"].items() if k != "replicas"}}
    kube.apply(main)
    if pool.autoscaling.enabled:
        if desired == current:
            return None
        why = f"kept within autoscaling.minReplicas..maxReplicas ({pool.autoscaling.min_replicas}..{pool.autoscaling.max_replicas})"
    elif pool.replicas is not None:
        why = f"spec.{role}.replicas is {desired}"
    else:
        return None
    kube.apply_replicas(sts["kind"], namespace, name, desired)
    return f"{role} pool scaled from {current} to {desired} replicas: {why}" if desired != current else None


def _changed(previous: dict, status: dict) -> bool:
    return any(previous.get(k) != v for k, v in status.items())


def _api_message(err: ApiException) -> str:
    import json

    try:
        return json.loads(err.body).get("message", "")
    except Exception:
        return str(err.body)[:500]
