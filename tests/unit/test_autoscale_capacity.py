"""One replica's capacity in the live loop: capacityPerReplica wins, else the
calibrated H200 cost model when it applies, else none (latency feedback only)."""

from __future__ import annotations

import pytest

from pd_operator.api import validate_service
from pd_operator.autoscale.capacity import (
    decode_mean_context,
    decode_tokens_per_s,
    estimate_capacity,
    pool_capacity,
    pool_kv_tokens,
    pool_max_running,
    pool_step_tokens,
    prefill_tokens_per_s,
    replica_cost_model,
)
from pd_operator.perfmodel.engine_defaults import default_max_running, kv_element_bytes
from pd_operator.perfmodel.costmodel import CostModel, Link, shape_for
from pd_operator_tools.enginesim.clock import VirtualClock
from pd_operator_tools.enginesim.engine import Engine, SimRequest
from tests.conftest import minimal

ISL, OSL = 2000.0, 500.0


def svc(kind="vllm", **spec):
    return validate_service(minimal(kind, **spec))


def both(s, isl=ISL, osl=OSL):
    return estimate_capacity(s, "prefill", isl, osl), estimate_capacity(s, "decode", isl, osl)


def _saturated_prefill_tokens_per_s(isl: int, seconds: float = 30.0) -> float:
    """Prompt tokens/s a simulated prefill engine (its own chunked scheduler) computes
    with a queue that never empties."""
    clock = VirtualClock()
    eng = Engine(clock, CostModel(shape=shape_for("Qwen/Qwen3-8B")), "prefill")
    reqs = [eng.add(SimRequest(isl, 1, prefill_only=True)) for _ in range(int(seconds * 100_000 / isl))]
    clock.run(until=seconds)
    return sum(isl for r in reqs if r.first_token is not None and r.first_token <= seconds) / seconds


def _decode_step_s(batch: int, ctx: int) -> float:
    """One decode step of ``batch`` streams at context ``ctx`` on a simulated decode engine."""
    clock = VirtualClock()
    eng = Engine(clock, CostModel(shape=shape_for("Qwen/Qwen3-8B")), "decode", link=Link("instant", 1e9, 0.0),
                 max_num_seqs=max(batch, 1), kv_capacity_tokens=10**9)
    reqs = [eng.add(SimRequest(ctx, 3, kv_transfer=True)) for _ in range(batch)]
    clock.run()
    return sum(sum(r.itls) / len(r.itls) for r in reqs) / batch


def test_default_pool_estimate_agrees_with_the_simulated_engine():
    """The estimate is the headroom share of what a saturated engine does, measured
    on the engine simulator's own scheduler, not recomputed from the formula."""
    s = svc()
    p = estimate_capacity(s, "prefill", ISL, OSL)
    assert p == pytest.approx(0.8 * _saturated_prefill_tokens_per_s(int(ISL)), rel=0.05)
    d = estimate_capacity(s, "decode", ISL, OSL)
    ctx = int(decode_mean_context(ISL, OSL, 0.6))
    batch = max(b for b in range(1, 257) if _decode_step_s(b, ctx) <= 0.05)  # the largest batch within 50 ms
    assert d == pytest.approx(0.85 * batch / _decode_step_s(batch, ctx), rel=0.05)
    assert pool_capacity(s, "prefill", ISL, OSL).source == "cost model"


def test_unknown_model_has_no_estimate():
    assert both(svc(model={"name": "acme/secret-model-13b"})) == (None, None)


@pytest.mark.parametrize("placement", [
    {"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
])
def test_other_gpus_have_no_estimate(placement):
    assert both(svc(prefill=placement, decode=placement)) == (None, None)


def test_h200_by_product_or_node_label_is_estimated():
    by_product = svc(prefill={"gpuProduct": "NVIDIA-H200"}, decode={"gpuProduct": "NVIDIA-H200"})
    by_label = svc(prefill={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}})
    assert both(by_product) == both(svc())
    assert estimate_capacity(by_label, "prefill", ISL, OSL) == estimate_capacity(svc(), "prefill", ISL, OSL)


def test_amd_has_no_estimate():
    s = svc(engine={"kind": "vllm", "accelerator": "amd", "image": "rocm/vllm:latest"})
    assert both(s) == (None, None)


def test_more_tensor_parallelism_serves_more_per_replica():
    tp1 = both(svc(prefill={"tensorParallelSize": 1}, decode={"tensorParallelSize": 1}))
    tp2 = both(svc(prefill={"tensorParallelSize": 2}, decode={"tensorParallelSize": 2}))
    assert tp2[0] > tp1[0] and tp2[1] > tp1[1]


def test_data_parallel_ranks_add_up_and_pipeline_parallelism_is_not_modelled():
    dp1, dp2 = both(svc()), both(svc(prefill={"dataParallelSize": 2}, decode={"dataParallelSize": 2}))
    assert dp2 == (pytest.approx(2 * dp1[0]), pytest.approx(2 * dp1[1]))
    # vLLM NIXL takes pipeline parallelism on prefill only (tests/contract/FACTS.md)
    assert estimate_capacity(svc(prefill={"pipelineParallelSize": 2}), "prefill", ISL, OSL) is None


def test_override_wins():
    pool = {"autoscaling": {"capacityPerReplica": 12345.0}}
    s = svc(model={"name": "acme/secret-model-13b"}, prefill=pool, decode=pool)
    assert both(s, None, None) == (12345.0, 12345.0)  # no model, no lengths: the override still holds
    assert pool_capacity(s, "decode", None, None).source == "capacityPerReplica"


def test_no_lengths_no_estimate():
    s = svc()
    assert estimate_capacity(s, "prefill", None, None) is None        # idle: no requests in the window
    assert estimate_capacity(s, "prefill", ISL, None) is not None      # prefill needs the ISL only
    assert estimate_capacity(s, "decode", ISL, None) is None           # decode needs the context: ISL and OSL
    assert estimate_capacity(s, "decode", 0.0, OSL) is None


def test_decode_capacity_follows_context_itl_target_and_batch_limits():
    base = estimate_capacity(svc(), "decode", ISL, OSL)
    assert estimate_capacity(svc(), "decode", 8 * ISL, OSL) < base        # longer contexts: slower steps
    tight = svc(decode={"autoscaling": {"target": {"value": "20ms"}}})
    assert estimate_capacity(tight, "decode", ISL, OSL) < base            # a tighter ITL target: smaller batches
    capped = svc(decode={"maxRunningRequests": 8})
    assert estimate_capacity(capped, "decode", ISL, OSL) < base           # the engine's batch limit


def test_steady_capacity_takes_the_headroom_on_the_batch_where_the_slots_bind():
    """Decode at a steady demand (decide's rule 3e): 0.85 of the 256 slots, h / step(h) on the
    simulated engine, above 0.85 of the full batch's throughput; none where the KV cache or
    the ITL target binds before the slots (their tokens vary more than their count)."""
    slots = {"maxRunningRequests": 256}
    cap = pool_capacity(svc(decode=slots), "decode", ISL, OSL)
    ctx = int(decode_mean_context(ISL, OSL, 0.6))
    assert _decode_step_s(256, ctx) <= 0.05  # the slots bind here
    held = int(0.85 * 256)
    assert cap.steady == pytest.approx(held / _decode_step_s(held, ctx), rel=0.05)
    assert cap.steady > 1.05 * cap.per_replica
    assert pool_capacity(svc(decode={"maxRunningRequests": 8}), "decode", ISL, OSL).steady is not None
    tight = svc(decode={**slots, "autoscaling": {"target": {"value": "15ms"}}})
    assert pool_capacity(tight, "decode", ISL, OSL).steady is None        # the ITL target binds
    assert pool_capacity(svc(decode=slots), "decode", 30 * ISL, OSL).steady is None    # the KV cache binds
    # vLLM's own limit on an H200, 1024: the KV cache holds fewer at this context
    assert pool_capacity(svc(), "decode", ISL, OSL).steady is None
    assert pool_capacity(svc(decode=slots), "prefill", ISL, OSL).steady is None


def test_an_unset_batch_limit_is_the_engines_own_default_on_the_h200():
    """vLLM 0.33.0's API server on a >= 70 GiB GPU defaults to 1024 sequences, cut to the
    batched tokens; SGLang 0.5.23 derives its limit from the KV pool (tests/contract/FACTS.md)."""
    assert default_max_running("vllm", 10**6, 40960) == 1024
    assert default_max_running("vllm", 10**6, 40960, max_batched_tokens=512) == 512
    assert default_max_running("sglang", 900_000, 40960) == 4096             # 900k / 40960 x 512 = 11k, held at 4096
    assert default_max_running("sglang", 100_000, 40960) == 2048             # 1250, held at 2048
    assert default_max_running("sglang", 3000, 40960) == 1500                # at most half the KV tokens
    for kind in ("vllm", "sglang"):
        cost = replica_cost_model(svc(kind).spec, "decode")
        limit = pool_max_running(svc(kind).spec, "decode", cost)
        assert limit == default_max_running(kind, cost.kv_capacity_tokens(), cost.shape.max_model_len)
        unset = pool_capacity(svc(kind), "decode", ISL, OSL).per_replica
        assert unset == pool_capacity(svc(kind, decode={"maxRunningRequests": limit}), "decode", ISL, OSL).per_replica
        # the KV cache, not 256 slots, bounds the batch at this context: more than with 256
        assert unset > pool_capacity(svc(kind, decode={"maxRunningRequests": 256}), "decode", ISL, OSL).per_replica


def test_vllm_throughput_mode_in_extra_args_is_the_engines_batch_limit():
    """--performance-mode throughput doubles vLLM's unset batch limits (2048 sequences, 16384
    batched tokens on an H200: tests/contract/FACTS.md); the capacity reads the flag as the
    engine does, from spec.engine.extraArgs then the pool's (the last wins)."""
    fast = {"extraArgs": ["--performance-mode", "throughput"]}
    spec = svc(decode=fast, prefill=fast).spec
    cost = replica_cost_model(spec, "decode")
    assert pool_max_running(spec, "decode", cost) == 2048
    assert pool_step_tokens(spec, "prefill") == 16384
    assert pool_step_tokens(svc().spec, "prefill") == 8192
    assert pool_step_tokens(svc(prefill={"maxBatchedTokens": 4096, **fast}).spec, "prefill") == 4096
    both_ways = svc(engine={"kind": "vllm", "extraArgs": ["--performance-mode=throughput"]},
                    decode={"extraArgs": ["--performance-mode", "balanced"]}).spec
    assert pool_step_tokens(both_ways, "prefill") == 16384
    assert pool_max_running(both_ways, "decode", cost) == 1024
    # where the slots bind (short contexts), the doubled limit is more capacity
    assert (pool_capacity(svc(decode=fast), "decode", 200.0, 100.0).per_replica
            > pool_capacity(svc(), "decode", 200.0, 100.0).per_replica)


def test_vllm_step_budget_follows_the_layout_and_chunked_prefill():
    """vLLM 0.33.0's unset step budget is 256 with batched data-parallel MoE (deepepMode
    low_latency, expert parallelism, DP above 1: ParallelConfig.use_batched_dp_moe), which
    also cuts the unset batch to 256; with chunked prefill turned off it is at least the
    context length (engine/arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args)."""
    moe = svc(model={"name": "deepseek-ai/DeepSeek-V3"},
              decode={"tensorParallelSize": 8, "dataParallelSize": 2, "expertParallel": True,
                      "deepepMode": "low_latency"}).spec
    assert pool_step_tokens(moe, "decode") == 256
    cost = replica_cost_model(moe, "decode")
    assert cost is not None and pool_max_running(moe, "decode", cost) == 256
    normal = svc(model={"name": "deepseek-ai/DeepSeek-V3"},
                 decode={"tensorParallelSize": 8, "dataParallelSize": 2, "expertParallel": True,
                         "deepepMode": "normal"}).spec
    assert pool_step_tokens(normal, "decode") == 8192
    off = svc(prefill={"extraArgs": ["--no-enable-chunked-prefill"]}).spec
    assert pool_step_tokens(off, "prefill") == shape_for("Qwen/Qwen3-8B").max_model_len
    assert pool_step_tokens(svc(model={"name": "Qwen/Qwen3-8B", "maxModelLen": 16384},
                                prefill={"extraArgs": ["--disable-chunked-prefill"]}).spec, "prefill") == 16384
    assert pool_step_tokens(off, "decode") == 8192


def test_the_kv_cache_dtype_of_extra_args_sizes_the_kv_bound():
    """--kv-cache-dtype in extraArgs (the engine's, then the pool's: the last wins): a plain
    FP8 cache holds twice the tokens, so a decode pool bound by its KV cache carries more; a
    layout the cost model does not model (packed 4-bit, an FP8 MLA latent) has no estimate
    rather than the bf16 one."""
    fp8 = {"extraArgs": ["--kv-cache-dtype", "fp8"]}
    plain = replica_cost_model(svc().spec, "decode")
    packed = replica_cost_model(svc(decode=fp8).spec, "decode")
    assert packed.kv_capacity_tokens() == pytest.approx(2 * plain.kv_capacity_tokens(), rel=1e-6)
    # 6000-token contexts: the KV cache, not the slots, bounds the batch
    assert (pool_capacity(svc(decode=fp8), "decode", 4000.0, 2000.0).per_replica
            > 1.5 * pool_capacity(svc(), "decode", 4000.0, 2000.0).per_replica)
    assert replica_cost_model(svc(decode=fp8).spec, "prefill").kv_capacity_tokens() == plain.kv_capacity_tokens()
    undone = svc(engine={"kind": "vllm", "extraArgs": ["--kv-cache-dtype=fp8"]},
                 decode={"extraArgs": ["--kv-cache-dtype", "auto"]}).spec
    assert replica_cost_model(undone, "decode").kv_capacity_tokens() == plain.kv_capacity_tokens()
    assert replica_cost_model(undone, "prefill").kv_capacity_tokens() == packed.kv_capacity_tokens()
    assert pool_capacity(svc(decode={"extraArgs": ["--kv-cache-dtype", "nvfp4"]}), "decode", ISL, OSL) is None
    assert kv_element_bytes("vllm", "fp8", 2, mla=True) is None  # vLLM's MLA FP8 caches have their own layouts
    assert (replica_cost_model(svc("sglang", decode={"extraArgs": ["--kv-cache-dtype", "fp8_e4m3"]}).spec,
                               "decode").kv_capacity_tokens()
            == pytest.approx(2 * replica_cost_model(svc("sglang").spec, "decode").kv_capacity_tokens(), rel=1e-6))


def test_weights_that_do_not_fit_have_no_estimate():
    # Llama-3.1-70B (141 GB of weights) fits one H200 at full memory, not at half of it
    big = {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}}
    assert both(svc(**big))[0] is not None
    half = {"gpuMemoryUtilization": 0.5}
    assert both(svc(**big, prefill=half, decode=half)) == (None, None)
    # at full memory ~20k KV tokens are left: 9 contexts of 2250 fit where the ITL target allows 59
    itl_bound = decode_tokens_per_s(CostModel(shape=shape_for(big["model"]["name"])), decode_mean_context(ISL, OSL))
    assert estimate_capacity(svc(**big), "decode", ISL, OSL) < itl_bound / 2
    assert estimate_capacity(svc(**big), "decode", 40_000.0, OSL) is None  # not one context fits


def test_wide_ep_layouts_count_each_engine_once():
    # SGLang attention DP: one engine whose DP ranks share the TP GPUs and split its batch;
    # vLLM DP: DP engines of TP GPUs each, side by side (what the simulated engines build
    # from the rendered commands, enginesim config_from_argv)
    import yaml

    from pd_operator.api import validate_service
    from pd_operator.autoscale.capacity import pool_cost_model
    from pd_operator.perfmodel.costmodel import shape_for
    from tests.conftest import ROOT as REPO

    sg = validate_service(yaml.safe_load((REPO / "manifests/examples/deepseek-wide-ep.yaml").read_text()))
    cost, ranks = pool_cost_model(shape_for(sg.spec.model.name), "sglang", sg.spec.decode)
    assert ranks == 1 and (cost.tp, cost.dp, cost.ep) == (32, 32, 32)
    assert estimate_capacity(sg, "prefill", ISL, OSL) > 0 and estimate_capacity(sg, "decode", ISL, OSL) > 0
    vl = validate_service(yaml.safe_load((REPO / "manifests/examples/deepseek-wide-ep-vllm.yaml").read_text()))
    pool = vl.spec.decode
    cost, ranks = pool_cost_model(shape_for(vl.spec.model.name), "vllm", pool)
    assert ranks == pool.data_parallel_size and cost.tp == pool.tensor_parallel_size
    assert cost.ep == pool.tensor_parallel_size * pool.data_parallel_size


def test_an_output_spread_read_below_the_mean_is_taken_at_the_mean():
    """E[OSL^2] / E[OSL] >= E[OSL]. SGLang's default output-length buckets start at
    (0, 100] (metrics_collector.py, default_bucket_prompt_tokens): outputs of 80 tokens
    all read as the bucket's geometric middle, 10, a length bias below the mean that
    would put the running context short of what it is."""
    from pd_operator.autoscale.capacity import length_bias

    sglang_buckets = [(100.0, 50.0), (300.0, 50.0), (500.0, 50.0), (float("inf"), 50.0)]
    bias = length_bias(sglang_buckets)
    assert bias == pytest.approx(10.0)                                 # what the buckets say
    osl = 80.0
    long_isl = 30000.0
    read = estimate_capacity(svc(), "decode", long_isl, osl, osl_bias=bias)
    assert read == estimate_capacity(svc(), "decode", long_isl, osl, osl_bias=osl)     # at the mean instead


def test_the_kv_cache_size_flags_of_extra_args_size_the_kv_bound():
    """vLLM's --kv-cache-memory-bytes is the KV memory of each GPU (in place of what
    gpuMemoryUtilization leaves), SGLang's --max-total-tokens caps each worker's pool, never
    raising it (tests/contract/FACTS.md, "KV cache size"); vLLM's --num-gpu-blocks-override
    counts blocks of --block-size tokens or of the attention backend's size (16 for the H200's
    default backends, 64 for FLASHMLA); under a backend whose size is not known, no estimate
    rather than the one of the memory it no longer uses."""
    shape = replica_cost_model(svc().spec, "decode").shape
    small = svc(decode={"extraArgs": ["--kv-cache-memory-bytes", "20G"]})  # vLLM: G is 2^30
    cost = replica_cost_model(small.spec, "decode")
    assert pool_kv_tokens(small.spec, "decode", cost) == 20 * 2 ** 30 // shape.kv_bytes_per_token
    tp2 = svc(decode={"tensorParallelSize": 2, "extraArgs": ["--kv-cache-memory-bytes", "20G"]})
    assert pool_kv_tokens(tp2.spec, "decode", replica_cost_model(tp2.spec, "decode")) == 2 * 20 * 2 ** 30 // shape.kv_bytes_per_token
    # long contexts: the KV cache bounds the batch, and 20 GiB holds fewer streams than the default
    assert (pool_capacity(small, "decode", 4000.0, 2000.0).per_replica
            < 0.8 * pool_capacity(svc(), "decode", 4000.0, 2000.0).per_replica)
    # the prefill pool's KV is its own
    assert pool_kv_tokens(small.spec, "prefill", cost) == pool_kv_tokens(svc().spec, "prefill", cost)
    blocks = svc(decode={"extraArgs": ["--num-gpu-blocks-override", "4096"]}).spec
    assert pool_kv_tokens(blocks, "decode", replica_cost_model(blocks, "decode")) == 4096 * 16
    assert pool_kv_tokens(blocks, "prefill", cost) == pool_kv_tokens(svc().spec, "prefill", cost)
    sized = svc(decode={"extraArgs": ["--num-gpu-blocks-override", "4096", "--block-size", "64"]}).spec
    assert pool_kv_tokens(sized, "decode", replica_cost_model(sized, "decode")) == 4096 * 64
    # 65 536 tokens bound the batch well under the memory's (~900k)
    assert (pool_capacity(svc(decode={"extraArgs": ["--num-gpu-blocks-override", "4096"]}), "decode", 4000.0,
                          2000.0).per_replica < 0.5 * pool_capacity(svc(), "decode", 4000.0, 2000.0).per_replica)
    assert pool_capacity(svc(decode={"extraArgs": ["--num-gpu-blocks-override", "4096", "--attention-backend",
                                                   "TREE_ATTN"]}), "decode", ISL, OSL) is None
    sgl = svc("sglang").spec
    plain = pool_kv_tokens(sgl, "decode", replica_cost_model(sgl, "decode"))
    capped = svc("sglang", decode={"extraArgs": ["--max-total-tokens", "100k"]}).spec
    assert pool_kv_tokens(capped, "decode", replica_cost_model(capped, "decode")) == 100_000
    # unset, SGLang's batch limit comes from its KV pool (engine_defaults.default_max_running)
    assert pool_max_running(capped, "decode", replica_cost_model(capped, "decode")) < pool_max_running(
        sgl, "decode", replica_cost_model(sgl, "decode"))
    above = svc("sglang", decode={"extraArgs": ["--max-total-tokens", "100M"]}).spec
    assert pool_kv_tokens(above, "decode", replica_cost_model(above, "decode")) == plain


def test_kv_heads_are_replicated_past_the_tensor_parallel_size():
    """Each GPU holds max(1, KV heads // TP) heads (get_num_kv_heads in both engines): Qwen3-8B's
    8 KV heads over 16 GPUs are two copies, so 16 GPUs hold the tokens 8 do, not twice them."""
    s = shape_for("Qwen/Qwen3-8B")
    per_gpu_token = s.layers * 1 * s.head_dim * 2 * s.dtype_bytes  # one KV head per GPU at TP 8 and 16
    gib20 = 20 * 2 ** 30
    assert CostModel(shape=s, tp=8).kv_capacity_tokens(kv_bytes_per_gpu=gib20) == gib20 // per_gpu_token
    assert CostModel(shape=s, tp=16).kv_capacity_tokens(kv_bytes_per_gpu=gib20) == gib20 // per_gpu_token
    assert CostModel(shape=s, tp=4).kv_capacity_tokens(kv_bytes_per_gpu=gib20) == 4 * gib20 // s.kv_bytes_per_token
    # attention data parallelism: two ranks of 16 GPUs, each holding what 8 hold
    assert CostModel(shape=s, tp=32, dp=2).kv_capacity_tokens(kv_bytes_per_gpu=gib20) == 2 * (gib20 // per_gpu_token)
    # each GPU reads and sends its one head per token, as at TP 8
    eight, sixteen, link = CostModel(shape=s, tp=8), CostModel(shape=s, tp=16), Link("test", 10.0, 0.0)
    assert sixteen.transfer_ms(4096, link) == pytest.approx(eight.transfer_ms(4096, link))
    assert CostModel(shape=s, tp=4).transfer_ms(4096, link) == pytest.approx(2 * eight.transfer_ms(4096, link))
    assert sixteen._kv == pytest.approx(eight._kv)
