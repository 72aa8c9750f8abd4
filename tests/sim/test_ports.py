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


def test_a_request_sent_before_the_sim_started_waits_on_an_inherited_listener():
    """The e2e harness binds an engine pod's port before the sim starts (kwok
    marks the pod Ready at once; a router may send to it within that second).
    With --listen-fd the sim serves that very socket, so a connection made
    before it ran is answered, not refused (issue 17: HTTP 500s in the demo
    during a prefill scale-up)."""
    import socket
    import threading
    import time
    import urllib.request

    host = loopback_host()
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    got = {}

    def early():
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=60) as resp:
                got["status"] = resp.status
        except Exception as exc:  # noqa: BLE001 - recorded for the assert
            got["error"] = repr(exc)

    t = threading.Thread(target=early)
    t.start()
    time.sleep(0.3)  # connected, in the backlog: nothing has accepted yet
    argv = [sys.executable, "-m", "pd_operator_tools.enginesim", "--bind", host, "--bind-port", str(port),
            "--listen-fd", str(listener.fileno()), "--", "vllm", "serve", "Qwen/Qwen3-8B"]
    proc = subprocess.Popen(argv, pass_fds=(listener.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    listener.close()
    try:
        t.join(60)
        assert got.get("status") == 200, (got, proc.poll(), proc.stderr.read().decode() if proc.poll() is not None else "")
    finally:
        proc.terminate()
        proc.wait(20)
