"""The benchmark's fixed setting: its service as a PDInferenceService, the
scrape and control intervals, the pod start delay, the per-pool maximum and
the GPU budget that every policy with a budget gets."""

from __future__ import annotations

import json

from pd_operator.api import validate_service
from pd_operator.api.models import PDInferenceService

SCRAPE = 15.0
INTERVAL = 30.0
START_DELAY = 120.0
MAX_PER_POOL = 32
BUDGET = 48  # GPUs, for every policy that has a budget


def reference_manifest(max_per_pool: int = MAX_PER_POOL, budget: int = BUDGET) -> dict:
    """The benchmark's service as a PDInferenceService manifest: Qwen3-8B on H200, TP 1, 256
    running requests per engine, both pools autoscaled with the default targets and behaviour (p99 TTFT 1 s, p99 ITL 50 ms,
    tolerance 0.1, HPA's defaults), min 1, max ``max_per_pool``, ``maxTotalGPUs`` =
    ``budget``, interval 30 s."""
    # maxRunningRequests: the fleet's engines run at most 256 requests (fleet.BenchFleet's
    # max_num_seqs), rendered as --max-num-seqs 256; unset, vLLM on an H200 would take 1024
    pool = {"tensorParallelSize": 1, "gpuProduct": "NVIDIA-H200", "maxRunningRequests": 256,
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": max_per_pool}}
    return {
        "apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService",
        "metadata": {"name": "autoscale-bench", "namespace": "bench"},
        "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "engine": {"kind": "vllm"}, "router": {"image": "registry.example.com/pd/router:test"},
                 "prefill": json.loads(json.dumps(pool)), "decode": json.loads(json.dumps(pool)),
                 "autoscaling": {"prometheus": {"url": "http://prometheus.monitoring.svc:9090"},
                                 "interval": f"{INTERVAL:g}s", "maxTotalGPUs": budget}},
    }


def reference_service(max_per_pool: int = MAX_PER_POOL, budget: int = BUDGET) -> PDInferenceService:
    """:func:`reference_manifest`, validated as the operator does."""
    return validate_service(reference_manifest(max_per_pool, budget))
