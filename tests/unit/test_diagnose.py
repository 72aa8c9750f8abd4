"""The Serving condition (autoscale/diagnose.py and the autoscaler loop that writes it).

Series as the pinned routers and engines export them (tests/contract/FACTS.md,
"Serving diagnosis"); one query per signal covers every service."""

from __future__ import annotations

import pytest

from pd_operator.autoscale.diagnose import Signals, diagnose, diagnosis_queries, merge, signals_by_service
from pd_operator.controller.autoscaler import Autoscaler
from pd_operator.controller.kube import DIAGNOSIS_MANAGER

from .test_autoscaler_loop import FakeKube, Signals as LatencySignals, body

VLLM = dict(served_name="qwen3-8b", engine="vllm", router="vllm-router")
SGL = dict(served_name="qwen3-8b", engine="sglang", router="sglang-router")
HEALTHY = dict(workers=2, healthy=2, unhealthy=None, worker_errors=0, requests=100, kv_failures=0, overload=0)


def vec(by_service: dict):
    return [{"metric": {"namespace": ns, "pdserving_io_service": svc}, "value": [0, str(v)]}
            for (ns, svc), v in by_service.items()]


def test_queries_are_grouped_by_service_one_per_signal():
    for engine, router in (("vllm", "vllm-router"), ("sglang", "sglang-router")):
        qs = diagnosis_queries(engine, router)
        for q in qs.values():
            for promql in q.promql:
                assert "by (namespace, pdserving_io_service" in promql, promql
                assert "pdserving_io_service=" not in promql  # never one query per service
                assert "__name__" not in promql  # increase() of several names clashes (Prometheus 422)
    text = lambda e, r, s: " ".join(diagnosis_queries(e, r)[s].promql)  # noqa: E731
    for engine, router, metric in (("vllm", "vllm-router", "vllm:nixl_num_failed_transfers_total"),
                                   ("sglang", "sglang-router", "sglang:num_transfer_failed_reqs_total")):
        for match in ('!=""', '=""'):  # the pods of an LWS group, the other pods
            assert f"increase({metric}{{leaderworkerset_sigs_k8s_io_group_key{match}}}[1m])" in text(engine, router, "kv_failures")
    assert "smg_worker_health" in text("sglang", "sglang-router", "unhealthy")
    assert "vllm:admission_rejections_total" in text("vllm", "vllm-router", "overload")


def test_a_signal_of_several_metrics_is_summed_per_service():
    a = vec({("ns", "x"): 2, ("ns", "y"): 1})
    b = vec({("ns", "x"): 3})
    got = {(s["metric"]["pdserving_io_service"]): float(s["value"][1]) for s in merge([a, b])}
    assert got == {"x": 5.0, "y": 1.0}


def test_results_split_by_service_and_model():
    sig = signals_by_service({
        "workers": [{"metric": {"namespace": "a", "pdserving_io_service": "s"}, "value": [0, "2"]}],
        "worker_errors": [{"metric": {"namespace": "a", "pdserving_io_service": "s"}, "value": [0, "NaN"]}],
        "models": [{"metric": {"namespace": "a", "pdserving_io_service": "s", "model": "gpt-4"}, "value": [0, "7"]},
                   {"metric": {"namespace": "b", "pdserving_io_service": "t", "model": "x"}, "value": [0, "1"]}],
    })
    assert sig[("a", "s")].workers == 2 and sig[("a", "s")].worker_errors is None
    assert sig[("a", "s")].models == {"gpt-4": 7.0} and sig[("b", "t")].models == {"x": 1.0}


@pytest.mark.parametrize("kind,signals,reason,words", [
    (VLLM, dict(HEALTHY, unhealthy=1, worker_errors=30), "WorkersUnreachable", ["1/2 workers", "port 8000", "NO_PROXY"]),
    # sglang-router drops a worker it cannot reach at startup: fewer healthy workers than ready pods
    (SGL, dict(HEALTHY, workers=1, healthy=1), "WorkersUnreachable", ["1 healthy worker(s) for the 2 ready"]),
    (VLLM, dict(HEALTHY, worker_errors=12, kv_failures=12), "KVTransferFailing", ["12 failed", "NIXL"]),
    (VLLM, dict(HEALTHY, worker_errors=5, overload=5), "Overloaded", ["5 requests", "queue limit", "--max-num-queued-reqs", "replicas"]),
    (SGL, dict(HEALTHY, models={"qwen3-8b": 90, "gpt-4o": 10}, not_found=10), "UnknownModelRequested",
     ["10 requests", "404", "'gpt-4o' (10)", '"model": "qwen3-8b"']),
    # SGLang's chat API serves any model name: no 404, nothing failed, the name is noted
    (SGL, dict(HEALTHY, models={"qwen3-8b": 90, "gpt-4o": 10}), "Serving", ["'gpt-4o' (10)", "any model name"]),
    (SGL, dict(HEALTHY, worker_errors=20), "EngineAuthRejected", ["refused 20 of 100", "401", "same key"]),
    (VLLM, dict(HEALTHY, worker_errors=20), "EngineAuthRejected", ["401", "404", "qwen3-8b"]),
    (VLLM, HEALTHY, "Serving", ["2 workers healthy"]),
])
def test_verdicts(kind, signals, reason, words):
    v = diagnose(Signals(**signals), backend="nixl", engine_port=8000, ready_workers=2, **kind)
    assert v.reason == reason, v
    assert v.status == ("True" if reason == "Serving" else "False")
    for w in words:
        assert w in v.message, (w, v.message)


def test_workers_are_counted_on_the_ips_of_the_ready_pods():
    # the routers keep exporting a removed worker's last health (1): after a pod was
    # recreated on a new IP the router may hold the old URL "healthy" and never add
    # the new one (vllm-router waits for its health check, e.g. a wrong port)
    stale = dict(HEALTHY, workers=3, healthy=3, health={"http://10.0.0.1:8000": 1, "http://10.0.0.2:8000": 1,
                                                        "http://10.0.0.9:8000": 1})
    ready = frozenset({"10.0.0.1", "10.0.0.3"})
    assert diagnose(Signals(**stale), ready_workers=2, **VLLM).reason == "Serving"  # the count alone is fooled
    v = diagnose(Signals(**stale), ready_workers=2, ready_ips=ready, engine_port=8000, **VLLM)
    assert v.reason == "WorkersUnreachable" and "holds 1 healthy worker(s) for the 2 ready" in v.message, v
    ok = dict(HEALTHY, health={"http://10.0.0.1:8000": 1, "http://10.0.0.3:8000": 1, "http://10.0.0.9:8000": 0})
    v = diagnose(Signals(**ok), ready_ips=ready, **VLLM)
    assert v.reason == "Serving" and v.message.startswith("2 workers healthy"), v  # the stale 0 is not counted
    v6 = dict(HEALTHY, health={"http://[fd00::1]:8000": 1})
    assert diagnose(Signals(**v6), ready_ips=frozenset({"fd00::1"}), **VLLM).reason == "Serving"


def test_an_open_circuit_is_named_once_its_failures_left_the_window():
    # sglang-router opened the prefill worker's circuit during KV failures; they are out
    # of the window, the router still sends it nothing (503 "all circuits open")
    sig = dict(HEALTHY, health={"http://10.0.0.1:30000": 1, "http://10.0.0.2:30000": 1},
               circuits={"http://10.0.0.1:30000": 1, "http://10.0.0.2:30000": 0, "http://10.0.0.7:30000": 1})
    v = diagnose(Signals(**sig), ready_ips=frozenset({"10.0.0.1", "10.0.0.2"}), **SGL)
    assert v.reason == "WorkersUnreachable" and "circuit breaker is open for 1/2 workers" in v.message, v
    assert "--cb-timeout-duration-secs" in v.message
    # while the KV failures are in the window, they are the cause named
    assert diagnose(Signals(**dict(sig, kv_failures=3)), ready_ips=frozenset({"10.0.0.1", "10.0.0.2"}),
                    **SGL).reason == "KVTransferFailing"
    closed = dict(sig, circuits={"http://10.0.0.1:30000": 2, "http://10.0.0.2:30000": 0})  # half-open: trying
    assert diagnose(Signals(**closed), ready_ips=frozenset({"10.0.0.1", "10.0.0.2"}), **SGL).reason == "Serving"


def test_per_worker_series_are_read_by_url():
    sig = signals_by_service({
        "health": [{"metric": {"namespace": "a", "pdserving_io_service": "s", "worker": "http://10.0.0.1:8000"},
                    "value": [0, "1"]}],
        "circuits": [{"metric": {"namespace": "a", "pdserving_io_service": "s", "worker": "http://10.0.0.1:8000"},
                      "value": [0, "1"]}],
    })
    assert sig[("a", "s")].health == {"http://10.0.0.1:8000": 1.0}
    assert sig[("a", "s")].circuits == {"http://10.0.0.1:8000": 1.0}
    for engine, router in (("vllm", "vllm-router"), ("sglang", "sglang-router")):
        q = diagnosis_queries(engine, router)
        assert "worker)" in q["health"].promql[0] and "cb_state" in q["circuits"].promql[0]


def test_no_series_is_unknown_not_serving():
    assert diagnose(None, **VLLM).status == "Unknown"
    assert diagnose(Signals(), **VLLM).reason == "NoData"


LOOP = dict(HEALTHY, workers=10, healthy=10)  # whatever the fake pools scale to


class Diagnosis:
    def __init__(self, signals: Signals):
        self.signals, self.calls = signals, []

    def __call__(self, prom, engine, router):
        self.calls.append((prom.url, engine, router))
        return {("ns", "svc"): self.signals}


class Kube(FakeKube):
    def __init__(self):
        super().__init__()
        self.applied: dict[str, dict] = {}

    def patch_status(self, namespace, name, patch, manager=None):
        self.applied[manager] = patch
        super().patch_status(namespace, name, patch, manager)


def test_loop_writes_serving_with_its_own_manager_and_events_on_start_and_end():
    kube, events = Kube(), []
    diag = Diagnosis(Signals(**dict(LOOP, worker_errors=40)))
    scaler = Autoscaler(kube, LatencySignals(), lambda b, t, r, m: r != "Autoscaled" and events.append((t, r, m)), diagnosis=diag)
    b = body()
    scaler.run_once([b], force=True)
    assert diag.calls == [("http://prometheus.monitoring:9090", "vllm", "vllm-router")]
    serving = kube.applied[DIAGNOSIS_MANAGER]["conditions"]
    assert [c["type"] for c in serving] == ["Serving"]  # only its own condition: the autoscaler's stay its own
    assert serving[0]["reason"] == "EngineAuthRejected" and serving[0]["status"] == "False"
    assert [(t, r) for t, r, _ in events] == [("Warning", "EngineAuthRejected")]

    # same failure next round: no new Event
    b["status"] = {"conditions": serving}
    scaler.run_once([b], force=True)
    assert [(t, r) for t, r, _ in events] == [("Warning", "EngineAuthRejected")]

    # fixed: Serving True, an Event says it cleared
    diag.signals = Signals(**LOOP)
    scaler.run_once([b], force=True)
    assert kube.applied[DIAGNOSIS_MANAGER]["conditions"][0]["status"] == "True"
    assert events[-1][:2] == ("Normal", "ServingRecovered") and "EngineAuthRejected cleared" in events[-1][2]


def test_services_without_autoscaling_are_diagnosed_too():
    kube = Kube()
    b = body()
    for role in ("prefill", "decode"):
        b["spec"][role]["autoscaling"]["enabled"] = False
    diag = Diagnosis(Signals(**dict(LOOP, kv_failures=3)))
    Autoscaler(kube, LatencySignals(), lambda *a: None, diagnosis=diag).run_once([b], force=True)
    assert kube.applied[DIAGNOSIS_MANAGER]["conditions"][0]["reason"] == "KVTransferFailing"


def test_prometheus_down_is_unknown_and_no_event():
    kube, events = Kube(), []

    def down(prom, engine, router):
        raise ConnectionError("refused")

    Autoscaler(kube, LatencySignals(), lambda b, t, r, m: r != "Autoscaled" and events.append(r),
               diagnosis=down).run_once([body()], force=True)
    (cond,) = kube.applied[DIAGNOSIS_MANAGER]["conditions"]
    assert (cond["status"], cond["reason"]) == ("Unknown", "PrometheusUnreachable")
    assert events == []



def _promtool_values(promtool: str, tmp_path, series: list[dict], expr: str, at: str) -> dict[str, float]:
    """The value of ``expr`` per service at ``at`` over ``series`` (promtool test rules prints
    what it got when it differs from the expected: nothing is expected here)."""
    import re
    import subprocess

    import yaml

    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "15s", "tests": [
        {"interval": "15s", "input_series": series,
         "promql_expr_test": [{"expr": expr, "eval_time": at, "exp_samples": []}]}]}))
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    out = r.stdout + r.stderr
    assert "got:" in out, out
    got = out.split("got:", 1)[1]
    return {svc: float(v) for svc, v in re.findall(r'pdserving_io_service="([^"]+)"\} ([-0-9.eE+]+)', got)}


def test_sglang_kv_failures_count_each_request_once_not_once_per_rank(tmp_path):
    """SGLang counts a failed KV transfer on every rank of the request's attention-TP group, each
    under its own tp_rank: the transfer status is all-reduced over the group and each rank
    concludes the request (disaggregation/prefill.py handle_inflight_transfer_failure, after
    poll_and_all_reduce_attn_cp_tp_group; decode.py _record_transfer_failure), its collector
    created on every rank with metrics on (observability/metrics_collector.py init_new). Summed
    over the series, one failed request read as tensor-parallel-size failures (the Serving
    message, the chart's recording rule and the dashboard)."""
    import json
    import re

    from tests.conftest import ROOT, prometheus_binary

    promtool = prometheus_binary("promtool")
    if promtool is None:
        pytest.skip("promtool not built (e2e/controlplane/build.sh)")
    series = []
    # the same two failed requests on a pod of TP 4 (service s), on a pod of TP 1 (service s1), and
    # on a replica of TP 16 over two pods of one LWS group (s2: each pod's 8 ranks count them); two
    # failed requests on each of two one-pod replicas (s3, its ranks on distinct pods: 4)
    layouts = {"s": [("s", "", range(4))], "s1": [("s1", "", range(1))],
               "s2": [("s2-0", "g2", range(8)), ("s2-0-1", "g2", range(8, 16))],
               "s3": [("s3-0", "", range(2)), ("s3-1", "", range(2))]}
    for svc, pods in layouts.items():
        for index, (pod, group, ranks) in enumerate(pods):
            # the labels the scrape job copies from an LWS group's pods
            key = (f',leaderworkerset_sigs_k8s_io_group_key="{group}",leaderworkerset_sigs_k8s_io_worker_index="{index}"'
                   if group else "")
            target = f'namespace="ns",pdserving_io_service="{svc}",instance="{pod}:8000",job="pd-engines",pod="{pod}"{key}'
            series.append({"series": f"up{{{target}}}", "values": "1x16"})
            series += [{"series": f'sglang:num_transfer_failed_reqs_total{{{target},tp_rank="{r}",pp_rank="0",moe_ep_rank="{r}"}}',
                        "values": "0x8 2x7"} for r in ranks]
    (diagnosis, *_) = diagnosis_queries("sglang", "sglang-router", window="2m")["kv_failures"].promql
    template = (ROOT / "charts/pd-operator/templates/prometheusrule.yaml").read_text()
    (rule,) = re.findall(r"record: pdserving:kv_transfer_failures:increase\n\s+expr: (.+)", template)
    rule = rule.replace("{{ $svc }}", "pdserving_io_service").replace("{{ $m }}", "sglang:num_transfer_failed_reqs_total")
    rule = rule.replace("{{ $r.window }}", "2m")
    dash = json.loads((ROOT / "charts/pd-operator/dashboards/pd-operator.json").read_text())
    (panel,) = [p for p in dash["panels"] if p["title"].startswith("Serving failures")]
    (board,) = [t["expr"] for t in panel["targets"] if "KV transfer" in t["legendFormat"]]
    board = board.replace("$namespace", "ns").replace("$service", ".*").replace("$__rate_interval", "2m")
    for name, expr in (("diagnosis", diagnosis), ("rule", rule), ("dashboard", board)):
        got = _promtool_values(promtool, tmp_path, series, expr, "3m")
        assert set(got) == {"s", "s1", "s2", "s3"} and got["s1"] > 0, (name, got)
        assert got["s"] == got["s2"] == pytest.approx(got["s1"]), (name, got)
        assert got["s3"] == pytest.approx(2 * got["s1"]), (name, got)
