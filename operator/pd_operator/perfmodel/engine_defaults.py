"""What an engine runs with when the operator renders no batch limit (pure).

The most requests an engine batches at once when ``--max-num-seqs`` (vLLM) or
``--max-running-requests`` (SGLang) is not on its command line, as the pinned
engines compute it (tests/contract/FACTS.md, "Batch limits when unset"):

* vLLM 0.33.0 (``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults`` and
  ``_set_default_max_num_seqs_and_batched_tokens_args``): the OpenAI API server on a GPU
  of at least 70 GiB that is not an A100 (H100, H200) defaults to 1024 sequences and
  8192 batched tokens; at least 160 GiB (B200) to 1024 and 16384; smaller GPUs to 256
  and 2048. ``--performance-mode throughput`` doubles each of the two that is unset
  (``_set_default_max_num_seqs_and_batched_tokens_args``: 2048 and 16384 on an H200). An
  unset limit is then cut to the batched tokens (``min(max_num_seqs,
  max_num_batched_tokens)``).
* SGLang 0.5.23 (``sglang/srt/mem_cache/kv_cache_configurator.py``,
  ``resolve_max_num_reqs``): per data-parallel worker, ``token_capacity / context_len x
  512`` held within [2048, 4096], and at most half the KV tokens.

The cost model is calibrated on the H200 (141 GB: the 70-160 GiB tier), the only GPU
these are asked for.
"""

from __future__ import annotations

VLLM_H200_MAX_NUM_SEQS = 1024          # the API server's default on H100/H200
VLLM_H200_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_THROUGHPUT_MODE_FACTOR = 2        # --performance-mode throughput, on each unset limit
# the unset budget with batched data-parallel MoE (--all2all-backend deepep_low_latency with
# expert parallelism and data parallelism above 1): config/scheduler.py
# SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP, set by arg_utils.py where
# ParallelConfig.use_batched_dp_moe
VLLM_BATCHED_DP_MAX_NUM_BATCHED_TOKENS = 256


def _vllm_mode_factor(performance_mode: str | None) -> int:
    return VLLM_THROUGHPUT_MODE_FACTOR if performance_mode == "throughput" else 1


def vllm_step_tokens(max_batched_tokens: int | None, performance_mode: str | None = None, *,
                     batched_dp_moe: bool = False, chunked_prefill: bool | None = None,
                     max_model_len: int | None = None) -> int:
    """vLLM's step token budget on an H200: ``--max-num-batched-tokens`` when rendered, else
    its default (``_set_default_max_num_seqs_and_batched_tokens_args``): 8192, or 256 with
    batched data-parallel MoE; doubled under ``--performance-mode throughput`` (None: not on
    the command line, "balanced"); at least ``max_model_len`` with chunked prefill turned off
    (``--no-enable-chunked-prefill``; None: the default, on)."""
    if max_batched_tokens is not None:
        return max_batched_tokens
    base = VLLM_BATCHED_DP_MAX_NUM_BATCHED_TOKENS if batched_dp_moe else VLLM_H200_MAX_NUM_BATCHED_TOKENS
    tokens = base * _vllm_mode_factor(performance_mode)
    if chunked_prefill is False and max_model_len:
        tokens = max(max_model_len, tokens)
    return tokens


def default_max_running(engine: str, kv_tokens_per_worker: int, context_len: int,
                        max_batched_tokens: int | None = None, performance_mode: str | None = None) -> int:
    """The engine's own batch limit (requests) on an H200 when the command line sets none;
    ``max_batched_tokens``: the engine's step token budget (:func:`vllm_step_tokens`; vLLM
    caps an unset limit at it);
    ``performance_mode``: vLLM's ``--performance-mode`` (throughput doubles the unset limits)."""
    if engine == "vllm":
        seqs = VLLM_H200_MAX_NUM_SEQS * _vllm_mode_factor(performance_mode)
        return max(1, min(seqs, vllm_step_tokens(max_batched_tokens, performance_mode)))
    estimated = max(min(int(kv_tokens_per_worker / max(context_len, 1) * 512), 4096), 2048)
    return max(1, min(estimated, kv_tokens_per_worker // 2))


# --kv-cache-dtype values whose cache is dense K and V of one byte per element, as the pinned
# engines lay it out (tests/contract/FACTS.md, "KV cache dtype"): vLLM 0.33.0
# (utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE: uint8 / float8_e4m3fn; v1/kv_cache_interface.py
# AttentionSpec: (head_size + head_size_v) x the dtype's size per KV head and token);
# SGLang 0.5.23 (mem_cache/kv_cache_dtype.py configure_kv_cache_dtype: float8_e4m3fn / float8_e5m2).
ONE_BYTE_KV = {"vllm": frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"}),
               "sglang": frozenset({"fp8_e4m3", "fp8_e5m2"})}
# the model's own dtype (what the shape holds): vLLM "auto" and the 16-bit names; SGLang "auto"
# (unless the checkpoint's quantization config names an FP8 KV cache) and bf16
MODEL_DTYPE_KV = {"vllm": frozenset({"auto", "bfloat16", "float16", "half"}),
                  "sglang": frozenset({"auto", "bf16", "bfloat16"})}


def kv_element_bytes(engine: str, kv_cache_dtype: str | None, model_bytes: int, mla: bool) -> int | None:
    """Bytes per element of the engine's KV cache under ``--kv-cache-dtype`` (None: unset):
    the model's (``model_bytes``) or one byte for the plain FP8 formats; None for a layout not
    modelled here (packed 4-bit and per-token-head formats with their scales, an FP8 latent of
    an MLA model)."""
    if kv_cache_dtype is None or kv_cache_dtype in MODEL_DTYPE_KV.get(engine, ()):
        return model_bytes
    if kv_cache_dtype in ONE_BYTE_KV.get(engine, ()) and not mla:
        return 1
    return None


# vLLM 0.33.0's KV block size on the H200 (compute capability 9.0) when --block-size is unset, by
# the attention backend: 16 where the backend takes it, else the smallest size it supports
# (v1/attention/backend.py get_preferred_block_size; platforms/interface.py
# update_block_size_for_backend; config/cache.py DEFAULT_BLOCK_SIZE 16). Unnamed, vLLM picks
# FLASH_ATTN, or FLASH_ATTN_MLA for an MLA model (platforms/cuda.py), both MultipleOf(16).
VLLM_H200_BLOCK_SIZE = {None: 16, "FLASH_ATTN": 16, "FLASH_ATTN_MLA": 16, "FLASHINFER": 16, "TRITON_ATTN": 16,
                        "TRITON_MLA": 16, "FLEX_ATTENTION": 16, "FLASHMLA": 64, "CUTLASS_MLA": 128}


def vllm_block_size(attention_backend: str | None, block_size: int | None) -> int | None:
    """The tokens of one vLLM KV block on the H200: ``--block-size`` when set, else the
    backend's (``--attention-backend``, any case; "auto" or None: vLLM's choice):
    :data:`VLLM_H200_BLOCK_SIZE`. None for a backend not listed there."""
    if block_size:
        return block_size
    name = None if attention_backend is None or attention_backend.lower() == "auto" else attention_backend.upper()
    return VLLM_H200_BLOCK_SIZE.get(name)


def kv_tokens(cost, engine: str, mem_fraction: float, kv_cache_memory_bytes: int | None = None,
              max_total_tokens: int | None = None, gpu_blocks: int | None = None, block_size: int | None = None) -> int:
    """KV tokens of one engine rank (``cost``: its cost model) as the engine sizes its cache from
    the user's flags (tests/contract/FACTS.md, "KV cache size"): vLLM's --num-gpu-blocks-override
    (``gpu_blocks``) is the number of blocks of ``block_size`` tokens (:func:`vllm_block_size`)
    each worker allocates, whatever memory is left (v1/core/kv_cache_planning.py
    may_override_num_blocks); vLLM's --kv-cache-memory-bytes
    is the KV memory of each GPU, in place of what gpu-memory-utilization leaves (0 or unset:
    not used); SGLang's --max-total-tokens caps the pool of each attention-DP worker at that
    many tokens (never raises it). Otherwise the cost model's at ``mem_fraction``."""
    if engine == "vllm" and gpu_blocks is not None and block_size:
        return max(cost.dp, 1) * gpu_blocks * block_size  # each DP engine's (the cost model of several: dp)
    if engine == "vllm" and kv_cache_memory_bytes:
        return cost.kv_capacity_tokens(kv_bytes_per_gpu=kv_cache_memory_bytes)
    kv = cost.kv_capacity_tokens(mem_fraction)
    if engine == "sglang" and max_total_tokens is not None:
        workers = max(cost.dp, 1)
        kv = workers * min(kv // workers, max_total_tokens)
    return kv
