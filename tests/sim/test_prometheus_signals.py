"""The autoscaler's queries against real Prometheus scraping a simulated engine."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request

import pytest

from pd_operator.autoscale.signals import PrometheusSignals
from tests.sim.conftest import free_port, get, loopback_host, parse_metrics, wait_http

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus (tests/run.sh installs it)")


def complete(url: str, n: int) -> None:
    for i in range(n):
        body = json.dumps({"model": "q", "prompt": "word " * (400 + 50 * i), "max_tokens": 8}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200


def scraped(url: str, targets: int, timeout: float = 30.0) -> None:
    """Wait until Prometheus has scraped every target at least twice."""
    deadline = time.monotonic() + timeout
    q = "count_over_time(up[1m]) >= 2"
    while time.monotonic() < deadline:
        body = json.loads(get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": q}))[1])
        if len(body["data"]["result"]) >= targets:
            return
        time.sleep(0.5)
    raise TimeoutError("Prometheus did not scrape the targets")


def bucket_bounds(metrics_text: str, name: str, q: float) -> tuple[float, float]:
    """The histogram bucket that holds quantile q of the engine's own histogram."""
    buckets = sorted(
        (float(k.split('le="')[1].split('"')[0]), v)
        for k, v in parse_metrics(metrics_text).items() if k.startswith(name + "_bucket")
    )
    total = buckets[-1][1]
    prev = 0.0
    for le, count in buckets:
        if count >= q * total:
            return prev, le
        prev = le
    raise AssertionError("empty histogram")


def test_ttft_quantile_idle_and_absent(procs, tmp_path):
    busy_host, idle_host = loopback_host(), loopback_host()
    busy_port, idle_port = free_port(busy_host), free_port(idle_host)
    engine = ["vllm", "serve", "Qwen/Qwen3-8B", "--served-model-name", "q", "--port", "8000"]
    procs.sim(engine, busy_host, busy_port)
    procs.sim(engine, idle_host, idle_port)
    prom_host = loopback_host()
    prom_port = free_port(prom_host)
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global: {{scrape_interval: 1s}}
scrape_configs:
- job_name: engines
  static_configs:
  - targets: ["{busy_host}:{busy_port}"]
    labels: {{namespace: team-a, pdserving_io_service: busy, pdserving_io_role: prefill}}
  - targets: ["{idle_host}:{idle_port}"]
    labels: {{namespace: team-a, pdserving_io_service: idle, pdserving_io_role: prefill}}
""")
    procs.start([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address={prom_host}:{prom_port}"])
    url = f"http://{prom_host}:{prom_port}"
    wait_http(url + "/-/ready", timeout=30)
    scraped(url, 2)  # samples before the load: rate() needs the counter's start
    complete(f"http://{busy_host}:{busy_port}", 12)
    time.sleep(3.5)
    obs = PrometheusSignals(url).pool("vllm", "prefill", 0.99, window="30s")
    lo, hi = bucket_bounds(get(f"http://{busy_host}:{busy_port}/metrics")[1], "vllm:time_to_first_token_seconds", 0.99)
    busy = obs[("team-a", "busy")].observed
    assert busy is not None and lo <= busy <= hi, (busy, lo, hi)
    assert obs[("team-a", "idle")].observed == 0.0
    assert obs[("team-a", "busy")].demand > 0  # prompt tokens/s
    assert ("team-a", "absent") not in obs
