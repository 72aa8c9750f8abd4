"""What vLLM 0.33.0's NIXL handshake compares between prefill and decode, refused before anything
is created (render/engines/vllm.py ``_check_nixl_pair``; tests/contract/FACTS.md "NIXL
handshake"), and prefill context parallelism, which needs GPUs the pod does not request."""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from pd_operator.perfmodel.engine_defaults import default_attention_backend
from tests.conftest import minimal


def rendered(prefill=(), decode=(), engine=(), backend=None, prefill_pool=None, decode_pool=None, **spec):
    if engine:
        spec["engine"] = {"kind": "vllm", "extraArgs": list(engine)}
    if backend:
        spec["kvTransfer"] = {"backend": backend}
    obj = minimal(prefill={"extraArgs": list(prefill), **(prefill_pool or {})},
                  decode={"extraArgs": list(decode), **(decode_pool or {})}, **spec)
    render(validate_service(obj))


def refused(*args, **kwargs) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        rendered(*args, **kwargs)
    return dict(info.value.problems)


def test_a_model_dtype_named_differently_on_the_pools_is_refused():
    """The hash covers str(model_config.dtype) (nixl/metadata.py): names of one torch dtype
    (config/model.py _STR_DTYPE_TO_TORCH_DTYPE: half = float16) match; "auto" is the checkpoint's
    and is let through."""
    p = refused(["--dtype", "bfloat16"], ["--dtype", "float16"])
    assert "NIXL compatibility hash mismatch" in p["spec.decode.extraArgs"] and "'bfloat16'" in p["spec.decode.extraArgs"]
    rendered(["--dtype", "half"], ["--dtype", "float16"])
    rendered([], ["--dtype", "float16"])
    rendered(["--dtype", "auto"], ["--dtype", "bfloat16"])


def test_an_attention_backend_on_one_pool_only_is_refused_unless_the_other_default_is_known_equal():
    """The hash covers the attention backend's name. One pool naming it and the other left to
    vLLM's choice (by GPU and model) is refused unless the operator knows that choice: a known
    model on a named GPU product (platforms/cuda.py _get_backend_priorities)."""
    p = refused([], ["--attention-backend", "FLASHINFER"])
    assert "FLASHINFER on decode" in p["spec.decode.extraArgs"]
    p = refused(["--attention-backend", "FLASH_ATTN"], ["--attention-backend", "FLASHINFER"])
    assert "spec.decode.extraArgs" in p
    rendered(["--attention-backend", "flash_attn"], ["--attention-backend", "FLASH_ATTN"])  # any case
    rendered(engine=["--attention-backend", "FLASHINFER"])
    rendered(["--attention-backend", "auto"], [])
    # Qwen3-8B (no MLA) on H200: vLLM picks FLASH_ATTN there, so naming it on decode matches
    h200 = {"gpuProduct": "NVIDIA-H200"}
    rendered([], ["--attention-backend", "FLASH_ATTN"], prefill_pool=h200, decode_pool=h200)
    p = refused([], ["--attention-backend", "FLASHINFER"], prefill_pool=h200, decode_pool=h200)
    assert "vLLM's default on its GPU (FLASH_ATTN) on prefill" in p["spec.decode.extraArgs"]


def test_pools_on_gpu_generations_whose_default_backends_differ_are_refused():
    """FLASH_ATTN on Hopper, FLASHINFER on Blackwell (compute capability 10.x) for a model without
    MLA; with MLA, FLASH_ATTN_MLA on 9.x, FLASHINFER_MLA on 10.x, TRITON_MLA on 8.x."""
    p = refused(prefill_pool={"gpuProduct": "NVIDIA-H200"}, decode_pool={"gpuProduct": "NVIDIA-B200"})
    assert "FLASH_ATTN and FLASHINFER" in p["spec.decode.gpuProduct"]
    # the same generation, or one backend named for both
    rendered(prefill_pool={"gpuProduct": "NVIDIA-H100-80GB-HBM3"}, decode_pool={"gpuProduct": "NVIDIA-H200"})
    rendered(engine=["--attention-backend", "FLASHINFER"], prefill_pool={"gpuProduct": "NVIDIA-H200"},
             decode_pool={"gpuProduct": "NVIDIA-B200"})
    # Ampere and Hopper both pick FLASH_ATTN for a model without MLA
    rendered(prefill_pool={"gpuProduct": "NVIDIA-A100-SXM4-80GB"}, decode_pool={"gpuProduct": "NVIDIA-H200"})
    # an unknown product: not judged
    rendered(prefill_pool={"gpuProduct": "NVIDIA-H200"}, decode_pool={"gpuProduct": "ACME-X1"})
    # the product label in nodeSelector is read too, and named
    p = refused(prefill_pool={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
                decode_pool={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB200"}})
    assert "spec.decode.nodeSelector" in p


@pytest.mark.parametrize("product,mla,kv,backend", [
    ("NVIDIA-H200", False, None, "FLASH_ATTN"), ("NVIDIA-H200", True, "auto", "FLASH_ATTN_MLA"),
    ("NVIDIA-B200", False, None, "FLASHINFER"), ("NVIDIA-GB200", True, None, "FLASHINFER_MLA"),
    ("NVIDIA-B300-SXM6-AC", True, None, "FLASHINFER_MLA"), ("NVIDIA-GH200-480GB", True, None, "FLASH_ATTN_MLA"),
    ("NVIDIA-A100-SXM4-80GB", True, None, "TRITON_MLA"), ("NVIDIA-L40S", False, None, "FLASH_ATTN"),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", True, None, "TRITON_MLA"),
    ("NVIDIA-H20", None, None, "FLASH_ATTN or FLASH_ATTN_MLA"),
    ("NVIDIA-A100-PCIE-40GB", None, None, "FLASH_ATTN or TRITON_MLA"),
    # an FP8 KV cache: FLASH_ATTN_MLA takes none (FLASHMLA then, on 9.x), FlashAttention takes it
    # on 9.x only and never as e5m2 (FLASHINFER then)
    ("NVIDIA-H200", True, "fp8", "FLASHMLA"), ("NVIDIA-H200", False, "fp8_e4m3", "FLASH_ATTN"),
    ("NVIDIA-H200", False, "fp8_e5m2", "FLASHINFER"), ("NVIDIA-A100-SXM4-80GB", False, "fp8", "FLASHINFER"),
    ("NVIDIA-H200", True, "fp8_e5m2", None), ("NVIDIA-H200", False, "nvfp4", None),
    ("Tesla-T4", False, None, None), (None, False, None, None),
])
def test_the_default_attention_backend_by_gpu_product(product, mla, kv, backend):
    assert default_attention_backend(product, mla, kv) == backend


def test_fp8_kv_on_ampere_and_hopper_is_refused_and_the_backend_vllm_picks_is_compared():
    """With an FP8 KV cache an A100 pool runs FLASHINFER and an H200 pool FLASH_ATTN; an MLA model
    with FP8 KV runs FLASHMLA on the H200, so naming it on one H200 pool matches the other."""
    fp8 = ["--kv-cache-dtype", "fp8"]
    p = refused(engine=fp8, prefill_pool={"gpuProduct": "NVIDIA-A100-SXM4-80GB"},
                decode_pool={"gpuProduct": "NVIDIA-H200"})
    assert "FLASHINFER and FLASH_ATTN" in p["spec.decode.gpuProduct"]
    h200 = {"gpuProduct": "NVIDIA-H200", "tensorParallelSize": 8}
    rendered([], ["--attention-backend", "FLASHMLA"], fp8, model={"name": "deepseek-ai/DeepSeek-V3"},
             prefill_pool=h200, decode_pool=h200)


def test_an_mla_model_on_ampere_and_hopper_is_refused():
    """DeepSeek-V3 (MLA): FLASH_ATTN_MLA needs compute capability 9.x, so an A100 pool runs
    TRITON_MLA and an H200 pool FLASH_ATTN_MLA."""
    model = {"name": "deepseek-ai/DeepSeek-V3"}
    p = refused(model=model, prefill_pool={"gpuProduct": "NVIDIA-A100-SXM4-80GB", "tensorParallelSize": 8},
                decode_pool={"gpuProduct": "NVIDIA-H200", "tensorParallelSize": 8})
    assert "TRITON_MLA and FLASH_ATTN_MLA" in p["spec.decode.gpuProduct"]


def test_the_hybrid_kv_cache_manager_is_compared_as_vllm_sets_it():
    """is_hma_enabled is hashed. Unset, vLLM decides by connector and model (config/vllm.py): on
    with NixlConnector (SupportsHMA) for a model without chunked local attention, off under the
    lmcache MultiConnector (LMCacheConnectorV1 lacks it); for a model the operator does not know,
    not told."""
    p = refused([], ["--disable-hybrid-kv-cache-manager"])
    assert "on on prefill and off on decode" in p["spec.decode.extraArgs"]
    p = refused(["--enable-hybrid-kv-cache-manager"], ["--disable-hybrid-kv-cache-manager"])
    assert "on on prefill and off on decode" in p["spec.decode.extraArgs"]
    rendered(engine=["--disable-hybrid-kv-cache-manager"])
    rendered([], ["--enable-hybrid-kv-cache-manager"])                  # NIXL: on anyway
    rendered([], ["--disable-hybrid-kv-cache-manager"], backend="lmcache")  # LMCache: off anyway
    p = refused([], ["--enable-hybrid-kv-cache-manager"], model={"name": "acme/unknown-7b"})
    assert "vLLM's choice" in p["spec.decode.extraArgs"]


def test_eagle_family_speculation_on_one_pool_only_is_refused():
    """A speculative method on the target's hidden states (use_eagle: eagle, eagle3, mtp, dflash,
    dspark) enters the hash with its draft; others (ngram, draft_model) do not. vLLM reads a
    *_mtp method as mtp, infers a missing method from the draft's name, and gives the draft the
    target's KV dtype unless it names one (config/speculative.py, nixl/metadata.py)."""
    mtp = '{"method": "mtp", "num_speculative_tokens": 1}'
    p = refused([], ["--speculative-config", mtp])
    assert "none on prefill and method 'mtp' on decode" in p["spec.decode.extraArgs"]
    p = refused([], ["--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}'])
    assert "method 'mtp' on decode" in p["spec.decode.extraArgs"]
    p = refused(["-sc", '{"method": "eagle3", "model": "a/eagle3"}'], ["-sc", '{"method": "eagle3", "model": "b/eagle3"}'])
    assert "model 'a/eagle3' and 'b/eagle3'" in p["spec.decode.extraArgs"]
    p = refused([], ["-sc", '{"model": "yuhuili/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 2}'])
    assert "method 'eagle'" in p["spec.decode.extraArgs"]
    rendered([], ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'])
    rendered(engine=["--speculative-config", mtp])
    rendered(["--speculative-config", mtp], ["--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 3}'])
    # the draft's KV dtype is the target's unless named
    rendered(["-sc", '{"method": "mtp", "kv_cache_dtype": "auto"}'], ["-sc", '{"method": "mtp"}'])
    # a draft whose method only its config tells: not judged
    rendered([], ["-sc", '{"model": "acme/draft-1b", "num_speculative_tokens": 2}'])


def test_a_decode_block_size_not_a_multiple_of_prefills_is_refused():
    """Decode, which pulls, asserts its block size is a multiple of prefill's
    (kv_connector/utils.py block_size_ratio). Unset, a pool's is its backend's (16 for vLLM's
    defaults on the H200, v1/attention/backend.py get_preferred_block_size)."""
    p = refused(["--block-size", "32"], ["--block-size", "16"])
    assert "multiple of prefill's" in p["spec.decode.extraArgs"]
    rendered(["--block-size", "16"], ["--block-size", "32"])
    rendered(engine=["--block-size", "32"])
    # one pool only: the other's is its backend's, when the operator can tell
    h200 = {"gpuProduct": "NVIDIA-H200"}
    p = refused(["--block-size", "32"], [], prefill_pool=h200, decode_pool=h200)
    assert "32 on prefill and vLLM's default (16) on decode" in p["spec.prefill.extraArgs"]
    rendered([], ["--block-size", "32"], prefill_pool=h200, decode_pool=h200)
    p = refused([], ["--block-size", "32"])   # no GPU named: the prefill's backend is not told
    assert "vLLM's default for its backend on prefill" in p["spec.decode.extraArgs"]


def test_a_backend_named_in_the_attention_config_counts():
    """--attention-config '{"backend": ...}' names the backend as --attention-backend does
    (engine/arg_utils.py: the two are mutually exclusive)."""
    p = refused([], ["-ac", '{"backend": "FLASHINFER"}'])
    assert "FLASHINFER on decode" in p["spec.decode.extraArgs"]
    rendered(["--attention-backend", "flashinfer"], ["-ac", '{"backend": "FLASHINFER"}'])


def test_the_lmcache_backend_is_held_to_them_too():
    """Its MultiConnector carries the PD handoff over a NixlConnector child."""
    p = refused([], ["--dtype", "float16"], ["--dtype", "bfloat16"], backend="lmcache")
    assert "--dtype" in p["spec.decode.extraArgs"]


def test_every_mismatch_is_reported_at_once():
    with pytest.raises(SpecError) as info:
        rendered(["--dtype", "bfloat16", "--block-size", "32"], ["--dtype", "float16", "--block-size", "16"])
    messages = [m for f, m in info.value.problems if f == "spec.decode.extraArgs"]
    assert len(info.value.problems) == 2 and "--dtype" in messages[0] and "--block-size" in messages[1]


def test_prefill_context_parallelism_is_refused():
    """vLLM's world size is PP x TP x PCP (config/parallel.py); the pod requests TP x PP x DP GPUs."""
    p = refused(["--prefill-context-parallel-size", "2"])
    assert "spec.prefill.extraArgs" in p and "TP x PP x 2 GPUs" in p["spec.prefill.extraArgs"]
    p = refused(["-pcp", "2"])                  # under its short name too
    assert set(p) == {"spec.prefill.extraArgs"}
    with pytest.raises(SpecError) as info:      # set once for both pools: reported once
        rendered(engine=["-pcp", "2"])
    assert [f for f, _ in info.value.problems] == ["spec.engine.extraArgs"]
    rendered(["--prefill-context-parallel-size", "1"])
