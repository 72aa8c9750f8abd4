"""An in-memory stand-in for the API server behind ``controller.kube.Kube``.

It keeps what a real one keeps that the controller's decisions depend on:
objects, server-side apply per field manager (``managedFields`` entries with
a time), the scale and status writes of other managers, dry-run, and refusals
(422 with ``details.causes`` naming the field). Every call is counted, so a
test can tell how many requests a reconcile sent.
"""

from __future__ import annotations

import copy
import itertools
import json

from kubernetes.client.rest import ApiException

from pd_operator.controller.kube import FIELD_MANAGER, REPLICAS_MANAGER

WRITES = ("apply", "apply_replicas", "delete", "patch_status")


def leaves(obj, prefix: str = "") -> dict[str, object]:
    """Field path -> value of every leaf (the fake's stand-in for fieldsV1)."""
    out: dict[str, object] = {}
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            out.update(leaves(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = obj
    return out


def owned(obj: dict) -> list[str]:
    return sorted(k for k in leaves({k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")})
                  if not k.startswith(("metadata.managedFields", "metadata.resourceVersion")))


def invalid(kind: str, name: str, causes: list[tuple[str, str]]) -> ApiException:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
            "message": f'{kind} "{name}" is invalid: ' + ", ".join(f"{f}: {m}" for f, m in causes),
            "details": {"name": name, "kind": kind.lower() + "s",
                        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes]}}
    return ApiException(status=422, reason="Unprocessable Entity", body=json.dumps(body))


def toleration_exists_with_value(obj: dict) -> list[tuple[str, str]]:
    """What the API server's pod template validation says of a toleration Exists with a value
    (kube-apiserver 1.37 names the operator field; seen on the local cluster, test_webhook.py)."""
    tols = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("tolerations") or []
    return [(f"spec.template.spec.tolerations[{i}].operator", f'Invalid value: "{t["value"]}": '
             "value must be empty when `operator` is 'Exists'")
            for i, t in enumerate(tols) if t.get("operator") == "Exists" and t.get("value")]


class FakeApi:
    def __init__(self, refuse=lambda obj: []):
        self.refuse = refuse
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.services: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, str]] = []
        self._tick = itertools.count(1)
        self._rv = itertools.count(1)

    # -- bookkeeping ------------------------------------------------------------------
    def now(self) -> str:
        t = next(self._tick)
        return f"2026-01-01T{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}Z"

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in WRITES]

    def _stamp(self, obj: dict, manager: str, operation: str, subresource: str = "", fields: list[str] = (),
               shared: set[str] = frozenset()) -> None:
        """Record a write: ``fields`` move to ``manager`` (taken from whoever had them),
        except those in ``shared``: applied with the value they already had, the
        appliers own them together (server-side apply)."""
        meta = obj.setdefault("metadata", {})
        taken = set(fields)
        moved = set(fields) - (set(shared) if operation == "Apply" else set())
        entries = []
        for e in meta.get("managedFields") or []:
            if e["manager"] == manager and e.get("subresource", "") == subresource:
                taken |= set(e["fieldsV1"]) if operation == "Update" else set()
                continue
            e = {**e, "fieldsV1": [f for f in e.get("fieldsV1", []) if f not in moved]}
            if e["fieldsV1"]:
                entries.append(e)
        entry = {"manager": manager, "operation": operation, "time": self.now(), "fieldsV1": sorted(taken)}
        if subresource:
            entry["subresource"] = subresource
        meta["managedFields"] = entries + [entry]
        meta["resourceVersion"] = str(next(self._rv))

    # -- reads --------------------------------------------------------------------------
    def get(self, kind, namespace, name):
        self.calls.append(("get", kind))
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def list(self, kind, namespace, selector):
        self.calls.append(("list", kind))
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind and ns == namespace
                and selector.items() <= (o["metadata"].get("labels") or {}).items()]

    def pods(self, namespace, selector):
        self.calls.append(("list", "Pod"))
        return []

    def create_failures(self, namespace, kind, name):
        self.calls.append(("list", "Event"))
        return []

    def secret_problem(self, namespace, name, key):
        self.calls.append(("get", "Secret"))
        return None

    def cluster_gpu_view(self):
        return None

    def get_service(self, namespace, name):
        self.calls.append(("get", "PDInferenceService"))
        return copy.deepcopy(self.services.get((namespace, name)))

    def list_services(self, namespace):
        self.calls.append(("list", "PDInferenceService"))
        return [copy.deepcopy(b) for (ns, _), b in self.services.items() if namespace in (None, ns)]

    # -- writes -------------------------------------------------------------------------
    def apply(self, obj, manager=FIELD_MANAGER, dry_run=False):
        self.calls.append(("apply-dry-run" if dry_run else "apply", obj["kind"]))
        name = obj["metadata"]["name"]
        problems = self.refuse(obj)
        if problems:
            raise invalid(obj["kind"], name, problems)
        if dry_run:
            return copy.deepcopy(obj)
        key = (obj["kind"], obj["metadata"]["namespace"], name)
        old = self.objects.get(key)
        new = copy.deepcopy(obj)
        if old is not None:
            if "replicas" not in (new.get("spec") or {}) and "replicas" in (old.get("spec") or {}):
                # as server-side apply: a field this manager applied before and leaves out
                # now is removed unless another manager owns it (replicas then default to 1)
                entries = old["metadata"].get("managedFields") or []
                mine = any(e["manager"] == manager and not e.get("subresource") and "spec.replicas" in e["fieldsV1"]
                           for e in entries)
                others = any((e["manager"] != manager or e.get("subresource")) and "spec.replicas" in e["fieldsV1"]
                             for e in entries)
                new.setdefault("spec", {})["replicas"] = 1 if mine and not others else old["spec"]["replicas"]
            if "status" in old:
                new["status"] = old["status"]
            new["metadata"]["managedFields"] = old["metadata"].get("managedFields") or []
        # as the API server: generation 1 at creation, +1 for each change of the spec
        before = (old or {}).get("metadata", {}).get("generation", 0)
        new["metadata"]["generation"] = before + (old is None or (old.get("spec") != new.get("spec")))
        before_leaves = leaves(old) if old is not None else {}
        after_leaves = leaves(new)
        self._stamp(new, manager, "Apply", fields=owned(obj),
                    shared={f for f in owned(obj) if f in before_leaves and before_leaves[f] == after_leaves.get(f)})
        self.objects[key] = new
        return copy.deepcopy(new)

    def apply_replicas(self, kind, namespace, name, replicas):
        self.calls.append(("apply_replicas", kind))
        obj = self.objects[(kind, namespace, name)]
        same = obj["spec"].get("replicas") == replicas
        if not same:
            obj["metadata"]["generation"] = obj["metadata"].get("generation", 0) + 1
        obj["spec"]["replicas"] = replicas
        self._stamp(obj, REPLICAS_MANAGER, "Apply", fields=["spec.replicas"], shared={"spec.replicas"} if same else set())
        return copy.deepcopy(obj)

    def delete(self, kind, namespace, name):
        self.calls.append(("delete", kind))
        self.objects.pop((kind, namespace, name), None)

    def prune(self, namespace, service, keep):
        from pd_operator.controller.kube import KINDS

        removed = []
        for kind in KINDS:
            for obj in self.list(kind, namespace, {"pdserving.io/service": service}):
                if (kind, obj["metadata"]["name"]) not in keep:
                    self.delete(kind, namespace, obj["metadata"]["name"])
                    removed.append((kind, obj["metadata"]["name"]))
        return removed

    def patch_status(self, namespace, name, status, manager=FIELD_MANAGER):
        self.calls.append(("patch_status", manager))
        svc = self.services.get((namespace, name))
        if svc is None:
            return None
        svc["status"] = {**(svc.get("status") or {}), **copy.deepcopy(status)}
        svc["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(svc)

    # -- what others do -------------------------------------------------------------------
    def edit(self, kind, namespace, name, change, manager="kubectl-edit", subresource=""):
        """A write by another client (a person, a cluster controller)."""
        obj = self.objects[(kind, namespace, name)]
        before = leaves(copy.deepcopy(obj))
        change(obj)
        after = leaves(obj)
        changed = [k for k in set(before) | set(after) if before.get(k) != after.get(k)
                   and not k.startswith("metadata.managedFields")]
        self._stamp(obj, manager, "Update", subresource, fields=changed)
