"""The real routers (vllm-router 0.1.17, sglang-router 0.3.2) in front of simulated engines.

Static worker URLs on loopback (the Kubernetes discovery path is the e2e
harness's).  A streamed chat completion through the router must complete, the
prefill sim's metrics must show the prefill (prompt tokens, one token) and the
decode sim's the decode tokens and one KV transfer of the prompt.
"""

from __future__ import annotations

import time

import pytest

from pd_operator.render.engines.flagset import check_argv
from pd_operator_tools.enginesim.__main__ import config_from_argv
from pd_operator_tools.enginesim.server import chat_tokens

from .conftest import free_port, get, loopback_host, metric, rendered_engine, stream_chat, wait_http

pytestmark = pytest.mark.routers

MAX_TOKENS = 20
PROMPT = "word " * 4000  # 20000 chars = 5000 tokens


def stream(url: str, model: str) -> tuple[list[str], bool]:
    pieces, _, done = stream_chat(url, model, PROMPT, MAX_TOKENS)
    return pieces, done


def run_pd(procs, router_py, example: str, router_module: str, pd_flags: list[str], with_bootstrap: bool,
           metric_prefix: str) -> None:
    pre_argv, pre_env = rendered_engine(example, "prefill")
    dec_argv, dec_env = rendered_engine(example, "decode")
    hp, hd, hr = loopback_host(), loopback_host(), loopback_host()
    pp, pdp, pr, pm = free_port(hp), free_port(hd), free_port(hr), free_port(hr)
    procs.sim(pre_argv, hp, pp, env={**pre_env, "VLLM_NIXL_SIDE_CHANNEL_HOST": hp})
    procs.sim(dec_argv, hd, pdp, env={**dec_env, "VLLM_NIXL_SIDE_CHANNEL_HOST": hd})
    pre_cfg, dec_cfg = config_from_argv(pre_argv), config_from_argv(dec_argv)
    prefill = ["--prefill", f"http://{hp}:{pp}"] + ([str(pre_cfg.bootstrap_port)] if with_bootstrap else [])
    router_args = ["--host", hr, "--port", str(pr), *pd_flags, *prefill, "--decode", f"http://{hd}:{pdp}",
                   "--prometheus-host", hr, "--prometheus-port", str(pm), "--worker-startup-check-interval", "1"]
    component = "vllm-router" if router_module.startswith("vllm") else "sglang-router"
    check_argv(component, {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}[component],
               ["python3", "-m", router_module, *router_args])
    router = procs.start([str(router_py), "-m", router_module, *router_args])
    wait_http(f"http://{hr}:{pr}/readiness", timeout=60, proc=router)

    t0 = time.monotonic()
    pieces, done = stream(f"http://{hr}:{pr}", dec_cfg.served_name)
    elapsed = time.monotonic() - t0
    assert done and len(pieces) == MAX_TOKENS, pieces

    n_prompt = chat_tokens([{"role": "user", "content": PROMPT}])
    pre = get(f"http://{hp}:{pp}/metrics")[1]
    dec = get(f"http://{hd}:{pdp}/metrics")[1]
    p = metric_prefix
    # prefill did the prompt and produced exactly one token; no decode steps there
    assert metric(pre, f"{p}prompt_tokens_total") == n_prompt
    assert metric(pre, f"{p}generation_tokens_total") == 1
    if p == "vllm:":
        assert metric(pre, f"{p}time_to_first_token_seconds_count") == 1
    else:  # an SGLang PD prefill worker observes no TTFT, and SGLang creates the series at the first
        with pytest.raises(KeyError):
            metric(pre, f"{p}time_to_first_token_seconds_count")
    assert metric(pre, f"{p}inter_token_latency_seconds_count") == 0
    # decode pulled the KV once and generated every token, without computing the prompt; it counts
    # the prompt all the same (vLLM as external KV, cached; SGLang per finished request)
    assert metric(dec, f"{p}prompt_tokens_total") == n_prompt
    if p == "vllm:":
        assert metric(dec, "vllm:prompt_tokens_cached_total") == n_prompt
        assert metric(pre, "vllm:prompt_tokens_cached_total") == 0
    assert metric(dec, f"{p}generation_tokens_total") == MAX_TOKENS
    assert metric(dec, f"{p}inter_token_latency_seconds_count") == MAX_TOKENS - 1
    assert metric(dec, "pdsim_kv_transfer_seconds_count") == 1
    want = dec_cfg.cost().transfer_ms(n_prompt, dec_cfg.link) / 1e3
    got = metric(dec, "pdsim_kv_transfer_seconds_sum")
    # the sim's timer fires late on a loaded machine, never early (the exact time: test_costmodel)
    assert want * 0.95 <= got <= want + 0.25, (got, want)
    assert metric(dec, f"{p}time_to_first_token_seconds_sum") >= want * 0.95
    # the client waited for prefill + transfer + 20 decode steps
    prefill_s = pre_cfg.cost().prefill_ms(n_prompt) / 1e3
    if p == "sglang:":  # SGLang's TTFT starts at the decode worker's receipt: the prefill's wait too
        assert metric(dec, f"{p}time_to_first_token_seconds_sum") >= (prefill_s + want) * 0.95
    assert elapsed >= prefill_s + want


def test_vllm_router_nixl(procs, router_py):
    run_pd(procs, router_py, "vllm-nixl", "vllm_router.launch_router",
           ["--vllm-pd-disaggregation", "--kv-connector", "nixl"], with_bootstrap=False, metric_prefix="vllm:")


def test_sglang_router_pd(procs, router_py):
    run_pd(procs, router_py, "sglang-mooncake", "sglang_router.launch_router",
           ["--pd-disaggregation"], with_bootstrap=True, metric_prefix="sglang:")
