"""The sim starts from the exact engine command the operator renders, and refuses what the engine refuses."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from pd_operator.perfmodel.engine_defaults import default_max_running
from pd_operator.render.engines.flagset import FlagError
from pd_operator_tools.enginesim.__main__ import config_from_argv

from .conftest import free_port, get, loopback_host, metric, rendered_engine


@pytest.mark.parametrize("example,role,flavor,expected", [
    ("vllm-nixl", "prefill", "vllm", dict(role="prefill", tp=4, model="Qwen/Qwen3-32B", port=8000)),
    ("vllm-nixl", "decode", "vllm", dict(role="decode", tp=4, served_name="qwen3-32b")),
    ("vllm-lmcache", "prefill", "vllm", dict(role="prefill", model="meta-llama/Llama-3.1-8B-Instruct")),
    ("sglang-mooncake", "prefill", "sglang", dict(role="prefill", tp=4, bootstrap_port=8998, port=30000)),
    ("sglang-mooncake", "decode", "sglang", dict(role="decode", tp=8, bootstrap_port=None)),
])
def test_rendered_commands_configure_the_sim(example, role, flavor, expected):
    argv, _env = rendered_engine(example, role)
    cfg = config_from_argv(argv)
    assert cfg.flavor == flavor
    for key, val in expected.items():
        assert getattr(cfg, key) == val, key


def test_an_unset_batch_limit_is_the_engines_own_default():
    """No --max-num-seqs / --max-running-requests on the command line: the engine's own default
    on the H200 (perfmodel.engine_defaults, from vLLM's arg_utils and SGLang's KV-cache
    configurator), not a number of the sim's; vLLM's limit is per DP rank."""
    vllm = ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert config_from_argv(vllm).running_limit() == 1024
    assert config_from_argv(vllm + ["--max-num-batched-tokens", "512"]).running_limit() == 512
    assert config_from_argv(vllm + ["--data-parallel-size", "2"]).running_limit() == 2048
    assert config_from_argv(vllm + ["--max-num-seqs", "64", "--data-parallel-size", "2"]).running_limit() == 128
    sgl = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B"]
    cfg = config_from_argv(sgl)
    assert cfg.running_limit() == default_max_running("sglang", cfg.kv_tokens(), cfg.max_model_len) >= 2048
    assert config_from_argv(sgl + ["--max-running-requests", "64"]).running_limit() == 64


def test_the_kv_cache_is_sized_by_the_engines_flags():
    """vLLM --kv-cache-memory-bytes: that much KV memory on each GPU (human_readable_int: G is
    2^30, g 10^9); SGLang --max-total-tokens: a cap on the pool, never a raise (tests/contract/
    FACTS.md, "KV cache size"). --num-gpu-blocks-override: that many blocks of --block-size tokens,
    or of the attention backend's size on the H200 (16 for vLLM's default backends, 64 for
    FLASHMLA); a backend whose size is not known is refused, not run as the default."""
    vllm = ["vllm", "serve", "Qwen/Qwen3-8B"]
    per_token = config_from_argv(vllm).shape.kv_bytes_per_token
    assert config_from_argv(vllm + ["--kv-cache-memory-bytes", "20G"]).kv_tokens() == 20 * 2 ** 30 // per_token
    assert config_from_argv(vllm + ["--kv-cache-memory-bytes", "20g", "--tensor-parallel-size", "2"]).kv_tokens() == (
        2 * 20 * 10 ** 9 // per_token)
    assert config_from_argv(vllm + ["--num-gpu-blocks-override", "4096"]).kv_tokens() == 4096 * 16
    assert config_from_argv(vllm + ["--num-gpu-blocks-override", "4096", "--block-size", "32"]).kv_tokens() == 4096 * 32
    assert config_from_argv(vllm + ["--num-gpu-blocks-override", "100", "--attention-backend", "flashmla"]).kv_tokens() == 6400
    assert config_from_argv(vllm + ["--num-gpu-blocks-override", "100", "--data-parallel-size", "2"]).kv_tokens() == 3200
    with pytest.raises(ValueError, match="--num-gpu-blocks-override"):
        config_from_argv(vllm + ["--num-gpu-blocks-override", "4096", "--attention-backend", "TREE_ATTN"])
    sgl = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B"]
    plain = config_from_argv(sgl)
    capped = config_from_argv(sgl + ["--max-total-tokens", "100k"])
    assert capped.kv_tokens() == 100_000 and capped.running_limit() < plain.running_limit()
    assert config_from_argv(sgl + ["--max-total-tokens", "100M"]).kv_tokens() == plain.kv_tokens()


def test_speculative_decoding_is_refused_not_run_as_plain_decoding():
    """The tokens a speculative step emits depend on the draft's acceptance, which the
    calibration does not cover: before, the simulator took the flags and decoded one token a
    step, a fleet kinder or harsher than the one the spec runs."""
    with pytest.raises(ValueError, match="speculative decoding \\(--speculative-config\\)"):
        config_from_argv(["vllm", "serve", "Qwen/Qwen3-8B", "--speculative-config",
                          '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'])
    with pytest.raises(ValueError, match="speculative decoding \\(--speculative-algorithm\\)"):
        config_from_argv(["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B",
                          "--speculative-algorithm", "NGRAM"])


@pytest.mark.parametrize("flag", ["--pp-size", "--pipeline-parallel-size", "--attn-cp-size"])
def test_sglang_pipeline_and_attention_context_parallelism_are_refused(flag):
    """Not modelled: their step times, and which ranks report the schedulers' series from which
    node (a replica over nodes serves each node's own: FACTS.md "Series per engine")."""
    sgl = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--tp-size", "4"]
    with pytest.raises(ValueError, match="does not model --(pp|attn-cp)-size 2"):
        config_from_argv(sgl + [flag, "2"])
    config_from_argv(sgl + [flag, "1"])


def test_an_fp8_kv_cache_holds_twice_the_tokens_and_a_layout_not_modelled_is_refused():
    """--kv-cache-dtype fp8 (vLLM) / fp8_e5m2 (SGLang) stores K and V in one byte per element
    (tests/contract/FACTS.md, "KV cache dtype"): twice the tokens in the same memory, half the
    bytes to move to decode. A packed 4-bit cache is not modelled: refused, not run as bf16."""
    vllm = ["vllm", "serve", "Qwen/Qwen3-8B"]
    plain = config_from_argv(vllm)
    fp8 = config_from_argv(vllm + ["--kv-cache-dtype", "fp8"])
    assert fp8.kv_tokens() == pytest.approx(2 * plain.kv_tokens(), rel=1e-6)
    assert fp8.cost().transfer_ms(4096, fp8.link) < plain.cost().transfer_ms(4096, plain.link)
    assert config_from_argv(vllm + ["--kv-cache-dtype", "bfloat16"]).kv_tokens() == plain.kv_tokens()
    with pytest.raises(ValueError, match="--kv-cache-dtype nvfp4"):
        config_from_argv(vllm + ["--kv-cache-dtype", "nvfp4"])
    sgl = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B"]
    assert (config_from_argv(sgl + ["--kv-cache-dtype", "fp8_e5m2"]).kv_tokens()
            == pytest.approx(2 * config_from_argv(sgl).kv_tokens(), rel=1e-6))


def test_vllm_throughput_mode_doubles_the_unset_batch_limits():
    """vLLM 0.33.0 --performance-mode throughput doubles --max-num-seqs and
    --max-num-batched-tokens where unset (engine/arg_utils.py,
    _set_default_max_num_seqs_and_batched_tokens_args); a budget under the batch is refused at
    start (config/scheduler.py), as the engine does."""
    vllm = ["vllm", "serve", "Qwen/Qwen3-8B"]
    cfg = config_from_argv(vllm + ["--performance-mode", "throughput"])
    assert (cfg.running_limit(), cfg.max_batched_tokens) == (2048, 16384)
    cfg = config_from_argv(vllm + ["--performance-mode=throughput", "--max-num-batched-tokens", "4096"])
    assert (cfg.running_limit(), cfg.max_batched_tokens) == (2048, 4096)
    cfg = config_from_argv(vllm + ["--performance-mode", "interactivity"])
    assert (cfg.running_limit(), cfg.max_batched_tokens) == (1024, 8192)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8192\) must be greater than or equal to max_num_seqs"):
        config_from_argv(vllm + ["--max-num-seqs", "10000"])
    assert config_from_argv(vllm + ["--max-num-seqs", "10000", "--performance-mode", "throughput"]).running_limit() == 10000
    # chunked prefill off: the budget is at least the context length, so 10000 sequences start
    cfg = config_from_argv(vllm + ["--max-num-seqs", "10000", "--no-enable-chunked-prefill"])
    assert cfg.max_batched_tokens == cfg.max_model_len == 40960
    # batched data-parallel MoE: 256 tokens, 256 sequences per rank
    moe = ["vllm", "serve", "deepseek-ai/DeepSeek-V3", "--tensor-parallel-size", "8", "--data-parallel-size", "2",
           "--enable-expert-parallel", "--all2all-backend", "deepep_low_latency"]
    cfg = config_from_argv(moe)
    assert (cfg.max_batched_tokens, cfg.running_limit()) == (256, 512)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(256\)"):
        config_from_argv(moe + ["--max-num-seqs", "300"])


def test_rendered_api_key_from_env(monkeypatch):
    argv, _ = rendered_engine("vllm-autoscaling", "decode")
    monkeypatch.setenv("VLLM_API_KEY", "k1")
    assert config_from_argv(argv).api_keys == ["k1"]
    sgl = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--api-key", "$(PD_ENGINE_API_KEY)"]
    monkeypatch.setenv("PD_ENGINE_API_KEY", "k2")
    assert config_from_argv(sgl).api_keys == ["k2"]  # $(VAR) expanded as the kubelet does


def test_flag_the_engine_lacks_is_refused():
    with pytest.raises(FlagError) as err:
        config_from_argv(["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--pd-disaggregation"])
    assert err.value.flag == "--pd-disaggregation"
    with pytest.raises(FlagError, match="kv_ip"):
        config_from_argv(["vllm", "serve", "Qwen/Qwen3-8B", "--kv-transfer-config",
                          '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_ip":"1.2.3.4"}'])
    with pytest.raises(ValueError, match="no cost shape"):
        config_from_argv(["vllm", "serve", "acme/mystery-13b"])


def test_wrong_flag_exits_nonzero_naming_it():
    proc = subprocess.run([sys.executable, "-m", "pd_operator_tools.enginesim", "--", "python3", "-m", "sglang.launch_server",
                           "--model-path", "Qwen/Qwen3-8B", "--disaggregation-mode", "prefill", "--pd-disaggregation"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--pd-disaggregation" in proc.stderr


def test_rendered_vllm_sim_serves_openai_and_metrics(procs):
    """Start the rendered decode command (bound to loopback); auth on /v1 only; one chat completion."""
    argv, env = rendered_engine("vllm-autoscaling", "decode")
    host = loopback_host()
    port = free_port(host)
    procs.sim(argv, host, port, env={**env, "VLLM_API_KEY": "secret"})
    base = f"http://{host}:{port}"
    assert get(base + "/v1/models")[0] == 401
    status, body = get(base + "/v1/models", {"Authorization": "Bearer secret"})
    served = argv[argv.index("--served-model-name") + 1]
    assert status == 200 and json.loads(body)["data"][0]["id"] == served
    status, text = get(base + "/metrics")
    assert status == 200 and f'vllm:num_requests_running{{engine="0",model_name="{served}"}}' in text
    req = urllib.request.Request(
        base + "/v1/chat/completions", method="POST",
        headers={"Authorization": "Bearer secret", "Content-Type": "application/json"},
        data=json.dumps({"model": served, "max_tokens": 7,
                         "messages": [{"role": "user", "content": "x" * 400}]}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        out = json.loads(resp.read())
    # 400 chars = 100 tokens, + 4 per message + 3 for the generation prompt
    assert out["usage"] == {"prompt_tokens": 107, "completion_tokens": 7, "total_tokens": 114}
    text = get(base + "/metrics")[1]
    assert metric(text, "vllm:generation_tokens_total") == 7
    assert metric(text, "vllm:prompt_tokens_total") == 107
    assert metric(text, "vllm:inter_token_latency_seconds_count") == 6


def test_sglang_sim_auth_metrics_flag_and_disconnect(procs):
    """SGLang: --api-key guards all but /health and /metrics; /metrics only with --enable-metrics;
    a client that goes away mid-stream frees its slot and KV."""
    host = loopback_host()
    port = free_port(host)
    base_argv = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--served-model-name", "q"]
    procs.sim(base_argv, host, port)
    assert get(f"http://{host}:{port}/metrics")[0] == 404  # no --enable-metrics

    host2 = loopback_host()
    port2 = free_port(host2)
    procs.sim([*base_argv, "--enable-metrics", "--api-key", "k"], host2, port2)
    base = f"http://{host2}:{port2}"
    assert get(base + "/health")[0] == 200
    assert get(base + "/get_server_info")[0] == 401
    assert get(base + "/get_server_info", {"Authorization": "Bearer k"})[0] == 200
    text = get(base + "/metrics")[1]
    # a scheduler's series carry its ranks, the tokenizer's none (observability/metrics_collector.py)
    assert ('sglang:num_running_reqs{engine_type="unified",model_name="q",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0'
            in text)
    assert 'sglang:generation_tokens_total{engine_type="unified",model_name="q"} 0.0' in text

    import http.client
    import time

    conn = http.client.HTTPConnection(host2, port2, timeout=10)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": 5000, "stream": True}),
                 headers={"Content-Type": "application/json", "Authorization": "Bearer k"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.fp.readline()  # first chunk
    assert metric(get(base + "/metrics")[1], "sglang:num_running_reqs") == 1
    conn.sock.close()
    conn.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = get(base + "/metrics")[1]
        if metric(text, "sglang:num_running_reqs") == 0:
            break
        time.sleep(0.1)
    assert metric(text, "sglang:num_running_reqs") == 0
    assert metric(text, "sglang:token_usage") == 0
