"""pdctl bench against a simulated engine: its numbers agree with the sim's own histograms.

Tolerance: the sim's TTFT runs from the moment the request enters its engine
to the token's creation; the client's adds the loopback HTTP round trip, JSON
encoding and SSE delivery, two processes on a busy 2-core machine: a few ms.
So mean TTFT must agree within 10 ms + 10%, and mean ITL (the gaps between
SSE chunks, one per token, vs the engine's step-to-step times) within
2 ms + 10%.  Counts (tokens, ITL samples) must agree exactly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from pd_operator_tools.loadgen import BenchConfig, run_bench
from pd_operator_tools.workload import LengthDist

from .conftest import free_port, get, loopback_host, metric

SIM = ["vllm", "serve", "Qwen/Qwen3-8B", "--served-model-name", "qwen3-8b", "--max-num-seqs", "64"]


def test_bench_agrees_with_sim_metrics(procs, tmp_path):
    host = loopback_host()
    port = free_port(host)
    procs.sim(SIM, host, port)
    cfg = BenchConfig(url=f"http://{host}:{port}/v1", model="qwen3-8b", rate=10.0, num_requests=50,
                      duration=30, isl="uniform:1500:0.5", osl="lognormal:40:0.4", seed=3)
    summary, results = asyncio.run(run_bench(cfg, progress=False))
    assert summary["completed"] == 50, summary["errors"]
    text = get(f"http://{host}:{port}/metrics")[1]

    # exact: tokens in and out, one ITL sample per token after the first
    rng_isl = sum(r.isl for r in results)
    assert metric(text, "vllm:prompt_tokens_total") == rng_isl
    assert metric(text, "vllm:generation_tokens_total") == summary["output_tokens"] == sum(r.osl for r in results)
    n_itl = sum(len(r.itls) for r in results)
    assert metric(text, "vllm:inter_token_latency_seconds_count") == n_itl
    assert metric(text, "vllm:time_to_first_token_seconds_count") == 50

    sim_ttft = metric(text, "vllm:time_to_first_token_seconds_sum") / 50
    sim_itl = metric(text, "vllm:inter_token_latency_seconds_sum") / n_itl
    b_ttft, b_itl = summary["ttft_s"]["mean"], summary["itl_s"]["mean"]
    print(f"TTFT mean: bench {b_ttft * 1e3:.2f} ms, sim {sim_ttft * 1e3:.2f} ms; "
          f"ITL mean: bench {b_itl * 1e3:.3f} ms, sim {sim_itl * 1e3:.3f} ms")
    assert b_ttft >= sim_ttft - 0.001  # the client cannot see the token before it exists
    assert abs(b_ttft - sim_ttft) <= 0.010 + 0.10 * sim_ttft
    assert abs(b_itl - sim_itl) <= 0.002 + 0.10 * sim_itl
    assert summary["goodput_fraction"] == 1.0  # light load: every request meets 1 s / 50 ms


def test_bench_cli_json_and_plot(procs, tmp_path):
    host = loopback_host()
    port = free_port(host)
    procs.sim(SIM, host, port)
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    proc = subprocess.run([sys.executable, "-m", "pd_operator.cli", "bench", "--url", f"http://{host}:{port}",
                           "--concurrency", "4", "-n", "12", "--isl", "200", "--osl", "fixed:16",
                           "--completions", "--json", str(out), "--plot", str(png)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "goodput" in proc.stdout and "12/12 completed" in proc.stdout
    assert "12/12" in proc.stderr  # the progress bar
    doc = json.loads(out.read_text())
    assert doc["summary"]["completed"] == 12 and len(doc["requests"]) == 12
    assert all(r["output_tokens"] == 16 for r in doc["requests"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_refuses_bad_input():
    with pytest.raises(ValueError):
        asyncio.run(run_bench(BenchConfig(url="localhost:8000", rate=1.0), progress=False))
    with pytest.raises(ValueError):
        LengthDist.parse("zipf:10")


def test_bench_says_when_the_duration_cut_n_short_and_reports_what_other_tools_do(procs, tmp_path):
    """Issue 17: --duration used to cap -n silently ("143/143 completed" for
    -n 150). Now the summary says it, and reports TPOT (per-request mean ITL)
    apart from per-gap ITL, E2E latency, p95, input tok/s, concurrency and the
    client's lag behind the arrival schedule; --warmup requests are not
    counted; --csv has one row per request; without a terminal the progress is
    plain lines, no carriage returns."""
    import csv as _csv

    host = loopback_host()
    port = free_port(host)
    procs.sim(SIM, host, port)
    out, table = tmp_path / "b.json", tmp_path / "b.csv"
    proc = subprocess.run([sys.executable, "-m", "pd_operator.cli", "bench", "--url", f"http://{host}:{port}",
                           "--rate", "20", "-n", "150", "--duration", "1.5", "--isl", "100", "--osl", "fixed:8",
                           "--completions", "--warmup", "2", "--seed", "5", "--json", str(out), "--csv", str(table)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert 10 < s["sent"] < 150 and s["stopped_by_duration"] and s["planned"] == 150
    assert f"stopped at the 1.5 s duration: {s['sent']} of 150 sent" in proc.stdout
    for label in ("ITL per gap", "TPOT (mean ITL per request)", "E2E latency", "p95", "input tok/s",
                  "mean concurrency", "arrival schedule: send lag p99"):
        assert label in proc.stdout, label
    assert s["input_tokens"] == 100 * s["completed"]
    assert s["latency_s"]["p50"] >= s["ttft_s"]["p50"]
    assert s["mean_itl_per_request_s"]["p50"] is not None and s["schedule_lag_s"]["max"] is not None
    assert s["warmup"] == 2 and sorted(r["index"] for r in doc["requests"]) == list(range(s["sent"]))
    rows = list(_csv.DictReader(table.open()))
    assert len(rows) == s["sent"] and all(float(r["latency_s"]) >= float(r["ttft_s"]) for r in rows if r["ok"] == "1")
    assert "\r" not in proc.stderr  # plain lines, no bar redrawn into the log
    assert f"bench: {s['completed']}/{s['sent']} done" in proc.stderr  # the last line says where it ended
