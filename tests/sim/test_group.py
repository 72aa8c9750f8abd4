"""A replica over several nodes in the simulator (enginesim/group.py): the sims
start from the rendered leader and worker commands of a LeaderWorkerSet, the
leader serves only when every worker joined, a lost worker takes it down."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from pd_operator.api import validate_service
from pd_operator.render import render
from tests.conftest import minimal

from .conftest import free_port, get, loopback_host

SPEC = dict(topology={"gpusPerNode": 8, "nvlinkDomainKey": "kubernetes.io/hostname"},
            decode={"tensorParallelSize": 24, "dataParallelSize": 24, "dataParallelAttention": True,
                    "expertParallel": True, "deepepMode": "low_latency", "nodesPerReplica": 3})
VLLM_SPEC = dict(topology={"gpusPerNode": 8, "nvlinkDomainKey": "kubernetes.io/hostname"},
                 decode={"tensorParallelSize": 1, "dataParallelSize": 24, "expertParallel": True})


def group_commands(kind: str, spec: dict) -> tuple[list[str], list[str]]:
    lws = next(o for o in render(validate_service(minimal(kind, **spec)))
               if o["kind"] == "LeaderWorkerSet" and o["metadata"]["name"].endswith("decode"))
    t = lws["spec"]["leaderWorkerTemplate"]
    return (t["leaderTemplate"]["spec"]["containers"][0]["command"],
            t["workerTemplate"]["spec"]["containers"][0]["command"])


def start(argv: list[str], bind: str, index: int, leader_ip: str, port: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "LWS_LEADER_ADDRESS": "svc-decode-0.svc-decode.ns", "LWS_WORKER_INDEX": str(index),
           "LWS_GROUP_SIZE": "3", "PD_SIM_LEADER_IP": leader_ip, "POD_IP": bind}
    sim = [sys.executable, "-m", "pd_operator_tools.enginesim", "--bind", bind]
    if port:
        sim += ["--bind-port", str(port)]
    return subprocess.Popen([*sim, "--", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def health(host: str, port: int) -> int:
    try:
        return get(f"http://{host}:{port}/health")[0]
    except OSError:
        return 0


def wait_for(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.2)
    return False


def series(host: str, port: int, name: str) -> dict[str, dict[str, str]]:
    """The ``name`` series of a metrics page: dp_rank (or "") -> its labels."""
    status, text = get(f"http://{host}:{port}/metrics")
    assert status == 200, text
    out = {}
    for m in re.finditer(r"^" + re.escape(name) + r"\{([^}]*)\} ", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out[labels.get("dp_rank", "")] = labels
    return out


def run_group(kind: str, spec: dict, worker_port: int) -> None:
    leader_cmd, worker_cmd = group_commands(kind, spec)
    leader_ip, w1, w2 = loopback_host(), loopback_host(), loopback_host()
    port = free_port(leader_ip)
    procs = [start(leader_cmd, leader_ip, 0, leader_ip, port)]
    try:
        # the leader listens but is not healthy alone
        assert wait_for(lambda: health(leader_ip, port) == 503), procs[0].stderr
        procs.append(start(worker_cmd, w1, 1, leader_ip))
        time.sleep(1.0)
        assert health(leader_ip, port) == 503          # 1 of 2 workers joined
        procs.append(start(worker_cmd, w2, 2, leader_ip))
        assert wait_for(lambda: health(leader_ip, port) == 200)
        if kind == "vllm":
            assert health(w1, worker_port) == 0        # headless workers serve no HTTP
        else:
            # SGLang's serve /health and /metrics on --port: their own schedulers' series. DP
            # attention 24 over 3 nodes of 8 GPUs: groups 0-7 on the leader, 8-15 on node 1,
            # 16-23 on node 2, each from its first (here only) TP rank
            assert wait_for(lambda: health(w1, worker_port) == 200 and health(w2, worker_port) == 200)
            assert wait_for(lambda: series(w2, worker_port, "sglang:num_queue_reqs"))  # its first page
            for host, p, first in ((leader_ip, port, 0), (w1, worker_port, 8), (w2, worker_port, 16)):
                for name in ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"):
                    got = series(host, p, name)
                    assert sorted(got, key=int) == [str(d) for d in range(first, first + 8)], (host, name, got)
                    assert all(labels["tp_rank"] == d for d, labels in got.items())
            assert series(w1, worker_port, "sglang:e2e_request_latency_seconds_count") == {}  # no tokenizer there
        procs[1].kill()                                # a lost worker ...
        assert wait_for(lambda: procs[0].poll() is not None)
        assert procs[0].returncode == 1                # ... takes the leader down
        assert wait_for(lambda: procs[2].poll() is not None)  # and the rest of the group
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_sglang_group_serves_only_whole_and_dies_with_a_worker():
    run_group("sglang", SPEC, worker_port=30000)


def test_vllm_group_serves_only_whole_and_dies_with_a_worker():
    run_group("vllm", VLLM_SPEC, worker_port=8000)
