"""The simulated SGLang reports TTFT where and as SGLang 0.5.23 does (tests/contract/FACTS.md):
none on a PD prefill worker; on a decode worker from its receipt of the request, labelled
is_streaming, and for a request not streamed at its first batched output."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pd_operator_tools.enginesim.clock import VirtualClock
from pd_operator_tools.enginesim.engine import Engine, SimRequest
from pd_operator_tools.enginesim.metrics import PromSink
from pd_operator_tools.enginesim.server import SGLANG_FORCE_STREAM_INTERVAL
from tests.sim.conftest import parse_metrics


def _ttft_series(role: str, requests) -> tuple[dict[str, float], list[SimRequest]]:
    clock, registry = VirtualClock(), CollectorRegistry()
    sink = PromSink("sglang", "q", role, registry=registry)
    engine = Engine(clock, role=role, sink=sink)
    made = []
    for at, stream, tokens in requests:
        req = SimRequest(2000, tokens, prefill_only=role == "prefill")
        req.received, req.stream = 0.0, stream
        if role == "decode" and not stream:
            req.ttft_token = SGLANG_FORCE_STREAM_INTERVAL
        clock.call_at(at, lambda req=req: engine.add(req))
        made.append(req)
    clock.run(until=600.0)
    text = generate_latest(registry).decode()
    return {k: v for k, v in parse_metrics(text).items() if k.startswith("sglang:time_to_first_token_seconds")}, made


def test_a_prefill_worker_reports_no_ttft():
    series, made = _ttft_series("prefill", [(0.0, True, 1)])
    assert made[0].finished is not None and series == {}


def test_a_decode_worker_reports_it_from_its_receipt_streamed_or_batched():
    series, (streamed, batched, short) = _ttft_series("decode", [(1.0, True, 200), (1.0, False, 200), (1.0, False, 10)])
    count = {k.split("is_streaming=")[1][1:].split('"')[0]: v for k, v in series.items() if "_count" in k}
    total = {k.split("is_streaming=")[1][1:].split('"')[0]: v for k, v in series.items() if "_sum" in k}
    assert count == {"true": 1.0, "false": 2.0}
    # streamed: its first token, counted from the receipt (the 1 s before the engine took it included)
    assert total["true"] == pytest.approx(streamed.first_token - 0.0) and streamed.first_token > 1.0
    # not streamed: its 50th token, or its end when it has fewer
    fiftieth = batched.first_token + sum(batched.itls[:SGLANG_FORCE_STREAM_INTERVAL - 1])
    assert total["false"] == pytest.approx(fiftieth - 0.0 + short.finished - 0.0)
    assert fiftieth > batched.first_token


def test_generated_tokens_count_at_the_end_and_as_the_decode_batches_run():
    """SGLang adds a request's tokens to generation_tokens_total when it finishes
    (observe_one_finished_request); realtime_tokens_total{mode="decode"} moves with each decode
    batch (report_decode_stats): the autoscaler's decode demand reads the latter."""
    clock, registry = VirtualClock(), CollectorRegistry()
    sink = PromSink("sglang", "q", "decode", registry=registry)
    engine = Engine(clock, role="decode", sink=sink)
    req = SimRequest(2000, 400)
    req.received = 0.0
    clock.call_at(0.0, lambda: engine.add(req))

    def counters() -> tuple[float, float]:
        page = parse_metrics(generate_latest(registry).decode())
        decoded = sum(v for k, v in page.items() if k.startswith("sglang:realtime_tokens_total") and 'mode="decode"' in k)
        return page['sglang:generation_tokens_total{engine_type="decode",model_name="q"}'], decoded

    clock.run(until=1.0)
    assert req.finished is None and 0 < req.generated < 400
    assert counters() == (0.0, req.generated)                    # mid-stream: only the batches' counter
    clock.run(until=600.0)
    assert req.finished is not None and counters() == (400.0, 400.0)


def test_a_request_not_streamed_observes_its_itls_per_batched_output():
    """SGLang observes ITL per output (collect_metrics): an output of n tokens after the first
    output is n observations of its interval / n. A request not streamed has an output every
    50 tokens, so its ITLs are 50-token averages (a slow step is smoothed) and the tokens of its
    first output, which stamps the TTFT, observe none. A streamed one observes every token."""
    def run(stream: bool):
        clock, registry = VirtualClock(), CollectorRegistry()
        sink = PromSink("sglang", "q", "decode", registry=registry)
        engine = Engine(clock, role="decode", sink=sink)
        req = SimRequest(2000, 120)
        req.received, req.stream = 0.0, stream
        if not stream:
            req.ttft_token = SGLANG_FORCE_STREAM_INTERVAL
        clock.call_at(0.0, lambda: engine.add(req))
        clock.run(until=600.0)
        assert req.finished is not None
        return req, list(sink.samples.itl)

    streamed, seen = run(True)
    assert seen == streamed.itls and len(seen) == 119
    batched, seen = run(False)
    # tokens 51..120 as two outputs, at the 100th (50 tokens) and the end (20)
    first = sum(batched.itls[49:99]) / 50
    second = sum(batched.itls[99:]) / 20
    assert seen == pytest.approx([first] * 50 + [second] * 20)
    assert sum(seen) == pytest.approx(batched.finished - batched.first_token - sum(batched.itls[:49]))
