"""The operator's only door to the cluster: server-side apply, reads, prune.

Paths are built from a fixed table of the kinds the renderer emits, so no
discovery round-trips are needed at start-up.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timezone
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..api.constants import GROUP, KIND, LABEL_MANAGED_BY, LABEL_SERVICE, PLURAL, VERSION

FIELD_MANAGER = "pd-operator"
# The single writer of the pools' replicas (spec, initial size, autoscaler).
# A separate manager, so the main apply can leave replicas out without
# releasing them to the StatefulSet default.
REPLICAS_MANAGER = "pd-operator-replicas"
# The autoscaler's status fields (its conditions, metrics, scale reasons).
AUTOSCALER_MANAGER = "pd-operator-autoscaler"
# The Serving condition (what the live signals say is failing).
DIAGNOSIS_MANAGER = "pd-operator-diagnosis"

# kind -> (apiVersion, plural)
KINDS: dict[str, tuple[str, str]] = {
    "ConfigMap": ("v1", "configmaps"),
    "Service": ("v1", "services"),
    "ServiceAccount": ("v1", "serviceaccounts"),
    "StatefulSet": ("apps/v1", "statefulsets"),
    # pools whose replicas span nodes (the LWS CRD may be absent: see prune)
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
    "Deployment": ("apps/v1", "deployments"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
    "Role": ("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings"),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies"),
}


def content_hash(obj) -> str:
    """A short, stable hash of a JSON-able value (a rendering, a set of managed fields)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def _path(api_version: str, plural: str, namespace: str, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


class Kube:
    """Thin wrapper over the Kubernetes REST API for the controller."""

    def __init__(self, api_client: client.ApiClient | None = None):
        self.api = api_client or client.ApiClient()

    # -- raw calls ---------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None, query: list | None = None, content_type: str | None = None,
              timeout: float = 60, accept: str = "application/json") -> Any:
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        method, url, headers, body, _ = self.api.param_serialize(
            method=method, resource_path=path, query_params=query or [], header_params=headers,
            body=body, auth_settings=["BearerToken"],
        )
        from . import metrics

        metrics.API_REQUESTS.labels(method).inc()
        resp = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=timeout)
        raw = resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason, body=raw.decode("utf-8", "replace") if raw else "")
        return json.loads(raw) if raw else None

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        api_version, plural = KINDS[kind]
        try:
            return self._call("GET", _path(api_version, plural, namespace, name))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str, selector: dict[str, str]) -> list[dict]:
        api_version, plural = KINDS[kind] if kind in KINDS else ("v1", "pods")
        sel = ",".join(f"{k}={v}" for k, v in selector.items())
        out = self._call("GET", _path(api_version, plural, namespace), query=[("labelSelector", sel)])
        return out.get("items", []) if out else []

    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict]:
        sel = ",".join(f"{k}={v}" for k, v in selector.items())
        out = self._call("GET", f"/api/v1/namespaces/{namespace}/pods", query=[("labelSelector", sel)])
        return out.get("items", []) if out else []

    def create_failures(self, namespace: str, kind: str, name: str) -> list[dict]:
        """FailedCreate Warning events of one object (how the StatefulSet controller reports a refused pod)."""
        sel = f"involvedObject.kind={kind},involvedObject.name={name},reason=FailedCreate"
        out = self._call("GET", f"/api/v1/namespaces/{namespace}/events", query=[("fieldSelector", sel)])
        return out.get("items", []) if out else []

    def cluster_gpu_view(self) -> tuple[list[dict], list[dict]] | None:
        """(nodes, unfinished pods of all namespaces), from the API server's watch
        cache; None when RBAC does not allow it (a namespace-scoped install)."""
        try:
            nodes = self._call("GET", "/api/v1/nodes", query=[("resourceVersion", "0")])
            pods = self._call("GET", "/api/v1/pods", query=[
                ("resourceVersion", "0"), ("fieldSelector", "status.phase!=Succeeded,status.phase!=Failed")])
        except ApiException as err:
            if err.status == 403:
                return None
            raise
        return (nodes or {}).get("items", []), (pods or {}).get("items", [])

    # -- writes ------------------------------------------------------------------
    def apply(self, obj: dict, manager: str = FIELD_MANAGER, dry_run: bool = False) -> dict:
        """Server-side apply with one of the operator's field managers
        (``dry_run``: validated and admitted by the API server, nothing stored)."""
        api_version, plural = KINDS[obj["kind"]]
        meta = obj["metadata"]
        query = [("fieldManager", manager), ("force", "true")] + ([("dryRun", "All")] if dry_run else [])
        return self._call(
            "PATCH",
            _path(api_version, plural, meta["namespace"], meta["name"]),
            body=obj,
            query=query,
            content_type="application/apply-patch+yaml",
        )

    def apply_replicas(self, kind: str, namespace: str, name: str, replicas: int) -> dict:
        """Set only ``spec.replicas``, as the replicas writer."""
        api_version, _ = KINDS[kind]
        body = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": replicas}}
        return self.apply(body, manager=REPLICAS_MANAGER)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        api_version, plural = KINDS[kind]
        try:
            self._call("DELETE", _path(api_version, plural, namespace, name), body={"propagationPolicy": "Background"})
        except ApiException as err:
            if err.status != 404:
                raise

    def prune(self, namespace: str, service: str, keep: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """Delete children of ``service`` that the current spec no longer renders."""
        removed = []
        selector = {LABEL_SERVICE: service, LABEL_MANAGED_BY: FIELD_MANAGER}
        for kind in KINDS:
            try:
                found = self.list(kind, namespace, selector)
            except ApiException as err:
                if err.status == 404 and kind == "LeaderWorkerSet":
                    continue  # LWS not installed: nothing of that kind to prune
                raise
            for obj in found:
                key = (kind, obj["metadata"]["name"])
                if key not in keep:
                    self.delete(kind, namespace, key[1])
                    removed.append(key)
        return removed

    def post_event(self, body: dict, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``body`` (what ``kubectl describe`` lists)."""
        meta = body["metadata"]
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": body.get("apiVersion", f"{GROUP}/{VERSION}"), "kind": body.get("kind", KIND),
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=event)

    def list_names(self, api_version: str, plural: str, namespace: str | None, selector: str = "",
                   page: int = 500) -> set[tuple[str, str, str]] | None:
        """(namespace, name, uid) of every object of a kind that the selector matches, read as
        metadata only (PartialObjectMetadataList) and in pages; None when the kind is not
        served (the LWS CRD absent)."""
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
        out: set[tuple[str, str, str]] = set()
        token = ""
        while True:
            query = [("limit", str(page))] + ([("labelSelector", selector)] if selector else []) \
                + ([("continue", token)] if token else [])
            try:
                got = self._call("GET", path, query=query,
                                 accept="application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")
            except ApiException as err:
                if err.status == 404:
                    return None
                raise
            for item in (got or {}).get("items") or []:
                meta = item.get("metadata") or {}
                out.add((meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or ""))
            token = ((got or {}).get("metadata") or {}).get("continue") or ""
            if not token:
                return out

    # -- the custom resource ---------------------------------------------------------
    def get_service(self, namespace: str, name: str) -> dict | None:
        try:
            return self._call("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}")
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def list_services(self, namespace: str | None) -> list[dict]:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}" if namespace else f"/apis/{GROUP}/{VERSION}/{PLURAL}"
        out = self._call("GET", path)
        return out.get("items", []) if out else []

    def patch_status(self, namespace: str, name: str, status: dict, manager: str = FIELD_MANAGER) -> dict | None:
        """Server-side apply of the status fields this writer owns (conditions
        merge by type with the other writer's). Returns the service as written
        (None: it was deleted meanwhile)."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": name, "namespace": namespace}, "status": status}
        try:
            return self._call(
                "PATCH",
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status",
                body=body,
                query=[("fieldManager", manager), ("force", "true")],
                content_type="application/apply-patch+yaml",
            )
        except ApiException as err:
            if err.status != 404:  # deleted while we reconciled: nothing to report on
                raise
            return None

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        """One key of a Secret, decoded. PermissionError when RBAC forbids the
        read; LookupError (with the fix) when the Secret or the key is missing."""
        try:
            secret = self._call("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiException as err:
            if err.status == 403:
                raise PermissionError(f"get secrets {namespace}/{name} is forbidden") from None
            if err.status == 404:
                raise LookupError(f"Secret {namespace}/{name} not found: create it, e.g. "
                                  f"kubectl -n {namespace} create secret generic {name} --from-literal={key}=...") from None
            raise
        data = secret.get("data") or {}
        if key not in data:
            raise LookupError(f"Secret {namespace}/{name} has no key {key!r} (it has: {', '.join(sorted(data)) or 'none'})")
        return base64.b64decode(data[key]).decode()

    def secret_problem(self, namespace: str, name: str, key: str) -> str | None:
        """Why a referenced Secret key cannot be used (None: it can)."""
        try:
            secret = self._call("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiException as err:
            if err.status == 404:
                return f"Secret {namespace}/{name} not found: create it, e.g. kubectl -n {namespace} create secret generic {name} --from-literal={key}=..."
            if err.status == 403:
                return None  # not allowed to check (RBAC without Secret reads): the kubelet will tell
            raise
        data = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
        if key not in data:
            return f"Secret {namespace}/{name} has no key {key!r} (it has: {', '.join(sorted(data)) or 'none'})"
        return None


def refusal(err: ApiException) -> tuple[str, list[tuple[str, str]]]:
    """The API server's answer to a refused write: (message, [(field path, what is wrong)]).

    A 422 Invalid names each field in ``details.causes``; other refusals
    (400 BadRequest, 403 from an admission plugin) carry only a message."""
    try:
        status = json.loads(err.body or "{}")
    except ValueError:
        return str(err.body or err.reason)[:500], []
    message = status.get("message") or str(err.reason)
    causes = [(c.get("field") or "", c.get("message") or c.get("reason") or "")
              for c in ((status.get("details") or {}).get("causes") or [])]
    return message, causes
