"""Per-replica capacity at the latency targets, from the calibrated cost model (pure).

These feed the model floor of :func:`~pd_operator.autoscale.decide.decide`
(``Signal.capacity``, in the unit of ``Signal.demand``):

* prefill, prompt tokens/s: a saturated prefill instance runs full steps of
  ``max_batched_tokens`` tokens (chunked prefill), each costing the fixed term,
  the linear term and the attention term of its prompts (``mean_isl`` long);
  throughput = tokens / step time.  Held at ``utilization`` (default 0.8) of
  that, so the queue -- and the TTFT quantile -- stays bounded;
* decode, generated tokens/s: the batch ``B`` whose step time at the mean
  context reaches the ITL target, capped by ``max_num_seqs`` and the KV cache;
  held at ``utilization`` (default 0.85) of ``B / step(B)`` so requests are not
  kept waiting for a slot (waiting for a decode slot is TTFT, invisible to
  ITL). Under a steady demand, when the slots (``max_num_seqs``) bind rather
  than the KV cache or the ITL target, the same 0.85 is taken on the batch
  instead, ``0.85 B / step(0.85 B)`` (``Capacity.steady``): the throughput is
  concave in the batch, and 85 % of it leaves half the slots empty.

The mean context of a running decode is length-biased: a request is seen in
proportion to its output length, so ``E[ctx] = ISL + E[OSL^2] / (2 E[OSL])``
(= ISL + OSL/2 * exp(sigma^2) for a lognormal OSL).

In the operator, :func:`pool_capacity` picks the capacity of one replica of a
pool: the pool's ``autoscaling.capacityPerReplica`` when set; else the cost
model at the observed mean ISL/OSL, when it applies (a model whose shape is
known, NVIDIA H200 or no GPU constraint, no pipeline parallelism, weights
that fit); else none, and the pool is sized on latency feedback alone.  With
no ISL/OSL (an idle pool: no requests in the window) there is no estimate
either: guessing lengths could only put a wrong floor under the pool, and an
idle pool has no demand to floor.  Decode capacity is in generated tokens/s,
the unit of :func:`~pd_operator.autoscale.promql.demand_query`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..api.models import PDInferenceService, PDInferenceServiceSpec, PoolSpec, duration_seconds
from ..perfmodel.costmodel import CostModel, shape_for
from ..perfmodel.engine_defaults import (default_attention_backend, default_max_running, kv_element_bytes, kv_tokens,
                                        vllm_attention_backend, vllm_block_size, vllm_step_tokens)
from ..render.args import user_engine_flag

CALIBRATED_GPU = "H200"            # the GPU the cost model is calibrated on
DEFAULT_MAX_BATCHED_TOKENS = 8192  # the engines' step token budget when the pool sets none
CALIBRATED_MEMORY_FRACTION = 0.92  # the cost model's usable memory is at vLLM's default utilization
# Headroom of the capacity estimate: a replica is loaded to this share of what it sustains at the target.
PREFILL_UTILIZATION = 0.8
DECODE_UTILIZATION = 0.85
# vLLM's request_tokens histogram family: 1-2-5 bucket edges up to max_model_len
# (vllm/v1/metrics/buckets.py, build_1_2_5_buckets); used to estimate the spread of
# output lengths (length_bias) and the share of prompts too long for the TTFT target
# (share_longer).


def length_bias(buckets: list[tuple[float, float]]) -> float | None:
    """``E[OSL^2] / E[OSL]`` from a histogram of output lengths (Prometheus' cumulative
    ``(le, count)`` pairs, e.g. the rate of ``vllm:request_generation_tokens_bucket``): each
    bucket's requests taken at the geometric middle of the bucket (the lower edge of the
    first is 1, the +Inf bucket at its lower edge). The mean context of a running decode is
    ``ISL + E[OSL^2] / (2 E[OSL])`` (module docstring): a wide spread of lengths means long
    streams dominate what is running. None without counts."""
    pts = sorted((le, c) for le, c in buckets if c == c)
    prev_le, prev_c = 0.0, 0.0
    m1 = m2 = 0.0
    for le, c in pts:
        n = c - prev_c
        if n > 0:
            if math.isinf(le):
                x = max(prev_le, 1.0)
            else:
                x = math.sqrt(max(prev_le, 1.0) * le)
            m1 += n * x
            m2 += n * x * x
        prev_le, prev_c = le, max(prev_c, c)
    return m2 / m1 if m1 > 0 else None


def prefill_tokens_per_s(cost: CostModel, mean_isl: float, max_batched_tokens: int = 8192,
                         utilization: float = 0.8, cached_share: float = 0.0) -> float:
    """Prompt tokens/s one prefill engine sustains in full chunked-prefill steps of
    ``max_batched_tokens``, times ``utilization``. ``cached_share`` of each prompt's tokens
    come from a prefix cache: only the rest is computed (attending over the cached prefix),
    so a step holds more prompts and the same engine serves more prompt tokens/s (the
    demand, ``prompt_tokens_total``, counts the cached tokens too)."""
    n = max_batched_tokens
    share = min(1.0, max(0.0, cached_share or 0.0))
    computed = max(1.0, mean_isl * (1 - share))  # the engine computes at least a prompt's last token
    chunk = min(computed, n)
    prompts = max(1.0, n / computed)
    step_ms = cost.prefill_fixed_ms() + prompts * cost.prefill_chunk_ms(int(mean_isl - computed), int(chunk))
    # a step computes n tokens (prompts x chunk), of prompts mean_isl / computed times as long
    return utilization * n * (mean_isl / computed) / (step_ms / 1e3)


def decode_mean_context(mean_isl: float, mean_osl: float, osl_sigma: float = 0.0,
                        osl_bias: float | None = None) -> float:
    """``ISL + E[OSL^2] / (2 E[OSL])``: with ``osl_bias`` (= E[OSL^2]/E[OSL], observed) when
    given, else for a lognormal OSL of spread ``osl_sigma``."""
    if osl_bias is not None:
        return mean_isl + osl_bias / 2
    return mean_isl + mean_osl / 2 * math.exp(osl_sigma ** 2)


def decode_streams(cost: CostModel, mean_ctx: float, itl_target: float = 0.05, max_num_seqs: int = 256,
                   utilization: float = 0.85) -> float:
    b = 1
    while b < max_num_seqs and cost.decode_uniform_ms(b + 1, int(mean_ctx)) / 1e3 <= itl_target:
        b += 1
    return utilization * b


def decode_tokens_per_s(cost: CostModel, mean_ctx: float, itl_target: float = 0.05, max_num_seqs: int = 256,
                        utilization: float = 0.85) -> float:
    """Generation tokens/s one decode replica sustains with its step time within the ITL target:
    ``B / step(B)`` at the largest such batch ``B`` (<= max_num_seqs), times ``utilization``.
    Unlike running streams, this demand unit does not depend on the pool size (streams =
    tokens/s x ITL, and the ITL falls when the pool grows)."""
    b = decode_streams(cost, mean_ctx, itl_target, max_num_seqs, utilization=1.0)
    return utilization * b / (cost.decode_uniform_ms(int(b), int(mean_ctx)) / 1e3)


def decode_tokens_per_s_steady(cost: CostModel, mean_ctx: float, itl_target: float = 0.05,
                               max_num_seqs: int = 256, utilization: float = 0.85) -> float:
    """Generation tokens/s one decode replica sustains with ``utilization`` of its batch
    held free instead of its throughput: ``h / step(h)`` at ``h = utilization x B``.
    Throughput is concave in the batch (the step's fixed part is shared), so 85 % of the
    throughput at ``B`` is reached near half the batch (the reference mix on an H200: 6.1k
    tok/s at 100 of 256 slots). The running streams of a steady demand fluctuate by about
    the square root of their number (arrivals independent of each other): 15 % of 256
    slots is more than three such deviations of a replica's batch. This is the capacity
    of a steady demand; a rising one is led with :func:`decode_tokens_per_s` (decide's
    rule 3e)."""
    b = max(1, int(decode_streams(cost, mean_ctx, itl_target, max_num_seqs, utilization=utilization)))
    return b / (cost.decode_uniform_ms(b, int(mean_ctx)) / 1e3)


@dataclass(frozen=True)
class Capacity:
    """What one replica of a pool serves at the target, and where that figure comes from."""

    per_replica: float  # tokens/s: prompt tokens for prefill, generated tokens for decode
    source: str         # "capacityPerReplica" (the spec), "cost model", ...
    utilization: float = 1.0  # the headroom per_replica carries (cost model: 0.8 prefill, 0.85 decode)
    # decode, cost model: the same headroom on the batch instead of the throughput
    # (decode_tokens_per_s_steady), for a steady demand; None: per_replica only
    steady: float | None = None

    def describe(self) -> str:
        return f"capacity {si(self.per_replica)} tok/s/replica ({self.source})"


def si(value: float) -> str:
    """A number with a k or M suffix, three significant digits (for reasons)."""
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


def replica_cost_model(spec: PDInferenceServiceSpec, role: str) -> CostModel | None:
    """The calibrated cost model of one engine rank of the pool, or None where it
    does not apply: a model shape the cost model does not know (or a KV cache
    dtype, --kv-cache-dtype, whose layout it does not model: pool_shape), a GPU product
    other than H200 (``gpuProduct``, or the product label in ``nodeSelector``)
    or AMD, pipeline parallelism (not modelled), weights that do not fit."""
    pool = spec.pool(role)
    if spec.engine.accelerator != "nvidia" or pool.pipeline_parallel_size != 1:
        return None
    product = pool.gpu_product or pool.node_selector.get(spec.gpu_product_label())
    if product is not None and CALIBRATED_GPU not in product.upper():
        return None
    shape = pool_shape(spec, role)
    if shape is None:
        return None
    cost, _ = pool_cost_model(shape, spec.engine.kind, pool)
    kv = pool_kv_tokens(spec, role, cost)
    return cost if kv is not None and kv > 0 else None


def pool_kv_tokens(spec: PDInferenceServiceSpec, role: str, cost: CostModel) -> int | None:
    """KV tokens of one engine rank of the pool (``cost``: :func:`pool_cost_model`): the cost
    model's at the pool's gpuMemoryUtilization, or as the KV flags of extraArgs size it
    (perfmodel.engine_defaults.kv_tokens: vLLM --kv-cache-memory-bytes, SGLang
    --max-total-tokens, vLLM --num-gpu-blocks-override blocks of --block-size tokens or of the
    attention backend's size, the one named or vLLM's default on the H200 for the model and
    KV-cache dtype: perfmodel.engine_defaults.vllm_block_size). None under
    --num-gpu-blocks-override with a backend whose block size is not known."""
    engine = spec.engine.kind
    if engine == "vllm":
        blocks = user_engine_flag(spec, role, "--num-gpu-blocks-override")
        kv_dtype = user_engine_flag(spec, role, "--kv-cache-dtype")
        backend = (vllm_attention_backend(user_engine_flag(spec, role, "--attention-backend"),
                                          user_engine_flag(spec, role, "--attention-config"))
                   or default_attention_backend(CALIBRATED_GPU, cost.shape.mla, kv_dtype))
        size = vllm_block_size(backend, user_engine_flag(spec, role, "--block-size"))
        if blocks is not None and size is None:
            return None
        return kv_tokens(cost, engine, _memory_fraction(spec.pool(role)),
                         kv_cache_memory_bytes=user_engine_flag(spec, role, "--kv-cache-memory-bytes"),
                         gpu_blocks=blocks, block_size=size)
    return kv_tokens(cost, engine, _memory_fraction(spec.pool(role)),
                     max_total_tokens=user_engine_flag(spec, role, "--max-total-tokens"))


def pool_cost_model(shape, engine: str, pool: PoolSpec) -> tuple[CostModel, int]:
    """The cost model of one engine rank of ``pool``, and how many such ranks serve side by
    side in a replica. vLLM: each DP rank is an engine of TP GPUs (experts spread over
    all TP x DP GPUs with --enable-expert-parallel). SGLang with attention DP: one engine
    whose attention-DP ranks share the TP GPUs and split its batch (experts over
    --ep-size, the TP size); without it, each DP replica is an engine of TP GPUs."""
    tp, dp = pool.tensor_parallel_size, pool.data_parallel_size
    if engine == "sglang" and pool.data_parallel_attention:
        return CostModel(shape=shape, tp=tp, dp=dp, ep=tp if pool.expert_parallel else 1), 1
    ep = tp * dp if engine == "vllm" else tp
    return CostModel(shape=shape, tp=tp, ep=ep if pool.expert_parallel else 1), dp


def pool_max_running(spec: PDInferenceServiceSpec, role: str, cost: CostModel) -> int:
    """The most requests one engine rank of the pool batches: ``maxRunningRequests`` when set
    (rendered as --max-num-seqs / --max-running-requests), else the engine's own default on
    the H200 (``cost``: the rank's cost model, :func:`pool_cost_model`), as
    :func:`~pd_operator.perfmodel.engine_defaults.default_max_running` computes it: vLLM 1024,
    SGLang from its KV pool (2048-4096)."""
    pool = spec.pool(role)
    if pool.max_running_requests is not None:
        return pool.max_running_requests
    kv = (pool_kv_tokens(spec, role, cost) or 0) // max(cost.dp, 1)  # SGLang: per attention-DP worker
    return default_max_running(spec.engine.kind, kv, spec.model.max_model_len or cost.shape.max_model_len,
                               pool_step_tokens(spec, role), vllm_performance_mode(spec, role))


def vllm_performance_mode(spec: PDInferenceServiceSpec, role: str) -> str | None:
    """vLLM's ``--performance-mode`` of the pool (:func:`user_engine_flag`); None with SGLang or unset."""
    return user_engine_flag(spec, role, "--performance-mode") if spec.engine.kind == "vllm" else None


def pool_shape(spec: PDInferenceServiceSpec, role: str):
    """The model's shape as the pool's engines hold it: its KV cache in the element size
    ``--kv-cache-dtype`` (extraArgs) gives it (perfmodel.engine_defaults.kv_element_bytes).
    None: a model the cost model does not know, or a KV layout it does not model."""
    try:
        shape = shape_for(spec.model.name)
    except KeyError:
        return None
    model_bytes = shape.kv_dtype_bytes or shape.dtype_bytes
    size = kv_element_bytes(spec.engine.kind, user_engine_flag(spec, role, "--kv-cache-dtype"), model_bytes,
                            shape.mla)
    if size is None:
        return None
    return shape if size == model_bytes else replace(shape, kv_dtype_bytes=size)


def pool_step_tokens(spec: PDInferenceServiceSpec, role: str) -> int:
    """The pool's step token budget (chunked prefill): ``maxBatchedTokens`` when set, else the
    engine's default on the H200 (vLLM: :func:`~pd_operator.perfmodel.engine_defaults.vllm_step_tokens`
    from the layout and the user flags it depends on)."""
    pool = spec.pool(role)
    if spec.engine.kind != "vllm":
        return pool.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS
    chunked = user_engine_flag(spec, role, "--enable-chunked-prefill")
    max_len = spec.model.max_model_len
    if chunked is False and max_len is None:
        shape = pool_shape(spec, role)
        max_len = shape.max_model_len if shape is not None else None
    return vllm_step_tokens(pool.max_batched_tokens, vllm_performance_mode(spec, role),
                            batched_dp_moe=vllm_batched_dp_moe(pool), chunked_prefill=chunked, max_model_len=max_len)


def vllm_batched_dp_moe(pool: PoolSpec) -> bool:
    """vLLM's ``ParallelConfig.use_batched_dp_moe`` for the pool as rendered: deepepMode
    low_latency (--all2all-backend deepep_low_latency) with expert and data parallelism."""
    return pool.deepep_mode == "low_latency" and pool.expert_parallel and pool.data_parallel_size > 1


def _memory_fraction(pool: PoolSpec) -> float:
    """The pool's GPU memory for weights and KV, relative to the cost model's."""
    return min(1.0, (pool.gpu_memory_utilization or CALIBRATED_MEMORY_FRACTION) / CALIBRATED_MEMORY_FRACTION)


def _cost_model_capacity(spec: PDInferenceServiceSpec, role: str, mean_isl: float | None,
                         mean_osl: float | None, osl_bias: float | None = None,
                         step_ratio: float | None = None,
                         cached_share: float | None = None) -> tuple[float, float | None] | None:
    """(per replica, per replica at steady demand: decode only, else None), or None."""
    cost = replica_cost_model(spec, role)
    if cost is None or mean_isl is None or mean_isl <= 0:
        return None
    if step_ratio:
        cost = cost.scaled(step_ratio)
    pool = spec.pool(role)
    steady_rank = None  # decode only
    if role == "prefill":
        per_rank = prefill_tokens_per_s(cost, mean_isl, pool_step_tokens(spec, role),
                                        utilization=PREFILL_UTILIZATION, cached_share=cached_share or 0.0)
    else:
        if mean_osl is None or mean_osl <= 0:
            return None
        ctx = _context(mean_isl, mean_osl, osl_bias)
        # the batch is capped by the engine's limit and by the KV cache at the mean context
        slots = pool_max_running(spec, role, cost)
        seqs = min(slots, int((pool_kv_tokens(spec, role, cost) or 0) // ctx))
        if seqs < 1:
            return None
        itl = duration_seconds(pool.autoscaling.target.value)
        per_rank = decode_tokens_per_s(cost, ctx, itl, seqs, utilization=DECODE_UTILIZATION)
        if seqs == slots and decode_streams(cost, ctx, itl, seqs, utilization=1.0) >= slots:
            # the slots bind, not the KV cache nor the ITL target: the headroom is for the
            # count of running streams; their tokens (KV, step time) vary more, by the spread
            # of their contexts, and keep the headroom on the throughput
            steady_rank = decode_tokens_per_s_steady(cost, ctx, itl, seqs, utilization=DECODE_UTILIZATION)
    _, ranks = pool_cost_model(cost.shape, spec.engine.kind, pool)
    # data-parallel engines of a replica serve side by side
    return per_rank * ranks, (steady_rank * ranks if steady_rank else None)


def _context(mean_isl: float, mean_osl: float, osl_bias: float | None) -> float:
    """The mean context of a running decode: from the observed spread of output lengths
    (``osl_bias``, :func:`length_bias`) when Prometheus has it; else the spread of an
    exponential distribution (E[OSL^2]/E[OSL] = 2 mean), wider than typical chat traffic,
    so an unknown spread errs towards more decode capacity, not less. ``osl_bias`` is at
    least the mean (E[X^2] >= E[X]^2): coarse buckets can read less, e.g. SGLang's default
    output-length buckets start at (0, 100], whose geometric middle, 10, stands for every
    output shorter than 100 tokens."""
    return decode_mean_context(mean_isl, mean_osl, osl_bias=max(osl_bias, mean_osl) if osl_bias else 2 * mean_osl)


def pool_capacity(svc: PDInferenceService, role: str, mean_isl: float | None,
                  mean_osl: float | None, osl_bias: float | None = None,
                  step_ratio: float | None = None, cached_share: float | None = None) -> Capacity | None:
    """One replica's capacity at the pool's target: ``capacityPerReplica`` when set,
    else the cost model's estimate at the mean ISL/OSL (with its step times x
    ``step_ratio``, the engines' measured speed: :func:`step_time_ratio` for decode,
    :func:`prefill_time_ratio` for prefill; prefill with ``cached_share`` of the prompt
    tokens served from a prefix cache), else None (feedback only)."""
    override = svc.spec.pool(role).autoscaling.capacity_per_replica
    if override is not None:
        return Capacity(override, "capacityPerReplica")
    estimate = _cost_model_capacity(svc.spec, role, mean_isl, mean_osl, osl_bias, step_ratio, cached_share)
    source = "cost model"
    if step_ratio and abs(step_ratio - 1) >= 0.005:
        source = f"cost model, step time x {step_ratio:.2f} as measured"
    if not estimate or not estimate[0]:
        return None
    return Capacity(estimate[0], source, PREFILL_UTILIZATION if role == "prefill" else DECODE_UTILIZATION,
                    steady=estimate[1])


def step_time_ratio(svc: PDInferenceService, mean_isl: float | None, mean_osl: float | None,
                    osl_bias: float | None, running_per_replica: float | None,
                    mean_itl: float | None) -> float | None:
    """The decode engines' step time over the cost model's, as they ran: the observed mean
    ITL (each generated token is one step after the last) over the model's step at the
    batch each engine ran (running requests per replica over its engines) and the mean
    context. 0.8: engines 20 % faster than calibrated. None where the cost model does not
    apply, or nothing ran."""
    cost = replica_cost_model(svc.spec, "decode")
    if (cost is None or not mean_itl or mean_itl <= 0 or not mean_isl or mean_isl <= 0
            or not mean_osl or mean_osl <= 0 or not running_per_replica):
        return None
    _, ranks = pool_cost_model(cost.shape, svc.spec.engine.kind, svc.spec.pool("decode"))
    batch = running_per_replica / ranks
    if batch < 1:
        return None
    expected = cost.decode_uniform_ms(round(batch), int(_context(mean_isl, mean_osl, osl_bias))) / 1e3
    return mean_itl / expected


def prefill_time_ratio(svc: PDInferenceService, mean_isl: float | None, running_per_replica: float | None,
                       mean_prefill_time: float | None, cached_share: float | None = None) -> float | None:
    """The prefill engines' step time over the cost model's, as they ran: the observed mean
    prefill time (vLLM's ``request_prefill_time_seconds``, SGLang's prefill_forward stage:
    from a request's first scheduled step to its first token) over the model's time for the
    same work. The work of a prompt is its tokens not served from a prefix cache
    (``cached_share`` of them are: computed after a cached prefix of that length). A request
    shares its step with the others running (``running_per_replica`` over the replica's
    engines, at least itself): one step of a fixed cost and their chunks while they fit the
    step's token budget; past it, the request waits for as many full steps as its share of
    the tokens fills. By Little's law the running count is arrivals x prefill time, so this
    is a step model at the load the engine ran; a batch that varies reads slower than its
    mean (the request-weighted step is the longer one), never faster. None where the cost
    model does not apply, nothing ran, or every prompt token came from the cache."""
    cost = replica_cost_model(svc.spec, "prefill")
    if (cost is None or not mean_prefill_time or mean_prefill_time <= 0 or not mean_isl or mean_isl <= 0
            or running_per_replica is None):
        return None
    share = min(1.0, max(0.0, cached_share or 0.0))
    computed, prefix = mean_isl * (1 - share), int(mean_isl * share)
    if computed < 1:
        return None
    pool = svc.spec.pool("prefill")
    _, ranks = pool_cost_model(cost.shape, svc.spec.engine.kind, pool)
    budget = pool_step_tokens(svc.spec, "prefill")
    prompts = max(1.0, running_per_replica / ranks)
    chunk = max(1, int(min(computed, budget)))
    per_prompt = cost.prefill_chunk_ms(prefix, chunk) * computed / chunk  # a prompt longer than the budget: its chunks
    tokens = prompts * computed
    if tokens <= budget:
        expected = cost.prefill_fixed_ms() + prompts * per_prompt
    else:  # full steps, as many as the tokens running fill
        expected = tokens / budget * (cost.prefill_fixed_ms() + budget / computed * per_prompt)
    return mean_prefill_time / (expected / 1e3)


def estimate_capacity(svc: PDInferenceService, role: str, mean_isl: float | None,
                      mean_osl: float | None, osl_bias: float | None = None) -> float | None:
    """One replica's capacity in tokens/s (see :func:`pool_capacity`), or None."""
    capacity = pool_capacity(svc, role, mean_isl, mean_osl, osl_bias)
    return capacity.per_replica if capacity else None


def latency_floor(svc: PDInferenceService, role: str, mean_isl: float | None, mean_osl: float | None,
                  osl_bias: float | None = None, step_ratio: float | None = None) -> float | None:
    """The pool's latency with no load at all, seconds: the prefill of a mean
    prompt alone (TTFT) or a decode step of one sequence at the mean context
    (ITL), from the cost model; None where the cost model does not apply or
    the lengths are unknown. The feedback sizes the pool on the latency above
    this floor, the part that load adds (:func:`..decide.decide`)."""
    cost = replica_cost_model(svc.spec, role)
    if cost is None or not mean_isl or mean_isl <= 0:
        return None
    if role == "prefill":
        return cost.prefill_ms(int(mean_isl)) / 1e3 * (step_ratio or 1.0)
    if not mean_osl or mean_osl <= 0:
        return None
    return cost.decode_uniform_ms(1, int(_context(mean_isl, mean_osl, osl_bias))) / 1e3 * (step_ratio or 1.0)


def longest_prompt_in_time(svc: PDInferenceService, target_s: float, step_ratio: float | None = None) -> int | None:
    """The longest prompt one prefill replica computes alone within ``target_s``: chunked
    prefill, one step of the fixed cost and its chunk per ``max_batched_tokens`` tokens, each
    chunk's attention over the tokens before it (with the step times x ``step_ratio``, the
    engines' measured speed). At most the model's context length (``maxModelLen``, else the
    model's own). None where the cost model does not apply. A prompt longer than this misses
    the target whatever the pool's size; only its compute is counted (not the KV transfer nor
    the first decode step), so the estimate errs towards prompts that can make it."""
    cost = replica_cost_model(svc.spec, "prefill")
    if cost is None or target_s <= 0:
        return None
    if step_ratio:
        cost = cost.scaled(step_ratio)
    budget = pool_step_tokens(svc.spec, "prefill")
    limit = max_prompt_tokens(svc, cost)
    left, done = target_s * 1e3, 0
    while done < limit:
        n = min(budget, limit - done)
        step = cost.prefill_fixed_ms() + cost.prefill_chunk_ms(done, n)
        if step > left:
            # the last chunk that fits: the step time grows with its tokens (bisection)
            lo, hi = 0, n
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if cost.prefill_fixed_ms() + cost.prefill_chunk_ms(done, mid) <= left:
                    lo = mid
                else:
                    hi = mid - 1
            return done + lo
        left -= step
        done += n
    return limit


def max_prompt_tokens(svc: PDInferenceService, cost: CostModel | None = None) -> int | None:
    """The longest prompt the engines accept: ``maxModelLen``, else the model's context length
    (the cost model's shape); None when neither is known."""
    if svc.spec.model.max_model_len:
        return svc.spec.model.max_model_len
    cost = cost or replica_cost_model(svc.spec, "prefill")
    return cost.shape.max_model_len if cost is not None else None


def share_longer(buckets, length: float, longest: float | None = None) -> float | None:
    """The share of requests longer than ``length`` tokens, from a histogram of request lengths
    (Prometheus' cumulative ``(le, count)`` pairs, e.g. the rate of
    ``vllm:request_prompt_tokens_bucket``), interpolated linearly inside the bucket that holds
    ``length`` (as ``histogram_quantile`` does); no request is longer than ``longest`` (the
    longest prompt the engines accept: a bucket past it ends there); unknown, the +Inf
    bucket's requests all count as longer. None without counts. Within its bucket the
    estimate can err either way by up to that bucket's share (vLLM's buckets are 1-2-5)."""
    pts = sorted((le, c) for le, c in buckets if c == c)
    if not pts or pts[-1][1] <= 0:
        return None
    total = pts[-1][1]
    if longest and length >= longest:
        return 0.0  # every prompt the engines accept
    below, prev_le, prev_c = 0.0, 0.0, 0.0
    for le, c in pts:
        if le <= length:
            below = c
        else:
            top = min(le, longest) if longest else le
            if not math.isinf(top) and top > prev_le:
                below = prev_c + (c - prev_c) * min(1.0, (length - prev_le) / (top - prev_le))
            break
        prev_le, prev_c = le, c
    return max(0.0, min(1.0, 1.0 - below / total))
