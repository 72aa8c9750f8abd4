"""Contract tier: every command line the renderer emits parses with the pinned
engine's or router's own parser (as captured in the flag-set snapshots), and
every engine env var it sets is one the pinned engine reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings

from pd_operator.api import SpecError, validate_service
from pd_operator.api.constants import ROUTER_VERSIONS
from pd_operator.render import render
from pd_operator.render.launch import resolve_argv
from pd_operator.render.engines.flagset import (
    FlagError,
    check_argv,
    connector_extra_config_keys,
    known_env,
)
from tests.conftest import EXAMPLES, load_example, minimal
from tests.strategies import service

ENGINE_PREFIX = {"vllm": "VLLM_", "sglang": "SGLANG_"}


# What the LWS pod webhook writes into a group pod's env (render/launch.py), for
# a worker of index 2: the launcher's templates are filled in from it.
GROUP_ENV = {"LWS_LEADER_ADDRESS": "svc-decode-0.svc-decode.ns", "LWS_WORKER_INDEX": "2", "LWS_GROUP_SIZE": "4",
             "PD_ENGINE_API_KEY": "key", "POD_IP": "10.0.0.7"}


def commands(svc):
    """(component, version, argv, env names) of every container rendered; the
    leader and worker commands of a LeaderWorkerSet as the program sees them."""
    out = []
    kind = svc.spec.engine.kind
    for obj in render(svc):
        if obj["kind"] == "LeaderWorkerSet":
            lwt = obj["spec"]["leaderWorkerTemplate"]
            for side in ("leaderTemplate", "workerTemplate"):
                c = lwt[side]["spec"]["containers"][0]
                env = [e["name"] for e in c.get("env", [])]
                argv = resolve_argv(c["command"], {**GROUP_ENV, "LWS_WORKER_INDEX": "0" if side == "leaderTemplate" else "2"})
                out.append((kind, svc.spec.engine.effective_version(), argv, env))
            continue
        if obj["kind"] not in ("StatefulSet", "Deployment"):
            continue
        c = obj["spec"]["template"]["spec"]["containers"][0]
        env = [e["name"] for e in c.get("env", [])]
        if obj["kind"] == "StatefulSet":
            out.append((kind, svc.spec.engine.effective_version(), c["command"], env))
        else:
            rk = svc.spec.router_kind()
            out.append((rk, ROUTER_VERSIONS[rk], c["command"], env))
    return out


def assert_contract(svc):
    for component, version, argv, env in commands(svc):
        check_argv(component, version, argv)
        prefix = ENGINE_PREFIX.get(component)
        if prefix:
            for name in env:
                if name.startswith(prefix):
                    assert known_env(component, version, name), f"{component} {version} does not read {name}"
        if component == "vllm":
            cfg = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            parts = cfg.get("kv_connector_extra_config", {}).get("connectors", [cfg])
            for part in parts:
                keys = set(part.get("kv_connector_extra_config", {})) - {"connectors"}
                allowed = connector_extra_config_keys(version, part["kv_connector"])
                assert keys <= allowed, f"{part['kv_connector']} does not read {keys - allowed}"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_parse_with_the_real_parsers(path):
    assert_contract(validate_service(load_example(path)))


@pytest.mark.parametrize(
    "spec",
    [
        {"kvTransfer": {"backend": "moriio"}, "engine": {"kind": "vllm", "accelerator": "amd", "image": "rocm/vllm:x"}},
        {"kvTransfer": {"backend": "nixl", "nixl": {"backends": ["LIBFABRIC"]}}},
        {"prefill": {"pipelineParallelSize": 2, "dataParallelSize": 2, "maxRunningRequests": 128, "maxBatchedTokens": 8192,
                     "gpuMemoryUtilization": 0.9, "enablePrefixCaching": False}},
        {"model": {"name": "Qwen/Qwen3-8B", "maxModelLen": 32768, "trustRemoteCode": True, "source": {"revision": "main"}}},
        {"engine": {"kind": "vllm", "apiKeySecretRef": {"name": "k"}, "extraArgs": ["--enforce-eager"]}},
    ],
)
def test_vllm_variants(spec):
    assert_contract(validate_service(minimal(**spec)))


@pytest.mark.parametrize(
    "spec",
    [
        {"kvTransfer": {"backend": "nixl", "nixl": {"backends": ["LIBFABRIC"]}}},
        {"prefill": {"tensorParallelSize": 2, "dataParallelSize": 2}, "decode": {"tensorParallelSize": 4}},
        {"engine": {"kind": "sglang", "apiKeySecretRef": {"name": "k"}}, "kvTransfer": {"rdma": {"ibDevices": ["mlx5_0"]}}},
        {"prefill": {"maxRunningRequests": 128, "maxBatchedTokens": 8192, "gpuMemoryUtilization": 0.85, "enablePrefixCaching": False}},
    ],
)
def test_sglang_variants(spec):
    assert_contract(validate_service(minimal("sglang", **spec)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(service())
def test_every_valid_spec_renders_parseable_commands(obj):
    try:
        svc = validate_service(obj)
    except SpecError:
        assume(False)
        return
    assert_contract(svc)


@pytest.mark.parametrize(
    "kind, args, why",
    [
        ("sglang", ["--pd-disaggregation"], "router-only flag on the server"),
        ("sglang", ["--prefill-only"], "blog flag; a prefix of another flag"),
        ("vllm", ["--disaggregation-mode", "prefill"], "an SGLang flag on vLLM"),
        ("vllm", ["--no-such-flag"], "unknown"),
    ],
)
def test_unknown_user_flags_are_refused_before_anything_is_rendered(kind, args, why):
    with pytest.raises(SpecError) as info:
        render(validate_service(minimal(kind, engine={"kind": kind, "extraArgs": args})))
    field, message = info.value.problems[0]
    assert field == "spec.engine.extraArgs" and args[0] in message, why


def test_wrong_case_connector_fails_the_contract():
    with pytest.raises(FlagError, match="MoRIIOConnector"):
        check_argv("vllm", "0.33.0", ["vllm", "serve", "m", "--kv-transfer-config", '{"kv_connector":"MoriIOConnector","kv_role":"kv_both"}'])


def test_user_flags_the_engine_has_pass():
    svc = validate_service(minimal(engine={"kind": "vllm", "extraArgs": ["--enforce-eager", "--long-prefill-token-threshold", "2048", "--watermark", "0.01"]}))
    render(svc)
