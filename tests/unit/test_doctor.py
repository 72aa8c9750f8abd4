"""``pdctl doctor``: the page (doctor.report, pure) and the command line."""

from __future__ import annotations

from pd_operator.autoscale.diagnose import Signals, diagnose
from pd_operator.cli import build_parser
from pd_operator.doctor import History, history_from, report

NOW = 1_800_000_000.0
BODY = {
    "metadata": {"name": "chat", "namespace": "team-a"},
    "spec": {"engine": {"kind": "sglang"}},
    "status": {"servedModelName": "qwen3-8b", "endpoint": "http://chat.team-a.svc:8000/v1",
               "conditions": [
                   {"type": "Ready", "status": "True", "reason": "Ready", "message": "serving qwen3-8b",
                    "lastTransitionTime": "2027-01-15T08:00:00Z"},
                   {"type": "Serving", "status": "False", "reason": "UnknownModelRequested",
                    "message": "clients asked for a model ...", "lastTransitionTime": "2027-01-15T07:59:00Z"}]},
}
POD = {"metadata": {"name": "chat-decode-0", "labels": {"pdserving.io/role": "decode"}},
       "spec": {"nodeName": "gpu-3"},
       "status": {"phase": "Running", "containerStatuses": [{"ready": True, "restartCount": 2}]}}


def matrix(service: str, values: list[float]) -> list[dict]:
    return [{"metric": {"namespace": "team-a", "pdserving_io_service": service},
             "values": [[NOW - 3600 + 60 * i, str(v)] for i, v in enumerate(values)]}]


def test_page_shows_conditions_pods_last_hour_and_the_fix():
    hist = history_from({"not_found": matrix("chat", [0] * 50 + [4, 9, 12]) + matrix("other", [99] * 53),
                         "requests": matrix("chat", [20] * 53)}, "team-a", "chat")
    assert hist["not_found"].peak == 12  # the other service's 99 is not this one's
    verdict = diagnose(Signals(workers=2, healthy=2, requests=53, worker_errors=0, kv_failures=0, overload=0,
                               not_found=12, models={"qwen3-8b": 41, "gpt-4o": 12}),
                       served_name="qwen3-8b", engine="sglang", router="sglang-router", ready_workers=2)
    page = report(BODY, [POD], [{"type": "Warning", "reason": "UnknownModelRequested", "message": "m",
                                 "lastTimestamp": "2027-01-15T07:59:00Z"}], hist, verdict, "http://prom:9090", now=NOW)
    assert "Serving            False   UnknownModelRequested" in page
    assert "chat-decode-0" in page and "decode" in page and "restarts 2" in page and "gpu-3" in page
    line = next(l for l in page.splitlines() if "another model" in l)
    assert line.rstrip().endswith("peak 12") and "█" in line
    assert "'gpt-4o' (12)" in page and '"model": "qwen3-8b"' in page  # the numbers and the fix
    assert "Recent warnings" in page


def test_without_prometheus_it_says_how_to_get_one():
    page = report(BODY, [], [], None, None, None, now=NOW)
    assert "--prometheus" in page and "(none)" in page
    assert "UnknownModelRequested: clients asked" in page  # the operator's last verdict


def test_spark_marks_when():
    h = History([(NOW + 60 * i, 0.0 if i < 55 else 5.0) for i in range(60)])
    assert h.spark()[0] == "▁" and h.spark()[-1] == "█"


def test_command_line():
    args = build_parser().parse_args(["doctor", "chat", "-n", "team-a", "--prometheus", "http://127.0.0.1:9090"])
    assert (args.name, args.namespace, args.prometheus) == ("chat", "team-a", "http://127.0.0.1:9090")
