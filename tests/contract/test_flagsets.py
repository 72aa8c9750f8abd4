"""Contract tier: command lines checked against snapshots of the real parsers.

Runs with only the project's own dependencies (no vLLM/SGLang): the loader in
``pd_operator.render.engines.flagset`` is stdlib only.  The ``realparser``
tests at the bottom compare the committed snapshots with a live extraction
and are skipped unless the pinned packages can be found (see
``tests/contract/extract_flagsets.py`` for the venvs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
try:
    from pd_operator.render.engines import flagset as fs
except ImportError:  # package not installed: import from the source tree
    sys.path.insert(0, str(ROOT / "operator"))
    from pd_operator.render.engines import flagset as fs

VLLM = "0.33.0"
SGLANG = "0.5.23"
VLLM_ROUTER = "0.1.17"
SGLANG_ROUTER = "0.3.2"

NIXL_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def accepts(component: str, version: str, argv: list[str], **kw) -> None:
    fs.check_argv(component, version, argv, **kw)


def refuses(component: str, version: str, argv: list[str], match: str, **kw) -> fs.FlagError:
    with pytest.raises(fs.FlagError, match=match) as info:
        fs.check_argv(component, version, argv, **kw)
    return info.value


# --------------------------------------------------------------------------
# Snapshots themselves
# --------------------------------------------------------------------------


def test_all_pinned_snapshots_are_shipped():
    have = set(fs.available_snapshots())
    assert {("vllm", VLLM), ("sglang", SGLANG), ("vllm-router", VLLM_ROUTER), ("sglang-router", SGLANG_ROUTER)} <= have


@pytest.mark.parametrize("component,version", [("vllm", VLLM), ("sglang", SGLANG),
                                               ("vllm-router", VLLM_ROUTER), ("sglang-router", SGLANG_ROUTER)])
def test_snapshot_header(component, version):
    snap = fs.load_snapshot(component, version)
    assert snap["schema_version"] == 1
    assert snap["component"] == component and snap["version"] == version
    for key in ("extracted_at", "python_version", "entry_point"):
        assert snap[key]
    assert snap["entry_point"]["parser"]
    assert snap["parser"]["actions"]
    # every option string is unique across actions
    seen: dict[str, str] = {}
    for a in snap["parser"]["actions"]:
        for opt in a["aliases"]:
            assert opt not in seen, (opt, a["dest"], seen.get(opt))
            seen[opt] = a["dest"]


def test_unknown_snapshot():
    with pytest.raises(fs.SnapshotNotFound):
        fs.load_snapshot("vllm", "0.0.1")


# --------------------------------------------------------------------------
# (a) real, correct command lines are accepted
# --------------------------------------------------------------------------


def test_vllm_serve_nixl_command_line():
    ns = fs.check_argv("vllm", VLLM, [
        "vllm", "serve", "Qwen/Qwen3-32B", "--port", "8000", "--served-model-name", "qwen3-32b",
        "--tensor-parallel-size", "4", "--kv-transfer-config", NIXL_BOTH,
    ])
    assert ns.model_tag == "Qwen/Qwen3-32B"
    assert ns.port == 8000
    assert ns.tensor_parallel_size == 4
    assert ns.served_model_name == ["qwen3-32b"]  # nargs="+"
    assert ns.kv_transfer_config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def test_vllm_serve_full_pd_prefill_line():
    accepts("vllm", VLLM, [
        "vllm", "serve", "Qwen/Qwen3-32B",
        "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "qwen3-32b",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1", "--data-parallel-size", "1",
        "--max-model-len", "32768", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "256",
        "--max-num-batched-tokens", "8192", "--enable-chunked-prefill", "--enable-prefix-caching",
        "--long-prefill-token-threshold", "2048", "--api-key", "secret", "--enable-log-requests",
        "--kv-transfer-config",
        '{"kv_connector":"NixlConnector","kv_role":"kv_producer",'
        '"kv_connector_extra_config":{"backends":["UCX"]}}',
    ])


@pytest.mark.parametrize("config", [
    '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_load_failure_policy":"recompute"}',
    '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}',
    '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer","kv_load_failure_policy":"recompute"}',
    '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}',
    '{"kv_connector":"MoRIIOConnector","kv_role":"kv_producer","kv_connector_extra_config":'
    '{"proxy_ip":"10.0.0.1","proxy_ping_port":36367,"http_port":8000,"handshake_port":6301,'
    '"notify_port":61005,"read_mode":true}}',
    '{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":['
    '{"kv_connector":"NixlConnector","kv_role":"kv_both"},{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}]}}',
])
def test_vllm_kv_transfer_configs_accepted(config):
    accepts("vllm", VLLM, ["vllm", "serve", "m", "--kv-transfer-config", config])


def test_vllm_model_flag_and_flexible_spellings():
    # --model is moved to the positional model by FlexibleArgumentParser
    ns = fs.check_argv("vllm", VLLM, ["vllm", "serve", "--port", "8000", "--model", "Qwen/Qwen3-8B"])
    assert ns.model_tag == "Qwen/Qwen3-8B"
    # underscores in flag names are accepted, also before "="
    ns = fs.check_argv("vllm", VLLM, ["vllm", "serve", "m", "--tensor_parallel_size", "2", "--max_model_len=4k"])
    assert ns.tensor_parallel_size == 2 and ns.max_model_len == 4000
    # dotted JSON keys are merged into one --kv-transfer-config JSON
    ns = fs.check_argv("vllm", VLLM, ["vllm", "serve", "m", "--kv-transfer-config.kv_connector", "NixlConnector",
                                      "--kv-transfer-config.kv_role", "kv_both"])
    assert ns.kv_transfer_config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    # short aliases and -O
    ns = fs.check_argv("vllm", VLLM, ["vllm", "serve", "m", "-tp", "8", "-O3"])
    assert ns.tensor_parallel_size == 8 and ns.optimization_level == "3"
    # paired enable/disable spellings
    for flag in ("--disable-log-requests", "--no-enable-prefix-caching", "--disable-chunked-prefill"):
        accepts("vllm", VLLM, ["vllm", "serve", "m", flag])
    # arguments only (no command) are `vllm serve` arguments
    accepts("vllm", VLLM, ["Qwen/Qwen3-8B", "--port", "8000"])


def test_a_negative_boolean_spelling_reads_false():
    """argparse.BooleanOptionalAction stores False for --no-X, and vLLM's EnableDisableAction
    (vllm/utils/argparse_utils.py) for --disable-X of an --enable-X flag and the reverse; the
    value is what the capacity reads (--no-enable-chunked-prefill raises vLLM's unset step
    budget to the context length). Before, every spelling read True."""
    def read(*flags, component="vllm", base=("vllm", "serve", "m")):
        return fs.check_argv(component, VLLM if component == "vllm" else SGLANG, [*base, *flags])

    assert read("--no-enable-chunked-prefill").enable_chunked_prefill is False
    assert read("--disable-chunked-prefill").enable_chunked_prefill is False
    assert read("--enable-chunked-prefill").enable_chunked_prefill is True
    assert read().enable_chunked_prefill is None
    assert read("--no-enable-prefix-caching").enable_prefix_caching is False
    assert read("--enable-chunked-mm-input").disable_chunked_mm_input is False
    assert read("--enable-prefix-caching", "--no-enable-prefix-caching").enable_prefix_caching is False  # last wins
    sgl = ("python3", "-m", "sglang.launch_server", "--model-path", "m")
    assert read("--no-enable-tf32-matmul", component="sglang", base=sgl).enable_tf32_matmul is False


def test_human_readable_ints_read_as_each_engine_reads_them():
    """Each engine has its own human_readable_int: vLLM's (vllm/utils/argparse_utils.py) reads
    lower-case suffixes as decimal and capitals as binary, SGLang's (sglang/srt/utils/common.py)
    case-sensitive SI (k, M, G, T) and IEC (Ki, Mi, Gi, Ti) suffixes. Before, SGLang's flags
    were read with vLLM's rules: --max-total-tokens 2M read 2,097,152 tokens and 1Ki was refused."""
    sgl = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--max-total-tokens"]
    read = {v: fs.check_argv("sglang", SGLANG, sgl + [v]).max_total_tokens for v in ("100k", "2M", "1G", "25.6k", "1Ki", "7")}
    assert read == {"100k": 100_000, "2M": 2_000_000, "1G": 10**9, "25.6k": 25_600, "1Ki": 1024, "7": 7}
    refuses("sglang", SGLANG, sgl + ["1m"], "invalid integer")     # no lower-case M
    refuses("sglang", SGLANG, sgl + ["1.5Ki"], "decimals")
    vllm = ["vllm", "serve", "m", "--kv-cache-memory-bytes"]
    assert fs.check_argv("vllm", VLLM, vllm + ["2M"]).kv_cache_memory_bytes == 2 * 2**20
    assert fs.check_argv("vllm", VLLM, vllm + ["2m"]).kv_cache_memory_bytes == 2 * 10**6
    refuses("vllm", VLLM, vllm + ["1Gi"], "human-readable")


def test_vllm_recent_scheduler_flags_exist_at_0_33():
    # Both exist at 0.33.0 (ENGINES.md: "very recent vLLM only").
    assert fs.has_flag("vllm", VLLM, "--watermark")
    assert fs.has_flag("vllm", VLLM, "--scheduler-reserve-full-isl")
    assert fs.has_flag("vllm", VLLM, "--no-scheduler-reserve-full-isl")
    accepts("vllm", VLLM, ["vllm", "serve", "m", "--watermark", "0.01", "--scheduler-reserve-full-isl"])
    refuses("vllm", VLLM, ["vllm", "serve", "m", "--watermark", "high"], "invalid float")


SGLANG_PREFILL = [
    "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-32B",
    "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
    "--disaggregation-bootstrap-port", "8998", "--tp-size", "4",
]


def test_sglang_prefill_command_line():
    ns = fs.check_argv("sglang", SGLANG, SGLANG_PREFILL)
    assert ns.disaggregation_mode == "prefill"
    assert ns.disaggregation_bootstrap_port == 8998
    assert ns.tp_size == 4


def test_sglang_decode_full_command_line():
    accepts("sglang", SGLANG, [
        "python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-32B",
        "--served-model-name", "qwen3-32b", "--host", "0.0.0.0", "--port", "30001",
        "--tp-size", "4", "--pp-size", "1", "--dp-size", "2", "--enable-dp-attention",
        "--context-length", "32768", "--mem-fraction-static", "0.85", "--max-running-requests", "128",
        "--chunked-prefill-size", "8192", "--enable-metrics", "--api-key", "secret",
        "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
        "--disaggregation-ib-device", "mlx5_0,mlx5_1",
        "--dist-init-addr", "10.0.0.1:5000", "--nnodes", "2", "--node-rank", "0",
    ])


def test_sglang_serve_positional_model():
    ns = fs.check_argv("sglang", SGLANG, ["sglang", "serve", "Qwen/Qwen3-8B", "--model-type", "llm", "--tp-size", "2"])
    assert ns.model_path == "Qwen/Qwen3-8B"


SGLANG_ROUTER_PD = [
    "python", "-m", "sglang_router.launch_router", "--pd-disaggregation",
    "--prefill", "http://p:30000", "8998", "--decode", "http://d:30001",
    "--prefill-policy", "cache_aware", "--decode-policy", "round_robin",
    "--host", "0.0.0.0", "--port", "8000",
]


def test_sglang_router_pd_command_line():
    ns = fs.check_argv("sglang-router", SGLANG_ROUTER, SGLANG_ROUTER_PD)
    assert ns.pd_disaggregation is True
    assert ns.prefill == [["http://p:30000", "8998"]]
    assert ns.decode == [["http://d:30001"]]


def test_sglang_router_service_discovery():
    ns = fs.check_argv("sglang-router", SGLANG_ROUTER, [
        "smg", "launch", "--pd-disaggregation", "--service-discovery",
        "--prefill-selector", "app=qwen", "role=prefill", "--decode-selector", "app=qwen", "role=decode",
        "--service-discovery-namespace", "inference", "--service-discovery-port", "30000",
        "--prometheus-port", "29000", "--prometheus-host", "0.0.0.0", "--api-key", "secret",
        "--policy", "power_of_two", "--log-level", "info",
    ])
    assert ns.prefill_selector == ["app=qwen", "role=prefill"]


VLLM_ROUTER_PD = [
    "vllm-router", "--vllm-pd-disaggregation",
    "--prefill", "http://p:8000", "--decode", "http://d:8000",
    "--kv-connector", "nixl", "--prefill-policy", "cache_aware", "--decode-policy", "round_robin",
    "--host", "0.0.0.0", "--port", "8080", "--prometheus-port", "29000", "--prometheus-host", "0.0.0.0",
]


def test_vllm_router_pd_command_line():
    ns = fs.check_argv("vllm-router", VLLM_ROUTER, VLLM_ROUTER_PD)
    assert ns.vllm_pd_disaggregation is True and ns.kv_connector == "nixl"


def test_vllm_router_mooncake_and_discovery():
    accepts("vllm-router", VLLM_ROUTER, [
        "python", "-m", "vllm_router.launch_router", "--vllm-pd-disaggregation", "--kv-connector", "mooncake",
        "--service-discovery", "--prefill-selector", "app=qwen", "role=prefill",
        "--decode-selector", "app=qwen", "role=decode", "--service-discovery-namespace", "inference",
        "--service-discovery-port", "8000", "--api-key", "secret", "--policy", "kv_aware",
    ])


# --------------------------------------------------------------------------
# (b) known-wrong command lines (from blog posts) are refused
# --------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--pd-disaggregation", "--decode-only", "--prefill-only"])
def test_sglang_server_refuses_router_and_blog_flags(flag):
    err = refuses("sglang", SGLANG, [*SGLANG_PREFILL, flag], "has no flag")
    assert err.flag == flag


def test_sglang_prefill_only_is_an_abbreviation_trap():
    # The REAL parser (allow_abbrev=True) takes --prefill-only as an
    # abbreviation of --prefill-only-disable-kv-cache.  check_argv refuses
    # abbreviations by default for exactly this reason.
    ns = fs.check_argv("sglang", SGLANG, [*SGLANG_PREFILL, "--prefill-only"], allow_abbrev=None)
    assert ns.prefill_only_disable_kv_cache is True
    refuses("sglang", SGLANG, [*SGLANG_PREFILL, "--decode-only"], "has no flag", allow_abbrev=None)


def test_sglang_bad_choices():
    refuses("sglang", SGLANG, [*SGLANG_PREFILL[:-6], "--disaggregation-mode", "both"], "invalid choice: 'both'")
    refuses("sglang", SGLANG, [*SGLANG_PREFILL, "--disaggregation-transfer-backend", "rdma"], "invalid choice")


def test_sglang_has_no_decode_tp_flags_at_0_5_23():
    for flag in ("--disaggregation-decode-tp", "--disaggregation-decode-dp"):
        assert not fs.has_flag("sglang", SGLANG, flag)
        refuses("sglang", SGLANG, [*SGLANG_PREFILL, flag, "2"], "has no flag")


def test_sglang_missing_value():
    refuses("sglang", SGLANG, ["python", "-m", "sglang.launch_server", "--model-path", "X", "--tp-size"],
            "--tp-size needs one argument")
    refuses("sglang", SGLANG, ["python", "-m", "sglang.launch_server", "--model-path", "X", "--tp-size", "four"],
            "invalid int value")


def test_vllm_unknown_flag_message():
    err = refuses("vllm", VLLM, ["vllm", "serve", "m", "--foo", "1"], r"^vllm 0\.33\.0 has no flag --foo$")
    assert err.flag == "--foo" and err.component == "vllm" and err.version == VLLM


@pytest.mark.parametrize("name", ["MoriIOConnector", "NIXLConnector", "P2pNcclConnector", "LMCacheConnector"])
def test_vllm_refuses_unknown_connector_names(name):
    refuses("vllm", VLLM, ["vllm", "serve", "m", "--kv-transfer-config",
                           json.dumps({"kv_connector": name, "kv_role": "kv_both"})], "no KV connector")


def test_vllm_connector_case_hint():
    with pytest.raises(fs.FlagError, match="did you mean MoRIIOConnector"):
        fs.check_kv_transfer_config(VLLM, {"kv_connector": "MoriIOConnector", "kv_role": "kv_producer"})


@pytest.mark.parametrize("config,match", [
    ('{"kv_connector":"NixlConnector"}', "kv_role is required"),
    ('{"kv_connector":"NixlConnector","kv_role":"both"}', "kv_role='both' is not one of"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"retry"}', "kv_load_failure_policy"),
    # fields of older vLLM releases, gone at 0.33.0 (KVTransferConfig forbids extras)
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_ip":"10.0.0.1"}', "no field"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_rank":0,"kv_parallel_size":2}', "no field"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_size":1e9}', "no field"),
    ("{kv_connector: NixlConnector}", "invalid JSON"),
])
def test_vllm_refuses_bad_kv_transfer_config(config, match):
    refuses("vllm", VLLM, ["vllm", "serve", "m", "--kv-transfer-config", config], match)


def test_vllm_other_refusals():
    refuses("vllm", VLLM, ["vllm", "serve", "--port", "8000", "--served-model-name", "x"], "positional")
    refuses("vllm", VLLM, ["vllm", "serve", "m", "--port"], "--port needs one argument")
    refuses("vllm", VLLM, ["vllm", "serve", "m", "--tensor-parallel-size", "four"], "invalid int")
    refuses("vllm", VLLM, ["vllm", "serve", "m", "--dtype", "fp64"], "invalid choice")
    refuses("vllm", VLLM, ["vllm", "serve", "m", "extra-positional"], "unexpected positional")
    # an abbreviation the real parser would take is refused by default ...
    refuses("vllm", VLLM, ["vllm", "serve", "m", "--gpu-memory-util", "0.9"], "has no flag --gpu-memory-util")
    # ... and accepted when asked to behave exactly like the real parser
    accepts("vllm", VLLM, ["vllm", "serve", "m", "--gpu-memory-util", "0.9"], allow_abbrev=None)


def test_router_flag_confusion_refused():
    refuses("vllm-router", VLLM_ROUTER, ["vllm-router", "--pd-disaggregation"], "has no flag --pd-disaggregation")
    refuses("sglang-router", SGLANG_ROUTER, [*SGLANG_ROUTER_PD, "--vllm-pd-disaggregation"], "has no flag")
    refuses("vllm-router", VLLM_ROUTER, [*VLLM_ROUTER_PD, "--kv-connector", "lmcache"], "invalid choice")
    refuses("sglang-router", SGLANG_ROUTER, [*SGLANG_ROUTER_PD, "--policy", "least_load"], "invalid choice")
    refuses("sglang-router", SGLANG_ROUTER, [*SGLANG_ROUTER_PD, "--kv-connector", "nixl"], "has no flag")
    for comp, ver in (("vllm-router", VLLM_ROUTER), ("sglang-router", SGLANG_ROUTER)):
        # neither router has a flag for it; the annotation name is hard-coded
        assert not fs.has_flag(comp, ver, "--bootstrap-port-annotation")
    refuses("sglang-router", SGLANG_ROUTER, [*SGLANG_ROUTER_PD, "--decode", "http://a", "http://b"],
            "unexpected positional")


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def test_vllm_facts_helpers():
    conns = fs.known_connectors(VLLM)
    assert {"NixlConnector", "MooncakeConnector", "LMCacheConnectorV1", "MoRIIOConnector",
            "MultiConnector", "OffloadingConnector"} <= conns
    assert "MoriIOConnector" not in conns and "P2pNcclConnector" not in conns
    assert fs.kv_transfer_fields(VLLM) == {
        "kv_connector", "engine_id", "kv_buffer_device", "kv_role", "kv_port",
        "kv_connector_extra_config", "kv_connector_module_path", "enable_permute_local_kv",
        "kv_load_failure_policy",
    }
    assert set(fs.kv_roles(VLLM)) == {"kv_producer", "kv_consumer", "kv_both"}
    assert set(fs.kv_load_failure_policies(VLLM)) == {"recompute", "fail"}
    moriio = fs.connector_extra_config_keys(VLLM, "MoRIIOConnector")
    assert {"proxy_ip", "proxy_ping_port", "http_port", "handshake_port", "notify_port", "read_mode"} <= moriio
    assert not {"proxy_addr", "proxy_port", "transfer_mode"} & moriio
    assert "backends" in fs.connector_extra_config_keys(VLLM, "NixlConnector")
    with pytest.raises(fs.FlagError, match="did you mean"):
        fs.connector_extra_config_keys(VLLM, "MoriIOConnector")


@pytest.mark.parametrize("component,version,name,known", [
    ("vllm", VLLM, "VLLM_NIXL_SIDE_CHANNEL_HOST", True),
    ("vllm", VLLM, "VLLM_NIXL_SIDE_CHANNEL_PORT", True),
    ("vllm", VLLM, "VLLM_MOONCAKE_BOOTSTRAP_PORT", True),
    ("vllm", VLLM, "VLLM_API_KEY", True),
    ("vllm", VLLM, "VLLM_HOST_IP", True),
    ("vllm", VLLM, "VLLM_NIXL_SIDE_CHANNEL_HOSTNAME", False),
    ("sglang", SGLANG, "SGLANG_DISAGGREGATION_QUEUE_SIZE", True),
    ("sglang", SGLANG, "SGLANG_DISAGGREGATION_NIXL_BACKEND", True),
    ("sglang", SGLANG, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", True),
    ("sglang", SGLANG, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", True),
    ("sglang", SGLANG, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", True),
    ("sglang", SGLANG, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", True),
    ("sglang", SGLANG, "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", True),
    ("sglang", SGLANG, "SGLANG_DISAGG_STAGING_BUFFER", True),
    ("sglang", SGLANG, "SGLANG_DISAGGREGATION_STAGING_BUFFER", False),
])
def test_known_env(component, version, name, known):
    assert fs.known_env(component, version, name) is known


def test_known_env_declared_only():
    # LMCache reads LMCACHE_CONFIG_FILE in vLLM's integration code; vllm.envs does not declare it
    assert fs.known_env("vllm", VLLM, "LMCACHE_CONFIG_FILE")
    assert not fs.known_env("vllm", VLLM, "LMCACHE_CONFIG_FILE", declared_only=True)
    assert fs.known_env("vllm", VLLM, "VLLM_API_KEY", declared_only=True)


def test_sglang_choice_facts():
    facts = fs.load_snapshot("sglang", SGLANG)["facts"]
    assert set(facts["disaggregation_mode_choices"]) == {"null", "prefill", "decode"}
    assert {"mooncake", "nixl"} <= set(facts["disaggregation_transfer_backend_choices"])
    assert fs.flag_choices("sglang", SGLANG, "--disaggregation-transfer-backend") == \
        facts["disaggregation_transfer_backend_choices"]


def test_split_command():
    assert fs.split_command("sglang", SGLANG, ["/usr/bin/python3", "-m", "sglang.launch_server", "--port", "1"]) == \
        (["/usr/bin/python3", "-m", "sglang.launch_server"], ["--port", "1"])
    assert fs.split_command("vllm-router", VLLM_ROUTER, ["--port", "1"]) == ([], ["--port", "1"])


def test_check_argv_rejects_single_string():
    with pytest.raises(TypeError):
        fs.check_argv("vllm", VLLM, "vllm serve m")  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# (c) drift: compare with the real parsers when they are installed
# --------------------------------------------------------------------------

EXTRACT = ROOT / "tests" / "contract" / "extract_flagsets.py"
VENV_BASE = Path(os.environ.get("PD_OPERATOR_ENGINE_VENVS", "/root/.cache/pd-operator/venvs"))
PYTHONS = {
    "vllm": ["engines-vllm"],
    "sglang": ["engines-sglang"],
    "vllm-router": ["routers", "vllm-router"],
    "sglang-router": ["routers", "sglang-router"],
}
MODULES = {"vllm": "vllm", "sglang": "sglang", "vllm-router": "vllm_router", "sglang-router": "sglang_router"}
VERSIONS = {"vllm": VLLM, "sglang": SGLANG, "vllm-router": VLLM_ROUTER, "sglang-router": SGLANG_ROUTER}


def _python_for(component: str) -> str | None:
    """An interpreter that can import the component: this one, or a known venv."""
    candidates = [sys.executable] + [str(VENV_BASE / name / "bin" / "python") for name in PYTHONS[component]]
    for py in candidates:
        if not Path(py).exists():
            continue
        code = f"import importlib.util,sys; sys.exit(importlib.util.find_spec({MODULES[component]!r}) is None)"
        probe = subprocess.run([py, "-c", code], capture_output=True, timeout=120)
        if probe.returncode == 0:
            return py
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return env


# Command lines whose verdict must be the same for the live parser and the
# loader in real-parser mode (allow_abbrev=None, no connector registry check).
DRIFT_CASES: dict[str, list[list[str]]] = {
    "vllm": [
        ["Qwen/Qwen3-32B", "--port", "8000", "--served-model-name", "q", "--tensor-parallel-size", "4",
         "--kv-transfer-config", NIXL_BOTH],
        ["--model", "m", "--port", "8000"],
        ["m", "--tensor_parallel_size", "2", "--max_model_len=32k"],
        ["--port", "8000", "--served-model-name", "x"],
        ["m", "--kv-transfer-config.kv_connector", "NixlConnector", "--kv-transfer-config.kv_role", "kv_both"],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector"}'],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_ip":"x"}'],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"x"}'],
        ["m", "--kv-transfer-config",
         '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_load_failure_policy":"recompute"}'],
        ["m", "--gpu-memory-util", "0.9"],
        ["m", "-O3", "-tp", "2", "-pp", "1", "-dp", "2"],
        ["m", "--watermark", "0.01", "--scheduler-reserve-full-isl"],
        ["m", "--disable-log-requests", "--no-enable-prefix-caching", "--enable-chunked-prefill"],
        ["m", "--api-key", "a", "b"],
        ["m", "--dtype", "float64x"],
        ["m", "--moe-backend", "FLASHINFER-TRTLLM"],
        ["m", "--no-such-flag"],
        ["m", "--port"],
        ["m", "--port", "eighty"],
        ["m", "--max-model-len", "auto"],
        ["m", "extra"],
        ["m", "-O", "3"],
        ["m", "--kv-transfer-config=" + NIXL_BOTH],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_port":"abc"}'],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_port":"5600"}'],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_port":5600.5}'],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","engine_id":7}'],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_connector_extra_config":[]}'],
        ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","enable_permute_local_kv":"yes"}'],
        ["m", "--kv-transfer-config", '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",'
         '"kv_connector_extra_config":{"cpu_bytes_to_use":80m}}'],
        ["m", "--kv-transfer-config", "None"],
        ["m", "--kv-transfer-config.kv_role", "kv_both", "--kv-transfer-config.kv_connector_extra_config.backends+",
         "UCX,LIBFABRIC", "--kv-transfer-config.kv_connector", "NixlConnector"],
        ["m", "--compilation-config", '{"mode":3}'],
        ["m", "--compilation-config", '{"no_such_field":3}'],
        ["m", "--compilation-config.mode", "3"],
        ["m", "--served-model-name", "a", "b"],
        ["m", "--enable-log-requests", "--enable-log-outputs"],
        ["m", "--max-num-batched-tokens", "2K"],
        ["m", "--max-num-batched-tokens", "2.5K"],
        ["m", "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'],
        ["m", "--data-parallel-size-local", "1", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"],
        ["m", "--help=Frontend"],
        ["--port", "8000"],
        [],
        ["m", "--watermark", "-0.5"],
        ["m", "--watermark=-0.5"],
        ["m", "--seed", "-1"],
        ["m", "--enable-log"],
    ],
    "sglang": [
        SGLANG_PREFILL[3:],
        [*SGLANG_PREFILL[3:], "--pd-disaggregation"],
        [*SGLANG_PREFILL[3:], "--prefill-only"],
        [*SGLANG_PREFILL[3:], "--decode-only"],
        ["--model-path", "X", "--disaggregation-mode", "both"],
        ["--model-path", "X", "--disaggregation-transfer-backend", "nixl", "--disaggregation-ib-device", "mlx5_0"],
        ["--model-path", "X", "--disaggregation-decode-tp", "2"],
        ["--model-path", "X", "--tp", "4"],
        ["--model-path", "X", "--tp-size"],
        ["--model-path", "X", "--enable-metrics", "--api-key", "k", "--context-length", "32k"],
    ],
    "vllm-router": [
        VLLM_ROUTER_PD[1:],
        ["--pd-disaggregation"],
        ["--vllm-pd"],
        ["--kv-connector", "lmcache"],
        ["--prefill-selector", "a=b", "c=d", "--service-discovery"],
        ["--bootstrap-port-annotation", "x"],
    ],
    "sglang-router": [
        SGLANG_ROUTER_PD[3:],
        ["--vllm-pd-disaggregation"],
        ["--policy", "least_load"],
        ["--decode", "http://a", "http://b"],
        ["--prefill-selector", "a=b", "--service-discovery", "--service-discovery-namespace", "ns"],
        ["--bootstrap-port-annotation", "x"],
    ],
}


def _loader_verdict(component: str, args: list[str]) -> str:
    try:
        fs.check_argv(component, VERSIONS[component], args, allow_abbrev=None, check_connectors=False)
        return "accepted"
    except fs.FlagError:
        return "rejected"


@pytest.mark.realparser
@pytest.mark.parametrize("component", sorted(PYTHONS))
def test_snapshot_matches_live_parser(component, tmp_path):
    py = _python_for(component)
    if py is None:
        pytest.skip(f"{component} is not installed (see tests/contract/extract_flagsets.py)")
    run = subprocess.run([py, str(EXTRACT), component, "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env=_env())
    if run.returncode != 0 and "the pin is" in (run.stdout + run.stderr):
        pytest.skip(f"{component}: installed version is not the pin: {run.stderr.strip()[-200:]}")
    assert run.returncode == 0, run.stderr[-2000:]
    live = json.loads((tmp_path / f"{component}-{VERSIONS[component]}.json").read_text())
    committed = fs.load_snapshot(component, VERSIONS[component])
    volatile = ("extracted_at", "python_version")
    strip = lambda d: {k: v for k, v in d.items() if k not in volatile}  # noqa: E731
    assert strip(live)["parser"] == strip(committed)["parser"], "re-run extract_flagsets.py and review the diff"
    assert strip(live) == strip(committed), "snapshot facts drifted; re-run extract_flagsets.py"
    # the sources the live extraction imported are the ones recorded for CI (test_flagset_sources.py)
    live_sources = json.loads((tmp_path / "flagset_sources.json").read_text())[component]["sources"]
    recorded = json.loads((ROOT / "tests" / "contract" / "flagset_sources.json").read_text())[component]["sources"]
    assert live_sources == recorded, "re-run extract_flagsets.py: the recorded source hashes are not the installed ones"

    # the loader's verdicts agree with the live parser's
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps({component: DRIFT_CASES[component]}))
    run = subprocess.run([py, str(EXTRACT), component, "--probe", str(cases)], capture_output=True, text=True,
                         timeout=600, env=_env())
    assert run.returncode == 0, run.stderr[-2000:]
    live_verdicts = json.loads(run.stdout.strip().splitlines()[-1])[component]
    mismatches = []
    for args, live_v in zip(DRIFT_CASES[component], live_verdicts, strict=True):
        mine = _loader_verdict(component, args)
        if mine != live_v.split(":")[0]:
            mismatches.append((args, live_v, mine))
    assert not mismatches, mismatches


def test_extractor_is_importable_without_engines():
    # the realparser test and humans rely on `--help` working anywhere
    if shutil.which(sys.executable) is None:  # pragma: no cover
        pytest.skip("no interpreter")
    run = subprocess.run([sys.executable, str(EXTRACT), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "vllm" in run.stdout
