"""A generated set of malformed PDInferenceServices (issue 15).

Each is wrong in one way that either the CRD (schema, CEL), the operator's
own validation, or the API server's validation of a rendered child refuses:
tolerations, nodeSelector keys and values, resources, annotation keys,
drainSeconds against the grace period, Service ports (above 65535, two
equal ports on one Service), env names, extraArgs.
``tests/integration/test_all_or_nothing.py`` creates every one on a real API
server: each must be refused at admission or reported InvalidSpec with no
child created.
"""

from __future__ import annotations

import copy
import itertools

from tests.conftest import minimal

ENGINES = ("vllm", "sglang")
POOLS = ("prefill", "decode")


def _spec(kind: str, **spec) -> dict:
    return minimal(kind, **spec)


def _pool(kind: str, pool: str, **fields) -> dict:
    return _spec(kind, **{pool: fields})


def _cases() -> itertools.chain:
    for engine, pool in itertools.product(ENGINES, POOLS):
        # a toleration the API server refuses
        for tol in ({"key": "gpu", "operator": "Exists", "value": "yes"},
                    {"operator": "Exists", "value": "x"},
                    {"key": "gpu", "operator": "Exists", "value": "a", "effect": "NoSchedule"},
                    {"key": "gpu", "operator": "Equal", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 30},
                    {"key": "gpu", "operator": "Exists", "effect": "PreferNoSchedule", "tolerationSeconds": 5},
                    {"operator": "Equal", "value": "v"},
                    {"key": "bad key", "operator": "Exists"},
                    {"key": "-gpu", "operator": "Exists"},
                    {"key": "k" * 64, "operator": "Exists"}):
            yield f"toleration-{engine}-{pool}-{len(tol)}{tol.get('operator')}{tol.get('key', '')[:8]}", \
                _pool(engine, pool, tolerations=[tol])
        # node selector values and keys that are not label values / keys
        for value in ("has space", "-lead", "trail-", "a/b", "a:b", "x!", "_x", "é", "trailing.", "."):
            yield f"nodeselector-value-{engine}-{pool}-{value}", _pool(engine, pool, nodeSelector={"gpu": value})
        for key in ("k" * 64, "example.com/" + "k" * 64, "a" * 254 + "/k"):
            yield f"nodeselector-key-{engine}-{pool}-{len(key)}", _pool(engine, pool, nodeSelector={key: "v"})
        # resources: negative, not a quantity, a request above its limit
        for res, small, big in (("cpu", "1", "2"), ("memory", "1Gi", "2Gi"), ("ephemeral-storage", "1Gi", "5Gi")):
            yield f"request-above-limit-{engine}-{pool}-{res}", \
                _pool(engine, pool, resources={"requests": {res: big}, "limits": {res: small}})
            yield f"negative-{engine}-{pool}-{res}", _pool(engine, pool, resources={"requests": {res: "-1"}})
            yield f"not-a-quantity-{engine}-{pool}-{res}", _pool(engine, pool, resources={"limits": {res: "lots"}})
        # annotation keys too long (name part > 63, prefix > 253) or malformed
        for key in ("a" * 64, "example.com/" + "b" * 64, "c" * 254 + "/x", "bad key"):
            yield f"annotation-key-{engine}-{pool}-{len(key)}", _pool(engine, pool, annotations={key: "v"})
        # drainSeconds that leaves the engine no time to finish in-flight requests
        for drain, grace in ((60, 30), (120, 120), (600, 10)):
            yield f"drain-{engine}-{pool}-{drain}-{grace}", \
                _pool(engine, pool, drainSeconds=drain, terminationGracePeriodSeconds=grace)
        # env names that are not C identifiers (a repeated name is not malformed:
        # the later entry replaces the earlier one, render/engines/base.py merge_env)
        for env in ([{"name": "1BAD", "value": "x"}],
                    [{"name": "BAD NAME", "value": "x"}]):
            yield f"env-{engine}-{pool}-{env[0]['name']}-{len(env)}", _pool(engine, pool, env=env)
        # extraArgs the engine does not have, or that the operator manages
        for args in (["--no-such-flag"], ["--port", "1"], ["--model", "other"], ["--tensor-parallel-size=2"],
                     ["--definitely-not-a-flag=1"]):
            yield f"extraargs-{engine}-{pool}-{args[0].lstrip('-')}", _pool(engine, pool, extraArgs=args)
    for engine in ENGINES:
        # Service ports: above 65535, zero, equal to another port of the same Service
        for port in (65536, 70000, 0, -1):
            yield f"router-port-{engine}-{port}", _spec(engine, router={"service": {"port": port}})
        for key in ("a" * 64, "example.com/" + "b" * 64):
            yield f"router-annotation-{engine}-{len(key)}", _spec(engine, router={"service": {"annotations": {key: "v"}}})
        for res, small, big in (("cpu", "1", "2"), ("memory", "1Gi", "2Gi")):
            yield f"router-request-above-limit-{engine}-{res}", \
                _spec(engine, router={"resources": {"requests": {res: big}, "limits": {res: small}}})
        yield f"router-extraargs-{engine}", _spec(engine, router={"extraArgs": ["--no-such-router-flag"]})
    yield "sglang-pd-disaggregation", _spec("sglang", engine={"kind": "sglang", "extraArgs": ["--pd-disaggregation"]})
    for port in (8000, 65536, 80):
        yield f"nixl-port-{port}", _spec("vllm", kvTransfer={"nixl": {"sideChannelPort": port}})
    for port in (30000, 65536, 80):
        yield f"bootstrap-port-{port}", _spec("sglang", kvTransfer={"bootstrapPort": port})


def malformed_specs() -> list[tuple[str, dict]]:
    """(case id, PDInferenceService body without metadata.name/namespace), ids unique."""
    out, seen = [], set()
    for case, body in _cases():
        if case in seen:
            continue
        seen.add(case)
        body = copy.deepcopy(body)
        body["metadata"] = {}
        out.append((case, body))
    return out
