"""The CEL rules in the CRD and the pydantic rules agree on every spec.

celpy evaluates the exact CEL strings of the generated CRD on the object as
the API server would store it (after structural defaulting); pydantic
validates the same object. Both must accept or refuse it, and every message
pydantic reports must be one the API server reports too.
"""

from __future__ import annotations

import copy

import celpy
import pytest
from hypothesis import HealthCheck, given, settings

from pd_operator.api import SpecError, validate_service
from pd_operator.api.crd import apply_defaults, cel_rules, generate_crd
from tests.strategies import service

SCHEMA = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
ENV = celpy.Environment()
PROGRAMS: dict[str, object] = {}


def cel_failures(obj: dict) -> set[str]:
    stored = apply_defaults(SCHEMA, copy.deepcopy(obj))
    failed = set()
    for _path, rule, node in cel_rules(SCHEMA, stored):
        prog = PROGRAMS.get(rule["rule"])
        if prog is None:
            prog = PROGRAMS[rule["rule"]] = ENV.program(ENV.compile(rule["rule"]))
        if not bool(prog.evaluate({"self": celpy.json_to_cel(node)})):
            failed.add(rule["message"])
    return failed


def pydantic_failures(obj: dict) -> set[str] | None:
    try:
        validate_service(obj)
    except SpecError as err:
        return {msg for _field, msg in err.problems}
    return None


def test_every_rule_compiles():
    rules = [r for _, r, _ in cel_rules(SCHEMA, {"never": 1})]
    assert rules  # the root rule at least
    for path, node in [("spec", SCHEMA["properties"]["spec"])]:
        assert node.get("x-kubernetes-validations"), path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(service())
def test_cel_and_pydantic_agree(obj):
    cel = cel_failures(obj)
    py = pydantic_failures(obj)
    if py is None:
        assert cel == set(), f"API server would refuse what pdctl accepts: {cel}"
        return
    rule_messages = {m for m in py if m in ALL_MESSAGES}
    # Schema-level errors (patterns, bounds) are the API server's own; the rule
    # messages pdctl reports are a subset of what the API server reports (it
    # does not stop at the first failing object).
    assert rule_messages <= cel, (py, cel)
    if not (py - ALL_MESSAGES):
        assert cel, f"pdctl refuses what the API server would accept: {py}"


def _all_messages(node) -> set[str]:
    out = {r["message"] for r in node.get("x-kubernetes-validations", [])}
    for child in node.get("properties", {}).values():
        out |= _all_messages(child)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out |= _all_messages(node[key])
    return out


ALL_MESSAGES = _all_messages(SCHEMA)


@pytest.mark.parametrize(
    "spec_patch, message_part",
    [
        ({"prefill": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "minReplicas must be <= maxReplicas"),
        ({"kvTransfer": {"backend": "mooncake"}, "prefill": {"tensorParallelSize": 4}, "decode": {"tensorParallelSize": 6}}, "MooncakeConnector"),
        ({"engine": {"kind": "sglang"}, "prefill": {"tensorParallelSize": 3},
          "decode": {"tensorParallelSize": 4, "dataParallelSize": 2, "dataParallelAttention": True}}, "SGLang maps attention"),
        ({"decode": {"pipelineParallelSize": 2}}, "pipeline parallelism on decode"),
        ({"decode": {"terminationGracePeriodSeconds": 20}}, "drainSeconds + 16"),
        ({"kvTransfer": {"backend": "moriio"}}, "ROCm"),
        ({"prefill": {"tensorParallelSize": 16}, "decode": {"tensorParallelSize": 16}}, "dataParallelSize must be a multiple of the nodes"),
        ({"engine": {"kind": "sglang"}, "decode": {"tensorParallelSize": 16, "nodesPerReplica": 3}}, "split evenly over its nodes"),
        ({"engine": {"kind": "sglang"}, "decode": {"tensorParallelSize": 8, "dataParallelSize": 2}}, "multi-node data-parallel replicas"),
    ],
)
def test_done_when_cases_fail_in_cel_too(spec_patch, message_part):
    from tests.conftest import minimal

    obj = minimal(**spec_patch)
    assert any(message_part in m for m in cel_failures(obj))
    assert any(message_part in m for m in pydantic_failures(obj))
