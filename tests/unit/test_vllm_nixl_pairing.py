"""What vLLM 0.33.0's NIXL handshake compares between prefill and decode, refused before anything
is created (render/engines/vllm.py ``_check_nixl_pair``; tests/contract/FACTS.md "NIXL
handshake"), and prefill context parallelism, which needs GPUs the pod does not request."""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from pd_operator.render.engines.vllm import default_attention_backend
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
    assert "vLLM's default for its GPU and model on prefill" in p["spec.decode.extraArgs"]


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


@pytest.mark.parametrize("product,mla,backend", [
    ("NVIDIA-H200", False, "FLASH_ATTN"), ("NVIDIA-H200", True, "FLASH_ATTN_MLA"),
    ("NVIDIA-B200", False, "FLASHINFER"), ("NVIDIA-GB200", True, "FLASHINFER_MLA"),
    ("NVIDIA-B300-SXM6-AC", True, "FLASHINFER_MLA"), ("NVIDIA-GH200-480GB", True, "FLASH_ATTN_MLA"),
    ("NVIDIA-A100-SXM4-80GB", True, "TRITON_MLA"), ("NVIDIA-L40S", False, "FLASH_ATTN"),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", True, "TRITON_MLA"),
    ("NVIDIA-H20", None, "FLASH_ATTN or FLASH_ATTN_MLA"), ("NVIDIA-A100-PCIE-40GB", None, "FLASH_ATTN or TRITON_MLA"),
    ("Tesla-T4", False, None), (None, False, None),
])
def test_the_default_attention_backend_by_gpu_product(product, mla, backend):
    assert default_attention_backend(product, mla) == backend


def test_an_mla_model_on_ampere_and_hopper_is_refused():
    """DeepSeek-V3 (MLA): FLASH_ATTN_MLA needs compute capability 9.x, so an A100 pool runs
    TRITON_MLA and an H200 pool FLASH_ATTN_MLA."""
    model = {"name": "deepseek-ai/DeepSeek-V3"}
    p = refused(model=model, prefill_pool={"gpuProduct": "NVIDIA-A100-SXM4-80GB", "tensorParallelSize": 8},
                decode_pool={"gpuProduct": "NVIDIA-H200", "tensorParallelSize": 8})
    assert "TRITON_MLA and FLASH_ATTN_MLA" in p["spec.decode.gpuProduct"]


def test_the_hybrid_kv_cache_manager_set_on_one_pool_only_is_refused():
    """is_hma_enabled is hashed; left unset, vLLM decides by connector and model (config/vllm.py)."""
    p = refused([], ["--disable-hybrid-kv-cache-manager"])
    assert "off on decode" in p["spec.decode.extraArgs"]
    p = refused(["--enable-hybrid-kv-cache-manager"], ["--disable-hybrid-kv-cache-manager"])
    assert "on on prefill and off on decode" in p["spec.decode.extraArgs"]
    rendered(engine=["--disable-hybrid-kv-cache-manager"])
    rendered(["--no-disable-hybrid-kv-cache-manager"], ["--enable-hybrid-kv-cache-manager"])


def test_eagle_family_speculation_on_one_pool_only_is_refused():
    """A speculative method on the target's hidden states (use_eagle: eagle, eagle3, mtp, dflash,
    dspark) enters the hash with its draft; others (ngram, draft_model) do not."""
    mtp = '{"method": "mtp", "num_speculative_tokens": 1}'
    p = refused([], ["--speculative-config", mtp])
    assert "method 'mtp' on decode" in p["spec.decode.extraArgs"]
    p = refused(["-sc", '{"method": "eagle3", "model": "a/eagle3"}'], ["-sc", '{"method": "eagle3", "model": "b/eagle3"}'])
    assert "spec.decode.extraArgs" in p
    rendered([], ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'])
    rendered(engine=["--speculative-config", mtp])
    # the number of tokens is not hashed
    rendered(["--speculative-config", mtp], ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'])


def test_a_decode_block_size_not_a_multiple_of_prefills_is_refused():
    """Decode, which pulls, asserts its block size is a multiple of prefill's
    (kv_connector/utils.py block_size_ratio)."""
    p = refused(["--block-size", "32"], ["--block-size", "16"])
    assert "multiple of prefill's" in p["spec.decode.extraArgs"]
    rendered(["--block-size", "16"], ["--block-size", "32"])
    rendered(engine=["--block-size", "32"])


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
    p = refused(engine=["-pcp", "2"])
    assert "spec.engine.extraArgs" in p
    rendered(["--prefill-context-parallel-size", "1"])
