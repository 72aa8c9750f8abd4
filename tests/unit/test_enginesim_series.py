"""The simulated engines export every series the autoscaler's queries read, on the pods they
read it from (autoscale/promql.py; tests/contract/FACTS.md "Autoscaling signals"): a series the
real engine has and the simulator lacks leaves its signal untested (no data) in every simulation."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pd_operator.autoscale.promql import LATENCY_ROLE, METRICS, POOL_METRIC
from pd_operator_tools.enginesim.clock import VirtualClock
from pd_operator_tools.enginesim.engine import Engine, SimRequest
from pd_operator_tools.enginesim.metrics import SGLANG_PROMPT_BUCKETS, PromSink
from tests.sim.conftest import parse_metrics

HISTOGRAMS = {"prefill": ("prefill_time", "prompt_hist", "computed_hist"), "decode": ("itl", "e2e", "generation_hist")}
COUNTERS = {"prefill": ("prompt_tokens",), "decode": ("generation_tokens", "decode_tokens")}


def _page(flavor: str, role: str) -> dict[str, float]:
    clock, registry = VirtualClock(), CollectorRegistry()
    engine = Engine(clock, role=role, sink=PromSink(flavor, "q", role, registry=registry))
    for _ in range(3):
        req = SimRequest(500, 120, prefill_only=role == "prefill")
        req.received, req.stream = 0.0, True
        clock.call_at(0.0, lambda req=req: engine.add(req))
    clock.run(until=600.0)
    return parse_metrics(generate_latest(registry).decode())


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_simulated_engines_export_what_the_autoscaler_reads(flavor, role):
    names = {k.split("{")[0] for k in _page(flavor, role)}
    wanted = [f"{METRICS[flavor][key]}_bucket" for key in HISTOGRAMS[role]]
    wanted += [METRICS[flavor][key] for key in COUNTERS[role]]
    wanted += [METRICS[flavor][key] for key in ("waiting", "running", "kv_usage")]
    # the pool's latency histogram, on the pods it is read from (SGLang's TTFT: decode pods)
    for pool, key in POOL_METRIC.items():
        if LATENCY_ROLE.get((flavor, pool), pool) == role:
            wanted.append(f"{METRICS[flavor][key]}_bucket")
    assert [m for m in wanted if m not in names] == []


def test_the_simulated_sglang_has_its_output_length_histogram_with_the_default_buckets():
    """SGLang observes every finished request's generated tokens in generation_tokens_histogram,
    a PD decode worker's too; without --generation-tokens-buckets its buckets are the prompt
    histogram's defaults (observability/metrics_collector.py, TokenizerMetricsCollector)."""
    page = _page("sglang", "decode")
    bounds = sorted(float(k.split('le="')[1].split('"')[0]) for k in page
                    if k.startswith("sglang:generation_tokens_histogram_bucket"))
    assert bounds == [*map(float, SGLANG_PROMPT_BUCKETS), float("inf")]
    count = [v for k, v in page.items() if k.startswith("sglang:generation_tokens_histogram_count")]
    total = [v for k, v in page.items() if k.startswith("sglang:generation_tokens_histogram_sum")]
    assert count == [3.0] and total == [360.0]
