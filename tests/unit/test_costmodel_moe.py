"""The MoE cost shape (DeepSeek-V3) against published figures.

Nothing here was measured by us: the reference is the LMSYS blog "Deploying
DeepSeek with PD Disaggregation and Large-scale Expert Parallelism on 96 H100
GPUs" (The SGLang Team, May 5 2025; tests/contract/FACTS.md "MoE cost shape"):

* prefill, 4 nodes (EP32), 2K prompts: 54,543 input tokens/s per node;
* decode, 9 nodes (EP72), batch 256 per GPU, KV length 2,000: 22,282 output
  tokens/s per node.

The blog ran H100 SXM; our calibration is H200. Same Hopper compute, HBM
3.35 vs 4.8 TB/s (NVIDIA's spec pages): the model is evaluated with
``hbm_ratio = 3.35/4.8`` (weight and KV reads slower, FLOPs unchanged).
Tolerances: prefill within 15% (GEMM-bound: the calibration's bf16 rate on the
37B active parameters), decode within 25% (the model has the DeepEP dispatch
but not the combine, expert imbalance or two-batch overlap; it reads 17% high).
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from pd_operator.perfmodel.costmodel import CALIBRATED, CostModel, MODELS, shape_for

DS = shape_for("deepseek-ai/DeepSeek-V3")
H100_HBM = 3.35 / 4.8

PREFILL_TOKENS_PER_S_PER_NODE = 54_543  # 2K prompts, 4 nodes, EP32
DECODE_TOKENS_PER_S_PER_NODE = 22_282  # batch 256/GPU, KV 2000, 9 nodes, EP72
PREFILL_TOL, DECODE_TOL = 0.15, 0.25


def prefill_per_node(shape, gpus: int = 32, hbm: float = H100_HBM, dp_ep: bool = True) -> float:
    """Input tokens/s per node of a prefill engine over ``gpus`` GPUs, 8 prompts of 2000
    tokens per GPU per step (the blog's 16,384 tokens per device, rounded to prompts)."""
    cost = CostModel(shape, tp=gpus, dp=gpus if dp_ep else 1, ep=gpus if dp_ep else 1, hbm_ratio=hbm)
    prompts = 8 * gpus
    step_ms = cost.step_ms(0, 0, [(0, 2000)] * prompts)
    return prompts * 2000 / (step_ms / 1e3) / (gpus // 8)


def decode_per_node(shape, gpus: int = 72, hbm: float = H100_HBM, dp_ep: bool = True) -> float:
    """Output tokens/s per node of a decode engine over ``gpus`` GPUs, 256 sequences per GPU
    at a KV length of 2000."""
    cost = CostModel(shape, tp=gpus, dp=gpus if dp_ep else 1, ep=gpus if dp_ep else 1, hbm_ratio=hbm)
    batch = 256 * gpus
    return batch / (cost.decode_uniform_ms(batch, 2000) / 1e3) / (gpus // 8)


def within(got: float, want: float, tol: float) -> bool:
    return abs(got / want - 1) <= tol


def test_config_figures():
    # memory counts all 671B parameters at 1 byte (FP8); compute the 37B active ones
    assert DS.weight_bytes == 671e9 and DS.compute_params == 37e9
    # MLA: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes (bf16 KV)
    assert DS.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272
    # routed experts: 58 MoE layers x 256 experts x 3 x 7168 x 2048
    assert DS.expert_params == pytest.approx(653.9e9, rel=1e-3)
    assert shape_for("DeepSeek-R1") is MODELS["deepseek-ai/DeepSeek-R1"]


def test_weights_per_gpu_follow_the_layout():
    # decode example (TP 32, attention DP 32, EP 32): every GPU holds the ~17 GB non-expert
    # part whole (attention TP 1) and 1/32 of the experts
    wide = CostModel(DS, tp=32, dp=32, ep=32)
    assert wide.attn_tp == 1
    assert wide.weight_bytes_per_gpu() == pytest.approx((671e9 - DS.expert_bytes) + DS.expert_bytes / 32)
    assert 36e9 < wide.weight_bytes_per_gpu() < 38e9
    # plain TP 16 (no attention DP): everything / 16
    assert CostModel(DS, tp=16).weight_bytes_per_gpu() == pytest.approx(671e9 / 16)
    # KV capacity: each attention rank keeps its own latent pool
    assert wide.kv_capacity_tokens() == pytest.approx(
        32 * (wide.gpu_usable_bytes - wide.weight_bytes_per_gpu()) / 70_272, rel=1e-6)


def test_prefill_matches_the_published_throughput():
    got = prefill_per_node(DS)
    assert within(got, PREFILL_TOKENS_PER_S_PER_NODE, PREFILL_TOL), got
    # GEMM-bound: the H200's wider HBM changes it by under 2%
    assert within(prefill_per_node(DS, hbm=1.0), got, 0.02)


def test_decode_matches_the_published_throughput():
    got = decode_per_node(DS)
    assert within(got, DECODE_TOKENS_PER_S_PER_NODE, DECODE_TOL), got
    # on H200 (the calibration GPU) faster, by less than the bandwidth ratio (GEMM- and
    # attention-FLOP-bound at batch 256)
    h200 = decode_per_node(DS, hbm=1.0)
    assert got < h200 < got / H100_HBM


@pytest.mark.parametrize("wrong, why", [
    (replace(DS, active_params=None, expert_params=0.0, moe_layers=0), "dense 671B"),
    (replace(DS, kv_lora_rank=0, qk_rope_head_dim=0), "MLA as 128 full K/V heads"),
    (replace(DS, active_params=671e9), "every parameter active"),
])
def test_a_wrong_shape_misses_the_published_figures(wrong, why):
    ok_prefill = within(prefill_per_node(wrong), PREFILL_TOKENS_PER_S_PER_NODE, PREFILL_TOL)
    ok_decode = within(decode_per_node(wrong), DECODE_TOKENS_PER_S_PER_NODE, DECODE_TOL)
    assert not (ok_prefill and ok_decode), why


def test_dense_shapes_unchanged():
    # the calibrated points (plain PyTorch efficiency) and the TP scaling of a dense shape
    # are the pre-MoE formulas
    cal = CostModel(eff=CostModel().eff.pytorch())
    assert cal.prefill_ms(2000) == pytest.approx(3.20 + 0.0270 * 2000 + 8.44e-7 * 2000 ** 2)
    assert cal.decode_uniform_ms(64, 2000) == pytest.approx(5.81 + 0.0173 * 64 + 60.75e-6 * 64 * 2001)
    big = CostModel(MODELS["Qwen/Qwen3-32B"], tp=4)
    assert big.weight_bytes_per_gpu() == pytest.approx(32.8e9 * 2 / 4)
    assert big.decode_fixed_ms() == pytest.approx(4.0 * 32.8e9 * 2 / CALIBRATED.weight_bytes / 4)
    assert big.kv_capacity_tokens() == int((4 * big.gpu_usable_bytes - 32.8e9 * 2) // (64 * 8 * 128 * 2 * 2))
