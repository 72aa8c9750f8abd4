"""Bad input is refused offline with the field path and what to change."""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from tests.conftest import minimal


def problems(obj) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_service(obj)
    return dict(info.value.problems)


def test_minimal_spec_is_a_working_service():
    svc = validate_service(minimal())
    spec = svc.spec
    assert spec.backend() == "nixl"
    assert spec.router_kind() == "vllm-router"
    assert spec.served_model_name() == "Qwen/Qwen3-8B"
    assert spec.engine.effective_image() == "docker.io/vllm/vllm-openai:v0.33.0"
    assert spec.prefill.gpus_per_replica() == 1 and spec.decode.desired_replicas(None) == 1
    sg = validate_service(minimal("sglang")).spec
    assert (sg.backend(), sg.router_kind()) == ("mooncake", "sglang-router")


def test_min_replicas_above_max():
    p = problems(minimal(prefill={"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}))
    assert "minReplicas must be <= maxReplicas" in p["spec.prefill.autoscaling.minReplicas"]


def test_autoscaling_enabled_needs_max():
    p = problems(minimal(decode={"autoscaling": {"enabled": True}}))
    assert "maxReplicas" in p["spec.decode.autoscaling.maxReplicas"]


def test_vllm_tp_that_do_not_divide():
    # NixlConnector TransferTopology.tp_ratio: 4/8 is fine, 4/6 asserts
    validate_service(minimal(prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 8}))
    p = problems(minimal(prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 6}))
    msg = p["spec.decode.tensorParallelSize"]
    assert "NixlConnector" in msg and "divides the other" in msg


def test_vllm_with_mooncake_is_refused():
    # vllm-router 0.1.17 fills its Mooncake bootstrap table only for static --prefill
    # URLs (VllmPDRouter::new); discovered prefill pods (add_prefill_server) never get an
    # entry, so decode requests go without kv_transfer_params (tests/contract/FACTS.md,
    # "vllm-router and Mooncake").
    p = problems(minimal(kvTransfer={"backend": "mooncake"}))
    msg = p["spec.kvTransfer.backend"]
    assert "kvTransfer.backend mooncake is refused with engine.kind vllm" in msg
    assert "discovers" in msg and "use kvTransfer.backend nixl" in msg
    # SGLang is not affected: sglang-router 0.3.2 puts the chosen prefill's bootstrap host and
    # port into each request (routers/http/pd_router.rs:211-258)
    validate_service(minimal("sglang", kvTransfer={"backend": "mooncake"}))


def test_sglang_mooncake_unequal_tp_is_fine():
    validate_service(minimal("sglang", prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 8}))


def test_vllm_nixl_decode_tp_below_prefill():
    # NIXL tp_ratio: prefill TP > decode TP is handled when it is a multiple
    validate_service(minimal(prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 2}))
    p = problems(minimal(prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 3}))
    assert "NixlConnector" in p["spec.decode.tensorParallelSize"]


def test_moriio_on_nvidia_image():
    p = problems(minimal(kvTransfer={"backend": "moriio"}))
    msg = p["spec.kvTransfer.backend"]
    assert "ROCm" in msg and "engine.accelerator amd" in msg


def test_moriio_on_rocm_is_accepted():
    validate_service(minimal(kvTransfer={"backend": "moriio"}, engine={"kind": "vllm", "accelerator": "amd", "image": "rocm/vllm:custom"}))


def test_amd_needs_an_image():
    p = problems(minimal(engine={"kind": "vllm", "accelerator": "amd"}))
    assert "ROCm image" in p["spec.engine.image"]


def test_vllm_tp_larger_than_a_node():
    # vLLM replicas span nodes through data parallelism only (tests/unit/test_multinode.py)
    p = problems(minimal(prefill={"tensorParallelSize": 16}, decode={"tensorParallelSize": 16}))
    assert "dataParallelSize must be a multiple of the nodes" in p["spec.prefill.dataParallelSize"]
    assert "dataParallelSize must be a multiple of the nodes" in p["spec.decode.dataParallelSize"]


def test_vllm_tp_times_pp_larger_than_a_node():
    # (on prefill: NixlConnector refuses pipeline parallelism on decode)
    p = problems(minimal(prefill={"tensorParallelSize": 8, "pipelineParallelSize": 2},
                         decode={"tensorParallelSize": 8}))
    assert list(p) == ["spec.prefill.dataParallelSize"]


def test_bigger_nodes_allow_bigger_replicas():
    validate_service(minimal(prefill={"tensorParallelSize": 16}, decode={"tensorParallelSize": 16}, topology={"gpusPerNode": 16}))


def test_no_model():
    obj = minimal()
    del obj["spec"]["model"]
    assert problems(obj) == {"spec.model": "required: set it"}


def test_empty_model_name():
    obj = minimal()
    obj["spec"]["model"]["name"] = ""
    assert "spec.model.name" in problems(obj)


def test_backend_not_supported_by_engine():
    p = problems(minimal("sglang", kvTransfer={"backend": "lmcache"}))
    assert "sglang supports mooncake, nixl" in p["spec.kvTransfer.backend"]


def test_router_must_match_engine():
    p = problems(minimal("sglang", router={"kind": "vllm-router"}))
    assert "vllm-router for vllm, sglang-router for sglang" in p["spec.router.kind"]


def test_unsupported_engine_version():
    p = problems(minimal(engine={"kind": "vllm", "version": "0.6.0"}))
    assert "0.33.0" in p["spec.engine.version"]


def test_gpu_in_resources_is_refused():
    p = problems(minimal(prefill={"resources": {"limits": {"nvidia.com/gpu": 2}}}))
    assert "set those instead" in p["spec.prefill.resources"]


def test_unknown_field_names_the_field():
    p = problems(minimal(router={"polcy": "round_robin"}))
    assert "unknown field" in p["spec.router.polcy"]


def test_bad_enum_names_the_choices():
    p = problems(minimal(topology={"colocate": "always"}))
    assert "'none', 'preferred' or 'required'" in p["spec.topology.colocate"]


def test_wrong_kind_and_version():
    obj = minimal()
    obj["apiVersion"] = "pdserving.io/v1"
    assert "pdserving.io/v1alpha1" in problems(obj)["apiVersion"]


def test_name_too_long_for_children():
    obj = minimal()
    obj["metadata"]["name"] = "x" * 41
    assert "metadata.name" in problems(obj)


def test_secret_literal_env_has_no_valuefrom_mix():
    p = problems(minimal(engine={"kind": "vllm", "env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}))
    assert "set value or valueFrom, not both" in p["spec.engine.env[0]"]


def test_all_problems_reported_at_once():
    p = problems(minimal(prefill={"tensorParallelSize": 6}, decode={"tensorParallelSize": 16}))
    # the TP rule and vLLM's span-nodes-by-DP rule both fail, both reported
    assert "NixlConnector" in p["spec.decode.tensorParallelSize"]
    assert "dataParallelSize must be a multiple of the nodes" in p["spec.decode.dataParallelSize"]


def test_replicas_have_one_writer():
    from pd_operator.api.models import DecodePool

    # autoscaling off: the spec decides; unset keeps the current size
    assert DecodePool(replicas=3).desired_replicas(current=5) == 3
    assert DecodePool().desired_replicas(current=5) == 5
    assert DecodePool().desired_replicas(current=None) == 1
    # autoscaling on: the autoscaler's size (current) stands, within bounds
    auto = {"enabled": True, "minReplicas": 2, "maxReplicas": 6}
    assert DecodePool(replicas=1, autoscaling=auto).desired_replicas(current=5) == 5
    assert DecodePool(replicas=1, autoscaling=auto).desired_replicas(current=9) == 6
    assert DecodePool(replicas=1, autoscaling=auto).desired_replicas(current=None) == 2
    assert DecodePool(replicas=4, autoscaling=auto).desired_replicas(current=None) == 4


@pytest.mark.parametrize("model, field, fix", [
    ({"cache": {"kind": "pvc"}}, "spec.model.cache.claimName", "ReadWriteMany"),
    ({"cache": {"kind": "hostPath"}}, "spec.model.cache.hostPath", "node"),
    ({"cache": {"kind": "hostPath", "hostPath": "relative/dir"}}, "spec.model.cache.hostPath", ""),
    ({"cache": {"kind": "image"}}, "spec.model.cache.reference", "image"),
    ({"cache": {"kind": "pvc", "claimName": "a"}, "source": {"cacheClaimName": "b"}}, "spec.model.source.cacheClaimName", "model.cache"),
    ({"cache": {"kind": "pvc", "claimName": "a"}, "source": {"type": "pvc", "claimName": "w"}}, "spec.model.cache", "source.type pvc"),
    ({"cache": {"kind": "image", "reference": "r:1"}, "source": {"revision": "main"}}, "spec.model.source.revision", "image"),
    ({"startupSeconds": 5}, "spec.model.startupSeconds", ""),
])
def test_model_cache_needs_its_fields(model, field, fix):
    p = problems(minimal(model={"name": "Qwen/Qwen3-8B", **model}))
    assert field in p, p
    assert fix in p[field]


def test_cache_claim_name_is_the_pvc_cache():
    svc = validate_service(minimal(model={"name": "Qwen/Qwen3-8B", "source": {"cacheClaimName": "hf"}}))
    cache = svc.spec.model.effective_cache()
    assert (cache.kind, cache.claim_name) == ("pvc", "hf")
    assert validate_service(minimal()).spec.model.effective_cache().kind == "emptyDir"


def test_sglang_served_name_with_a_colon_is_refused():
    # SGLang 0.5.23 arg_groups/validation_hook.py:213-218 (run by entrypoints/engine.py:1165):
    # ':' is reserved for 'model:adapter'; the engine would fail at start
    p = problems(minimal("sglang", model={"name": "Qwen/Qwen3-8B", "servedName": "qwen3:8b"}))
    assert "reserved for the 'model:adapter' syntax" in p["spec.model.servedName"]
    validate_service(minimal("vllm", model={"name": "Qwen/Qwen3-8B", "servedName": "qwen3:8b"}))  # vLLM takes it
    validate_service(minimal("sglang", model={"name": "Qwen/Qwen3-8B", "servedName": "qwen3-8b"}))


def test_vllm_step_token_budget_below_the_batch_size_is_refused():
    """vLLM 0.33.0 refuses to start when --max-num-batched-tokens is under --max-num-seqs
    (vllm/config/scheduler.py:331-336, SchedulerConfig.verify_max_model_len, run from
    __post_init__): admitted, the pool's engines would crash-loop. With --max-num-seqs unset
    vLLM lowers its default to fit (engine/arg_utils.py:3232-3234), and SGLang has no such check."""
    bad = minimal(decode={"maxBatchedTokens": 128, "maxRunningRequests": 256})
    p = problems(bad)
    assert "max-num-batched-tokens" in p["spec.decode.maxBatchedTokens"]
    assert "spec.prefill.maxBatchedTokens" not in p
    validate_service(minimal(decode={"maxBatchedTokens": 256, "maxRunningRequests": 256}))
    validate_service(minimal(decode={"maxBatchedTokens": 128}))
    validate_service(minimal(decode={"maxRunningRequests": 256}))
    validate_service(minimal("sglang", decode={"maxBatchedTokens": 128, "maxRunningRequests": 256}))
    p = problems(minimal(prefill={"maxBatchedTokens": 16, "maxRunningRequests": 17}))
    assert "max-num-batched-tokens" in p["spec.prefill.maxBatchedTokens"]


def test_vllm_batch_size_above_the_default_step_budget_needs_the_budget_set():
    """With --max-num-batched-tokens unset vLLM 0.33.0 takes 8192 on an H100/H200
    (engine/arg_utils.py get_batch_defaults) and does not raise it to --max-num-seqs
    (_set_default_max_num_seqs_and_batched_tokens_args only lowers it), so more than 8192
    sequences with no budget set is refused by its scheduler config at start."""
    p = problems(minimal(decode={"maxRunningRequests": 8193}))
    assert "spec.decode.maxRunningRequests" in p and "maxBatchedTokens" in p["spec.decode.maxRunningRequests"]
    assert "spec.prefill.maxRunningRequests" not in p
    validate_service(minimal(decode={"maxRunningRequests": 8192}))
    validate_service(minimal(decode={"maxRunningRequests": 10000, "maxBatchedTokens": 10000}))
    validate_service(minimal("sglang", decode={"maxRunningRequests": 10000}))
    # other GPUs have other defaults (B200: 16384): not checked there
    validate_service(minimal(decode={"maxRunningRequests": 10000, "gpuProduct": "NVIDIA-B200"}))
    assert "spec.decode.maxRunningRequests" in problems(minimal(decode={"maxRunningRequests": 10000,
                                                                        "gpuProduct": "NVIDIA-H200"}))
    # batched data-parallel MoE (ParallelConfig.use_batched_dp_moe): 256
    moe = {"tensorParallelSize": 8, "dataParallelSize": 2, "expertParallel": True, "deepepMode": "low_latency"}
    ds = {"name": "deepseek-ai/DeepSeek-V3"}
    validate_service(minimal(model=ds, decode={**moe, "maxRunningRequests": 256}))
    assert "spec.decode.maxRunningRequests" in problems(minimal(model=ds, decode={**moe, "maxRunningRequests": 257}))
    validate_service(minimal(model=ds, decode={**moe, "maxRunningRequests": 300, "maxBatchedTokens": 512}))
    # ... on any GPU (ahead of the GPU's table in arg_utils.py); a MIG slice is not in the H100/H200 tier
    assert "spec.decode.maxRunningRequests" in problems(minimal(model=ds, decode={**moe, "maxRunningRequests": 512,
                                                                                  "gpuProduct": "NVIDIA-B200"}))
    validate_service(minimal(decode={"maxRunningRequests": 10000, "gpuProduct": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"}))


def test_vllm_pools_with_kv_caches_nixl_cannot_match_are_refused():
    """vLLM 0.33.0's NIXL handshake hashes the string of cache_config.cache_dtype
    (kv_connector/v1/nixl/metadata.py compute_nixl_compatibility_hash) and refuses every
    transfer on a mismatch (nixl/base_worker.py): prefill and decode with different
    --kv-cache-dtype are refused when rendered, naming the pool's field. "auto" resolves
    from the checkpoint only (utils/torch_utils.py resolve_kv_cache_dtype_string), so
    "auto" against an FP8 name may match and is let through."""
    from pd_operator.render import render

    def rendered(prefill, decode, **spec):
        render(validate_service(minimal(prefill={"extraArgs": prefill}, decode={"extraArgs": decode}, **spec)))

    with pytest.raises(SpecError) as info:
        rendered([], ["--kv-cache-dtype", "bfloat16"])
    assert "NIXL" in dict(info.value.problems)["spec.decode.extraArgs"]
    with pytest.raises(SpecError) as info:
        rendered(["--kv-cache-dtype=fp8_e5m2"], [], engine={"kind": "vllm", "extraArgs": ["--kv-cache-dtype", "fp8"]})
    assert "spec.prefill.extraArgs" in dict(info.value.problems)
    rendered(["--kv-cache-dtype", "fp8"], ["--kv-cache-dtype", "fp8"])
    rendered([], ["--kv-cache-dtype", "fp8"])
    rendered([], [], engine={"kind": "vllm", "extraArgs": ["--kv-cache-dtype", "fp8_e4m3"]})
    # SGLang's handshake compares the dtype strings (tests/unit/test_sglang_pd_pairing.py); "auto"
    # may resolve to fp8_e4m3 (an FP8 checkpoint), so this pair is let through
    render(validate_service(minimal("sglang", decode={"extraArgs": ["--kv-cache-dtype", "fp8_e4m3"]})))


def test_a_vllm_kv_cache_memory_that_cannot_hold_one_request_is_refused():
    """--kv-cache-memory-bytes is each GPU's KV cache (vLLM 0.33.0 config/cache.py), and vLLM
    refuses to start when it cannot hold one request of the model's max length
    (v1/core/kv_cache_planning.py check_enough_kv_cache_memory). Qwen3-8B holds 144 KiB of
    KV per token on one GPU (36 layers x 8 KV heads x 128 x K and V x 2 bytes): 40960 tokens
    need 5.625 GiB."""
    from pd_operator.render import render

    def rendered(args, model=None, role="decode", **pool):
        spec = minimal(**{role: {"extraArgs": args, **pool}}, **({"model": model} if model else {}))
        render(validate_service(spec))

    assert minimal()["spec"]["model"]["name"] == "Qwen/Qwen3-8B"
    with pytest.raises(SpecError) as info:
        rendered(["--kv-cache-memory-bytes", "5G"])  # vLLM's human_readable_int: G is 2^30
    message = dict(info.value.problems)["spec.decode.extraArgs"]
    assert "5.00 GiB" in message and "40960 tokens" in message and "5.62 GiB" in message
    rendered(["--kv-cache-memory-bytes", "6G"])
    rendered(["--kv-cache-memory-bytes", "5G"], tensorParallelSize=2)         # half the heads per GPU
    rendered(["--kv-cache-memory-bytes", "5G", "--kv-cache-dtype", "fp8"])    # one byte per element
    rendered(["--kv-cache-memory-bytes", "5G"], model={"name": "Qwen/Qwen3-8B", "maxModelLen": 32768})
    with pytest.raises(SpecError):
        rendered(["--kv-cache-memory-bytes", "3G"], model={"name": "Qwen/Qwen3-8B", "maxModelLen": 32768})
    # a model known by its last path component only, or from a volume, may be configured otherwise:
    # its length is not assumed
    rendered(["--kv-cache-memory-bytes", "1G"], model={"name": "/models/Qwen3-8B"})
    rendered(["--kv-cache-memory-bytes", "1G"], model={"name": "Qwen/Qwen3-8B", "source": {"type": "pvc", "claimName": "w"}})
    # a worker holding part of the layers (a pipeline stage) or of the context (context parallelism)
    # needs less: not checked
    with pytest.raises(SpecError) as info:
        rendered(["--kv-cache-memory-bytes", "4G"], role="prefill")
    assert "spec.prefill.extraArgs" in dict(info.value.problems)
    rendered(["--kv-cache-memory-bytes", "4G"], role="prefill", pipelineParallelSize=2)
    with pytest.raises(SpecError):
        rendered(["--kv-cache-memory-bytes", "2G"], tensorParallelSize=2)
    rendered(["--kv-cache-memory-bytes", "2G", "--decode-context-parallel-size", "2"], tensorParallelSize=2)
    # a config rewritten in extraArgs may give another length
    rendered(["--kv-cache-memory-bytes", "4G", "--hf-overrides", '{"max_position_embeddings": 1024}'])


def test_an_sglang_max_total_tokens_that_leaves_no_pool_is_refused():
    """SGLang caps each worker's pool at min(profiled, --max-total-tokens)
    (mem_cache/kv_cache_configurator.py _apply_token_constraints) and refuses to start on an
    empty one (model_executor/pool_configurator.py "Not enough memory"): 0 is refused at
    admission, naming the pool's field, and so is less than one --page-size."""
    from pd_operator.render import render

    with pytest.raises(SpecError) as info:
        render(validate_service(minimal("sglang", prefill={"extraArgs": ["--max-total-tokens", "0"]})))
    message = dict(info.value.problems)["spec.prefill.extraArgs"]
    assert "--max-total-tokens 0" in message and "Not enough memory" in message
    with pytest.raises(SpecError) as info:
        render(validate_service(minimal("sglang", engine={"kind": "sglang", "extraArgs": ["--max-total-tokens=0"]})))
    assert "spec.engine.extraArgs" in dict(info.value.problems)
    render(validate_service(minimal("sglang", decode={"extraArgs": ["--max-total-tokens", "1k"]})))
    # rounded down to whole pages: under one page is none (found by a review)
    with pytest.raises(SpecError) as info:
        render(validate_service(minimal("sglang", decode={"extraArgs": ["--max-total-tokens", "32", "--page-size", "64"]})))
    assert "no page of 64 tokens" in dict(info.value.problems)["spec.decode.extraArgs"]
    # (prefill with the same page: the pools' pages must match, tests/unit/test_sglang_pd_pairing.py)
    render(validate_service(minimal("sglang", prefill={"extraArgs": ["--page-size", "64"]},
                                    decode={"extraArgs": ["--max-total-tokens", "64", "--page-size", "64"]})))


@pytest.mark.parametrize("args,page", [
    # FlashMLA pages by 64 whatever --page-size says (arg_groups/overrides.py
    # _mla_backend_page_constraints), as the decode backend too
    (["--attention-backend", "flashmla"], 64),
    (["--decode-attention-backend", "flashmla", "--page-size", "32"], 64),
    # TRT-LLM MLA keeps 32 or 64, any other becomes 64; TRT-LLM MHA keeps 16..128
    (["--attention-backend", "trtllm_mla", "--page-size", "32"], 32),
    (["--attention-backend", "trtllm_mla", "--page-size", "16"], 64),
    (["--prefill-attention-backend", "trtllm_mha", "--page-size", "16"], 16),
    (["--speculative-draft-attention-backend", "trtllm_mha"], 64),
    (["--prefill-attention-backend", "trtllm_mha", "--page-size", "128"], 128),
    (["--attention-backend", "cutedsl_mla", "--page-size", "32"], 32),
    (["--prefill-attention-backend", "hpc_ops", "--page-size", "16"], 64),
    # in order: trtllm_mha keeps 16, then hpc_ops makes it 64
    (["--page-size", "16", "--prefill-attention-backend", "trtllm_mha", "--attention-backend", "hpc_ops"], 64),
    # the deprecated tokenspeed_mla is cutedsl_mla (serving_hook.py _handle_deprecated_args)
    (["--attention-backend", "tokenspeed_mla"], 64),
    # an NVFP4 KV cache decodes on trtllm_mha (kv_cache_hook.py)
    (["--kv-cache-dtype", "nvfp4", "--page-size", "8"], 64),
    # prefill and decode alike name the backend (overrides.py _attention_backend_default): the
    # flashmla given as --attention-backend is not used, nothing forces the page
    (["--attention-backend", "flashmla", "--prefill-attention-backend", "fa3", "--decode-attention-backend", "fa3"], 1),
    # a backend that forces none: the flag's page (1 without it)
    (["--attention-backend", "fa3"], 1),
])
def test_the_page_an_sglang_attention_backend_forces_bounds_max_total_tokens(args, page):
    from pd_operator.render import render

    def spec(cap: int) -> dict:
        # prefill with the same flags: the pools' pages must match (tests/unit/test_sglang_pd_pairing.py)
        return minimal("sglang", prefill={"extraArgs": args}, decode={"extraArgs": args + ["--max-total-tokens", str(cap)]})

    if page > 1:
        with pytest.raises(SpecError) as info:
            render(validate_service(spec(page - 1)))
        assert f"no page of {page} tokens" in dict(info.value.problems)["spec.decode.extraArgs"]
    render(validate_service(spec(page)))


def test_a_pools_attention_backend_overrides_the_engines_for_its_page():
    from pd_operator.render import render

    obj = minimal("sglang", engine={"kind": "sglang", "extraArgs": ["--attention-backend", "flashmla"]},
                  prefill={"extraArgs": ["--max-total-tokens", "32"]},
                  decode={"extraArgs": ["--attention-backend", "fa3", "--max-total-tokens", "32"]})
    with pytest.raises(SpecError) as info:  # prefill keeps the engine's flashmla: a page of 64
        render(validate_service(obj))
    assert set(dict(info.value.problems)) == {"spec.prefill.extraArgs"}
    obj["spec"]["prefill"]["extraArgs"] = ["--max-total-tokens", "64"]
    with pytest.raises(SpecError) as info:  # and the pools' pages (64, 1) differ: tests/unit/test_sglang_pd_pairing.py
        render(validate_service(obj))
    assert "Page size mismatch" in dict(info.value.problems)["spec.decode.extraArgs"]
