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
    prefill_tokens_per_s,
)
from pd_operator.sim.costmodel import CostModel, shape_for
from tests.conftest import minimal

ISL, OSL = 2000.0, 500.0


def svc(kind="vllm", **spec):
    return validate_service(minimal(kind, **spec))


def both(s, isl=ISL, osl=OSL):
    return estimate_capacity(s, "prefill", isl, osl), estimate_capacity(s, "decode", isl, osl)


def test_default_pool_is_estimated_from_the_calibrated_model():
    p, d = both(svc())
    # the 8B calibration itself at TP 1: what the benchmark's floor uses
    assert p == pytest.approx(prefill_tokens_per_s(CostModel(shape=shape_for("Qwen/Qwen3-8B")), ISL))
    assert 10_000 < p < 100_000 and 1_000 < d < 50_000  # prompt tokens/s, generated tokens/s
    assert pool_capacity(svc(), "prefill", ISL, OSL).describe() == f"capacity {p / 1e3:.3g}k tok/s/replica (cost model)"


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
    assert both(svc(prefill={"pipelineParallelSize": 2}, decode={"pipelineParallelSize": 2})) == (None, None)


def test_override_wins():
    pool = {"autoscaling": {"capacityPerReplica": 12345.0}}
    s = svc(model={"name": "acme/secret-model-13b"}, prefill=pool, decode=pool)
    assert both(s, None, None) == (12345.0, 12345.0)  # no model, no lengths: the override still holds
    assert pool_capacity(s, "decode", None, None).describe() == "capacity 12.3k tok/s/replica (capacityPerReplica)"


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
