"""Behaviour the renderer and the rules take from the pinned engines' source.

Each test names the fact it relies on; tests/contract/FACTS.md gives the
engine file. Expectations are written from the fact, never read back from the
code under test.
"""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from tests.conftest import minimal


def problems(obj) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_service(obj)
    return dict(info.value.problems)


def objects(obj) -> list[dict]:
    return render(validate_service(obj))


def sts(obj, role: str) -> dict:
    return next(o for o in objects(obj) if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith(role))


def container(obj, role: str) -> dict:
    return sts(obj, role)["spec"]["template"]["spec"]["containers"][0]


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# ---------------------------------------------------------------- 1. SIGTERM

# vLLM 0.33.0 engine/arg_utils.py: --shutdown-timeout default 0; v1/engine/core.py
# _handle_shutdown: mode "abort" when 0, "drain" for up to N s otherwise.
TEARDOWN_S = 15  # v1/engine/utils.py ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S


@pytest.mark.parametrize("role,grace,drain", [("prefill", 120, 10), ("decode", 600, 10), ("decode", 90, 30)])
def test_vllm_drains_within_the_grace_period(role, grace, drain):
    obj = minimal(**{role: {"terminationGracePeriodSeconds": grace, "drainSeconds": drain}})
    c = container(obj, role)
    timeout = flag(c["command"], "--shutdown-timeout")
    assert timeout is not None, "without --shutdown-timeout vLLM aborts every in-flight request on SIGTERM"
    timeout = int(timeout)
    assert timeout > 0
    pod = sts(obj, role)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= c["lifecycle"]["preStop"]["sleep"]["seconds"] + timeout + TEARDOWN_S


def test_grace_period_too_short_to_drain_is_refused():
    p = problems(minimal(decode={"terminationGracePeriodSeconds": 20, "drainSeconds": 10}))
    msg = p["spec.decode.terminationGracePeriodSeconds"]
    assert "drainSeconds + 16" in msg and "raise terminationGracePeriodSeconds" in msg


# sglang-router 0.3.2 server.rs:1027-1031: on SIGTERM, graceful_shutdown(Some(
# --shutdown-grace-period-secs)) (default 180, router_args.py:65), then open
# streams are cut; vllm-router 0.1.17 server.rs:1270-1274: axum's
# with_graceful_shutdown, no deadline: only the kubelet's SIGKILL ends it.
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("pools", [{}, {"prefill": {"terminationGracePeriodSeconds": 1800},
                                        "decode": {"terminationGracePeriodSeconds": 900, "drainSeconds": 30}}])
def test_router_streams_as_long_as_the_engines_drain(kind, pools):
    obj = minimal(kind, **pools)
    spec = validate_service(obj).spec
    dep = next(o for o in objects(obj) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("router"))
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    prestop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    longest = max(spec.prefill.termination_grace_period_seconds, spec.decode.termination_grace_period_seconds)
    # a request the router streams when it is stopped may last as long as a stopping engine's
    assert pod["terminationGracePeriodSeconds"] >= prestop + longest
    window = flag(c["command"], "--shutdown-grace-period-secs")
    if kind == "vllm":
        assert window is None  # no such flag: it waits until the request ends
        return
    # sglang-router waits as long as any engine may drain, and exits before the SIGKILL
    drains = [p.engine_shutdown_timeout() for p in (spec.prefill, spec.decode)]
    assert max(drains) <= int(window) < pod["terminationGracePeriodSeconds"] - prestop


# sglang-router 0.3.2 service_discovery.rs:399-531: handle_pod_event acts only on a
# Ready, Running pod (no else branch): a pod that turns NotReady stays a worker. Its
# health checker (core/worker_registry.rs:641-683; core/worker.rs:735-744) marks it
# unhealthy after --health-failure-threshold failed checks, one every
# --health-check-interval-secs (defaults 3 and 60 s, router_args.py:84-88).
def test_sglang_router_checks_the_engines_as_the_readiness_probe_does():
    obj = minimal("sglang", prefill={"probes": {"readiness": {"periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 4}}},
                  decode={"probes": {"readiness": {"periodSeconds": 7, "timeoutSeconds": 3, "failureThreshold": 2}}})
    dep = next(o for o in objects(obj) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("router"))
    argv = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert flag(argv, "--health-check-interval-secs") == "2"    # the more frequent pool
    assert flag(argv, "--health-failure-threshold") == "2"      # the fewer failures
    assert flag(argv, "--health-check-timeout-secs") == "3"     # no pool cut shorter than its own probe
    assert flag(argv, "--health-check-endpoint") == "/ready"    # the readiness probe's path, not /health
    # the defaults (5 s, 3, 5 s): an engine is out within 15 s, not 180 s
    dep = next(o for o in objects(minimal("sglang")) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("router"))
    argv = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert int(flag(argv, "--health-check-interval-secs")) * int(flag(argv, "--health-failure-threshold")) == 15


def test_shutdown_timeout_is_managed():
    with pytest.raises(SpecError) as info:
        objects(minimal(engine={"kind": "vllm", "extraArgs": ["--shutdown-timeout", "0"]}))
    assert "spec.engine.extraArgs[0]" in dict(info.value.problems)


# vLLM 0.33.0 entrypoints/cli/serve.py: with DP the API-server count defaults to the
# DP size, and more than one runs run_multi_api_server: on SIGTERM the API-server
# processes (which do not own the engines) stop first and drop their requests; only
# the single in-process API server drains for --shutdown-timeout.
@pytest.mark.parametrize("extra", [["--api-server-count", "4"], ["-asc", "4"]])
def test_api_server_count_is_managed(extra):
    with pytest.raises(SpecError) as info:
        objects(minimal(engine={"kind": "vllm", "extraArgs": extra}))
    assert "set by the operator" in dict(info.value.problems)["spec.engine.extraArgs[0]"]


def test_vllm_data_parallel_pools_run_one_api_server_that_drains(monkeypatch):
    from pd_operator_tools.enginesim.__main__ import config_from_argv, vllm_api_servers
    from pd_operator.render.engines.flagset import check_argv

    obj = minimal(decode={"dataParallelSize": 4, "tensorParallelSize": 1}, prefill={"tensorParallelSize": 1})
    d, p = container(obj, "decode")["command"], container(obj, "prefill")["command"]
    assert flag(d, "--api-server-count") == "1"
    assert "--api-server-count" not in p  # DP 1: one API server anyway
    ns = check_argv("vllm", "0.33.0", d)
    assert vllm_api_servers(ns) == 1
    # the simulated vLLM drops in-flight requests on SIGTERM with several API servers, as vLLM does
    monkeypatch.delenv("PD_SIM_LEADER_IP", raising=False)
    assert config_from_argv(d).shutdown_timeout > 0
    i = d.index("--api-server-count")
    without = d[:i] + d[i + 2:]
    assert vllm_api_servers(check_argv("vllm", "0.33.0", without)) == 4
    assert config_from_argv(without).shutdown_timeout == 0


def test_vllm_group_leader_runs_one_api_server_and_workers_none():
    from pd_operator.render.launch import resolve_argv
    from pd_operator.render.engines.flagset import check_argv

    obj = minimal("vllm", topology={"gpusPerNode": 8, "nvlinkDomainKey": "kubernetes.io/hostname"},
                  decode={"tensorParallelSize": 1, "dataParallelSize": 16, "expertParallel": True})
    lws = next(o for o in objects(obj) if o["kind"] == "LeaderWorkerSet")
    env = {"LWS_LEADER_ADDRESS": "l.s.ns", "LWS_WORKER_INDEX": "1", "POD_IP": "10.0.0.1"}
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    leader = check_argv("vllm", "0.33.0", resolve_argv(tmpl["leaderTemplate"]["spec"]["containers"][0]["command"],
                                                       {**env, "LWS_WORKER_INDEX": "0"}))
    worker = check_argv("vllm", "0.33.0", resolve_argv(tmpl["workerTemplate"]["spec"]["containers"][0]["command"], env))
    assert leader.api_server_count == 1 and not leader.headless
    # serve.py refuses --api-server-count > 0 with --headless
    assert worker.headless and worker.api_server_count is None


# ---------------------------------------------------------------- 2. TP rules, over the grid

# What each pinned engine enforces between prefill TP (P) and decode TP (D).
# "divides": one of P, D is a multiple of the other.
#   vLLM NixlConnector: kv_connector/utils.py TransferTopology.tp_ratio asserts
#     local % remote == 0 (local >= remote) or remote % local == 0; both directions
#     are mapped (nixl/tp_mapping.py compute_tp_mapping).
#   SGLang mooncake and nixl: disaggregation/common/conn.py _resolve_rank_mapping maps
#     ranks with attn_tp // other attn_tp; the TP that counts is the attention TP
#     (runtime_context.py derive_attn_tp_size = tp_size // attn_dp_size).
TP_RULE = {
    ("vllm", "nixl"): ("divides", "NixlConnector"),
    ("sglang", "mooncake"): ("divides", "SGLang"),
    ("sglang", "nixl"): ("divides", "SGLang"),
}
# DP layouts per engine: (prefill DP, decode DP, DP attention). SGLang with attention DP
# needs TP % DP == 0 (arg_groups/parallel_hook.py) and maps attention TP = TP / DP.
DP_LAYOUTS = {
    "vllm": [(1, 1, False), (1, 4, False), (2, 1, False)],
    "sglang": [(1, 1, False), (2, 2, False), (1, 2, True)],
}
GRID = [(engine, backend, dp, p, d)
        for (engine, backend) in TP_RULE for dp in DP_LAYOUTS[engine] for p in range(1, 9) for d in range(1, 9)]


def _divides(a: int, b: int) -> bool:
    return a % b == 0 or b % a == 0


@pytest.mark.parametrize("engine,backend,dp,p,d", GRID)
def test_tp_grid(engine, backend, dp, p, d):
    pdp, ddp, attn = dp
    obj = minimal(engine, kvTransfer={"backend": backend}, topology={"gpusPerNode": 64},
                  prefill={"tensorParallelSize": p, "dataParallelSize": pdp},
                  decode={"tensorParallelSize": d, "dataParallelSize": ddp, **({"dataParallelAttention": True} if attn else {})})
    rule, reason = TP_RULE[(engine, backend)]
    assert rule == "divides"
    if attn and d % ddp:
        msg = problems(obj)["spec.decode.dataParallelSize"]
        assert "multiple of dataParallelSize" in msg
        return
    d_attn = d // ddp if attn else d
    if _divides(p, d_attn):
        validate_service(obj)
        render(validate_service(obj))
    else:
        msg = problems(obj)["spec.decode.tensorParallelSize"]
        assert reason in msg and "divide" in msg


def test_nixl_pipeline_parallel_on_decode_is_refused():
    # nixl/base_worker.py: kv_consumer with pipeline_parallel_size > 1 raises NotImplementedError
    p = problems(minimal(decode={"pipelineParallelSize": 2}))
    assert "pipeline parallelism on decode" in p["spec.decode.pipelineParallelSize"]
    # a producer (prefill) with PP > 1 is supported (push/pull pp_size handling)
    validate_service(minimal(prefill={"pipelineParallelSize": 2}))


# ---------------------------------------------------------------- 4. managed flags by any alias

# Aliases the pinned parsers register for flags the operator renders (flag-set
# snapshots, from SGLang ServerArgs Arg(aliases=...) and vLLM's add_argument).
@pytest.mark.parametrize("kind,args", [
    ("sglang", ["--tensor-parallel-size", "2"]),        # alias of --tp-size
    ("sglang", ["--data-parallel-size", "2"]),          # alias of --dp-size
    ("sglang", ["--pipeline-parallel-size", "2"]),      # alias of --pp-size
    ("sglang", ["--attention-data-parallel-size", "2"]),  # alias of --attn-dp-size
    ("sglang", ["--nccl-init-addr", "x:1"]),             # alias of --dist-init-addr (multi-node rendezvous, issue 16)
    ("vllm", ["--device-memory-utilization", "0.5"]),   # alias of --gpu-memory-utilization
    ("vllm", ["--disable-prefix-caching"]),             # negative alias of --enable-prefix-caching
    ("vllm", ["--tensor_parallel_size", "2"]),          # underscores are dashes to vLLM
    ("vllm", ["--kv-transfer-config.kv_role", "kv_both"]),  # dotted JSON key of a managed flag
    ("vllm", ["-tp=2"]),
])
def test_managed_flags_are_refused_by_any_alias(kind, args):
    obj = minimal(kind, engine={"kind": kind, "extraArgs": args})
    with pytest.raises(SpecError) as info:
        objects(obj)
    msg = dict(info.value.problems)["spec.engine.extraArgs[0]"]
    assert "set by the operator" in msg


# ---------------------------------------------------------------- 9. SGLang attention DP shares the TP GPUs

def test_sglang_dp_attention_counts_the_tp_gpus():
    # managers/data_parallel_controller.py: launch_dp_attention_schedulers runs the
    # attention-DP ranks inside one TP group (TP x PP GPUs); launch_dp_schedulers gives
    # each DP replica its own TP x PP GPUs.
    obj = minimal("sglang", decode={"tensorParallelSize": 8, "dataParallelSize": 8, "dataParallelAttention": True})
    c = container(obj, "decode")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert flag(c["command"], "--attn-dp-size") == "8" and "--dp-size" not in c["command"]
    # the same sizes as DP replicas: 64 GPUs, 8 nodes, and SGLang runs no DP replicas across nodes
    p = problems(minimal("sglang", decode={"tensorParallelSize": 8, "dataParallelSize": 8}))
    assert "multi-node data-parallel replicas are not supported" in p["spec.decode.dataParallelSize"]


def test_dp_attention_needs_tp_multiple_of_dp_and_is_sglang_only():
    # arg_groups/parallel_hook.py: assert tp_size % attn_dp_size == 0
    p = problems(minimal("sglang", decode={"tensorParallelSize": 4, "dataParallelSize": 8, "dataParallelAttention": True}))
    assert "multiple of dataParallelSize" in p["spec.decode.dataParallelSize"]
    p = problems(minimal("vllm", decode={"dataParallelSize": 2, "dataParallelAttention": True}))
    assert "SGLang setting" in p["spec.engine.kind"]


# ---------------------------------------------------------------- 3. env merged by name

RDMA = {"resourceName": "rdma/ib", "ibDevices": ["mlx5_0"]}


@pytest.mark.parametrize("kind,name,extra", [
    ("vllm", "UCX_TLS", {"kvTransfer": {"rdma": RDMA}}),
    ("vllm", "UCX_NET_DEVICES", {"kvTransfer": {"rdma": RDMA}}),
    ("vllm", "HF_HOME", {}),
    ("vllm", "VLLM_NIXL_SIDE_CHANNEL_PORT", {}),
    ("sglang", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", {}),
    ("sglang", "HF_HOME", {}),
])
def test_user_env_replaces_the_operator_value(kind, name, extra):
    # A pod with two env entries of one name is refused by the API server
    # (StatefulSet validation); the user's value must win, once.
    obj = minimal(kind, engine={"kind": kind, "env": [{"name": name, "value": "mine"}]}, **extra)
    for role in ("prefill", "decode"):
        env = container(obj, role)["env"]
        names = [e["name"] for e in env]
        assert len(names) == len(set(names)), names
        assert {"name": name, "value": "mine"} in env


def test_pool_env_wins_over_engine_env():
    obj = minimal(engine={"kind": "vllm", "env": [{"name": "X", "value": "engine"}]},
                  decode={"env": [{"name": "X", "value": "pool"}]})
    assert [e for e in container(obj, "decode")["env"] if e["name"] == "X"] == [{"name": "X", "value": "pool"}]
    assert [e for e in container(obj, "prefill")["env"] if e["name"] == "X"] == [{"name": "X", "value": "engine"}]


# ---------------------------------------------------------------- 6. port clashes on a pod

# Ports an engine pod listens on: the API port (vLLM --port 8000, SGLang --port 30000);
# the bootstrap server on prefill (SGLang --disaggregation-bootstrap-port); vLLM NIXL side channel
# VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank (nixl utils); MoRIIO handshake_port and notify_port, each
# + dp_rank + tp_rank (moriio_common.py get_port_offset, called without tp_size where the ports
# are bound). Two of them equal: the second bind fails at start.
@pytest.mark.parametrize("kind,spec,field", [
    ("sglang", {"kvTransfer": {"bootstrapPort": 30000}}, "spec.kvTransfer.bootstrapPort"),
    # attention DP on one node: 127.0.0.1:30233-30238 (server_args.py PortArgs.init_new, the HTTP port
    # + 233 ...) and the worker-ports handshake at 30013 (data_parallel_controller.py)
    ("sglang", {"kvTransfer": {"bootstrapPort": 30238},
                "prefill": {"tensorParallelSize": 2, "dataParallelSize": 2, "dataParallelAttention": True}},
     "spec.kvTransfer.bootstrapPort"),
    ("sglang", {"kvTransfer": {"bootstrapPort": 30013},
                "prefill": {"tensorParallelSize": 2, "dataParallelSize": 2, "dataParallelAttention": True}},
     "spec.kvTransfer.bootstrapPort"),
    ("vllm", {"kvTransfer": {"nixl": {"sideChannelPort": 8000}}}, "spec.kvTransfer.nixl.sideChannelPort"),
    # side channel of DP rank 3 = 7997 + 3 = the API port
    ("vllm", {"kvTransfer": {"nixl": {"sideChannelPort": 7997}}, "decode": {"dataParallelSize": 4}},
     "spec.kvTransfer.nixl.sideChannelPort"),
    ("vllm", {"engine": {"kind": "vllm", "accelerator": "amd", "image": "rocm/vllm:x"},
              "kvTransfer": {"backend": "moriio", "moriio": {"handshakePort": 7000, "notifyPort": 6999}},
              "decode": {"tensorParallelSize": 2}}, "spec.kvTransfer.moriio.notifyPort"),
    # TP rank 1's handshake listener: 7999 + 1 = the API port
    ("vllm", {"engine": {"kind": "vllm", "accelerator": "amd", "image": "rocm/vllm:x"},
              "kvTransfer": {"backend": "moriio", "moriio": {"handshakePort": 7999}},
              "decode": {"tensorParallelSize": 2}}, "spec.kvTransfer.moriio.handshakePort"),
])
def test_equal_ports_on_a_pod_are_refused(kind, spec, field):
    obj = minimal(kind, **spec)
    with pytest.raises(SpecError) as info:
        objects(obj)
    problems_ = dict(info.value.problems)
    assert field in problems_ and "port" in problems_[field], problems_


def test_distinct_ports_pass():
    objects(minimal("vllm", kvTransfer={"nixl": {"sideChannelPort": 7996}}, decode={"dataParallelSize": 4}))
    objects(minimal("sglang", kvTransfer={"bootstrapPort": 30001}))
    # without attention DP those ports are IPC files, not TCP
    objects(minimal("sglang", kvTransfer={"bootstrapPort": 30238}))
    objects(minimal("sglang", kvTransfer={"bootstrapPort": 30239},
                    prefill={"tensorParallelSize": 2, "dataParallelSize": 2, "dataParallelAttention": True}))


# ---------------------------------------------------------------- 5. Mooncake over RDMA needs RDMA

# SGLang --disaggregation-transfer-backend mooncake is the RDMA backend, mooncake_tcp TCP.
# (vLLM with mooncake is refused: vllm-router 0.1.17, see test_validation.py.)
def test_mooncake_without_rdma_uses_tcp():
    c = container(minimal("sglang"), "prefill")
    assert flag(c["command"], "--disaggregation-transfer-backend") == "mooncake_tcp"


def test_mooncake_with_rdma_uses_rdma():
    c = container(minimal("sglang", kvTransfer={"rdma": RDMA}), "prefill")
    assert flag(c["command"], "--disaggregation-transfer-backend") == "mooncake"
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_mooncake_rdma_set_without_a_device_is_refused():
    p = problems(minimal("sglang", kvTransfer={"mooncake": {"protocol": "rdma"}}))
    assert "kvTransfer.rdma.resourceName" in p["spec.kvTransfer.mooncake.protocol"]


def test_status_says_tcp_was_chosen():
    from pd_operator.controller.status import Observed, compute_status
    from tests.unit.test_status import deploy
    from tests.unit.test_status import sts as ready_sts

    obs = Observed({"prefill": ready_sts(1, 1), "decode": ready_sts(1, 1)}, deploy(1, 1), {})
    ready = {}
    for spec, says in ((minimal("sglang"), True), (minimal("sglang", kvTransfer={"rdma": RDMA}), False)):
        status = compute_status(validate_service(spec), obs, 1, None, "2026-01-01T00:00:00Z")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert ("Mooncake TCP" in ready["message"]) == says


# ---------------------------------------------------------------- 7. probes

def test_sglang_health_probe_does_not_generate():
    # srt/entrypoints/http_server.py health_generate: /health runs a one-token
    # generation unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION (environ.py, default
    # True) is false; then it answers without generating (503 while starting or draining).
    for role in ("prefill", "decode"):
        c = container(minimal("sglang"), role)
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        assert {"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "false"} in c["env"]


def test_sglang_startup_and_readiness_probe_ready():
    # http_server.py:714-718 /ready -> tokenizer_manager.py:729-734 is_ready: 200 only when
    # Up, not draining, not paused; /health (generation off) stays 200 for a server left
    # UnHealthy by a failed PD warmup (http_server.py:2515-2529). vLLM has /health only.
    for role in ("prefill", "decode"):
        c = container(minimal("sglang"), role)
        assert c["startupProbe"]["httpGet"]["path"] == "/ready"
        assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        v = container(minimal("vllm"), role)
        assert {v[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"/health"}


def test_the_simulated_sglang_serves_ready_like_sglang():
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from pd_operator_tools.enginesim.__main__ import config_from_argv
    from pd_operator_tools.enginesim.server import SimServer

    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--api-key", "k",
            "--disaggregation-mode", "decode"]

    async def run() -> list[int]:
        server = SimServer(config_from_argv(argv))
        async with TestClient(TestServer(server.app())) as client:
            codes = [(await client.get("/ready")).status]       # no API key needed (utils/auth.py:102-104)
            server.draining = True                               # SIGTERM: gracefully_exit
            codes.append((await client.get("/ready")).status)
            return codes

    assert asyncio.run(run()) == [200, 503]


def test_probe_timing_per_pool():
    obj = minimal("sglang", decode={"probes": {"liveness": {"periodSeconds": 30, "timeoutSeconds": 20, "failureThreshold": 10}}})
    live = container(obj, "decode")["livenessProbe"]
    assert (live["periodSeconds"], live["timeoutSeconds"], live["failureThreshold"]) == (30, 20, 10)
    assert container(obj, "prefill")["livenessProbe"]["timeoutSeconds"] == 5
