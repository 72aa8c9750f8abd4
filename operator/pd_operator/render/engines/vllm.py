"""vLLM (v1 engine) at its pinned version: flags, env and ports for PD.

Facts (vLLM 0.33.0, checked against its own argument parser; the flag set is
in flagsets/vllm-0.33.0.json and a contract test checks every emitted line):
- ``vllm serve MODEL``; ``--kv-transfer-config`` takes the KVTransferConfig
  JSON (``kv_connector``, ``kv_role``, ``kv_connector_extra_config``,
  ``kv_load_failure_policy``).
- NixlConnector: ``kv_producer`` on prefill, ``kv_consumer`` on decode
  (0.33.0 deprecates ``kv_both`` for NIXL, which older guides and llm-d use);
  side channel from env VLLM_NIXL_SIDE_CHANNEL_HOST (the pod IP, downward API;
  the default is localhost) and VLLM_NIXL_SIDE_CHANNEL_PORT (+ the DP rank).
- MooncakeConnector: ``kv_producer`` on prefill, ``kv_consumer`` on decode,
  VLLM_MOONCAKE_BOOTSTRAP_PORT on prefill.
- TP between the pools (both connectors): one TP must divide the other
  (kv_connector/utils.py ``tp_ratio``, mooncake_connector.py ``_get_tp_ratio``);
  NIXL decode cannot use PP > 1 (nixl/base_worker.py). Rules in api/models.py.
- lmcache backend: MultiConnector of NixlConnector (the PD handoff, which
  vllm-router drives: kv_producer / kv_consumer as above) and LMCacheConnectorV1
  (CPU/remote cache tier, kv_both); LMCache reads LMCACHE_CONFIG_FILE (a
  ConfigMap the renderer writes).
- NIXL's handshake compares dtype, KV-cache dtype, attention backend, hybrid
  KV-cache manager and EAGLE-family speculation between the pools, and decode's
  block size must be a multiple of prefill's: ``_check_nixl_pair``.
- MoRIIOConnector (ROCm only): ports in ``kv_connector_extra_config``, and
  ``proxy_ip``/``proxy_ping_port``: the router's discovery Service, which the
  engines register with (vllm-router in moriio mode knows no other worker).
- Decode sets ``kv_load_failure_policy: recompute``: a lost prefill pod
  degrades to recomputation instead of failed requests.
- Auth: env VLLM_API_KEY protects /v1; /health stays open for probes.
- SIGTERM: ``--shutdown-timeout`` 0 (the default) aborts every in-flight
  request; N > 0 rejects new ones and drains for up to N s
  (engine/arg_utils.py, v1/engine/core.py ``_handle_shutdown``). The renderer
  sets it to what the grace period leaves after the preStop sleep. The drain
  holds only with one API server in the engines' own process: with DP > 1
  ``--api-server-count 1`` is rendered (the default would be the DP size,
  whose separate API-server processes drop their requests on SIGTERM).
"""

from __future__ import annotations

import yaml

from ..common import ROUTER_DISCOVERY_PORT, discovery_service_host, secret_env
from ..launch import with_group_flags
from .base import EngineAdapter, compact_json

LMCACHE_CONFIG_DIR = "/etc/lmcache"
LMCACHE_CONFIG_FILE = f"{LMCACHE_CONFIG_DIR}/lmcache.yaml"

CONNECTORS = {
    "nixl": "NixlConnector",
    "mooncake": "MooncakeConnector",
    "lmcache": "LMCacheConnectorV1",
    "moriio": "MoRIIOConnector",
}


# DeepEP's two kernels as vLLM's --all2all-backend names (config/parallel.py All2AllBackend).
DEEPEP_ALL2ALL = {"normal": "deepep_high_throughput", "low_latency": "deepep_low_latency"}
# The leader's data-parallel coordination port (ParallelConfig.data_parallel_rpc_port's default, rendered explicitly).
DP_RPC_PORT = 29550


class VLLMAdapter(EngineAdapter):
    kind = "vllm"
    http_port = 8000
    flagset_component = "vllm"
    managed_flags = frozenset(
        {
            "--model", "--served-model-name", "--host", "--port",
            "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
            "--data-parallel-size", "-dp", "--kv-transfer-config", "--api-key",
            "--max-model-len", "--revision", "--trust-remote-code",
            "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens",
            "--enable-prefix-caching", "--no-enable-prefix-caching",
            "--shutdown-timeout",
            "--data-parallel-size-local", "-dpl", "--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp",
            "--data-parallel-start-rank", "-dpr", "--headless", "--enable-expert-parallel", "-ep", "--all2all-backend",
            "--nnodes", "-n", "--node-rank", "-r", "--api-server-count", "-asc",
        }
    )

    def check_extra_args(self) -> None:
        """Also: ``--prefill-context-parallel-size`` > 1 (:meth:`_check_context_parallel`) and, where
        NIXL carries the KV (nixl, lmcache), the settings of the two pools its handshake compares
        (:meth:`_check_nixl_pair`)."""
        from ...api.errors import SpecError

        super().check_extra_args()
        problems = []
        for role in ("prefill", "decode"):
            self._check_kv_memory(role)
            problems += self._check_context_parallel(role)
        if self.spec.backend() in ("nixl", "lmcache"):
            problems += self._check_nixl_pair()
        if problems:
            raise SpecError(list(dict.fromkeys(problems)), self.svc.metadata.name)  # each once

    def _check_context_parallel(self, role: str) -> list[tuple[str, str]]:
        """vLLM's world size is PP x TP x PCP GPUs per DP rank (config/parallel.py
        ``ParallelConfig.__post_init__``), and it refuses to start with fewer GPUs than that
        ("World size ... is larger than the number of available GPUs"). The operator requests
        TP x PP x DP GPUs per replica (spec.<pool>.tensorParallelSize and the rest), so prefill
        context parallelism would start pods that cannot run: refused, naming the field.
        (Decode context parallelism shares the TP ranks and needs no more GPUs.)"""
        from ..args import flag_field, user_engine_flag

        pcp = user_engine_flag(self.spec, role, "--prefill-context-parallel-size") or 1
        if pcp <= 1:
            return []
        return [(flag_field(self.spec, role, "--prefill-context-parallel-size"),
                 f"--prefill-context-parallel-size {pcp} makes each engine use "
                 f"TP x PP x {pcp} GPUs (vLLM config/parallel.py world_size), more than the pod requests "
                 "(TP x PP x local DP): the operator does not place prefill context parallelism; remove "
                 "the flag")]

    def _check_nixl_pair(self) -> list[tuple[str, str]]:
        """What vLLM's NIXL handshake compares between a decode engine and the prefill engine it
        pulls from. The compatibility hash (kv_connector/v1/nixl/metadata.py
        ``compute_nixl_compatibility_hash``) covers the model's ``dtype``, the attention backend's
        name, ``cache_config.cache_dtype``, whether the hybrid KV-cache manager is on and, for
        speculative methods that run on the target's hidden states (config/speculative.py
        ``use_eagle``: eagle, eagle3, mtp, dflash, dspark), the draft's method, model, revision,
        parallel drafting and KV dtype (``_get_speculative_compatibility_factors``); a mismatch
        fails every handshake ("NIXL compatibility hash mismatch", nixl/base_worker.py) and
        decode, with ``kv_load_failure_policy: recompute``, recomputes every prompt. Block sizes
        are checked at the handshake instead: decode's must be a multiple of prefill's
        (kv_connector/utils.py ``block_size_ratio``, asserted on the pulling side).

        Each setting is taken as the pool's flags give it or, unset, as vLLM would choose it
        where the operator can tell (the attention backend of a model the cost model knows on
        a named GPU product: perfmodel.engine_defaults.default_attention_backend; the block
        size of a known backend; the hybrid KV-cache manager by connector). Refused: settings
        that differ, and a setting one pool names where the other's choice cannot be told (set
        it for both pools, once in spec.engine.extraArgs). A ``--dtype`` or ``--kv-cache-dtype``
        left to the checkpoint ("auto") on one pool is let through: the checkpoint may give what
        the other pool names."""
        from ...perfmodel.costmodel import MODELS
        from ...perfmodel.engine_defaults import (ONE_BYTE_KV, VLLM_BLOCK_SIZE, default_attention_backend,
                                                  vllm_attention_backend)
        from ..args import pair_field, user_engine_flag

        spec = self.spec
        roles = ("prefill", "decode")

        def flag(name: str) -> dict:
            return {role: user_engine_flag(spec, role, name) for role in roles}

        problems = []

        def refuse(names: tuple[str, ...], why: str) -> None:
            problems.append((pair_field(spec, *names), f"{why}: vLLM's NIXL handshake compares it between prefill "
                                                        "and decode and refuses every KV transfer when it differs "
                                                        "(\"NIXL compatibility hash mismatch\"); set the same value "
                                                        "for both pools, e.g. once in spec.engine.extraArgs"))

        kv_named = flag("--kv-cache-dtype")
        kv = {role: v or "auto" for role, v in kv_named.items()}
        p, d = kv["prefill"], kv["decode"]
        if p != d and not ("auto" in (p, d) and ({p, d} - {"auto"}) <= ONE_BYTE_KV["vllm"]):
            refuse(("--kv-cache-dtype",), f"--kv-cache-dtype is {p!r} on prefill and {d!r} on decode")
        # config/model.py _STR_DTYPE_TO_TORCH_DTYPE; "auto" is the checkpoint's
        dt = {role: {"half": "float16", "float": "float32"}.get(v, v) for role, v in flag("--dtype").items()}
        if None not in dt.values() and "auto" not in dt.values() and dt["prefill"] != dt["decode"]:
            refuse(("--dtype",), f"--dtype is {dt['prefill']!r} on prefill and {dt['decode']!r} on decode")

        shape = MODELS.get(spec.model.name)
        known = shape is not None
        named = {role: vllm_attention_backend(user_engine_flag(spec, role, "--attention-backend"),
                                              user_engine_flag(spec, role, "--attention-config")) for role in roles}
        default = {role: default_attention_backend(self.gpu_product(role), shape.mla if known else None, kv_named[role])
                   for role in roles}
        backend = {role: named[role] or default[role] for role in roles}
        if named["prefill"] != named["decode"]:
            if None in backend.values() or backend["prefill"] != backend["decode"]:
                said = {role: named[role] or (f"vLLM's default on its GPU ({default[role]})" if default[role] else
                                              "vLLM's default for its GPU and model") for role in roles}
                refuse(("--attention-backend", "--attention-config"),
                       f"the attention backend is {said['prefill']} on prefill and {said['decode']} on decode")
        elif named["prefill"] is None and None not in default.values() and default["prefill"] != default["decode"]:
            problems.append(("spec.decode.gpuProduct" if spec.decode.gpu_product else "spec.decode.nodeSelector",
                             f"prefill runs on {self.gpu_product('prefill')} and decode on "
                             f"{self.gpu_product('decode')}, where vLLM picks different attention backends "
                             f"({default['prefill']} and {default['decode']}: platforms/cuda.py, by compute "
                             "capability) and its NIXL handshake refuses every KV transfer when they differ "
                             "(\"NIXL compatibility hash mismatch\"); use one GPU generation for both pools, or "
                             "name one --attention-backend both support in spec.engine.extraArgs"))

        # unset, vLLM turns the hybrid KV-cache manager off for a connector without HMA support
        # (config/vllm.py; NixlConnector has it, LMCacheConnectorV1 not, and a MultiConnector
        # has it only when every child does) or for a model with chunked local attention, which
        # no model the cost model knows has
        hma_default = {"lmcache": True, "nixl": False if known else None}[spec.backend()]
        hma_named = flag("--disable-hybrid-kv-cache-manager")
        hma = {role: hma_default if v is None else v for role, v in hma_named.items()}
        if hma_named["prefill"] != hma_named["decode"] and (None in hma.values() or hma["prefill"] != hma["decode"]):
            said = {role: {True: "off", False: "on", None: "vLLM's choice (by connector and model)"}[hma[role]]
                    for role in roles}
            refuse(("--disable-hybrid-kv-cache-manager",),
                   f"the hybrid KV-cache manager is {said['prefill']} on prefill and {said['decode']} on decode")

        draft = {role: _eagle_factors(v, kv[role]) for role, v in flag("--speculative-config").items()}
        if UNKNOWN not in draft.values() and draft["prefill"] != draft["decode"]:
            said = {role: "none" if draft[role] is None else f"method {draft[role][0]!r}" for role in roles}
            what = (f"{said['prefill']} on prefill and {said['decode']} on decode" if None in draft.values()
                    else "different on the two pools (" + ", ".join(
                        f"{name} {a!r} and {b!r}" for name, a, b in zip(EAGLE_FACTORS, draft["prefill"], draft["decode"])
                        if a != b) + ")")
            refuse(("--speculative-config",), "the speculative decoding run on the target's hidden states "
                                              "(EAGLE-family: eagle, eagle3, mtp, dflash, dspark) is " + what)

        block_named = flag("--block-size")
        block = {role: block_named[role] or VLLM_BLOCK_SIZE.get(backend[role] or "") for role in roles}
        if block_named["prefill"] != block_named["decode"] and (
                None in block.values() or block["decode"] % block["prefill"]):
            said = {role: block_named[role] or (f"vLLM's default ({block[role]})" if block[role]
                                                else "vLLM's default for its backend") for role in roles}
            problems.append((pair_field(spec, "--block-size"),
                             f"--block-size is {said['prefill']} on prefill and {said['decode']} on decode: vLLM's "
                             "NIXL transfer needs decode's block size to be a multiple of prefill's (kv_connector/"
                             "utils.py block_size_ratio, asserted at the handshake); set the same value for both "
                             "pools, e.g. once in spec.engine.extraArgs"))
        return problems

    def _check_kv_memory(self, role: str) -> None:
        """``--kv-cache-memory-bytes`` is each GPU's KV cache (config/cache.py), and vLLM refuses to
        start when it cannot hold one request of the model's max length
        (v1/core/kv_cache_planning.py ``check_enough_kv_cache_memory``: the layers' pages for
        ``max_model_len`` tokens plus the null block). Refused here when even the tokens alone
        do not fit, for a model whose KV layout the cost model knows, at the length the spec
        sets (``maxModelLen``) or, for a model named exactly and pulled from the Hugging Face
        Hub, its config's, unless extraArgs rewrite the config (--hf-overrides,
        --hf-config-path: the length vLLM derives follows them). Not checked where a worker
        holds part of the layers or of the context: pipeline parallelism (each stage checks its
        own layers, partitioned as VLLM_PP_LAYER_PARTITION may say) and context parallelism
        (--decode-context-parallel-size divides the length, v1/kv_cache_interface.py;
        --prefill-context-parallel-size is left out alike)."""
        from dataclasses import replace

        from ...api.errors import SpecError
        from ...perfmodel.costmodel import MODELS
        from ...perfmodel.engine_defaults import kv_element_bytes
        from ..args import flag_field, user_engine_flag

        budget = user_engine_flag(self.spec, role, "--kv-cache-memory-bytes")
        shape = MODELS.get(self.spec.model.name)
        hub = self.spec.model.source.type == "huggingface"
        rewritten = any(user_engine_flag(self.spec, role, flag) is not None for flag in ("--hf-overrides", "--hf-config-path"))
        length = self.spec.model.max_model_len or (shape.max_model_len if shape and hub and not rewritten else None)
        if not budget or shape is None or not length or self.pool(role).pipeline_parallel_size > 1:
            return
        if any((user_engine_flag(self.spec, role, flag) or 1) > 1
               for flag in ("--decode-context-parallel-size", "--prefill-context-parallel-size")):
            return
        element = kv_element_bytes("vllm", user_engine_flag(self.spec, role, "--kv-cache-dtype"),
                                   shape.kv_dtype_bytes or shape.dtype_bytes, shape.mla)
        if element is None:
            return
        tp = self.pool(role).tensor_parallel_size
        need = length * replace(shape, kv_dtype_bytes=element).kv_bytes_per_gpu_token(tp)
        if need <= budget:
            return
        field = flag_field(self.spec, role, "--kv-cache-memory-bytes")
        raise SpecError([(field, f"--kv-cache-memory-bytes gives each GPU {budget / 2 ** 30:.2f} GiB of KV cache, and one "
                                 f"request of {length} tokens of {shape.name} needs at least {need / 2 ** 30:.2f} GiB per GPU "
                                 f"at tensorParallelSize {tp}: vLLM refuses to start (\"To serve at least one request with "
                                 "the model's max seq len\"); raise it or set a smaller spec.model.maxModelLen")],
                        self.svc.metadata.name)

    def kv_transfer_config(self, role: str) -> dict:
        backend = self.spec.backend()
        kvt = self.spec.kv_transfer
        producer = role == "prefill"
        cfg: dict = {"kv_connector": CONNECTORS[backend]}
        role_name = "kv_producer" if producer else "kv_consumer"
        if backend in ("nixl", "lmcache"):
            nixl: dict = {"kv_connector": CONNECTORS["nixl"], "kv_role": role_name}
            if kvt.nixl.backends != ["UCX"]:
                nixl["kv_connector_extra_config"] = {"backends": list(kvt.nixl.backends)}
            if backend == "nixl":
                cfg = nixl
            else:
                # LMCache both stores and loads on every pod (the cache tier)
                lmcache = {"kv_connector": CONNECTORS["lmcache"], "kv_role": "kv_both"}
                cfg = {
                    "kv_connector": "MultiConnector",
                    "kv_role": role_name,
                    "kv_connector_extra_config": {"connectors": [nixl, lmcache]},
                }
        else:
            cfg["kv_role"] = role_name
        if backend == "mooncake" and self.spec.mooncake_protocol() != "rdma":
            # mooncake_connector.py: mooncake_protocol defaults to rdma
            cfg["kv_connector_extra_config"] = {"mooncake_protocol": self.spec.mooncake_protocol()}
        if backend == "moriio":
            cfg["kv_connector_extra_config"] = {
                "handshake_port": kvt.moriio.handshake_port,
                "notify_port": kvt.moriio.notify_port,
                "http_port": self.http_port,
                "read_mode": kvt.moriio.read_mode,
                # rank 0 heartbeats {type, http_address, zmq_address,
                # transfer_mode} here; vllm-router routes only to registered
                # engines (moriio_connector.py _start_heartbeat)
                "proxy_ip": discovery_service_host(self.svc),
                "proxy_ping_port": ROUTER_DISCOVERY_PORT,
            }
        if not producer:
            cfg["kv_load_failure_policy"] = "recompute"
        return cfg

    model_len_flag = "--max-model-len"
    memory_fraction_flag = "--gpu-memory-utilization"
    max_seqs_flag = "--max-num-seqs"
    step_tokens_flag = "--max-num-batched-tokens"

    def prefix_caching_args(self, enabled: bool | None) -> list[str]:
        if enabled is None:
            return []
        return ["--enable-prefix-caching" if enabled else "--no-enable-prefix-caching"]

    def command(self, role: str, headless: bool = False) -> list[str]:
        spec = self.spec
        pool = self.pool(role)
        argv = [
            "vllm", "serve", self.model_arg(),
            "--served-model-name", spec.served_model_name(),
            "--host", "0.0.0.0",
            "--port", str(self.http_port),
            "--tensor-parallel-size", str(pool.tensor_parallel_size),
        ]
        if pool.pipeline_parallel_size > 1:
            argv += ["--pipeline-parallel-size", str(pool.pipeline_parallel_size)]
        if pool.data_parallel_size > 1:
            argv += ["--data-parallel-size", str(pool.data_parallel_size)]
            if not headless:
                # One API server, in the process that owns the engines: with DP the
                # count defaults to the DP size (cli/serve.py), and several API
                # servers are separate processes that do not own the engines and
                # are stopped first on SIGTERM, dropping their in-flight requests;
                # only the in-process server drains (--shutdown-timeout).
                # --headless refuses the flag (cli/serve.py).
                argv += ["--api-server-count", "1"]
        if pool.expert_parallel:
            argv.append("--enable-expert-parallel")
        if pool.deepep_mode:
            argv += ["--all2all-backend", DEEPEP_ALL2ALL[pool.deepep_mode]]
        argv += self.model_and_pool_args(pool)
        argv += ["--kv-transfer-config", compact_json(self.kv_transfer_config(role))]
        # 0 (the default) aborts every in-flight request on SIGTERM; > 0 drains
        # them for up to that many seconds (v1/engine/core.py _handle_shutdown).
        argv += ["--shutdown-timeout", str(pool.engine_shutdown_timeout())]
        argv += list(spec.engine.extra_args) + list(pool.extra_args)
        return argv

    def group_command(self, role: str, leader: bool) -> list[str]:
        """A pod of a replica over several nodes: data parallelism across them
        (arg_utils.py _set_data_parallel / cli/serve.py run_headless). Each pod
        runs dataParallelSize / nodes DP ranks; the leader also serves the API
        and coordinates the ranks over --data-parallel-address:--data-parallel-rpc-port;
        a worker is --headless, its first rank LWS_WORKER_INDEX x local ranks."""
        pool = self.pool(role)
        local = pool.data_parallel_size // pool.nodes(self.spec.topology.gpus_per_node)
        argv = self.command(role, headless=not leader) + [
            "--data-parallel-size-local", str(local),
            "--data-parallel-rpc-port", str(DP_RPC_PORT),
        ]
        # The leader binds ZMQ ROUTER sockets (engine handshake, DP coordinator)
        # on --data-parallel-address, and libzmq binds IP addresses only: the
        # leader gives its pod IP; workers connect, which resolves LWS's DNS name.
        pairs = [("--data-parallel-address", "{POD_IP}" if leader else "{LWS_LEADER_ADDRESS}")]
        if not leader:
            argv.append("--headless")
            pairs.append(("--data-parallel-start-rank", f"{{LWS_WORKER_INDEX*{local}}}"))
        # `vllm` is the console script of vllm.entrypoints.cli.main:main
        return with_group_flags("vllm.entrypoints.cli.main", argv[1:], pairs)

    def group_ports(self, role: str) -> list[dict]:
        return [{"name": "dp-rpc", "containerPort": DP_RPC_PORT, "protocol": "TCP"}]

    def engine_env(self, role: str) -> list[dict]:
        spec = self.spec
        kvt = spec.kv_transfer
        backend = spec.backend()
        env: list[dict] = []
        if backend in ("nixl", "lmcache"):
            env += [
                {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(kvt.nixl.side_channel_port)},
            ]
        elif backend == "mooncake" and role == "prefill":
            env.append({"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(kvt.bootstrap_port)})
        elif backend == "moriio":
            # MoRIIO's local_ip (the registered http_address and the handshake
            # host) is host_ip, else get_ip(): VLLM_HOST_IP, else the address
            # of the default route (moriio_common.py resolve_host_ip,
            # utils/network_utils.py get_ip): pin it to the pod IP.
            env.append({"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        if backend == "lmcache":
            env.append({"name": "LMCACHE_CONFIG_FILE", "value": LMCACHE_CONFIG_FILE})
        if spec.engine.api_key_secret_ref:
            env.append(secret_env("VLLM_API_KEY", spec.engine.api_key_secret_ref))
        return env

    def ports(self, role: str) -> list[dict]:
        ports = super().ports(role)
        kvt = self.spec.kv_transfer
        backend = self.spec.backend()
        if backend in ("nixl", "lmcache"):
            # one side-channel port per data-parallel rank: base + rank
            for rank in range(self.pool(role).data_parallel_size):
                ports.append({"name": "nixl" if rank == 0 else f"nixl-{rank}",
                              "containerPort": kvt.nixl.side_channel_port + rank, "protocol": "TCP"})
        elif backend == "mooncake" and role == "prefill":
            ports.append({"name": "bootstrap", "containerPort": kvt.bootstrap_port, "protocol": "TCP"})
        elif backend == "moriio":
            ports.append({"name": "moriio-hs", "containerPort": kvt.moriio.handshake_port, "protocol": "TCP"})
            ports.append({"name": "moriio-notify", "containerPort": kvt.moriio.notify_port, "protocol": "TCP"})
        return ports

    def listen_ports(self, role: str) -> list[tuple[int, str, str]]:
        ports = super().listen_ports(role)
        kvt = self.spec.kv_transfer
        backend = self.spec.backend()
        pool = self.pool(role)
        if backend in ("nixl", "lmcache"):
            # VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index (nixl/utils.py)
            ports += [(kvt.nixl.side_channel_port + r, "kvTransfer.nixl.sideChannelPort", f"the NIXL side channel of DP rank {r}")
                      for r in range(pool.data_parallel_size)]
        elif backend == "mooncake" and role == "prefill":
            ports.append((kvt.bootstrap_port, "kvTransfer.bootstrapPort", "the Mooncake bootstrap server"))
        elif backend == "moriio":
            # each rank binds handshake_port and notify_port + get_port_offset(dp_rank, tp_rank), which the
            # bind sites call without tp_size: dp_rank + tp_rank (moriio_common.py, moriio_connector.py); with
            # the pool rule on MoRIIO's DP (api/models.py) the offsets are 0 .. DP + TP - 2, one per rank
            n = pool.data_parallel_size + pool.tensor_parallel_size - 1
            ports += [(kvt.moriio.handshake_port + i, "kvTransfer.moriio.handshakePort", f"MoRIIO handshake port {i}")
                      for i in range(n)]
            ports += [(kvt.moriio.notify_port + i, "kvTransfer.moriio.notifyPort", f"MoRIIO notify port {i}") for i in range(n)]
        return ports

    def config_files(self) -> dict[str, str]:
        """LMCache's config file: prefill stores to, decode loads from, the shared backend."""
        opts = self.spec.kv_transfer.lmcache
        if self.spec.backend() != "lmcache":
            return {}
        config: dict = {
            "chunk_size": opts.chunk_size,
            "local_cpu": opts.local_cpu,
            "max_local_cpu_size": opts.max_local_cpu_size_gb,
        }
        if opts.remote_url:
            config.update({"remote_url": opts.remote_url, "remote_serde": "naive"})
        return {LMCACHE_CONFIG_FILE.rsplit("/", 1)[1]: yaml.safe_dump(config, sort_keys=False)}

    def flagset_argv(self) -> list[str]:
        return ["vllm", "serve", "model"]


# vLLM's speculative methods that run on the target's hidden states (config/speculative.py
# SpeculativeConfig.use_eagle): their draft enters the NIXL compatibility hash
EAGLE_METHODS = frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"})
EAGLE_FACTORS = ("method", "model", "revision", "parallel_drafting", "kv_cache_dtype")
UNKNOWN = object()


def _eagle_factors(config, kv_cache_dtype: str):
    """What a ``--speculative-config`` adds to the NIXL compatibility hash
    (kv_connector/v1/nixl/metadata.py ``_get_speculative_compatibility_factors``), as vLLM
    resolves the JSON (config/speculative.py ``__post_init__``): a ``*_mtp`` method is ``mtp``;
    without ``method`` it is inferred from the draft's name ("eagle-", "eagle3", "dflash",
    "dspark") or, failing that, from the draft's config (:data:`UNKNOWN` here: not visible
    offline); the draft's KV dtype is the target's unless given (``kv_cache_dtype``: the pool's
    --kv-cache-dtype). None: no speculative config, or a method outside :data:`EAGLE_METHODS`."""
    if not isinstance(config, dict):
        return None
    method, model = config.get("method"), config.get("model")
    if method is None and isinstance(model, str):
        name = model.lower()
        method = next((m for key, m in (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"),
                                        ("dspark", "dspark"), ("ngram", "ngram")) if key in name), None)
        if method is None:
            return UNKNOWN
    if isinstance(method, str) and method.endswith("_mtp"):
        method = "mtp"
    if method not in EAGLE_METHODS:
        return None
    return (method, model, config.get("revision"), bool(config.get("parallel_drafting")),
            config.get("kv_cache_dtype") or kv_cache_dtype)
