"""Per-replica capacity at the latency targets, from the calibrated cost model (pure).

These feed the model floor of :func:`~pd_operator.autoscale.decide.decide`
(``Signal.capacity``, in the unit of ``Signal.demand``):

* prefill, prompt tokens/s: a saturated prefill instance runs full steps of
  ``max_batched_tokens`` tokens (chunked prefill), each costing the fixed term,
  the linear term and the attention term of its prompts (``mean_isl`` long);
  throughput = tokens / step time.  Held at ``utilization`` (default 0.8) of
  that, so the queue -- and the TTFT quantile -- stays bounded;
* decode, concurrent streams: the batch ``B`` whose step time at the mean
  context reaches the ITL target, capped by ``max_num_seqs``; held at
  ``utilization`` (default 0.85) so requests are not kept waiting for a slot
  (waiting for a decode slot is TTFT, invisible to ITL).

The mean context of a running decode is length-biased: a request is seen in
proportion to its output length, so ``E[ctx] = ISL + E[OSL^2] / (2 E[OSL])``
(= ISL + OSL/2 * exp(sigma^2) for a lognormal OSL).
"""

from __future__ import annotations

import math

from ..sim.costmodel import CostModel


def prefill_tokens_per_s(cost: CostModel, mean_isl: float, max_batched_tokens: int = 8192,
                         utilization: float = 0.8) -> float:
    n = max_batched_tokens
    prompts = max(1.0, n / mean_isl)
    step_ms = cost.prefill_fixed_ms() + prompts * cost.prefill_chunk_ms(0, int(min(mean_isl, n)))
    return utilization * n / (step_ms / 1e3)


def decode_mean_context(mean_isl: float, mean_osl: float, osl_sigma: float = 0.0) -> float:
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
