"""The operator's control plane at scale, on the local cluster (issue 15). One command:

    flock /tmp/work/cluster.lock .venv/bin/python -m tests.benchmarks.controlplane --services 10,100

For each N it creates N small PDInferenceServices in a fresh namespace with one
operator process watching it, and prints:

- create-to-children: seconds from the first create to every service's 13
  children present, against a raw ``kubectl apply --server-side`` of the same
  rendered children (``pdctl render``) into another namespace;
- steady state: API requests/s the operator sends with nothing changing
  (its own ``pd_operator_api_requests_total``, every request it makes but its
  watches), total and per service, over ``--idle`` seconds after a settle;
- operator RSS (MB) and CPU (% of one core) over the same window (/proc);
- edit-to-child p50/p99: seconds from a spec edit (router replicas) to the
  router Deployment carrying it, for ``--edits`` edits spread over the services.

It is a benchmark, not a test: it asserts nothing. It uses the cluster of
tests/integration (e2e/cluster.py, "pd-test"; started if needed and stopped
again if it started it); run it under the cluster lock.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.conftest import load_e2e_module  # noqa: E402

GROUP, VERSION, PLURAL = "pdserving.io", "v1alpha1", "pdinferenceservices"


def body(name: str, namespace: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PDInferenceService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "engine": {"kind": "vllm"},
                     "router": {"image": "registry.example.com/pd/router:bench"},
                     "prefill": {"replicas": 0}, "decode": {"replicas": 0}}}


def kubectl(kc: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    k = str(load_e2e_module("cluster").binary("kubectl"))
    return subprocess.run([k, "--kubeconfig", kc, *args], input=stdin, capture_output=True, text=True, check=True)


def count(kc: str, namespace: str, kinds: str) -> int:
    out = kubectl(kc, "get", kinds, "-n", namespace, "-l", "app.kubernetes.io/managed-by=pd-operator", "-o", "name")
    return len([line for line in out.stdout.splitlines() if line.strip()])


def proc_stats(pid: int) -> tuple[float, float]:
    """(RSS MB, CPU seconds so far)."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


def api_requests(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r'^pd_operator_api_requests_total\{[^}]*\} (\S+)$', text, re.M))


def run(kc: str, n: int, idle: float, edits: int) -> dict:
    kinds = "statefulsets,deployments,services,serviceaccounts,poddisruptionbudgets,roles,rolebindings,networkpolicies"
    ns = f"bench-{n}-{uuid.uuid4().hex[:5]}"
    raw_ns = f"{ns}-raw"
    for name in (ns, raw_ns):
        kubectl(kc, "create", "namespace", name)
    port = 19000 + n % 1000
    log = open(tempfile.mktemp(prefix="bench-op-", suffix=".log"), "w")
    op = subprocess.Popen([sys.executable, "-m", "pd_operator", "-n", ns, "--liveness-port", "0",
                           "--metrics-port", str(port), "--bind", "127.0.0.1"],
                          env={**os.environ, "KUBECONFIG": kc, "PD_OPERATOR_WARMUP_SECONDS": "1"},
                          stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        time.sleep(4)
        want = 13 * n
        docs = [body(f"s{i}", ns) for i in range(n)]
        started = time.monotonic()
        kubectl(kc, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
        while count(kc, ns, kinds) < want:
            time.sleep(0.5)
        create_s = time.monotonic() - started
        # the same children, rendered and applied raw
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(yaml.safe_dump_all([body(f"s{i}", raw_ns) for i in range(n)]))
            f.flush()
            rendered = subprocess.run([str(Path(sys.executable).parent / "pdctl"), "render", "-f", f.name],
                                      capture_output=True, text=True, check=True, cwd=ROOT).stdout
        started = time.monotonic()
        kubectl(kc, "apply", "--server-side", "-f", "-", stdin=rendered)
        raw_s = time.monotonic() - started
        # steady state
        time.sleep(max(10.0, n / 20))
        r0, (rss0, cpu0), t0 = api_requests(port), proc_stats(op.pid), time.monotonic()
        time.sleep(idle)
        r1, (rss1, cpu1), t1 = api_requests(port), proc_stats(op.pid), time.monotonic()
        rate = (r1 - r0) / (t1 - t0)
        # edit-to-child
        lat = []
        for j in range(edits):
            name = f"s{(j * 7) % n}"
            replicas = 2 + j % 3
            cur = json.loads(kubectl(kc, "get", "deployment", f"{name}-router", "-n", ns, "-o", "json").stdout)
            if cur["spec"]["replicas"] == replicas:
                replicas += 1
            started = time.monotonic()
            kubectl(kc, "patch", PLURAL, name, "-n", ns, "--type", "merge",
                    "-p", json.dumps({"spec": {"router": {"replicas": replicas}}}))
            while json.loads(kubectl(kc, "get", "deployment", f"{name}-router", "-n", ns, "-o", "json").stdout)[
                    "spec"]["replicas"] != replicas:
                time.sleep(0.05)
            lat.append(time.monotonic() - started)
        lat.sort()
        return {"services": n, "create_to_children_s": round(create_s, 2), "raw_apply_s": round(raw_s, 2),
                "create_vs_raw": round(create_s / raw_s, 2) if raw_s else None,
                "idle_requests_per_s": round(rate, 4), "idle_requests_per_s_per_service": round(rate / n, 5),
                "rss_mb": round(rss1, 1), "cpu_percent": round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
                "edit_to_child_p50_s": round(statistics.median(lat), 3) if lat else None,
                "edit_to_child_p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3) if lat else None}
    finally:
        op.terminate()
        try:
            op.wait(15)
        except subprocess.TimeoutExpired:
            op.kill()
        for name in (ns, raw_ns):
            subprocess.run([str(load_e2e_module("cluster").binary("kubectl")), "--kubeconfig", kc, "delete", "namespace",
                            name, "--wait=false"], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", default="10,100", help="comma-separated N")
    p.add_argument("--idle", type=float, default=60.0, help="seconds of steady state measured")
    p.add_argument("--edits", type=int, default=20, help="spec edits timed per N")
    args = p.parse_args(argv)
    cluster = load_e2e_module("cluster")
    name = os.environ.get("PD_TEST_CLUSTER", "pd-test")
    was_running = cluster.is_running(name)
    kc = str(cluster.up(name))
    try:
        kubectl(kc, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / "pdinferenceservices.yaml"))
        kubectl(kc, "wait", "--for=condition=Established", "crd/pdinferenceservices.pdserving.io", "--timeout=60s")
        for n in (int(x) for x in args.services.split(",")):
            print(json.dumps(run(kc, n, args.idle, args.edits)), flush=True)
    finally:
        if not was_running and not os.environ.get("PD_KEEP_CLUSTER"):
            cluster.down(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
