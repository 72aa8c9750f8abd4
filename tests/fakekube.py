"""An in-memory cluster behind the operator's :class:`Kube` facade.

:class:`FakeKube` is the real ``Kube`` with its one raw call (``_call``)
answered by :class:`FakeCluster` instead of an API server, so every facade
method (get, list, apply, apply_replicas, prune, patch_status, secret reads)
runs its own code against the fake. The fake keeps what the reconciler relies
on from the API server:

* server-side apply with field managers: each manager owns the fields it
  applied; a field a manager stops applying is removed unless another
  manager owns it too; ``force`` moves a field with a different value to the
  applier; an equal value is shared. Lists are atomic, except
  ``status.conditions``, a map keyed by ``type`` (as the CRD declares it).
  Status is its own subresource: applying status does not touch the
  manager's spec fields and the other way round;
* defaulting of ``spec.replicas`` (1) on StatefulSets and Deployments;
* ``metadata.generation`` bumped when the spec changes, uid and
  creationTimestamp on create;
* 404 for what does not exist, label selectors ``k=v,k2=v2``.

Test knobs: :meth:`FakeCluster.refuse` (an apply answered with an API error),
``hooks`` (called before every request: to interleave another writer or
block), :meth:`FakeCluster.put` (objects other controllers write: pods,
secrets, a StatefulSet's status), :attr:`FakeCluster.calls`.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from pd_operator.api.constants import GROUP, KIND, PLURAL, VERSION
from pd_operator.controller.kube import KINDS, Kube

PLURALS = {plural: kind for kind, (_, plural) in KINDS.items()}
PLURALS.update({"pods": "Pod", "secrets": "Secret", "nodes": "Node", "events": "Event", PLURAL: KIND})
API_VERSIONS = {kind: api for kind, (api, _) in KINDS.items()}
API_VERSIONS.update({"Pod": "v1", "Secret": "v1", "Node": "v1", "Event": "v1", KIND: f"{GROUP}/{VERSION}"})
DEFAULT_REPLICAS = {"StatefulSet", "Deployment"}
# the clock of managedFields times (one per write, across objects)
TICKS = itertools.count(1)

Path = tuple  # a field path: ("spec", "replicas"), ("status", "conditions", ("type", "Ready"))


def flatten(value: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Leaf fields of an object: maps are descended, lists are atomic, except
    ``status.conditions`` (keyed by ``type``)."""
    if isinstance(value, dict) and value:
        out: dict[Path, Any] = {}
        for key, sub in value.items():
            out.update(flatten(sub, (*prefix, key)))
        return out
    if prefix == ("status", "conditions") and isinstance(value, list):
        return {(*prefix, ("type", c["type"])): copy.deepcopy(c) for c in value}
    return {prefix: copy.deepcopy(value)}


def unflatten(fields: dict[Path, Any]) -> dict:
    out: dict = {}
    for path, value in fields.items():
        node = out
        for i, key in enumerate(path[:-1]):
            if isinstance(path[i + 1], tuple):  # a keyed list item comes next
                node = node.setdefault(key, [])
                break
            node = node.setdefault(key, {})
        if isinstance(node, list):
            node.append(copy.deepcopy(value))
        else:
            node[path[-1]] = copy.deepcopy(value)
    return out


def api_error(status: int, reason: str, message: str) -> ApiException:
    return ApiException(status=status, reason=reason, body=json.dumps({"kind": "Status", "message": message}))


class Stored:
    """One object: server-set metadata, fields with their owners, and what each
    (manager, subresource) applied last."""

    def __init__(self, kind: str, namespace: str | None, name: str, uid: str):
        self.kind, self.namespace, self.name = kind, namespace, name
        self.meta = {"name": name, "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1,
                     "resourceVersion": "1"}
        if namespace:
            self.meta["namespace"] = namespace
        self.fields: dict[Path, Any] = {}
        self.owners: dict[Path, set[str]] = {}
        self.applied: dict[tuple[str, str], set[Path]] = {}
        self.writes: dict[tuple[str, str], tuple[int, str]] = {}  # (manager, subresource) -> (tick, operation)

    def apply(self, obj: dict, manager: str, subresource: str | None = "", release: bool = True) -> None:
        """Server-side apply (``release``: fields the manager no longer applies go),
        or, with ``release=False``, an update by ``manager`` (kubectl edit/scale)."""
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k in ("labels", "annotations", "ownerReferences")}
        if meta:
            body["metadata"] = meta
        config = {p: v for p, v in flatten(body).items()
                  if subresource is None or (p[0] == "status") == (subresource == "status")}
        key = (manager, subresource)
        self.writes[key] = (next(TICKS), "Apply" if release else "Update")
        if release:
            for path in self.applied.get(key, set()) - set(config):
                owners = self.owners.get(path, set())
                owners.discard(manager)
                if not owners:
                    self.fields.pop(path, None)
                    self.owners.pop(path, None)
        for path, value in config.items():
            # a field set under a path that was a leaf (or the reverse) replaces it
            for other in [p for p in self.fields if p != path and (p[:len(path)] == path or path[:len(p)] == p)]:
                self.fields.pop(other)
                self.owners.pop(other, None)
            if path in self.fields and self.fields[path] != value:
                self.owners[path] = {manager}  # force: the applier takes a field it changes
            else:
                self.owners.setdefault(path, set()).add(manager)
            self.fields[path] = value
        self.applied[key] = set(config) | (set() if release else self.applied.get(key, set()))
        if self.kind in DEFAULT_REPLICAS and ("spec", "replicas") not in self.fields:
            self.fields[("spec", "replicas")] = 1
            self.owners[("spec", "replicas")] = set()

    def managed_fields(self) -> list[dict]:
        """As the API server lists them: one entry per (manager, subresource) that owns a
        field, with the operation and time of its last write."""
        out = []
        for (manager, sub), (tick, operation) in sorted(self.writes.items(), key=lambda kv: kv[1][0]):
            paths = [p for p in self.applied.get((manager, sub), set()) if manager in self.owners.get(p, set())]
            if not paths:
                continue
            fields: dict = {}
            for path in sorted(paths):
                node = fields
                for part in path:
                    node = node.setdefault(f"f:{part}", {})
            entry = {"manager": manager, "operation": operation, "apiVersion": API_VERSIONS[self.kind],
                     "time": f"2026-01-01T{tick // 3600 % 24:02d}:{tick // 60 % 60:02d}:{tick % 60:02d}Z",
                     "fieldsType": "FieldsV1", "fieldsV1": fields}
            if sub:
                entry["subresource"] = sub
            out.append(entry)
        return out

    def object(self) -> dict:
        obj = unflatten(self.fields)
        meta = {**copy.deepcopy(self.meta), **obj.pop("metadata", {}), "managedFields": self.managed_fields()}
        return {"apiVersion": API_VERSIONS[self.kind], "kind": self.kind, "metadata": meta, **obj}

    def spec(self) -> dict:
        return {p: v for p, v in self.fields.items() if p[0] == "spec"}


class FakeCluster:
    def __init__(self):
        self.objects: dict[tuple[str, str | None, str], Stored] = {}
        self.refused: dict[tuple[str, str], ApiException] = {}
        self.hooks: list[Callable[[str, str, Any, dict], None]] = []
        self.calls: list[tuple[str, str, dict]] = []
        self.lock = threading.RLock()
        self._uids = itertools.count(1)

    # -- test knobs ---------------------------------------------------------------
    def refuse(self, kind: str, name: str, status: int = 422, reason: str = "Unprocessable Entity",
               message: str = "refused") -> None:
        """Every apply of kind/name is answered with this API error."""
        self.refused[(kind, name)] = api_error(status, reason, message)

    def put(self, obj: dict, manager: str = "test", subresource: str | None = None) -> dict:
        """Write an object as another client would: an update (nothing it does not
        name is released), of spec and status at once unless ``subresource`` says."""
        meta = obj["metadata"]
        return self._write(obj["kind"], meta.get("namespace"), meta["name"], obj, manager, subresource, release=False)

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        with self.lock:
            stored = self.objects.get((kind, namespace, name))
            return stored.object() if stored else None

    def owners(self, kind: str, namespace: str, name: str, *path) -> set[str]:
        return set(self.objects[(kind, namespace, name)].owners.get(tuple(path), set()))

    def applied_by(self, kind: str, namespace: str, name: str, manager: str) -> dict:
        """What ``manager`` last applied to the object (its main resource)."""
        stored = self.objects[(kind, namespace, name)]
        paths = stored.applied.get((manager, ""), set())
        return unflatten({p: stored.fields[p] for p in paths if p in stored.fields})

    def kinds(self, namespace: str) -> set[tuple[str, str]]:
        with self.lock:
            return {(k, n) for (k, ns, n) in self.objects if ns == namespace}

    def apply_service(self, body: dict) -> dict:
        """kubectl apply of a PDInferenceService."""
        meta = body["metadata"]
        return self._write(KIND, meta["namespace"], meta["name"], body, "kubectl", "", release=True)

    # -- the REST surface Kube uses -------------------------------------------------
    def call(self, method: str, path: str, body: Any = None, query: list | None = None,
             content_type: str | None = None) -> Any:
        params = dict(query or [])
        self.calls.append((method, path, params))
        for hook in list(self.hooks):
            hook(method, path, body, params)
        kind, namespace, name, sub = self._parse(path)
        with self.lock:
            if method == "GET" and name is None:
                return {"items": self._list(kind, namespace, params.get("labelSelector", ""))}
            if method == "GET":
                stored = self.objects.get((kind, namespace, name))
                if stored is None:
                    raise api_error(404, "Not Found", f'{kind.lower()}s "{name}" not found')
                return stored.object()
            if method == "PATCH":
                assert content_type == "application/apply-patch+yaml", content_type
                assert params.get("force") == "true" and params.get("fieldManager"), params
                if (kind, name) in self.refused:
                    raise self.refused[(kind, name)]
                if params.get("dryRun") == "All":  # validated and admitted, nothing stored
                    return copy.deepcopy(body)
                if sub == "status" and (kind, namespace, name) not in self.objects:
                    raise api_error(404, "Not Found", f'{kind} "{name}" not found')
                return self._write(kind, namespace, name, body, params["fieldManager"], sub, release=True)
            if method == "DELETE":
                if self.objects.pop((kind, namespace, name), None) is None:
                    raise api_error(404, "Not Found", f'{kind} "{name}" not found')
                return {"kind": "Status", "status": "Success"}
        raise AssertionError(f"the fake cluster does not serve {method} {path}")

    def _parse(self, path: str) -> tuple[str, str | None, str | None, str]:
        parts = path.strip("/").split("/")
        parts = parts[2:] if parts[0] == "api" else parts[3:]  # api/v1/... or apis/group/version/...
        namespace = None
        if parts[0] == "namespaces" and len(parts) > 2:
            namespace, parts = parts[1], parts[2:]
        kind = PLURALS[parts[0]]
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else ""
        return kind, namespace, name, sub

    def _list(self, kind: str, namespace: str | None, selector: str) -> list[dict]:
        want = dict(s.split("=", 1) for s in selector.split(",") if s)
        out = []
        for (k, ns, _), stored in sorted(self.objects.items(), key=lambda kv: str(kv[0])):
            if k != kind or (namespace is not None and ns != namespace):
                continue
            obj = stored.object()
            labels = obj["metadata"].get("labels") or {}
            if all(labels.get(a) == b for a, b in want.items()):
                out.append(obj)
        return out

    def _write(self, kind, namespace, name, body, manager, sub, release) -> dict:
        with self.lock:
            stored = self.objects.get((kind, namespace, name))
            if stored is None:
                stored = self.objects[(kind, namespace, name)] = Stored(kind, namespace, name, f"uid-{next(self._uids)}")
            before = stored.spec()
            stored.apply(body, manager, sub, release)
            if stored.spec() != before and before:
                stored.meta["generation"] += 1
            stored.meta["resourceVersion"] = str(int(stored.meta["resourceVersion"]) + 1)
            return stored.object()


class FakeKube(Kube):
    """The real facade over the fake cluster."""

    def __init__(self, cluster: FakeCluster | None = None):
        self.cluster = cluster or FakeCluster()

    def _call(self, method, path, body=None, query=None, content_type=None):
        return copy.deepcopy(self.cluster.call(method, path, copy.deepcopy(body), query, content_type))
