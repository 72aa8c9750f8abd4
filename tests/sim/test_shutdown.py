"""SIGTERM: the sim does what each pinned engine does (tests/contract/FACTS.md, "SIGTERM").

vLLM 0.33.0: ``--shutdown-timeout 0`` (its default) aborts every in-flight
request; N > 0 refuses new requests and drains the running ones for up to N s.
SGLang 0.5.23: /health answers 503, in-flight requests finish, then it exits.
A request in flight when the signal comes is streamed until it is done or cut.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from .conftest import free_port, get, loopback_host, rendered_engine

TOKENS = 600  # ~3 s of decode steps at batch 1: the signal lands mid-stream


def _stream(base: str, out: dict) -> None:
    body = {"prompt": "hello " * 20, "max_tokens": TOKENS, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out.update(pieces=0, finish=None, done=False)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data:"):
                    for ch in json.loads(line[5:]).get("choices", []):
                        if ch.get("text"):
                            out["pieces"] += 1
                        out["finish"] = ch.get("finish_reason") or out["finish"]
    except Exception as exc:  # noqa: BLE001 - a cut connection is a lost request
        out["error"] = repr(exc)


def _signal_mid_stream(proc, base: str) -> tuple[threading.Thread, dict]:
    """Start a long stream, SIGTERM the sim once 20 pieces have arrived."""
    out: dict = {}
    t = threading.Thread(target=_stream, args=(base, out))
    t.start()
    deadline = time.monotonic() + 10
    while out.get("pieces", 0) < 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert out.get("pieces", 0) >= 20, out
    proc.send_signal(signal.SIGTERM)
    return t, out


def _sigterm_mid_stream(proc, base: str) -> dict:
    t, out = _signal_mid_stream(proc, base)
    t.join(60)
    return out


def _status_becomes(fetch, code: int, within: float = 5.0) -> int:
    """Poll ``fetch()`` (an HTTP status) until it answers ``code`` or ``within`` s pass: the
    sim handles the signal when the loaded machine gets to it. Returns the last status."""
    deadline = time.monotonic() + within
    while True:
        got = fetch()
        if got == code or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _status(req) -> int:
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def _vllm_argv(shutdown_timeout: int | None) -> list[str]:
    argv = ["vllm", "serve", "Qwen/Qwen3-8B", "--served-model-name", "q"]
    return argv + (["--shutdown-timeout", str(shutdown_timeout)] if shutdown_timeout is not None else [])


@pytest.mark.parametrize("timeout", [None, 0])
def test_vllm_default_shutdown_aborts_in_flight(procs, timeout):
    host = loopback_host()
    port = free_port(host)
    proc = procs.sim(_vllm_argv(timeout), host, port)
    out = _sigterm_mid_stream(proc, f"http://{host}:{port}")
    assert out["pieces"] < TOKENS and out["finish"] == "abort", out
    assert proc.wait(10) == 0


def test_vllm_shutdown_timeout_drains_in_flight_and_refuses_new(procs):
    host = loopback_host()
    port = free_port(host)
    proc = procs.sim(_vllm_argv(30), host, port)
    base = f"http://{host}:{port}"
    t, out = _signal_mid_stream(proc, base)
    # a new request while draining is refused (EngineCore._reject_add_in_shutdown)
    late = urllib.request.Request(base + "/v1/completions", method="POST",
                                  data=json.dumps({"prompt": "x", "max_tokens": 2}).encode(),
                                  headers={"Content-Type": "application/json"})
    assert _status_becomes(lambda: _status(late), 503) == 503
    t.join(60)
    assert out["pieces"] == TOKENS and out["finish"] == "length" and out["done"], out
    assert proc.wait(10) == 0


def test_vllm_shutdown_timeout_aborts_what_is_left_at_the_deadline(procs):
    host = loopback_host()
    port = free_port(host)
    proc = procs.sim(_vllm_argv(1), host, port)
    out = _sigterm_mid_stream(proc, f"http://{host}:{port}")
    assert out["pieces"] < TOKENS and out["finish"] == "abort", out


def test_sglang_drains_in_flight_with_health_503(procs):
    host = loopback_host()
    port = free_port(host)
    proc = procs.sim(["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B"], host, port)
    base = f"http://{host}:{port}"
    t, out = _signal_mid_stream(proc, base)
    assert _status_becomes(lambda: get(base + "/health")[0], 503) == 503
    t.join(60)
    assert out["pieces"] == TOKENS and out["done"], out
    assert proc.wait(10) == 0


def test_rendered_vllm_decode_drains(procs):
    """The command the operator renders drains: the scale-down loses no request."""
    argv, env = rendered_engine("vllm-autoscaling", "decode")
    host = loopback_host()
    port = free_port(host)
    proc = procs.sim(argv, host, port, env=env)
    out = _sigterm_mid_stream(proc, f"http://{host}:{port}")
    assert out["pieces"] == TOKENS and out["done"], out
