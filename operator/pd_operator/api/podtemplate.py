"""The shape of a pool's pod-template overlay (``spec.<pool>.podTemplate``).

The CRD keeps the overlay as ``x-kubernetes-preserve-unknown-fields`` (a
PodTemplateSpec schema would make the CRD several times larger), so the shape
is checked here, offline and in the operator alike: only the pod fields an
overlay may carry, each of the right JSON type, list entries with the key they
are merged by. Whether the values are valid Kubernetes (a volume source, a
probe) is left to the API server when the StatefulSet is applied; which fields
the operator owns is checked at render time (render/overlay.py), where the
rendered pod is known.

Field names follow core/v1 PodSpec and Container (Kubernetes 1.37).
"""

from __future__ import annotations

from typing import Any

STR, BOOL, INT, DICT, LIST, STRMAP = "string", "boolean", "integer", "object", "list", "map of strings"

# PodSpec fields an overlay may set. Left out on purpose: nodeName (bypasses the
# scheduler and the free-GPU cap), restartPolicy (a StatefulSet needs Always),
# activeDeadlineSeconds (refused in a StatefulSet), priority (set by admission
# from priorityClassName), ephemeralContainers (not settable at create), and
# alpha fields.
POD_FIELDS: dict[str, str] = {
    "affinity": DICT,
    "automountServiceAccountToken": BOOL,
    "containers": LIST,
    "dnsConfig": DICT,
    "dnsPolicy": STR,
    "enableServiceLinks": BOOL,
    "hostAliases": LIST,
    "hostIPC": BOOL,
    "hostNetwork": BOOL,
    "hostPID": BOOL,
    "hostUsers": BOOL,
    "hostname": STR,
    "imagePullSecrets": LIST,
    "initContainers": LIST,
    "nodeSelector": STRMAP,
    "os": DICT,
    "overhead": DICT,
    "preemptionPolicy": STR,
    "priorityClassName": STR,
    "readinessGates": LIST,
    "resourceClaims": LIST,
    "resources": DICT,
    "runtimeClassName": STR,
    "schedulerName": STR,
    "schedulingGates": LIST,
    "securityContext": DICT,
    "serviceAccountName": STR,
    "setHostnameAsFQDN": BOOL,
    "shareProcessNamespace": BOOL,
    "subdomain": STR,
    "terminationGracePeriodSeconds": INT,
    "tolerations": LIST,
    "topologySpreadConstraints": LIST,
    "volumes": LIST,
}

CONTAINER_FIELDS: dict[str, str] = {
    "args": LIST,
    "command": LIST,
    "env": LIST,
    "envFrom": LIST,
    "image": STR,
    "imagePullPolicy": STR,
    "lifecycle": DICT,
    "livenessProbe": DICT,
    "name": STR,
    "ports": LIST,
    "readinessProbe": DICT,
    "resizePolicy": LIST,
    "resources": DICT,
    "restartPolicy": STR,
    "restartPolicyRules": LIST,
    "securityContext": DICT,
    "startupProbe": DICT,
    "stdin": BOOL,
    "stdinOnce": BOOL,
    "terminationMessagePath": STR,
    "terminationMessagePolicy": STR,
    "tty": BOOL,
    "volumeDevices": LIST,
    "volumeMounts": LIST,
    "workingDir": STR,
}

# The key each list's entries are merged by, as Kubernetes' strategic merge
# patch does (patchMergeKey in core/v1 types.go). Lists without one replace.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
}

# The JSON type of each merge key (core/v1: containerPort is an int32, the others strings).
MERGE_KEY_TYPES: dict[str, str] = {"containerPort": INT}

ENGINE_CONTAINER = "engine"


def _type_ok(value: Any, kind: str) -> bool:
    if kind == STR:
        return isinstance(value, str)
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == DICT:
        return isinstance(value, dict)
    if kind == LIST:
        return isinstance(value, list)
    if kind == STRMAP:
        return isinstance(value, dict)
    raise AssertionError(kind)


def _fields(obj: dict, allowed: dict[str, str], path: str, what: str, problems: list) -> None:
    for key, value in obj.items():
        here = f"{path}.{key}"
        if key not in allowed:
            problems.append((here, f"not a {what} field an overlay may set (allowed: {', '.join(sorted(allowed))})"))
        elif not _type_ok(value, allowed[key]):
            problems.append((here, f"must be a{'n' if allowed[key][0] in 'aeio' else ''} {allowed[key]}, got {type(value).__name__}"))
        elif allowed[key] == STRMAP:
            for k, v in value.items():
                if not isinstance(v, str):
                    problems.append((f"{here}[{k}]", f"must be a string (quote it), got {type(v).__name__}"))


def _entries(items: list, key: str, path: str, problems: list) -> list[tuple[str, dict]]:
    """(path of the entry, entry) for list entries that are objects with their merge key."""
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append((f"{path}[{i}]", f"must be an object, got {type(item).__name__}"))
            continue
        if item.get(key) in (None, ""):
            problems.append((f"{path}[{i}].{key}", f"required: entries are merged by {key}"))
            continue
        kind = MERGE_KEY_TYPES.get(key, STR)
        if not _type_ok(item[key], kind):
            # the merge indexes entries by it (a list or an object there is no key at all)
            problems.append((f"{path}[{i}].{key}", f"must be a{'n' if kind[0] in 'aeio' else ''} {kind}, "
                                                   f"got {type(item[key]).__name__}"))
            continue
        out.append((f"{path}[{item[key]}]" if key == "name" else f"{path}[{i}]", item))
    return out


def _container(c: dict, path: str, problems: list, init: bool) -> None:
    _fields(c, CONTAINER_FIELDS, path, "container", problems)
    if (init or c["name"] != ENGINE_CONTAINER) and not isinstance(c.get("image"), str):
        problems.append((f"{path}.image", "required: a container the overlay adds needs an image"))
    for name in ("command", "args"):
        if isinstance(c.get(name), list) and not all(isinstance(a, str) for a in c[name]):
            problems.append((f"{path}.{name}", "must be a list of strings"))
    for name in ("env", "volumeMounts", "ports", "volumeDevices"):
        if isinstance(c.get(name), list):
            _entries(c[name], MERGE_KEYS[name], f"{path}.{name}", problems)
    for i, m in enumerate(c.get("volumeMounts") if isinstance(c.get("volumeMounts"), list) else []):
        if isinstance(m, dict) and not m.get("name"):
            problems.append((f"{path}.volumeMounts[{i}].name", "required: the volume to mount"))
        elif isinstance(m, dict) and not isinstance(m["name"], str):
            problems.append((f"{path}.volumeMounts[{i}].name", f"must be a string, got {type(m['name']).__name__}"))
    for i, p in enumerate(c.get("ports") if isinstance(c.get("ports"), list) else []):
        if isinstance(p, dict) and p.get("name") is not None and not isinstance(p["name"], str):
            problems.append((f"{path}.ports[{i}].name", f"must be a string, got {type(p['name']).__name__}"))


def check_pod_template(overlay: Any) -> list[tuple[str, str]]:
    """Problems (path relative to the overlay, e.g. ``.spec.containers``, message) of an overlay's shape."""
    problems: list[tuple[str, str]] = []
    if not isinstance(overlay, dict):
        return [("", "must be an object with metadata and/or spec, as a PodTemplateSpec")]
    for key in overlay:
        if key not in ("metadata", "spec"):
            problems.append((f".{key}", "a pod-template overlay has only metadata (labels, annotations) and spec"))
    meta = overlay.get("metadata", {})
    if not isinstance(meta, dict):
        problems.append((".metadata", "must be an object"))
    else:
        _fields(meta, {"labels": STRMAP, "annotations": STRMAP}, ".metadata", "metadata", problems)
    spec = overlay.get("spec", {})
    if not isinstance(spec, dict):
        problems.append((".spec", "must be an object"))
        return problems
    _fields(spec, POD_FIELDS, ".spec", "pod", problems)
    for name in ("containers", "initContainers"):
        if isinstance(spec.get(name), list):
            for path, c in _entries(spec[name], "name", f".spec.{name}", problems):
                _container(c, path, problems, init=name == "initContainers")
    for name in ("volumes", "imagePullSecrets", "resourceClaims", "schedulingGates", "hostAliases"):
        if isinstance(spec.get(name), list):
            _entries(spec[name], MERGE_KEYS[name], f".spec.{name}", problems)
    for name in ("tolerations", "topologySpreadConstraints", "readinessGates"):
        for i, item in enumerate(spec.get(name) if isinstance(spec.get(name), list) else []):
            if not isinstance(item, dict):
                problems.append((f".spec.{name}[{i}]", f"must be an object, got {type(item).__name__}"))
            elif name in MERGE_KEYS and item.get(MERGE_KEYS[name]) is not None and not isinstance(item[MERGE_KEYS[name]], str):
                problems.append((f".spec.{name}[{i}].{MERGE_KEYS[name]}",
                                 f"must be a string, got {type(item[MERGE_KEYS[name]]).__name__}"))
    return problems
