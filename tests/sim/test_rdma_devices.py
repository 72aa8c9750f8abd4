"""A Mooncake transfer over RDMA in a pod without an RDMA device fails at start.

Mooncake's transfer engine (both engines call ``TransferEngine.initialize``)
installs its RDMA transport when it finds an HCA; if none of them can be
brought up it logs "RdmaTransport: No available RNIC", the install fails and
the engine raises "Mooncake Transfer Engine initialization failed." before it
serves (tests/contract/FACTS.md, "Mooncake protocol and RDMA").  The e2e
harness tells the sim how many RDMA devices the pod requested
(``PDSIM_RDMA_DEVICES``, from the pod's extended resources).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from kubernetes import client

from ..conftest import load_e2e_module
from .conftest import free_port, loopback_host

SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--disaggregation-mode", "decode"]
VLLM = ["vllm", "serve", "Qwen/Qwen3-8B"]


def _env(devices: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PDSIM_RDMA_DEVICES", "MC_FORCE_TCP", "MOONCAKE_PROTOCOL")}
    if devices is not None:
        env["PDSIM_RDMA_DEVICES"] = devices
    env.update(extra)
    return env


def _start(engine_argv: list[str], env: dict[str, str]) -> tuple[int | None, str]:
    """Start the sim; (exit code, stderr) if it exits, (None, "") once it serves /health."""
    host = loopback_host()
    port = free_port(host)
    argv = [sys.executable, "-m", "pd_operator_tools.enginesim", "--bind", host, "--bind-port", str(port), "--",
            *engine_argv]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return proc.returncode, proc.stderr.read()
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return None, ""
            except OSError:
                time.sleep(0.2)
        raise AssertionError("the sim neither served nor exited in 60 s")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(20)


def _vllm_mooncake(role: str = "kv_consumer", protocol: str | None = None) -> list[str]:
    extra = f', "kv_connector_extra_config": {{"mooncake_protocol": "{protocol}"}}' if protocol else ""
    return VLLM + ["--kv-transfer-config", f'{{"kv_connector": "MooncakeConnector", "kv_role": "{role}"{extra}}}']


def test_sglang_mooncake_rdma_without_a_device_fails_at_start_naming_the_reason():
    code, err = _start(SGLANG + ["--disaggregation-transfer-backend", "mooncake"], _env("0"))
    assert code == 1, (code, err)
    assert "No available RNIC" in err and "Mooncake Transfer Engine initialization failed" in err, err
    assert "PDSIM_RDMA_DEVICES=0" in err, err  # says why the sim thinks there is none


def test_vllm_mooncake_default_protocol_is_rdma_and_fails_without_a_device():
    code, err = _start(_vllm_mooncake(), _env("0"))
    assert code == 1 and "No available RNIC" in err, (code, err)


def test_mooncake_rdma_with_a_device_starts():
    assert _start(SGLANG + ["--disaggregation-transfer-backend", "mooncake", "--disaggregation-ib-device", "mlx5_0"],
                  _env("1")) == (None, "")
    assert _start(_vllm_mooncake(), _env("1")) == (None, "")


def test_mooncake_tcp_without_a_device_starts():
    assert _start(SGLANG + ["--disaggregation-transfer-backend", "mooncake_tcp"], _env("0")) == (None, "")
    assert _start(_vllm_mooncake(protocol="tcp"), _env("0")) == (None, "")
    # MC_FORCE_TCP makes Mooncake install its TCP transport whatever the protocol
    assert _start(SGLANG + ["--disaggregation-transfer-backend", "mooncake"], _env("0", MC_FORCE_TCP="1")) == (None, "")


def test_unknown_device_count_assumes_present_and_other_backends_ignore_it():
    # outside the harness nobody says what the pod has: assume the device is there
    assert _start(SGLANG + ["--disaggregation-transfer-backend", "mooncake"], _env(None)) == (None, "")
    # NIXL is not Mooncake: the RDMA-device rule is Mooncake's
    assert _start(SGLANG + ["--disaggregation-transfer-backend", "nixl"], _env("0")) == (None, "")


def _pod(requests: dict, limits: dict | None = None) -> client.V1Pod:
    res = client.V1ResourceRequirements(requests=requests, limits=limits if limits is not None else dict(requests))
    return client.V1Pod(spec=client.V1PodSpec(containers=[client.V1Container(name="engine", resources=res)]))


def test_harness_derives_the_rdma_device_count_from_the_pod_resources():
    harness = load_e2e_module("harness")
    count = harness.rdma_device_count
    base = {"cpu": "8", "memory": "64Gi", "ephemeral-storage": "10Gi", "nvidia.com/gpu": "1"}
    assert count(_pod(base)) == 0
    assert count(_pod({**base, "hugepages-2Mi": "1Gi", "amd.com/gpu": "2"})) == 0
    # render/pools.py: kvTransfer.rdma.resourceName (count) and one per rail resource
    assert count(_pod({**base, "rdma/hca_shared_devices_a": "1"})) == 1
    assert count(_pod({**base, "rdma/rail0": "1", "rdma/rail1": "1"})) == 2
    # a limit alone is a request for an extended resource
    assert count(_pod({}, {"rdma/ib": "2"})) == 2
    env = harness.sim_env_for_pod(_pod({**base, "rdma/ib": "1"}))
    assert env == {"PDSIM_RDMA_DEVICES": "1"}
