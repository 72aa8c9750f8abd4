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


# NVIDIA GPU products (the GPU feature discovery label values, e.g. NVIDIA-H200, NVIDIA-B200,
# NVIDIA-A100-SXM4-80GB) by compute capability major
_GPU_MAJOR = ((r"(?<![A-Z])G?B(200|300)(?![0-9])", 10),
              (r"RTX.*(BLACKWELL|50[0-9]0)", 12),
              (r"(?<![A-Z])G?H(100|200|800|20)(?![0-9])", 9),
              (r"(?<![A-Z])(A(100|800|40|30|10|16|2)|L(40S|40|20|4))(?![0-9])", 8))
_KV_16BIT = frozenset({None, "auto", "float16", "bfloat16", "half"})


def gpu_major(product: str | None) -> int | None:
    """The compute capability major of an NVIDIA GPU product name; None when not known."""
    import re

    if not product:
        return None
    return next((m for pattern, m in _GPU_MAJOR if re.search(pattern, product.upper())), None)


def default_attention_backend(product: str | None, mla: bool | None, kv_cache_dtype: str | None = None) -> str | None:
    """The attention backend vLLM 0.33.0 picks by itself (platforms/cuda.py
    ``_get_backend_priorities``: the first of its list that takes the compute capability and
    the KV-cache dtype, ``supports_compute_capability`` / ``supported_kv_cache_dtypes``).
    Without MLA: FLASHINFER on 10.x; FLASH_ATTN on 8.x, 9.x and 12.x, except an FP8 KV cache,
    which FlashAttention takes on 9.x only and never as fp8_e5m2 (v1/attention/backends/fa_utils.py
    ``flash_attn_supports_kv_cache_dtype``: FLASHINFER then). With MLA: FLASHINFER_MLA on 10.x;
    on 9.x FLASH_ATTN_MLA (major 9 only, 16-bit KV only) or, with FP8 KV, FLASHMLA; TRITON_MLA on
    8.x and 12.x. ``kv_cache_dtype``: --kv-cache-dtype ("auto" taken as the model's own dtype).
    ``mla`` None (a model whose attention the operator does not know): both answers, "X or Y".
    None: a GPU product, or a KV-cache dtype, not known here."""
    major = gpu_major(product)
    fp8 = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}.get(kv_cache_dtype or "auto")
    if major is None or (fp8 is None and kv_cache_dtype not in _KV_16BIT):
        return None
    if major == 10:
        plain = "FLASHINFER"
    else:
        plain = "FLASH_ATTN" if fp8 is None or (major == 9 and fp8 == "e4m3") else "FLASHINFER"
    latent = (None if fp8 == "e5m2" else "FLASHINFER_MLA" if major == 10
              else ("FLASH_ATTN_MLA" if fp8 is None else "FLASHMLA") if major == 9 else "TRITON_MLA")
    if mla is None:
        return f"{plain} or {latent}" if latent else None
    return latent if mla else plain


# vLLM 0.33.0's KV block size by attention backend when --block-size is unset: 16 where the
# backend takes it, else the smallest size it supports (v1/attention/backend.py
# get_preferred_block_size; platforms/interface.py update_block_size_for_backend; config/cache.py
# DEFAULT_BLOCK_SIZE 16; each backend's get_supported_kernel_block_sizes)
VLLM_BLOCK_SIZE = {"FLASH_ATTN": 16, "FLASH_ATTN_MLA": 16, "FLASHINFER": 16, "TRITON_ATTN": 16, "TRITON_MLA": 16,
                   "FLEX_ATTENTION": 16, "FLASHMLA": 64, "FLASHINFER_MLA": 32, "CUTLASS_MLA": 128}


def vllm_attention_backend(named: str | None, attention_config) -> str | None:
    """The backend a vLLM command line names: --attention-backend (any case; "auto" is none) or
    the ``backend`` of --attention-config (the two are mutually exclusive, engine/arg_utils.py)."""
    if named is None and isinstance(attention_config, dict):
        named = attention_config.get("backend")
    return None if not isinstance(named, str) or named.lower() == "auto" else named.upper()


def vllm_block_size(attention_backend: str | None, block_size: int | None) -> int | None:
    """The tokens of one vLLM KV block: ``--block-size`` when set, else the backend's
    (:data:`VLLM_BLOCK_SIZE`; ``attention_backend`` the one named or vLLM's default,
    :func:`default_attention_backend`). None for a backend not listed there."""
    if block_size:
        return block_size
    return VLLM_BLOCK_SIZE.get(attention_backend) if attention_backend else None


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
