"""``python -m pd_operator_tools.enginesim [SIM OPTIONS] -- <engine command line>``

The engine command line is the one the operator renders for the real engine
(``vllm serve MODEL ...`` or ``python3 -m sglang.launch_server ...``).  It is
parsed with the pinned engine's real flag set (``flagset.check_argv``, with the
real parser's abbreviation behaviour), so a flag the engine lacks makes the sim
exit with status 2 naming the flag, as the engine would.  ``$(VAR)`` in the
command is expanded from the environment, as the kubelet does.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import re
import signal
import sys
from dataclasses import replace

from pd_operator.render.engines.flagset import FlagError, check_argv, split_command
from pd_operator.perfmodel.costmodel import LINKS, Efficiency, Link, shape_for, MODELS
from pd_operator.perfmodel.engine_defaults import (default_attention_backend, kv_element_bytes, vllm_attention_backend,
                                                   vllm_block_size, vllm_step_tokens)
from .group import group_from_namespace, join, lead, serve_worker
from .server import SimConfig, SimServer

VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}


def sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pd_operator_tools.enginesim",
                                description="simulated vLLM/SGLang engine; give the engine command after --")
    p.add_argument("--bind", help="address to listen on instead of the command's --host (e.g. the pod IP)")
    p.add_argument("--bind-port", type=int, help="port to listen on instead of the command's --port")
    p.add_argument("--listen-fd", type=int, help="serve HTTP on this inherited, already listening socket "
                   "(bound to --bind/--bind-port by the caller; connections made before the sim started wait in its backlog)")
    p.add_argument("--efficiency", choices=("fused", "pytorch"), default="fused",
                   help="engine efficiency vs the PyTorch calibration (fused: ~4 ms fixed decode, ~39 ns/cached token)")
    p.add_argument("--kv-link", choices=sorted(LINKS), default="rdma", help="KV transfer path (rdma 50 GB/s + 1 ms)")
    p.add_argument("--kv-gbps", type=float, help="override the link bandwidth, GB/s")
    p.add_argument("--kv-fixed-ms", type=float, help="override the fixed cost per transfer, ms")
    p.add_argument("--kv-capacity-tokens", type=int, help="override the KV-cache capacity (tokens)")
    p.add_argument("--default-max-tokens", type=int, default=256, help="tokens generated when a request sets none")
    p.add_argument("--fail-kv-transfer", type=float, metavar="RATE",
                   default=float(os.environ.get("PDSIM_FAIL_KV_TRANSFER", "0") or 0),
                   help="fraction 0..1 of KV transfers into this decode engine that fail (counted in the engine's "
                        "real failure counter, answered 500); default $PDSIM_FAIL_KV_TRANSFER or 0")
    p.add_argument("--model-shape", choices=sorted(MODELS),
                   help="cost shape for a model name the simulator does not know (default: refuse)")
    return p


class EngineStartError(RuntimeError):
    """The engine would parse its command line and then fail while starting (exit 1)."""


def mooncake_protocol(flavor: str, ns: argparse.Namespace, env: dict[str, str]) -> str | None:
    """The transport a Mooncake transfer engine of this command would install, or None if not Mooncake.

    SGLang: ``--disaggregation-transfer-backend mooncake_tcp`` sets MC_FORCE_TCP
    (arg_groups/pd_disaggregation_hook.py); ``mooncake`` passes MOONCAKE_PROTOCOL
    (default rdma, srt/environ.py). vLLM MooncakeConnector: ``mooncake_protocol``
    in kv_connector_extra_config, default rdma (mooncake_connector.py). Mooncake
    itself installs TCP whenever MC_FORCE_TCP is set (transfer_engine.cpp).
    """
    if flavor == "sglang":
        if (ns.disaggregation_mode or "null") not in ("prefill", "decode"):
            return None
        backend = ns.disaggregation_transfer_backend or "mooncake"
        if backend == "mooncake_tcp":
            return "tcp"
        if backend != "mooncake":
            return None
        protocol = env.get("MOONCAKE_PROTOCOL") or "rdma"
    else:
        kvt = ns.kv_transfer_config if isinstance(ns.kv_transfer_config, dict) else {}
        if kvt.get("kv_connector") != "MooncakeConnector":
            return None
        extra = kvt.get("kv_connector_extra_config") or {}
        protocol = str(extra.get("mooncake_protocol", "rdma"))
    return "tcp" if env.get("MC_FORCE_TCP") else protocol.lower()


def check_rdma_devices(flavor: str, ns: argparse.Namespace, env: dict[str, str]) -> None:
    """EngineStartError if the command's Mooncake transfer needs RDMA and the pod has no RDMA device.

    ``PDSIM_RDMA_DEVICES`` is the number of RDMA devices the pod was given (the
    e2e harness sets it from the pod's extended resources); unset means
    unknown, taken as present.
    """
    devices = env.get("PDSIM_RDMA_DEVICES")
    if devices is None or devices.strip() == "" or mooncake_protocol(flavor, ns, env) != "rdma":
        return
    if not devices.strip().isdigit():
        raise ValueError(f"PDSIM_RDMA_DEVICES={devices!r}: expected a count of RDMA devices (0, 1, ...)")
    if int(devices) > 0:
        return
    # the engine's own log lines (Mooncake rdma_transport.cpp, transfer_engine.cpp;
    # vLLM mooncake_connector.py / SGLang mooncake_transfer_engine.py)
    raise EngineStartError(
        "RdmaTransport: No available RNIC; Failed to install RDMA transport; "
        "RuntimeError: Mooncake Transfer Engine initialization failed. "
        f"(simulated: the Mooncake transfer uses RDMA but the pod has no RDMA device, PDSIM_RDMA_DEVICES={devices}; "
        "request one with kvTransfer.rdma.resourceName, or use kvTransfer.mooncake.protocol: tcp)")


def check_bind_host(flavor: str, ns: argparse.Namespace, group) -> None:
    """EngineStartError if the leader of a replica over nodes would bind ZMQ sockets on a DNS name.

    SGLang node 0 with attention DP binds on the host of ``--dist-init-addr``
    as given (server_args.py PortArgs.init_new, managers/tokenizer_manager.py
    init_ipc_channels, managers/data_parallel_controller.py); the vLLM leader
    binds its handshake and coordinator ROUTER sockets on
    ``--data-parallel-address`` (v1/engine/utils.py launch_core_engines,
    v1/engine/coordinator.py). libzmq's bind takes an IP address or an
    interface name, never a DNS name (tcp_address resolve, allow_dns only for
    connect), and fails with ENODEV ("No such device").
    """
    if group is None or not group.leader:
        return
    if flavor == "sglang":
        attn_dp = (ns.attn_dp_size or 1) > 1 or (bool(ns.enable_dp_attention) and (ns.dp_size or 1) > 1)
        if not attn_dp:
            return
        host, flag = (ns.dist_init_addr or "").rpartition(":")[0].strip("[]"), "--dist-init-addr"
    else:
        host, flag = ns.data_parallel_address or "", "--data-parallel-address"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise EngineStartError(
            f"zmq.error.ZMQError: No such device (addr='tcp://{host}:...') (simulated: the leader binds ZMQ "
            f"sockets on the host of {flag}, and libzmq binds an IP address, not a DNS name)") from None


def vllm_api_servers(ns: argparse.Namespace) -> int:
    """How many API-server processes ``vllm serve`` starts (entrypoints/cli/serve.py
    ``ServeSubcommand.cmd``): 0 headless; else --api-server-count, whose default is
    1 with an external LB, the local DP size in hybrid LB mode (a start rank
    without --headless) and the whole DP size otherwise."""
    if getattr(ns, "headless", False):
        return 0
    if ns.api_server_count is not None:
        return ns.api_server_count
    external = bool(getattr(ns, "data_parallel_external_lb", False)) or getattr(ns, "data_parallel_rank", None) is not None
    multi_port = bool(getattr(ns, "data_parallel_multi_port_external_lb", False))
    hybrid = bool(getattr(ns, "data_parallel_hybrid_lb", False))
    if not hybrid and not multi_port:
        hybrid = getattr(ns, "data_parallel_start_rank", None) is not None  # "Infer hybrid LB mode"
    if external or multi_port:
        return 1
    if hybrid:
        return ns.data_parallel_size_local or 1
    return ns.data_parallel_size or 1


def _expand(argv: list[str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: os.environ.get(m.group(1), m.group(0)), a) for a in argv]


_SPECULATIVE = ("the simulator does not model speculative decoding ({flag}): the tokens a step emits depend "
                "on the draft's acceptance, which the calibration does not cover; run without it")


def config_from_argv(engine_argv: list[str], opts: argparse.Namespace | None = None) -> SimConfig:
    """Build a SimConfig from an engine command line; FlagError/ValueError if refused."""
    opts = opts or sim_parser().parse_args([])
    from pd_operator.render.launch import GROUP_LAUNCHER, logical_argv, resolve_argv

    engine_argv = list(engine_argv)
    if len(engine_argv) > 2 and engine_argv[2] == GROUP_LAUNCHER:
        # a pod of a replica over several nodes: the launcher's flags from the pod env (render/launch.py)
        engine_argv = resolve_argv(engine_argv, dict(os.environ))
    argv = _expand(logical_argv(engine_argv))
    flavor = None
    for comp in ("vllm", "sglang"):
        cmd, _ = split_command(comp, VERSIONS[comp], argv)
        if cmd:
            flavor = comp
            break
    if flavor is None:
        raise ValueError(f"not a vLLM or SGLang command line: {' '.join(argv[:3])} ... "
                         "(expected `vllm serve MODEL ...` or `python3 -m sglang.launch_server ...`)")
    ns = check_argv(flavor, VERSIONS[flavor], argv, allow_abbrev=None)
    check_rdma_devices(flavor, ns, dict(os.environ))
    group = group_from_namespace(flavor, ns)
    check_bind_host(flavor, ns, group)
    kv_blocks = None  # vLLM --num-gpu-blocks-override: (blocks, tokens per block)
    if flavor == "vllm":
        model = ns.model_tag or "facebook/opt-125m"
        served = list(ns.served_model_name or [model])
        host, port = ns.host or "0.0.0.0", ns.port or 8000
        tp = ns.tensor_parallel_size or 1
        # data parallelism: DP ranks of TP each; with --enable-expert-parallel the experts
        # are spread over all tp x dp GPUs (SimConfig.cost)
        dp = ns.data_parallel_size or 1
        ep = tp * dp if getattr(ns, "enable_expert_parallel", False) else 1
        kvt = ns.kv_transfer_config or {}
        kv_role = kvt.get("kv_role") if isinstance(kvt, dict) else None
        role = {"kv_producer": "prefill", "kv_consumer": "decode"}.get(kv_role, "unified")
        keys = list(ns.api_key or ([os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY") else []))
        max_seqs = ns.max_num_seqs  # None: the engine's default (SimConfig.running_limit)
        performance_mode = ns.performance_mode or "balanced"
        max_tokens = None  # below, once the model's context length is known
        mem = ns.gpu_memory_utilization or 0.92
        max_len = ns.max_model_len if ns.max_model_len and ns.max_model_len > 0 else None
        bootstrap = None
        metrics = True
        shutdown_timeout = ns.shutdown_timeout or 0
        if vllm_api_servers(ns) > 1:
            # several API-server processes (run_multi_api_server): on SIGTERM they are
            # stopped first, and they do not own the engines, so their in-flight
            # requests are dropped whatever --shutdown-timeout says (cli/serve.py,
            # v1/engine/core_client.py MPClient.shutdown): the sim aborts them
            shutdown_timeout = 0
        connector = kvt.get("kv_connector") if isinstance(kvt, dict) else None
        max_queued = ns.max_num_queued_reqs
        kv_memory, kv_cap = ns.kv_cache_memory_bytes, None
        if ns.num_gpu_blocks_override is not None:
            # that many blocks of --block-size tokens, or of the backend's size (kv_cache_planning.py):
            # the one named, or vLLM's choice on the H200 the simulator stands for (below, once the
            # model's shape is known)
            kv_blocks = (ns.num_gpu_blocks_override, vllm_attention_backend(ns.attention_backend, ns.attention_config))
        if ns.speculative_config:
            raise ValueError(_SPECULATIVE.format(flag="--speculative-config"))
    else:
        model = ns.model_path
        served = [ns.served_model_name or model]
        host, port = ns.host or "127.0.0.1", ns.port or 30000
        tp = ns.tp_size or 1
        # attention DP inside the TP group (0.5.23 --attn-dp-size; deprecated --dp-size N --enable-dp-attention)
        dp = (ns.attn_dp_size or 1) if (ns.attn_dp_size or 1) > 1 else ((ns.dp_size or 1) if ns.enable_dp_attention else 1)
        ep = ns.ep_size or 1
        mode = ns.disaggregation_mode or "null"
        role = {"prefill": "prefill", "decode": "decode"}.get(mode, "unified")
        keys = [ns.api_key] if ns.api_key else []
        max_seqs = ns.max_running_requests
        max_tokens = ns.chunked_prefill_size if ns.chunked_prefill_size and ns.chunked_prefill_size > 0 else 8192
        mem = ns.mem_fraction_static or 0.88
        max_len = ns.context_length
        bootstrap = (ns.disaggregation_bootstrap_port or 8998) if role == "prefill" else None
        metrics = bool(ns.enable_metrics)
        shutdown_timeout = None  # SGLang drains until no request is left
        connector, max_queued = None, None
        performance_mode = None
        kv_memory, kv_cap = None, ns.max_total_tokens
        if ns.speculative_algorithm:
            raise ValueError(_SPECULATIVE.format(flag="--speculative-algorithm"))
        for flag, size in (("--pp-size", ns.pp_size), ("--attn-cp-size", ns.attn_cp_size)):
            if (size or 1) > 1:  # the ranks' layout over nodes (which node reports which scheduler) and the cost
                raise ValueError(f"the simulator does not model {flag} {size} (pipeline or attention context "
                                 "parallelism: its step times, and which ranks, on which node, report the schedulers)")
    try:
        shape = shape_for(model)
    except KeyError:
        if not opts.model_shape:
            raise ValueError(f"the simulator has no cost shape for model {model!r}; known: "
                             f"{', '.join(sorted(MODELS))} (or pass --model-shape NAME)") from None
        shape = MODELS[opts.model_shape]
    # the KV cache in the element size --kv-cache-dtype gives it (as the capacity: pool_shape)
    model_bytes = shape.kv_dtype_bytes or shape.dtype_bytes
    kv_bytes = kv_element_bytes(flavor, ns.kv_cache_dtype, model_bytes, shape.mla)
    if kv_bytes is None:
        raise ValueError(f"the simulator does not model the KV cache of --kv-cache-dtype {ns.kv_cache_dtype} "
                         f"for {shape.name} (it models the model's own dtype and the plain FP8 formats)")
    if kv_bytes != model_bytes:
        shape = replace(shape, kv_dtype_bytes=kv_bytes)
    if kv_blocks is not None:
        backend = kv_blocks[1] or default_attention_backend("NVIDIA-H200", shape.mla, ns.kv_cache_dtype)
        size = vllm_block_size(backend, ns.block_size)
        if size is None:
            raise ValueError(f"the simulator does not know the KV block size of the attention backend {backend} "
                             "for --num-gpu-blocks-override; add --block-size")
        kv_blocks = (kv_blocks[0], size)
    if flavor == "vllm":
        max_tokens = vllm_step_tokens(
            ns.max_num_batched_tokens, performance_mode, chunked_prefill=ns.enable_chunked_prefill,
            max_model_len=max_len or shape.max_model_len,
            # ParallelConfig.use_batched_dp_moe
            batched_dp_moe=(ns.all2all_backend in ("deepep_low_latency", "nixl_ep")
                            and bool(getattr(ns, "enable_expert_parallel", False)) and dp > 1))
        if max_seqs is not None and max_tokens < max_seqs:
            # vllm/config/scheduler.py SchedulerConfig.verify_max_model_len (from __post_init__)
            raise ValueError(f"max_num_batched_tokens ({max_tokens}) must be greater than or equal to "
                             f"max_num_seqs ({max_seqs}).")
    link = LINKS[opts.kv_link]
    if opts.kv_gbps is not None or opts.kv_fixed_ms is not None:
        link = Link(f"{link.name}*", opts.kv_gbps or link.gbytes_per_s,
                    opts.kv_fixed_ms if opts.kv_fixed_ms is not None else link.fixed_ms)
    return SimConfig(
        flavor=flavor, model=model, served_names=served, shape=shape,
        host=opts.bind or host, port=opts.bind_port or port, role=role, tp=tp, dp=dp, ep=ep,
        moe_dp=getattr(ns, "moe_dp_size", None) or 1,
        max_num_seqs=max_seqs, max_batched_tokens=max_tokens, performance_mode=performance_mode,
        max_model_len=max_len or shape.max_model_len,
        # the calibration's capacity is at full memory; vLLM's default 0.92 is ~ that
        mem_fraction=min(1.0, mem / 0.92), kv_capacity_tokens=opts.kv_capacity_tokens,
        kv_cache_memory_bytes=kv_memory, max_total_tokens=kv_cap, kv_blocks=kv_blocks,
        api_keys=keys, enable_metrics=metrics, bootstrap_port=bootstrap,
        side_channel_host=os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
        side_channel_port=int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")),
        efficiency=Efficiency.named(opts.efficiency), link=link,
        default_max_tokens=opts.default_max_tokens,
        shutdown_timeout=shutdown_timeout, listen_fd=opts.listen_fd,
        group=group,
        kv_connector=connector, max_queued_reqs=max_queued,
        fail_kv_transfer=max(0.0, min(1.0, opts.fail_kv_transfer)),
    )


async def _serve(cfg: SimConfig) -> int:
    group = cfg.group
    if group is not None and not group.leader:
        # a worker node: no API (SGLang's node_rank >= 1 serves /health and its node's /metrics,
        # vLLM --headless nothing); it lives as long as the leader
        print(f"pd-sim: {cfg.flavor} {cfg.role} worker, node rank {group.rank}/{group.size}", file=sys.stderr, flush=True)
        runners = []

        async def serve_node() -> None:  # SGLang: launch_dummy_health_check_server, once the schedulers are up
            if cfg.flavor == "sglang":
                runners.append(await serve_worker(group, cfg.host, cfg.port, cfg.enable_metrics, cfg.listen_fd))

        joined = asyncio.create_task(join(group, on_joined=serve_node))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        done, _ = await asyncio.wait([joined, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        for runner in runners:
            await runner.cleanup()
        return 0 if stop.is_set() else 1
    server = SimServer(cfg)
    lost = asyncio.Event()
    rendezvous = (await lead(group, cfg.host, lost.set, server.node_page if cfg.flavor == "sglang" else None)
                  if group is not None else None)
    await server.start()
    extra = f", bootstrap :{cfg.bootstrap_port}" if cfg.bootstrap_port else ""
    print(f"pd-sim: {cfg.flavor} {cfg.role} {cfg.model} as {cfg.served_name} (TP {cfg.tp}) on "
          f"http://{cfg.host}:{cfg.port}{extra}; KV capacity {server.engine.kv_capacity} tokens, "
          f"link {cfg.link.name} {cfg.link.gbytes_per_s:g} GB/s", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await asyncio.wait([asyncio.create_task(stop.wait()), asyncio.create_task(lost.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    if rendezvous is not None:
        rendezvous.close()
    if lost.is_set() and not stop.is_set():
        await server.stop()  # a node is gone: the engine dies with its collectives
        return 1
    # the engine's own SIGTERM behaviour: abort or drain (SimServer.drain)
    await server.drain()
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m pd_operator_tools.enginesim [SIM OPTIONS] -- <engine command line>", file=sys.stderr)
        return 2
    i = argv.index("--")
    opts = sim_parser().parse_args(argv[:i])
    try:
        cfg = config_from_argv(argv[i + 1:], opts)
    except FlagError as err:
        print(f"pd-sim: error: {err}" + (f" (flag {err.flag})" if err.flag and err.flag not in str(err) else ""),
              file=sys.stderr)
        return 2
    except EngineStartError as err:
        print(f"pd-sim: the engine failed to start: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"pd-sim: error: {err}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(cfg))
    except OSError as err:
        print(f"pd-sim: cannot listen on {cfg.host}:{cfg.port}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
