"""SGLang at its pinned version: flags, env and ports for PD.

Facts (SGLang 0.5.23, checked against ``ServerArgs.add_cli_args``; the flag
set is in flagsets/sglang-0.5.23.json and a contract test checks every line):
- ``python3 -m sglang.launch_server --model-path M``; PD role by
  ``--disaggregation-mode prefill|decode`` (``--pd-disaggregation`` and
  ``--prefill-only`` are router/blog inventions, not server flags).
- ``--disaggregation-transfer-backend mooncake|nixl``,
  ``--disaggregation-bootstrap-port`` on prefill, ``--disaggregation-ib-device``.
- Unequal TP works without any setting (the decode side maps the ranks,
  disaggregation/common/conn.py). SGLANG_DISAGG_STAGING_BUFFER=1 is an
  optional speed-up for non-MLA models only: SGLang refuses it at start for
  MLA models (DeepSeek), for chunked_prefill_size not a positive multiple of
  the page size, and with pp > 1 on nixl (disaggregation/prefill.py,
  decode.py), so it is never set here; a user may set it in env.
  ``--disaggregation-decode-tp/-dp`` (older releases, and many guides) do not
  exist in 0.5.23: the bootstrap handshake carries the decode layout.
- Mooncake over TCP is its own backend name, ``mooncake_tcp``.
- Metrics only with ``--enable-metrics``; auth with ``--api-key`` (its value
  comes from a Secret through the environment, expanded by the kubelet).
"""

from __future__ import annotations

from ..common import secret_env
from ..launch import with_group_flags, with_secret_flag
from .base import EngineAdapter
from .flagset import has_flag

# Not an SGLang variable (SGLang reads its key from --api-key only): the
# launcher in render/launch.py appends --api-key with this variable's value
# inside the process, so the key is neither in the manifest nor in argv.
API_KEY_ENV = "PD_ENGINE_API_KEY"

# A replica over several nodes: node 0 (the LWS leader) hosts the rendezvous at
# --dist-init-addr HOST:PORT and, for DP attention, binds ZMQ sockets on HOST
# itself (PortArgs.init_new, the DP controller): HOST is the leader's pod IP
# (tests/contract/FACTS.md, "Replicas that span nodes"); nodes of rank >= 1
# serve no API (http_server.py launch_server returns after the schedulers exit), only
# /health and /metrics (launch_dummy_health_check_server).
DIST_INIT_PORT = 20000
DIST_INIT_PORTS = 8
# With attention DP, node 0 also answers the other nodes' worker-ports handshake
# at the --dist-init-addr port + 13 (server_args.py DP_ATTENTION_HANDSHAKE_PORT_DELTA,
# data_parallel_controller.py).
DP_ATTENTION_HANDSHAKE_PORT_DELTA = 13
# On one node, attention DP puts its ZMQ sockets on 127.0.0.1 at the HTTP port + 233 (the
# rendezvous) and the five after it (server_args.py PortArgs.init_new, ZMQ_TCP_PORT_DELTA; each
# checked free at start by wait_port_available), and the worker-ports handshake at the HTTP port
# + 13 on --host (data_parallel_controller.py _broadcast_worker_ports, dist_init_addr unset).
ZMQ_TCP_PORT_DELTA = 233
ZMQ_TCP_PORTS = 6


# The attention backend flags, and the backends that force the KV page (arg_groups/overrides.py
# ``_mla_backend_page_constraints``): (backend, the flags it counts on, the pages it keeps; any
# other becomes 64). FlashMLA keeps none but 64.
ATTENTION_BACKEND_FLAGS = ("--attention-backend", "--decode-attention-backend", "--prefill-attention-backend",
                           "--speculative-draft-attention-backend")
_MAIN, _DECODE, _PREFILL, _DRAFT = ATTENTION_BACKEND_FLAGS
BACKEND_PAGES = (
    ("flashmla", (_MAIN, _DECODE), (64,)),
    ("trtllm_mla", (_MAIN, _DECODE), (32, 64)),
    ("cutedsl_mla", (_MAIN, _DECODE, _PREFILL), (32, 64)),
    ("trtllm_mha", (_MAIN, _DECODE, _PREFILL, _DRAFT), (16, 32, 64, 128)),
    ("hpc_ops", (_MAIN, _DECODE, _PREFILL), (64,)),
)


class SGLangAdapter(EngineAdapter):
    kind = "sglang"
    http_port = 30000
    flagset_component = "sglang"
    managed_flags = frozenset(
        {
            "--model-path", "--model", "--served-model-name", "--host", "--port",
            "--tp-size", "--tp", "--pp-size", "--dp-size", "--dp",
            "--attn-dp-size", "--enable-dp-attention",
            "--disaggregation-mode", "--disaggregation-transfer-backend",
            "--disaggregation-bootstrap-port", "--disaggregation-ib-device",
            "--disaggregation-decode-tp", "--disaggregation-decode-dp",
            "--api-key", "--context-length", "--revision", "--trust-remote-code",
            "--mem-fraction-static", "--max-running-requests", "--chunked-prefill-size",
            "--disable-radix-cache", "--disaggregation-decode-enable-radix-cache", "--enable-metrics",
            "--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr",
            "--ep-size", "--ep", "--expert-parallel-size", "--moe-a2a-backend", "--deepep-mode",
        }
    )

    refused_flags = {
        # every TP rank would export the same requests and tokens as its DP group's first rank
        # (observability/metrics_collector.py: scheduler metrics by tp_rank/dp_rank), and the
        # autoscaler, the recording rules and the dashboard sum a pod's series
        "--enable-metrics-for-all-schedulers": "every tensor-parallel rank would then export the requests "
        "and tokens of its group again, and the autoscaler sums a pod's series: its demand and queues "
        "would read tensorParallelSize times what they are",
    }

    model_len_flag = "--context-length"
    memory_fraction_flag = "--mem-fraction-static"
    max_seqs_flag = "--max-running-requests"
    step_tokens_flag = "--chunked-prefill-size"

    def page_size(self, role: str) -> int:
        """The KV page of a role's engine: ``--page-size`` (on GPUs, 1 when not given:
        arg_groups/overrides.py ``_page_size_default``), then as the attention backends the
        flags name force it (same file, ``_mla_backend_page_constraints``, in its order). Not
        followed: a backend SGLang picks by itself when none is named (by GPU and model), and
        FA4's 128 on Blackwell (``_fa4_page_constraint``: it depends on the GPU and the model)."""
        from ..args import user_engine_flag

        page = max(1, user_engine_flag(self.spec, role, "--page-size") or 1)
        named = {flag: user_engine_flag(self.spec, role, flag) for flag in ATTENTION_BACKEND_FLAGS}
        # what the hooks before it make of the flags: the deprecated tokenspeed_mla is
        # cutedsl_mla (trtllm_mla for prefill: arg_groups/serving_hook.py
        # _handle_deprecated_args); an NVFP4 KV cache decodes on trtllm_mha
        # (kv_cache_hook.py); a prefill backend equal to the decode one is the backend
        # (overrides.py _attention_backend_default)
        for flag in ATTENTION_BACKEND_FLAGS:
            if named[flag] == "tokenspeed_mla":
                named[flag] = "trtllm_mla" if flag == _PREFILL else "cutedsl_mla"
        if user_engine_flag(self.spec, role, "--kv-cache-dtype") == "nvfp4" and named[_DECODE] is None:
            named[_DECODE] = "trtllm_mha"
        if named[_PREFILL] is not None and named[_PREFILL] == named[_DECODE]:
            named[_MAIN] = named[_PREFILL]
        for backend, flags, keeps in BACKEND_PAGES:
            if any(named[flag] == backend for flag in flags) and page not in keeps:
                page = 64
        return page

    def check_extra_args(self) -> None:
        """Also: ``--max-total-tokens`` must leave a page in the pool, and the prefill/decode
        pairs SGLang fails on (:meth:`_check_pair`, checked after it). SGLang caps each worker's
        pool at min(profiled, value) (mem_cache/kv_cache_configurator.py
        ``_apply_token_constraints``), rounds it down to whole pages
        (model_executor/pool_configurator.py ``calculate_pool_sizes_from_max_tokens``) and
        refuses to start on an empty one (same file, ``MemoryPoolConfig.__post_init__``: "Not
        enough memory"). The page: ``page_size``."""
        from ...api.errors import SpecError
        from ..args import flag_field, user_engine_flag

        super().check_extra_args()
        for role in ("prefill", "decode"):
            cap = user_engine_flag(self.spec, role, "--max-total-tokens")
            page = self.page_size(role)
            if cap is not None and cap < page:
                raise SpecError([(flag_field(self.spec, role, "--max-total-tokens"),
                                  f"--max-total-tokens {cap} leaves no page of {page} tokens in the {role} pool's KV "
                                  "cache (SGLang rounds it down to whole pages), and SGLang refuses to start (\"Not "
                                  "enough memory\"); give at least one page, or drop the flag to size the cache from "
                                  "gpuMemoryUtilization")],
                                self.svc.metadata.name)
        problems = self._check_pair()
        if problems:
            raise SpecError(problems, self.svc.metadata.name)

    def _check_pair(self) -> list[tuple[str, str]]:
        """Prefill/decode pairs each of which SGLang starts, then fails on (tests/contract/FACTS.md,
        "SGLang prefill/decode pairs"). The decode side fetches the prefill's parallel info at its
        first request and compares (disaggregation/common/conn.py
        ``CommonKVManager.try_ensure_parallel_info``, for mooncake and nixl alike):
        - the KV page (``kv_args.page_size``): "Page size mismatch", where both pools' pages are
          known (:meth:`_known_page`);
        - the KV-cache dtype string (``kv_cache_dtype_str``): "KV cache dtype mismatch";
        - the pipeline depth (``_resolve_rank_mapping``): decode's pp_size must be prefill's or 1.
        Also refused: a prefill chunk SGLang refuses at start (:meth:`_check_prefill_chunk`), and
        a decode radix cache next to flags SGLang refuses it with (:meth:`_check_decode_radix`)."""
        from ..args import pair_field, user_engine_flag

        spec = self.spec
        problems: list[tuple[str, str]] = []
        page = {role: self._known_page(role) for role in ("prefill", "decode")}
        if None not in page.values() and page["prefill"] != page["decode"]:
            problems.append((pair_field(spec, "--page-size", *ATTENTION_BACKEND_FLAGS, "--kv-cache-dtype"),
                             f"the KV page is {page['prefill']} on prefill and {page['decode']} on decode (tokens; "
                             "--page-size, or the page the attention backend forces): SGLang's decode "
                             "compares the pages at the first request it takes from a prefill and raises (\"Page "
                             "size mismatch\"); give both pools the same --page-size and attention backends, e.g. "
                             "once in spec.engine.extraArgs"))
        dtypes = {role: self._kv_dtypes(role) for role in ("prefill", "decode")}
        if not dtypes["prefill"] & dtypes["decode"]:
            said = {role: "fp8_e4m3 (tokenspeed_mla forces it)" if dtypes[role] == {"fp8_e4m3"}
                    and (user_engine_flag(spec, role, "--kv-cache-dtype") or "auto") != "fp8_e4m3"
                    else user_engine_flag(spec, role, "--kv-cache-dtype") or "auto" for role in ("prefill", "decode")}
            problems.append((pair_field(spec, "--kv-cache-dtype", *ATTENTION_BACKEND_FLAGS),
                             f"the KV cache is --kv-cache-dtype {said['prefill']} on prefill and {said['decode']} on "
                             "decode, which cannot resolve to the same dtype: SGLang's "
                             "decode compares them at the first request it takes from a prefill and raises (\"KV "
                             "cache dtype mismatch\"); set the same --kv-cache-dtype for both pools, e.g. once in "
                             "spec.engine.extraArgs"))
        pp = {role: spec.pool(role).pipeline_parallel_size for role in ("prefill", "decode")}
        if pp["decode"] not in (1, pp["prefill"]):
            problems.append(("spec.decode.pipelineParallelSize",
                             f"decode.pipelineParallelSize {pp['decode']} with prefill.pipelineParallelSize "
                             f"{pp['prefill']}: SGLang's decode maps pipeline stages only from a prefill of the same "
                             "depth or onto a decode of one stage (disaggregation/common/conn.py "
                             "_resolve_rank_mapping asserts it at the first request): set decode.pipelineParallelSize "
                             + (f"to {pp['prefill']} or 1" if pp["prefill"] > 1 else "to 1")))
        return problems + self._check_prefill_chunk() + self._check_decode_radix()

    def _known_page(self, role: str) -> int | None:
        """The pool's KV page where the operator can tell it (:meth:`page_size`): a page a named
        backend forces, or the flag's page where the backends are named (the main one, or the
        prefill and decode ones) or where SGLang's own pick forces none: on Hopper it picks fa3
        (arg_groups/model_override_base.py, the default backend, MHA and MLA alike), which keeps
        the page. Elsewhere its pick may force one (trtllm_mha raises a page under 16 to 64 on
        Blackwell for MHA models, overrides.py): None, not told."""
        from ...perfmodel.engine_defaults import gpu_major
        from ..args import user_engine_flag

        page = self.page_size(role)
        if page != max(1, user_engine_flag(self.spec, role, "--page-size") or 1):
            return page
        named = {flag: user_engine_flag(self.spec, role, flag) for flag in (_MAIN, _DECODE, _PREFILL)}
        if named[_MAIN] or (named[_DECODE] and named[_PREFILL]) or gpu_major(self.gpu_product(role)) == 9:
            return page
        return None

    def _kv_dtypes(self, role: str) -> frozenset[str]:
        """The KV-cache dtype strings a pool's engine may report at the PD handshake
        (``kv_cache_dtype_str``, model_executor/model_runner.py ``configure_kv_cache_dtype``: the
        dtype mem_cache/kv_cache_dtype.py resolves "auto" to, else the server argument as the hooks
        left it). A deprecated tokenspeed_mla attention or decode backend makes it fp8_e4m3
        (arg_groups/serving_hook.py ``_handle_deprecated_args``). "auto" stays "auto" unless the
        checkpoint names an FP8 KV cache (fp8_e4m3) or a model hook picks one (fp8_e4m3 or
        bfloat16: arg_groups/overrides.py DeepSeek DSA, DeepSeek V4, Muse Spark; MiniMax M3);
        "bf16" is renamed "bfloat16" for DeepSeek DSA only. For a model the cost model knows
        (none of them is one the hooks handle) "auto" is "auto" or a checkpoint's fp8_e4m3; for
        another, every string the flags may give is kept."""
        from ...perfmodel.costmodel import MODELS
        from ..args import user_engine_flag

        if "tokenspeed_mla" in (user_engine_flag(self.spec, role, _MAIN), user_engine_flag(self.spec, role, _DECODE)):
            return frozenset({"fp8_e4m3"})
        value = user_engine_flag(self.spec, role, "--kv-cache-dtype") or "auto"
        if self.spec.model.name in MODELS:  # no model hook renames it: a checkpoint's FP8 KV at most
            return frozenset({"auto", "fp8_e4m3"}) if value == "auto" else frozenset({value})
        return {"auto": frozenset({"auto", "fp8_e4m3", "bfloat16"}),
                "bf16": frozenset({"bf16", "bfloat16"})}.get(value, frozenset({value}))

    def _check_prefill_chunk(self) -> list[tuple[str, str]]:
        """SGLang refuses to start a prefill (any mode but decode: the check is skipped there)
        whose chunk is not a whole number of pages: arg_groups/validation_hook.py
        ``check_server_args`` asserts ``chunked_prefill_size % page_size == 0`` when it is > 0,
        after arg_groups/parallel_hook.py ``handle_data_parallelism`` divided it by the
        attention-DP size. Unset, the chunk is 2048, 4096, 8192 or 16384 by the GPU's memory
        (arg_groups/memory_hook.py ``handle_gpu_memory_settings``): refused only when none would
        do. Not checked: --enable-mis (chunk -1, attention_hook.py) and
        --enable-kv-cache-sharding (rounds it up to whole pages, kv_shard_hook.py).
        ``maxBatchedTokens`` is at least 16, so it is never -1 here."""
        from ..args import user_engine_flag

        pool = self.spec.prefill
        page = self.page_size("prefill")
        if page == 1 or any(user_engine_flag(self.spec, "prefill", flag)
                            for flag in ("--enable-mis", "--enable-kv-cache-sharding")):
            return []
        dp = pool.data_parallel_size if pool.data_parallel_attention else 1
        chunks = [pool.max_batched_tokens] if pool.max_batched_tokens is not None else [2048, 4096, 8192, 16384]
        if any(chunk // dp % page == 0 for chunk in chunks):
            return []
        per_rank = f" / dataParallelSize {dp}" if dp > 1 else ""
        said = (f"maxBatchedTokens {pool.max_batched_tokens}" if pool.max_batched_tokens is not None
                else "SGLang's chunk when maxBatchedTokens is unset (2048 to 16384 by GPU memory)")
        return [("spec.prefill.maxBatchedTokens",
                 f"{said}{per_rank} is not a whole number of the prefill pool's {page}-token KV pages: SGLang "
                 "refuses to start it (\"chunked_prefill_size must be divisible by page_size\"; with "
                 "dataParallelAttention each attention-DP rank takes the chunk divided by dataParallelSize); "
                 f"set maxBatchedTokens to a multiple of {page * dp}")]

    def _check_decode_radix(self) -> list[tuple[str, str]]:
        """decode.enablePrefixCaching true renders --disaggregation-decode-enable-radix-cache, which
        SGLang refuses at start with --enable-hisparse (arg_groups/pd_disaggregation_hook.py
        ``handle_pd_disaggregation``) and with --disaggregation-decode-allocation-policy
        prefill_complete (same file, ``_validate_prefill_complete``)."""
        from ..args import user_engine_flag

        if not self.spec.decode.enable_prefix_caching:
            return []
        clashes = []
        if user_engine_flag(self.spec, "decode", "--enable-hisparse"):
            clashes.append("--enable-hisparse")
        if user_engine_flag(self.spec, "decode", "--disaggregation-decode-allocation-policy") == "prefill_complete":
            clashes.append("--disaggregation-decode-allocation-policy prefill_complete")
        if not clashes:
            return []
        return [("spec.decode.enablePrefixCaching",
                 "decode.enablePrefixCaching true renders --disaggregation-decode-enable-radix-cache, which SGLang "
                 f"refuses at start with {' and '.join(clashes)} (arg_groups/pd_disaggregation_hook.py): unset "
                 "enablePrefixCaching on decode, or drop the flag")]

    def prefix_caching_args(self, enabled: bool | None) -> list[str]:
        # the radix cache is on by default, except on a PD decode server: _argv adds its flag there
        return ["--disable-radix-cache"] if enabled is False else []

    def command(self, role: str) -> list[str]:
        argv = self._argv(role)
        if self.spec.engine.api_key_secret_ref:
            return with_secret_flag("sglang.launch_server", argv[3:], "--api-key", API_KEY_ENV)
        return argv

    def group_command(self, role: str, leader: bool) -> list[str]:
        """A pod of a replica over ``nodes`` nodes: the same command on every node,
        the node rank and the rendezvous address filled in from the pod's env
        (the leader's own POD_IP on the leader, LWS's leader name on workers)."""
        nodes = self.pool(role).nodes(self.spec.topology.gpus_per_node)
        argv = self._argv(role) + ["--nnodes", str(nodes)]
        # Node 0 binds its ZMQ sockets on the host of --dist-init-addr as given,
        # and libzmq binds IP addresses only (no DNS name): the leader names
        # itself by its pod IP; the workers only connect (ZMQ and torch's
        # TCPStore resolve a DNS name on connect) and keep LWS's leader name.
        leader_host = "{POD_IP}" if leader else "{LWS_LEADER_ADDRESS}"
        pairs = [("--dist-init-addr", f"{leader_host}:{DIST_INIT_PORT}"), ("--node-rank", "{LWS_WORKER_INDEX}")]
        if self.spec.engine.api_key_secret_ref:
            pairs.append(("--api-key", f"{{{API_KEY_ENV}}}"))
        return with_group_flags("sglang.launch_server", argv[3:], pairs)

    def _argv(self, role: str) -> list[str]:
        spec = self.spec
        kvt = spec.kv_transfer
        pool = self.pool(role)
        argv = [
            "python3", "-m", "sglang.launch_server",
            "--model-path", self.model_arg(),
            "--served-model-name", spec.served_model_name(),
            "--host", "0.0.0.0",
            "--port", str(self.http_port),
            "--tp-size", str(pool.tensor_parallel_size),
        ]
        if pool.pipeline_parallel_size > 1:
            argv += ["--pp-size", str(pool.pipeline_parallel_size)]
        if pool.data_parallel_size > 1:
            # attention DP inside the TP group (0.5.23: --attn-dp-size; the old
            # --dp-size N --enable-dp-attention is deprecated), or DP replicas
            argv += ["--attn-dp-size" if pool.data_parallel_attention else "--dp-size", str(pool.data_parallel_size)]
        if pool.expert_parallel:
            # EP over the whole TP group (moe_dp_size 1: ep_size * moe_dp_size == tp_size,
            # parallel_hook.py); DeepEP would force ep_size = tp_size anyway (overrides.py _a2a_ep_size)
            argv += ["--ep-size", str(pool.tensor_parallel_size)]
        if pool.deepep_mode:
            argv += ["--moe-a2a-backend", "deepep", "--deepep-mode", pool.deepep_mode]
        argv += [
            "--disaggregation-mode", role,
            "--disaggregation-transfer-backend", self.transfer_backend(),
        ]
        if role == "prefill":
            argv += ["--disaggregation-bootstrap-port", str(kvt.bootstrap_port)]
            # Older SGLang told the prefill side the decode layout; 0.5.23 has
            # no such flags (the bootstrap handshake carries it), so they are
            # emitted only for versions whose parser has them.
            decode = spec.decode
            for flag, mine, theirs in (
                ("--disaggregation-decode-tp", pool.tensor_parallel_size, decode.tensor_parallel_size),
                ("--disaggregation-decode-dp", pool.data_parallel_size, decode.data_parallel_size),
            ):
                if mine != theirs and has_flag("sglang", self.version, flag):
                    argv += [flag, str(theirs)]
        if kvt.rdma.ib_devices:
            argv += ["--disaggregation-ib-device", ",".join(d.split(":")[0] for d in kvt.rdma.ib_devices)]
        argv += self.model_and_pool_args(pool)
        if role == "decode" and pool.enable_prefix_caching:
            # A PD decode server turns the radix cache off unless this flag is given
            # (arg_groups/pd_disaggregation_hook.py handle_pd_disaggregation: disable_radix_cache=True
            # otherwise), so the default-on radix cache of prefix_caching_args is off on decode.
            argv.append("--disaggregation-decode-enable-radix-cache")
        argv.append("--enable-metrics")
        argv += list(spec.engine.extra_args) + list(pool.extra_args)
        return argv

    def transfer_backend(self) -> str:
        backend = self.spec.backend()
        if backend == "mooncake" and self.spec.mooncake_protocol() == "tcp":
            return "mooncake_tcp"
        return backend

    def engine_env(self, role: str) -> list[dict]:
        spec = self.spec
        # /health runs a one-token generation unless this is false
        # (http_server.py health_generate; environ.py default True). Under a long
        # prefill that generation waits, and the liveness probe would restart a
        # busy pod. With it off, /health is 200 once started and 503 while
        # starting or draining after SIGTERM.
        env: list[dict] = [{"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "false"}]
        if spec.backend() == "nixl":
            nixl_backend = spec.kv_transfer.nixl.backends[0]
            if nixl_backend != "UCX":
                env.append({"name": "SGLANG_DISAGGREGATION_NIXL_BACKEND", "value": nixl_backend})
        if self.transfer_backend() == "mooncake" and spec.kv_transfer.rdma.gid_index is not None:
            # Mooncake's RDMA transport takes the GID index from MC_GID_INDEX; on RoCE its own
            # choice can come up empty ("GID is NULL, please check your GID index by specifying
            # MC_GID_INDEX", mooncake-transfer-engine engine.so) and every transfer fails (SGLang's
            # test/server_fixtures/disaggregation_fixture.py _maybe_set_roce_gid_index sets it so)
            env.append({"name": "MC_GID_INDEX", "value": str(spec.kv_transfer.rdma.gid_index)})
        if spec.engine.api_key_secret_ref:
            env.append(secret_env(API_KEY_ENV, spec.engine.api_key_secret_ref))
        return env

    def ports(self, role: str) -> list[dict]:
        ports = super().ports(role)
        if role == "prefill":
            ports.append({"name": "bootstrap", "containerPort": self.spec.kv_transfer.bootstrap_port, "protocol": "TCP"})
        return ports

    # Only node 0 runs the tokenizer manager, which starts the bootstrap server
    # (managers/tokenizer_manager.py init_disaggregation -> managers/disagg_service.py);
    # nodes of rank >= 1 return before it (entrypoints/engine.py), and serve /health and
    # /metrics (their own schedulers' series) on --port: launch_dummy_health_check_server.
    leader_only_ports = frozenset({"bootstrap"})

    def group_ports(self, role: str) -> list[dict]:
        return [{"name": "dist-init", "containerPort": DIST_INIT_PORT, "protocol": "TCP"}]

    def listen_ports(self, role: str) -> list[tuple[int, str, str]]:
        ports = super().listen_ports(role)
        pool = self.pool(role)
        if pool.nodes(self.spec.topology.gpus_per_node) > 1:
            ports += [(DIST_INIT_PORT + i, "", f"SGLang's multi-node rendezvous port {DIST_INIT_PORT}+{i}") for i in range(DIST_INIT_PORTS)]
            if pool.data_parallel_attention and pool.data_parallel_size > 1:
                port = DIST_INIT_PORT + DP_ATTENTION_HANDSHAKE_PORT_DELTA
                ports.append((port, "", f"SGLang's attention-DP port handshake {DIST_INIT_PORT}+{DP_ATTENTION_HANDSHAKE_PORT_DELTA}"))
        elif pool.data_parallel_attention and pool.data_parallel_size > 1:
            http = self.http_port
            ports.append((http + DP_ATTENTION_HANDSHAKE_PORT_DELTA, "",
                          f"SGLang's attention-DP port handshake (the HTTP port {http} + {DP_ATTENTION_HANDSHAKE_PORT_DELTA})"))
            ports += [(http + ZMQ_TCP_PORT_DELTA + i, "",
                       f"SGLang's attention-DP ZMQ port {http}+{ZMQ_TCP_PORT_DELTA + i} (127.0.0.1)") for i in range(ZMQ_TCP_PORTS)]
        if role == "prefill":
            ports.append((self.spec.kv_transfer.bootstrap_port, "kvTransfer.bootstrapPort", "the bootstrap server"))
        return ports

    def ready_path(self) -> str:
        # /ready (http_server.py ready -> tokenizer_manager.py is_ready): 200 only
        # when started, Up, not draining and not paused. /health with generation off
        # is 503 only while starting or draining: a server left UnHealthy by a
        # failed PD warmup still answers 200 there, so readiness would send it traffic.
        return "/ready"

    def flagset_argv(self) -> list[str]:
        return ["python3", "-m", "sglang.launch_server", "--model-path", "model"]
