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


# --------------------------------------------------------------------------
# Compiling every rule: what the API server does when the CRD is applied.
# It parses each rule and type-checks it against the schema the rule sits on:
# a syntax error, a field the schema does not declare, an identifier that is
# not ``self`` or a macro variable, or a fieldPath that names no field makes
# the CRD itself invalid. celpy parses; the schema walk below does the rest.
# --------------------------------------------------------------------------

ANY = None  # a value whose schema the checker does not follow (literals, function results)
MACROS = {"all", "exists", "exists_one", "filter", "map"}
# Root-level rules see these metadata fields only (the API server's rule on ObjectMeta).
METADATA = {"name": {"type": "string"}, "generateName": {"type": "string"}}


def _field(node: dict | None, name: str, where: str, problems: list[str]) -> dict | None:
    if node is ANY:
        return ANY
    if node.get("x-kubernetes-int-or-string") or node.get("type") not in (None, "object"):
        problems.append(f"{where}: .{name} on a {node.get('type', 'int-or-string')}")
        return ANY
    if node is SCHEMA["properties"]["metadata"]:
        props = METADATA
    else:
        props = node.get("properties", {})
    if name in props:
        return props[name]
    if isinstance(node.get("additionalProperties"), dict):
        return node["additionalProperties"]  # map access by key
    problems.append(f"{where}: no field {name!r} (fields: {sorted(props)})")
    return ANY


def _element(node: dict | None) -> dict | None:
    """What a macro variable ranges over: list items, map keys."""
    if node is ANY:
        return ANY
    if node.get("type") == "array":
        return node.get("items", ANY)
    if isinstance(node.get("additionalProperties"), dict):
        return {"type": "string"}
    return ANY


def _check(tree, env: dict, problems: list[str]) -> dict | None:
    """Walk a celpy parse tree; return the schema of a member expression (or ANY)."""
    from lark import Token

    if isinstance(tree, Token):
        return ANY
    kind, kids = tree.data, tree.children
    if kind == "ident":
        name = str(kids[0])
        if name not in env:
            problems.append(f"undeclared reference {name!r}")
            return ANY
        return env[name]
    if kind == "member_dot":
        return _field(_check(kids[0], env, problems), str(kids[1]), "member", problems)
    if kind == "member_index":
        base = _check(kids[0], env, problems)
        _check(kids[1], env, problems)
        if base is ANY:
            return ANY
        if base.get("type") == "array":
            return base.get("items", ANY)
        if isinstance(base.get("additionalProperties"), dict):
            return base["additionalProperties"]
        problems.append(f"index into a {base.get('type')}")
        return ANY
    if kind in ("member_dot_arg", "ident_arg"):
        if kind == "member_dot_arg":
            base, name, args = _check(kids[0], env, problems), str(kids[1]), kids[2:]
        else:
            base, name, args = ANY, str(kids[0]), kids[1:]
        exprs = args[0].children if args and args[0] is not None else []
        if kind == "member_dot_arg" and name in MACROS:
            if len(exprs) != 2 or not _is_ident(exprs[0]):
                problems.append(f"macro {name} needs (variable, expression)")
                return ANY
            inner = {**env, _ident_name(exprs[0]): _element(base)}
            _check(exprs[1], inner, problems)
            return base if name == "filter" else ANY
        if name != "has" and name not in celpy.evaluation.base_functions:
            problems.append(f"unknown function {name!r}")
        if name == "has" and (len(exprs) != 1 or not _is_field_selection(exprs[0])):
            problems.append("has() takes one field selection such as has(self.field)")
        for e in exprs:
            _check(e, env, problems)
        return ANY
    result = ANY
    for kid in kids:
        if kid is not None:
            sub = _check(kid, env, problems)
            if len(kids) == 1:
                result = sub  # expr -> conditionalor -> ... -> member: pass the schema up
    return result


def _descend(tree):
    """The single-child chain of a parse tree (expr -> ... -> primary)."""
    while getattr(tree, "children", None) and len(tree.children) == 1 and hasattr(tree.children[0], "data"):
        tree = tree.children[0]
    return tree


def _is_ident(expr) -> bool:
    return _descend(expr).data == "ident"


def _ident_name(expr) -> str:
    return str(_descend(expr).children[0])


def _is_field_selection(expr) -> bool:
    return _descend(expr).data == "member_dot"


def compile_problems(rule: dict, node: dict) -> list[str]:
    """Why the API server would refuse this rule on this schema node ([] = it compiles)."""
    try:
        tree = ENV.compile(rule["rule"])
    except celpy.CELParseError as err:
        return [f"syntax: {err}"]
    problems: list[str] = []
    _check(tree, {"self": node}, problems)
    if "fieldPath" in rule:
        target = node
        for part in rule["fieldPath"].lstrip(".").split("."):
            target = _field(target, part, f"fieldPath {rule['fieldPath']}", problems)
    return problems


def all_rules(node: dict, path: str = "$"):
    """(path, schema node, rule) for every rule anywhere in the schema, whatever
    object it would apply to."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, node, rule
    for name, child in node.get("properties", {}).items():
        yield from all_rules(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from all_rules(node[key], f"{path}.{key}")


def test_every_rule_compiles():
    rules = list(all_rules(SCHEMA))
    # every Rule the models declare reaches the CRD (the count is the models', not a literal)
    assert len({r["rule"] for _, _, r in rules}) >= len({r.cel for r in _model_rules()})
    failures = {f"{path}: {rule['rule']}": compile_problems(rule, node) for path, node, rule in rules}
    assert not {k: v for k, v in failures.items() if v}


def _model_rules():
    from pydantic import BaseModel

    import pd_operator.api.models as models

    return [rule for cls in vars(models).values()
            if isinstance(cls, type) and issubclass(cls, BaseModel) for rule in getattr(cls, "rules", ())]


@pytest.mark.parametrize("rule, problem", [
    ("self.minReplicas <= ", "syntax"),
    ("self.minReplica <= self.maxReplicas", "no field 'minReplica'"),
    ("self.secondaryTargets.all(t, t.metrc != '')", "no field 'metrc'"),
    ("self.enabled.size() > 0 && self.minReplicas.foo == 1", ".foo on a integer"),
    ("x.minReplicas > 0", "undeclared reference 'x'"),
    ("self.minReplicas.lowerAscii() == ''", "unknown function 'lowerAscii'"),
    ("has(self) || true", "has() takes one field selection"),
])
def test_compile_check_refuses_broken_rules(rule, problem):
    """The compile check itself: broken rules on the autoscaling object are refused."""
    autoscaling = SCHEMA["properties"]["spec"]["properties"]["prefill"]["properties"]["autoscaling"]
    assert any(problem in p for p in compile_problems({"rule": rule, "message": "m"}, autoscaling)), rule
    assert compile_problems({"rule": "self.minReplicas <= 3", "message": "m", "fieldPath": ".maxReplica"}, autoscaling)


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
        ({"prefill": {"tensorParallelSize": 4}, "decode": {"tensorParallelSize": 6}}, "one tensorParallelSize divides the other"),
        ({"kvTransfer": {"backend": "mooncake"}}, "kvTransfer.backend mooncake is refused with engine.kind vllm"),
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
