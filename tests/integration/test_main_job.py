"""The main job, by the same script path a user runs (issue 17):

``e2e/run.sh`` on a local cluster of its own (PD_CLUSTER_NAME, so the tests'
cluster and a user's pd-local are not touched) brings up the control plane,
the operator, a local Prometheus with the shipped scrape job and the harness
(simulated engines, the real router); the ``curl`` it prints answers through
the router; ``kubectl get pdservices`` shows TTFT and ITL read from
Prometheus; ``e2e/run.sh down`` leaves none of the processes it started.

Figures (time to a working curl) are printed: run with -s.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import load_e2e_module, prometheus_binary

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(prometheus_binary() is None, reason="needs prometheus (tests/run.sh builds it)")]

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "pd-main-job-test"


def pids_of(run_dir: Path) -> dict[str, int]:
    """Every pid file the main job keeps: operator, prometheus, harness, pod processes."""
    out = {}
    for f in [*run_dir.glob("*.pid"), *(run_dir / "pods").glob("*.pid")]:
        try:
            out[f.stem] = int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def columns(table: str) -> dict[str, str]:
    """The first row of a kubectl table, by header (values may hold blanks)."""
    header, row = table.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, starts[1:] + [len(row)])}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_main_job_serves_shows_ttft_itl_and_stops(tmp_path):
    cluster = load_e2e_module("cluster")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"PD_CLUSTER_NAME": CLUSTER}
    run_dir = cluster.cache_root() / "run" / CLUSTER
    t0 = time.monotonic()
    started: dict[str, int] = {}
    try:
        up = subprocess.run([str(REPO / "e2e" / "run.sh")], env=env, capture_output=True, text=True, timeout=900,
                            cwd=REPO)
        took = time.monotonic() - t0
        print(f"\n--- e2e/run.sh ({took:.0f}s) ---\n{up.stdout[-5000:]}")
        assert up.returncode == 0, up.stdout[-3000:] + "\n" + up.stderr[-3000:]
        started = pids_of(run_dir) | {f"cluster:{c}": p for c, p in cluster.running_components(CLUSTER).items()}
        assert {"operator", "prometheus", "harness"} <= started.keys(), started
        assert any("-router-" in k for k in started), started  # the router pod's process

        # the curl it printed works, through the real router
        line = next(ln.strip() for ln in up.stdout.splitlines() if ln.strip().startswith("curl "))
        r = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=90)
        doc = json.loads(r.stdout)
        assert doc["usage"]["completion_tokens"] == 16 and doc["choices"][0]["message"]["content"]

        # kubectl get pdservices: TTFT and ITL from Prometheus, in the columns
        table = cluster.kubectl("get", "pdservices", "-A", name=CLUSTER).stdout
        print(table)
        cols = columns(table)
        assert re.fullmatch(r"\d+(ms|\.\ds) p\d+", cols["TTFT"]), table  # e.g. "412ms p90"
        assert re.fullmatch(r"\d+(ms|\.\ds) p\d+", cols["ITL"]), table
        status = json.loads(cluster.kubectl("get", "pdservices", "-A", "-o", "json", name=CLUSTER).stdout)
        cond = {c["type"]: c for c in status["items"][0]["status"]["conditions"]}
        assert cond["MetricsAvailable"]["status"] == "True", cond["MetricsAvailable"]
    finally:
        down = subprocess.run([str(REPO / "e2e" / "run.sh"), "down"], env=env, capture_output=True, text=True,
                              timeout=300, cwd=REPO)
        print(f"--- e2e/run.sh down ---\n{down.stdout[-2000:]}{down.stderr[-2000:]}")
    assert down.returncode == 0, down.stdout + down.stderr
    left = {k: p for k, p in started.items() if alive(p)}
    assert not left, f"still running after e2e/run.sh down: {left}"
    assert not cluster.running_components(CLUSTER)
