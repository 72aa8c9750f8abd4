"""The sim fails to start where the engine would: two listeners on one port."""

from __future__ import annotations

import subprocess
import sys

from .conftest import free_port, loopback_host


def test_sglang_prefill_bootstrap_on_the_api_port_fails_to_start():
    host = loopback_host()
    port = free_port(host)
    argv = [sys.executable, "-m", "pd_operator_tools.enginesim", "--bind", host, "--bind-port", str(port), "--",
            "python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B",
            "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(port)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot listen" in proc.stderr, proc.stderr
