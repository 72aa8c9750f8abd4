"""The operator's control plane at scale, on the local cluster (issue 15). One command:

    flock /tmp/work/cluster.lock .venv/bin/python -m tests.benchmarks.controlplane --services 10,100

For each N it creates N small PDInferenceServices in a fresh namespace with one
operator process watching it, and prints:

- create-to-children: seconds from the ``kubectl apply`` of N services to every
  service's 13 children present (and p50/p99 over the services of the seconds to
  each one's 13th child), against a raw ``kubectl apply --server-side`` of
  the same rendered children (``pdctl render``) into another namespace, both
  timed the same way (watches count the children; polling with kubectl would
  load the 2-core API server during one run only);
- steady state: API requests/s the operator sends with nothing changing, total
  and per service, over ``--idle`` seconds after a settle, as the API server
  counts them: the operator runs as its own ServiceAccount, which a FlowSchema
  of its own matches, and ``apiserver_flowcontrol_dispatched_requests_total``
  of that FlowSchema counts every request it dispatched (watches started
  included: none should be in steady state). The operator's own
  ``pd_operator_api_requests_total`` (every request but its watches) by verb,
  alongside;
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
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pd_operator.api.constants import LABEL_SERVICE  # noqa: E402
from tests.conftest import load_e2e_module  # noqa: E402

GROUP, VERSION, PLURAL = "pdserving.io", "v1alpha1", "pdinferenceservices"


def body(name: str, namespace: str, served: str | None = None) -> dict:
    """A small service; ``served``: its served model name (``--distinct``: one per service,
    so no two services' pools, router or their Services render alike)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PDInferenceService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": "Qwen/Qwen3-8B", **({"servedName": served} if served else {})},
                     "engine": {"kind": "vllm"},
                     "router": {"image": "registry.example.com/pd/router:bench"},
                     "prefill": {"replicas": 0}, "decode": {"replicas": 0}}}


def kubectl(kc: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    k = str(load_e2e_module("cluster").binary("kubectl"))
    return subprocess.run([k, "--kubeconfig", kc, *args], input=stdin, capture_output=True, text=True, check=True)


def proc_stats(pid: int) -> tuple[float, float]:
    """(RSS MB, CPU seconds so far)."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


def cpu_seconds(names: tuple[str, ...] = ("kube-apiserver", "etcd")) -> dict[str, float]:
    """CPU seconds used so far by the cluster's processes of these names (where the time goes)."""
    out: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        if comm in names:
            fields = text.rsplit(")", 1)[1].split()
            out[comm] = out.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 1) for k in after}


def own_requests(port: int) -> dict[str, float]:
    """The operator's own count of its API requests, by verb, and of its reconciles
    (``reconciles``) and the seconds they took (``reconcile_s``)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {m.group(1): float(m.group(2)) for m in
           re.finditer(r'^pd_operator_api_requests_total\{[^}]*verb="(\w+)"[^}]*\} (\S+)$', text, re.M)}
    for key, metric in (("reconciles", "pd_operator_reconciles_total"),
                        ("reconcile_s", "pd_operator_reconcile_duration_seconds_sum")):
        out[key] = sum(float(m.group(1)) for m in re.finditer(rf"^{metric}\{{[^}}]*\}} (\S+)$", text, re.M))
    return out


IDENTITY = "pd-operator-bench"  # ServiceAccount (namespace default) and FlowSchema


def operator_identity(kc: str, workdir: Path) -> Path:
    """A kubeconfig for the operator as its own ServiceAccount (cluster-admin), and a
    FlowSchema matching only it, so the API server counts its requests."""
    kubectl(kc, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": IDENTITY, "namespace": "default"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": IDENTITY},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
         "subjects": [{"kind": "ServiceAccount", "name": IDENTITY, "namespace": "default"}]},
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": IDENTITY},
         "spec": {"priorityLevelConfiguration": {"name": "workload-high"}, "matchingPrecedence": 100,
                  "distinguisherMethod": {"type": "ByUser"},
                  "rules": [{"subjects": [{"kind": "ServiceAccount",
                                           "serviceAccount": {"name": IDENTITY, "namespace": "default"}}],
                             "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                "namespaces": ["*"], "clusterScope": True}],
                             "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}]))
    token = kubectl(kc, "create", "token", IDENTITY, "-n", "default", "--duration", "24h").stdout.strip()
    admin = yaml.safe_load(Path(kc).read_text())
    admin["users"][0]["user"] = {"token": token}
    out = workdir / "operator.kubeconfig"
    out.write_text(yaml.safe_dump(admin))
    return out


def apiserver_requests(kc: str) -> float:
    """Requests the API server dispatched for the operator's FlowSchema so far."""
    text = kubectl(kc, "get", "--raw", "/metrics").stdout
    return sum(float(m.group(1)) for m in re.finditer(
        r'^apiserver_flowcontrol_dispatched_requests_total\{[^}]*flow_schema="%s"[^}]*\} (\S+)$' % IDENTITY, text, re.M))


class Children:
    """The names of the operator-managed children of some namespaces, from one watch per
    kind (the API server serves watches from its cache; nothing is polled)."""

    PATHS = ("/apis/apps/v1/statefulsets", "/apis/apps/v1/deployments", "/api/v1/services", "/api/v1/serviceaccounts",
             "/apis/policy/v1/poddisruptionbudgets", "/apis/rbac.authorization.k8s.io/v1/roles",
             "/apis/rbac.authorization.k8s.io/v1/rolebindings", "/apis/networking.k8s.io/v1/networkpolicies")

    def __init__(self, kc: str):
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kc, client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.seen: set[tuple[str, str, str]] = set()  # (path, namespace, name)
        # (namespace, service) -> monotonic time each of its children was first seen
        self.first_seen: dict[tuple[str, str], list[float]] = {}
        self.cond = threading.Condition()
        for path in self.PATHS:
            threading.Thread(target=self._watch, args=(path,), daemon=True).start()

    def _watch(self, path: str) -> None:
        while True:
            try:
                resp = self.api.call_api("GET", self.api.configuration.host + path + "?" + urllib.parse.urlencode(
                    {"watch": "1", "labelSelector": "app.kubernetes.io/managed-by=pd-operator"}),
                    header_params={"Accept": "application/json"}, _request_timeout=(10, 3600))
                buf = b""
                for chunk in resp.response.stream(65536):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        meta = event["object"].get("metadata", {})
                        if event["type"] == "ADDED":
                            with self.cond:
                                key = (path, meta.get("namespace"), meta.get("name"))
                                if key not in self.seen:
                                    self.seen.add(key)
                                    service = (meta.get("labels") or {}).get(LABEL_SERVICE)
                                    if service:
                                        self.first_seen.setdefault((key[1], service), []).append(time.monotonic())
                                self.cond.notify_all()
            except Exception:  # noqa: BLE001 - a dropped watch is started again (it lists again)
                time.sleep(0.5)

    def count(self, namespace: str) -> int:
        with self.cond:
            return sum(1 for _, ns, _ in self.seen if ns == namespace)

    def completions(self, namespace: str, per_service: int, since: float) -> dict[str, float]:
        """p50 / p99 over the services of ``namespace`` of the seconds from ``since`` to the
        service's ``per_service``-th child seen (a service with fewer counts as never done)."""
        with self.cond:
            done = sorted(sorted(times)[per_service - 1] - since if len(times) >= per_service else math.inf
                          for (ns, _), times in self.first_seen.items() if ns == namespace)
        if not done:
            return {}
        return {"p50": round(done[len(done) // 2], 2), "p99": round(done[min(len(done) - 1, int(0.99 * len(done)))], 2)}

    def wait(self, namespace: str, want: int, timeout: float = 3600.0) -> float:
        """Seconds until ``want`` children of ``namespace`` were seen."""
        started = time.monotonic()
        with self.cond:
            if not self.cond.wait_for(lambda: sum(1 for _, ns, _ in self.seen if ns == namespace) >= want, timeout):
                raise TimeoutError(f"{namespace}: {self.count(namespace)} of {want} children after {timeout:.0f}s")
        return time.monotonic() - started


def wait_for_earlier_runs(kc: str, timeout: float = 1800.0) -> None:
    """An earlier run's namespaces are deleted in the background (thousands of
    objects for the garbage collector): measuring while that goes on measures it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [n for n in kubectl(kc, "get", "namespaces", "-o", "name").stdout.split() if n.startswith("namespace/bench-")]
        if not left:
            return
        print(f"waiting for {len(left)} namespace(s) of an earlier run to be deleted", file=sys.stderr, flush=True)
        time.sleep(10)
    raise SystemExit("namespaces of an earlier run are still being deleted")


def run(kc: str, n: int, idle: float, edits: int, children: Children, op_kc: Path, distinct: bool = False) -> dict:
    wait_for_earlier_runs(kc)
    ns = f"bench-{n}-{uuid.uuid4().hex[:5]}"
    raw_ns = f"{ns}-raw"
    for name in (ns, raw_ns):
        kubectl(kc, "create", "namespace", name)
    port = 19000 + n % 1000
    log = open(tempfile.mktemp(prefix="bench-op-", suffix=".log"), "w")
    op = subprocess.Popen([sys.executable, "-m", "pd_operator", "-n", ns, "--liveness-port", "0",
                           "--metrics-port", str(port), "--bind", "127.0.0.1"],
                          env={**os.environ, "KUBECONFIG": str(op_kc), "PD_OPERATOR_WARMUP_SECONDS": "1"},
                          stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        time.sleep(4)
        want = 13 * n
        docs = [body(f"s{i}", ns, f"model-{i}" if distinct else None) for i in range(n)]
        c0, r0, started = {**cpu_seconds(), "operator": proc_stats(op.pid)[1]}, own_requests(port), time.monotonic()
        kubectl(kc, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
        children.wait(ns, want)
        create_s = time.monotonic() - started
        create_each = children.completions(ns, 13, started)
        create_cpu = delta({**cpu_seconds(), "operator": proc_stats(op.pid)[1]}, c0)
        create_requests = delta(own_requests(port), r0)
        # the same children, rendered and applied raw, once the first phase's tail
        # (pods started, statuses written) is over, so it does not weigh on this one
        time.sleep(max(10.0, n / 20))
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(yaml.safe_dump_all([body(f"s{i}", raw_ns, f"model-{i}" if distinct else None) for i in range(n)]))
            f.flush()
            rendered = subprocess.run([str(Path(sys.executable).parent / "pdctl"), "render", "-f", f.name],
                                      capture_output=True, text=True, check=True, cwd=ROOT).stdout
        c0, started = cpu_seconds(), time.monotonic()
        kubectl(kc, "apply", "--server-side", "-f", "-", stdin=rendered)
        children.wait(raw_ns, want)
        raw_s = time.monotonic() - started
        raw_each = children.completions(raw_ns, 13, started)
        raw_cpu = delta(cpu_seconds(), c0)
        # steady state
        time.sleep(max(10.0, n / 20))
        a0, o0, (rss0, cpu0), t0 = apiserver_requests(kc), own_requests(port), proc_stats(op.pid), time.monotonic()
        time.sleep(idle)
        a1, o1, (rss1, cpu1), t1 = apiserver_requests(kc), own_requests(port), proc_stats(op.pid), time.monotonic()
        rate = (a1 - a0) / (t1 - t0)
        own = {verb: round((o1.get(verb, 0.0) - o0.get(verb, 0.0)) / (t1 - t0), 4) for verb in o1}
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
        return {"services": n, "distinct_specs": distinct, "create_to_children_s": round(create_s, 2), "raw_apply_s": round(raw_s, 2),
                "create_vs_raw": round(create_s / raw_s, 2) if raw_s else None,
                # per service: seconds from the apply to its 13th child, p50 / p99 over the services
                "create_per_service_s": create_each, "raw_per_service_s": raw_each,
                "create_vs_raw_p99": (round(create_each["p99"] / raw_each["p99"], 2)
                                      if create_each.get("p99") and raw_each.get("p99") else None),
                "create_cpu_s": create_cpu, "raw_cpu_s": raw_cpu, "create_requests_by_verb": create_requests,
                "idle_requests_per_s": round(rate, 4), "idle_requests_per_s_per_service": round(rate / n, 5),
                "idle_own_requests_per_s_by_verb": own,
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
    p.add_argument("--distinct", action="store_true",
                   help="every service its own served model name (no dry-run verdict carries over between them)")
    args = p.parse_args(argv)
    # stopped with SIGTERM: unwind, so the operator it started is stopped and its namespaces deleted
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cluster = load_e2e_module("cluster")
    name = os.environ.get("PD_TEST_CLUSTER", "pd-test")
    was_running = cluster.is_running(name)
    kc = str(cluster.up(name))
    try:
        kubectl(kc, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / "pdinferenceservices.yaml"))
        kubectl(kc, "wait", "--for=condition=Established", "crd/pdinferenceservices.pdserving.io", "--timeout=60s")
        children = Children(kc)
        with tempfile.TemporaryDirectory() as tmp:
            op_kc = operator_identity(kc, Path(tmp))
            for n in (int(x) for x in args.services.split(",")):
                print(json.dumps(run(kc, n, args.idle, args.edits, children, op_kc, args.distinct)), flush=True)
    finally:
        # the namespaces go before the cluster stops: a cluster stopped mid-deletion
        # resumes it at its next start, under whatever runs then (the tests)
        wait_for_earlier_runs(kc)
        if not was_running and not os.environ.get("PD_KEEP_CLUSTER"):
            cluster.down(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
