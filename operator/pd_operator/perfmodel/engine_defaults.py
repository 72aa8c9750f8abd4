"""What an engine runs with when the operator renders no batch limit (pure).

The most requests an engine batches at once when ``--max-num-seqs`` (vLLM) or
``--max-running-requests`` (SGLang) is not on its command line, as the pinned
engines compute it (tests/contract/FACTS.md, "Batch limits when unset"):

* vLLM 0.33.0 (``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults`` and
  ``_set_default_max_num_seqs_and_batched_tokens_args``): the OpenAI API server on a GPU
  of at least 70 GiB that is not an A100 (H100, H200) defaults to 1024 sequences and
  8192 batched tokens; at least 160 GiB (B200) to 1024 and 16384; smaller GPUs to 256
  and 2048. An unset limit is then cut to the batched tokens (``min(max_num_seqs,
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


def default_max_running(engine: str, kv_tokens_per_worker: int, context_len: int,
                        max_batched_tokens: int | None = None) -> int:
    """The engine's own batch limit (requests) on an H200 when the command line sets none;
    ``max_batched_tokens``: the step token budget rendered (vLLM caps an unset limit at it)."""
    if engine == "vllm":
        return max(1, min(VLLM_H200_MAX_NUM_SEQS, max_batched_tokens or VLLM_H200_MAX_NUM_BATCHED_TOKENS))
    estimated = max(min(int(kv_tokens_per_worker / max(context_len, 1) * 512), 4096), 2048)
    return max(1, min(estimated, kv_tokens_per_worker // 2))
