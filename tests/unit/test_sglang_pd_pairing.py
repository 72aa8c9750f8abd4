"""SGLang 0.5.23 prefill/decode pairs that each start but then fail together are refused when
rendered (the webhook renders), naming the field and the fix (tests/contract/FACTS.md,
"SGLang prefill/decode pairs"); the layouts that work are let through."""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from tests.conftest import minimal


def rendered(**spec) -> list[dict]:
    return render(validate_service(minimal("sglang", **spec)))


def refused(**spec) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        rendered(**spec)
    return dict(info.value.problems)


def engine_args(objs: list[dict], role: str) -> list[str]:
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["labels"]["app.kubernetes.io/component"] == role]
    return sts["spec"]["template"]["spec"]["containers"][0]["command"]


H100 = {"gpuProduct": "NVIDIA-H100-80GB-HBM3"}


def test_unequal_kv_pages_are_refused():
    """disaggregation/common/conn.py CommonKVManager.try_ensure_parallel_info: "Page size
    mismatch" at decode's first request; the page as SGLangAdapter.page_size follows it, where
    both pools' pages are known (_known_page)."""
    p = refused(prefill=H100, decode={**H100, "extraArgs": ["--page-size", "64"]})
    assert "Page size mismatch" in p["spec.decode.extraArgs"] and "1 on prefill and 64 on decode" in p["spec.decode.extraArgs"]
    # a page an attention backend forces (flashmla: 64) against --page-size 32 with fa3 named
    p = refused(prefill={"extraArgs": ["--attention-backend", "flashmla"]},
                decode={"extraArgs": ["--page-size", "32", "--attention-backend", "fa3"]})
    assert "64 on prefill and 32 on decode" in p["spec.decode.extraArgs"]
    p = refused(prefill={**H100, "extraArgs": ["--page-size", "16"]}, decode=H100)
    assert "Page size mismatch" in p["spec.prefill.extraArgs"]
    # the same page, however given
    rendered(engine={"kind": "sglang", "extraArgs": ["--page-size", "64"]})
    rendered(prefill={"extraArgs": ["--page-size", "64"]}, decode={"extraArgs": ["--attention-backend", "flashmla"]})
    rendered(prefill={"extraArgs": ["--page-size", "32"]}, decode={"extraArgs": ["--page-size", "32", "--attention-backend", "trtllm_mla"]})


def test_a_page_sglangs_own_backend_may_change_is_not_judged():
    """Where no backend is named SGLang picks one by GPU and model (arg_groups/
    model_override_base.py): fa3 on Hopper keeps the page, but on Blackwell trtllm_mha raises a
    page of 1 to 64 (overrides.py), so decode --page-size 64 alone may match there; without a
    GPU product the operator cannot tell, and lets it through."""
    rendered(decode={"extraArgs": ["--page-size", "64"]})
    b200 = {"gpuProduct": "NVIDIA-B200"}
    rendered(prefill=b200, decode={**b200, "extraArgs": ["--page-size", "64"]})
    # a forced page against a page SGLang's own pick may still move: not judged either
    rendered(prefill={"extraArgs": ["--attention-backend", "flashmla"]}, decode={"extraArgs": ["--page-size", "32"]})


def test_kv_cache_dtypes_that_cannot_match_are_refused():
    """Same function: "KV cache dtype mismatch", a comparison of kv_cache_dtype_str strings.
    "auto" may resolve to fp8_e4m3 (an FP8 checkpoint, mem_cache/kv_cache_dtype.py) or, for a
    model the hooks handle, bfloat16 (DeepSeek DSA), "bf16" to "bfloat16" (DSA): those pairs are
    let through for a model the operator does not know. For Qwen3-8B (known, no hook) "auto"
    stays "auto" against "bfloat16"."""
    p = refused(decode={"extraArgs": ["--kv-cache-dtype", "fp8_e5m2"]})
    assert "KV cache dtype mismatch" in p["spec.decode.extraArgs"] and "auto on prefill and fp8_e5m2" in p["spec.decode.extraArgs"]
    p = refused(engine={"kind": "sglang", "extraArgs": ["--kv-cache-dtype", "fp8_e4m3"]},
                prefill={"extraArgs": ["--kv-cache-dtype", "bfloat16"]})
    assert "KV cache dtype mismatch" in p["spec.prefill.extraArgs"]
    # tokenspeed_mla makes the cache fp8_e4m3 (serving_hook.py _handle_deprecated_args)
    # (and pages by 64 as cutedsl_mla)
    p = refused(prefill={"extraArgs": ["--attention-backend", "tokenspeed_mla"]},
                decode={"extraArgs": ["--kv-cache-dtype", "fp8_e5m2", "--page-size", "64"]})
    assert list(p) == ["spec.decode.extraArgs"] and "KV cache dtype mismatch" in p["spec.decode.extraArgs"]
    rendered(decode={"extraArgs": ["--kv-cache-dtype", "fp8_e4m3"]})
    p = refused(decode={"extraArgs": ["--kv-cache-dtype", "bfloat16"]})
    assert "auto on prefill and bfloat16 on decode" in p["spec.decode.extraArgs"]
    p = refused(prefill={"extraArgs": ["--kv-cache-dtype", "bf16"]}, decode={"extraArgs": ["--kv-cache-dtype", "bfloat16"]})
    assert "bf16 on prefill and bfloat16 on decode" in p["spec.decode.extraArgs"]
    unknown = {"name": "acme/dsa-like"}
    rendered(model=unknown, decode={"extraArgs": ["--kv-cache-dtype", "bfloat16"]})
    rendered(model=unknown, prefill={"extraArgs": ["--kv-cache-dtype", "bf16"]},
             decode={"extraArgs": ["--kv-cache-dtype", "bfloat16"]})
    rendered(engine={"kind": "sglang", "extraArgs": ["--kv-cache-dtype", "fp8_e5m2"]})
    rendered(prefill={"extraArgs": ["--attention-backend", "tokenspeed_mla"]},
             decode={"extraArgs": ["--kv-cache-dtype", "fp8_e4m3", "--page-size", "64"]})


def test_a_decode_pipeline_depth_prefill_lacks_is_refused():
    """_resolve_rank_mapping asserts decode pp_size == prefill pp_size or decode pp_size == 1."""
    p = refused(decode={"pipelineParallelSize": 2})
    assert p["spec.decode.pipelineParallelSize"].endswith("set decode.pipelineParallelSize to 1")
    assert "_resolve_rank_mapping" in p["spec.decode.pipelineParallelSize"]
    p = refused(prefill={"pipelineParallelSize": 2}, decode={"pipelineParallelSize": 4})
    assert p["spec.decode.pipelineParallelSize"].endswith("to 2 or 1")
    rendered(prefill={"pipelineParallelSize": 2}, decode={"pipelineParallelSize": 2})
    rendered(prefill={"pipelineParallelSize": 4})


def test_a_prefill_chunk_that_is_not_whole_pages_is_refused():
    """arg_groups/validation_hook.py check_server_args asserts chunked_prefill_size % page_size
    == 0 outside decode mode, after parallel_hook.py handle_data_parallelism divided it by the
    attention-DP size."""
    paged = {"extraArgs": ["--page-size", "64"]}
    engine = {"kind": "sglang", "extraArgs": ["--page-size", "64"]}
    p = refused(engine=engine, prefill={"maxBatchedTokens": 8100})
    assert "maxBatchedTokens 8100" in p["spec.prefill.maxBatchedTokens"] and "multiple of 64" in p["spec.prefill.maxBatchedTokens"]
    # per attention-DP rank: 8192 / 3 = 2730
    dp3 = {"tensorParallelSize": 3, "dataParallelSize": 3, "dataParallelAttention": True}
    p = refused(engine=engine, prefill={**dp3, "maxBatchedTokens": 8192})
    assert "multiple of 192" in p["spec.prefill.maxBatchedTokens"]
    # unset: every default chunk (2048..16384) / 3 misses the page
    assert "spec.prefill.maxBatchedTokens" in refused(engine=engine, prefill=dp3)
    rendered(engine=engine, prefill={**dp3, "maxBatchedTokens": 8256})
    rendered(engine=engine, prefill={"tensorParallelSize": 4, "dataParallelSize": 4, "dataParallelAttention": True})
    rendered(engine=engine, prefill={"maxBatchedTokens": 8192})
    # decode mode skips the check; --enable-mis turns chunking off
    rendered(engine=engine, decode={**paged, "maxBatchedTokens": 8100})
    rendered(engine=engine, prefill={"maxBatchedTokens": 8100, "extraArgs": ["--enable-mis"]})


def test_decode_prefix_caching_renders_the_decode_radix_cache_flag():
    """arg_groups/pd_disaggregation_hook.py handle_pd_disaggregation: a decode server keeps its
    radix cache only with --disaggregation-decode-enable-radix-cache."""
    flag = "--disaggregation-decode-enable-radix-cache"
    objs = rendered(decode={"enablePrefixCaching": True}, prefill={"enablePrefixCaching": True})
    assert flag in engine_args(objs, "decode") and flag not in engine_args(objs, "prefill")
    for unset_or_off in ({}, {"enablePrefixCaching": False}):
        assert flag not in engine_args(rendered(decode=unset_or_off), "decode")
    # the operator's flag now: extraArgs may not set it
    p = refused(decode={"extraArgs": [flag]})
    assert "set by the operator" in p["spec.decode.extraArgs[0]"]
    # and SGLang refuses it at start next to --enable-hisparse
    p = refused(decode={"enablePrefixCaching": True, "extraArgs": ["--enable-hisparse"]})
    assert "--enable-hisparse" in p["spec.decode.enablePrefixCaching"]
