"""The simulated SGLang engine's per-scheduler series (enginesim/metrics.py): one scheduler per
attention-DP group, on the node of its first TP rank, its gauges counting the requests the
engine gave that group. What a real node of rank >= 1 serves (FACTS.md "Series per engine")."""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest

from pd_operator_tools.enginesim.clock import VirtualClock
from pd_operator_tools.enginesim.engine import Engine, SimRequest
from pd_operator_tools.enginesim.metrics import PromSink


def page_ranks(sink: PromSink, node: int, name: str = "sglang:num_queue_reqs") -> dict[str, tuple[str, float]]:
    """dp_rank ("" without) -> (tp_rank, value) of ``name`` on a node's page."""
    text = generate_latest(sink.node_registries[node]).decode()
    out = {}
    for labels, value in re.findall(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$", text, re.M):
        d = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out[d.get("dp_rank", "")] = (d["tp_rank"], float(value))
    return out


@pytest.mark.parametrize("dp,tp,nodes,where", [
    # no attention DP: one scheduler, tp_rank 0, on node 0; the other nodes report none
    (1, 16, 2, {0: {"": "0"}}),
    # 4 groups of 4 TP ranks over 2 nodes of 8: groups 0-1 on node 0, 2-3 on node 1
    (4, 16, 2, {0: {"0": "0", "1": "4"}, 1: {"2": "8", "3": "12"}}),
    # 2 groups of 8 over 4 nodes of 4: their first ranks on nodes 0 and 2; nodes 1 and 3 none
    (2, 16, 4, {0: {"0": "0"}, 2: {"1": "8"}}),
])
def test_each_group_reports_from_the_node_of_its_first_rank(dp, tp, nodes, where):
    sink = PromSink("sglang", "m", "decode", dp=dp, tp=tp, nodes=nodes)
    assert set(sink.node_registries) == set(range(nodes))
    for node in range(nodes):
        assert {d: t for d, (t, _v) in page_ranks(sink, node).items()} == where.get(node, {})


def test_a_failed_transfer_counts_on_every_rank_of_its_group_on_their_nodes():
    """SGLang counts a failed KV transfer on every rank of the request's attention-TP group
    (disaggregation/decode.py _record_transfer_failure), each on its own node: TP 16 over two
    nodes without attention DP, ranks 0-7 on node 0, 8-15 on node 1; with attention DP 4, the
    request's group only (its 4 ranks)."""
    name = "sglang:num_transfer_failed_reqs_total"
    sink = PromSink("sglang", "m", "decode", dp=1, tp=16, nodes=2)
    assert page_ranks(sink, 0, name) == {} == page_ranks(sink, 1, name)  # created at the first failure
    sink.kv_transfer_failed()

    def ranks(node: int) -> list[str]:
        text = generate_latest(sink.node_registries[node]).decode()
        return sorted(re.findall(r'^' + re.escape(name) + r'\{[^}]*tp_rank="(\d+)"[^}]*\} 1\.0$', text, re.M), key=int)

    assert ranks(0) == [str(r) for r in range(8)] and ranks(1) == [str(r) for r in range(8, 16)]
    sink = PromSink("sglang", "m", "decode", dp=4, tp=16, nodes=2)
    sink.kv_transfer_failed(group=3)
    assert ranks(0) == [] and ranks(1) == ["12", "13", "14", "15"]


def test_the_groups_gauges_add_up_to_the_replica():
    clock = VirtualClock()
    sink = PromSink("sglang", "m", "decode", dp=4, tp=16, nodes=2)
    engine = Engine(clock, role="decode", max_num_seqs=3, sink=sink, dp_ranks=4)
    sink.bind(engine)
    for _ in range(10):
        engine.add(SimRequest(prompt_tokens=100, max_tokens=50))
    clock.run(until=0.001)
    # dealt in turn: groups 0 and 1 get 3 requests, 2 and 3 get 2; 3 running (the first three)
    waiting = {**page_ranks(sink, 0), **page_ranks(sink, 1)}
    running = {**page_ranks(sink, 0, "sglang:num_running_reqs"), **page_ranks(sink, 1, "sglang:num_running_reqs")}
    assert sum(v for _t, v in waiting.values()) == engine.num_waiting == 7
    assert sum(v for _t, v in running.values()) == len(engine.running) == 3
    assert {d: v for d, (_t, v) in running.items()} == {"0": 1, "1": 1, "2": 1, "3": 0}
    assert {d: v for d, (_t, v) in waiting.items()} == {"0": 2, "1": 2, "2": 1, "3": 2}
    # each group's KV usage is over its quarter of the pool: the mean is the replica's
    kv = {**page_ranks(sink, 0, "sglang:token_usage"), **page_ranks(sink, 1, "sglang:token_usage")}
    assert sum(v for _t, v in kv.values()) / 4 == pytest.approx(engine.kv_usage)
    # the decode batches' tokens, by the group of the request that made them
    clock.run(until=600.0)
    tokens = {**page_ranks(sink, 0, "sglang:realtime_tokens_total"), **page_ranks(sink, 1, "sglang:realtime_tokens_total")}
    assert {d: v for d, (_t, v) in tokens.items()} == {"0": 150, "1": 150, "2": 100, "3": 100}


def series_labels(sink: PromSink, node: int, name: str) -> list[dict[str, str]]:
    text = generate_latest(sink.node_registries[node]).decode()
    return [dict(re.findall(r'(\w+)="([^"]*)"', labels))
            for labels in re.findall(r"^" + re.escape(name) + r"\{([^}]*)\} \S+$", text, re.M)]


@pytest.mark.parametrize("dp,tp,ep,moe_dp,moe_ep_ranks", [
    (4, 16, 16, 1, ["0", "4", "8", "12"]),  # EP over the TP group: a rank's EP rank is its TP rank
    (4, 16, 1, 1, ["0", "0", "0", "0"]),    # no EP
    (4, 16, 4, 1, ["0", "1", "2", "3"]),    # EP 4 x MoE-TP 4: ranks 0-3 EP rank 0, 4-7 EP rank 1, ...
    (4, 16, 4, 2, ["0", "2", "0", "2"]),    # MoE DP 2: ranks 0-7 and 8-15 each an EP 4 x MoE-TP 2 block
])
def test_scheduler_series_carry_the_ranks_the_tokenizers_none(dp, tp, ep, moe_dp, moe_ep_ranks):
    """SGLang labels a scheduler's series model_name, engine_type, tp_rank, pp_rank, moe_ep_rank
    (and dp_rank with DP); the tokenizer's only model_name and engine_type (observability/
    metrics_collector.py: the scheduler collector's labels, tokenizer_metric_labels). The
    moe_ep_rank of a rank follows distributed/parallel_state.py's _MOE_EP groups."""
    sink = PromSink("sglang", "m", "decode", dp=dp, tp=tp, nodes=2, ep=ep, moe_dp=moe_dp)
    got = sorted((s for node in (0, 1) for s in series_labels(sink, node, "sglang:num_running_reqs")),
                 key=lambda s: int(s["dp_rank"]))
    assert [set(s) for s in got] == [{"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"}] * dp
    assert [s["moe_ep_rank"] for s in got] == moe_ep_ranks and {s["pp_rank"] for s in got} == {"0"}
    assert [set(s) for s in series_labels(sink, 0, "sglang:generation_tokens_total")] == [{"model_name", "engine_type"}]


def test_every_rank_of_a_group_observes_its_requests_queue_and_prefill_times():
    """Queue time and the prefill_forward stage are scheduler histograms, observed on every rank
    with metrics on (the scheduler collector is made on each: SchedulerMetricsCollectorContext
    .init_new; req_time_stats.py), each under its tp_rank on its own node, for the requests of its
    attention-DP group, and created at the first observation."""
    clock = VirtualClock()
    sink = PromSink("sglang", "m", "prefill", dp=4, tp=16, nodes=2)
    engine = Engine(clock, role="prefill", sink=sink, dp_ranks=4)
    sink.bind(engine)
    for name in ("sglang:queue_time_seconds_count", "sglang:per_stage_req_latency_seconds_count"):
        assert series_labels(sink, 0, name) == [] == series_labels(sink, 1, name)
    for _ in range(6):
        engine.add(SimRequest(prompt_tokens=100, max_tokens=1))
    clock.run(until=60.0)
    text = {node: generate_latest(sink.node_registries[node]).decode() for node in (0, 1)}
    for name in ("sglang:queue_time_seconds_count", "sglang:per_stage_req_latency_seconds_count"):
        got = {}
        for node in (0, 1):
            for labels, value in re.findall(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$", text[node], re.M):
                d = dict(re.findall(r'(\w+)="([^"]*)"', labels))
                got[int(d["tp_rank"])] = (node, d["dp_rank"], float(value))
        # dealt in turn: groups 0 and 1 got 2 requests, 2 and 3 one; ranks 0-7 on node 0, 8-15 on node 1
        assert got == {r: (r // 8, str(r // 4), 2.0 if r < 8 else 1.0) for r in range(16)}, name
