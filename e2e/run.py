#!/usr/bin/env python3
"""The main job (e2e/run.sh calls this with the project's venv).

    up [EXAMPLE]   local world (no $KUBECONFIG): the local cluster (e2e/cluster.py),
                   the CRD, the operator, a local Prometheus with the shipped
                   scrape job, the e2e harness (e2e/harness.py: simulated engines
                   from the rendered commands, the real router) and the example
                   (default e2e/demo.yaml); ends with a curl through the router
                   and TTFT/ITL read from Prometheus in `kubectl get pdservices`.
                   With $KUBECONFIG: the CRD, the operator and the example on
                   that cluster; no harness, no local Prometheus.
    demo           a short load through the router with `pdctl bench` (progress,
                   table, PNG plot) while the pools' replicas are sampled
    down           stop everything `up` started (and the local cluster)

Background processes keep a pid file and a log under
${XDG_CACHE_HOME:-~/.cache}/pd-operator/run/<cluster>/ (the local cluster's
name: pd-local, or $PD_CLUSTER_NAME; "external" with $KUBECONFIG).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_EXAMPLE = HERE / "demo.yaml"
SCRAPE_JOB = ROOT / "manifests" / "prometheus" / "scrape-engines.yaml"
SCRAPE_INTERVAL = "5s"  # the shipped job says 15s; shorter here so the columns fill fast


def _load(stem: str):
    import importlib.util

    name = f"pd_e2e_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{stem}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


cluster = _load("cluster")
RUN = cluster.cache_root() / "run" / ("external" if os.environ.get("KUBECONFIG") else cluster.DEFAULT_NAME)
STATE = RUN / "state.json"
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------- processes


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def running(name: str) -> int | None:
    """The pid of our background process ``name`` when it is alive (the pid file's
    pid, running the command line we recorded: a reused pid is not ours)."""
    f = RUN / f"{name}.pid"
    if not f.is_file():
        return None
    with contextlib.suppress(ValueError, OSError):
        pid, marker = f.read_text().split("\n", 1)
        pid = int(pid)
        if _alive(pid) and marker.strip() and marker.strip() in _cmdline(pid):
            return pid
    return None


def start_bg(name: str, argv: list[str], env: dict | None = None, marker: str | None = None) -> int:
    log = (RUN / f"{name}.log").open("ab")
    log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode())
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                            env=env, start_new_session=True)
    log.close()
    (RUN / f"{name}.pid").write_text(f"{proc.pid}\n{marker or argv[-1]}\n")
    return proc.pid


def stop_bg(name: str, grace: float = 40.0) -> None:
    pid = running(name)
    if pid is None:
        (RUN / f"{name}.pid").unlink(missing_ok=True)  # stale: its process is gone
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        say(f"{name} (pid {pid}) ignored SIGTERM for {grace:g}s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    (RUN / f"{name}.pid").unlink(missing_ok=True)
    say(f"stopped {name} (pid {pid})")


def stop_pod_leftovers() -> list[int]:
    """Pod processes a harness could not stop (it was killed): their pid files."""
    killed = []
    for f in (RUN / "pods").glob("*.pid") if (RUN / "pods").is_dir() else []:
        with contextlib.suppress(ValueError, OSError):
            pid = int(f.read_text())
            cmd = _cmdline(pid)
            if _alive(pid) and ("enginesim" in cmd or "router" in cmd):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
        f.unlink(missing_ok=True)
    return killed


def free_port(host: str = "127.0.0.1", prefer: int | None = None) -> int:
    for port in ([prefer] if prefer else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - not yet
        return False


def wait(what: str, fn, timeout: float, every: float = 0.5, tick=None):
    deadline = time.monotonic() + timeout
    next_note = time.monotonic() + 15
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if time.monotonic() > next_note:
            say(f"  still waiting for {what}...")
            next_note = time.monotonic() + 15
        if tick:
            tick()
        time.sleep(every)


# ----------------------------------------------------------------- kubectl


class Kube:
    def __init__(self, kubeconfig: str, local: bool):
        self.kubeconfig, self.local = kubeconfig, local
        import shutil

        pinned = cluster.binary("kubectl")
        # your kubectl on your cluster; the pinned one on the local cluster (or when you have none)
        self.bin = str(pinned) if local or (not shutil.which("kubectl") and pinned.is_file()) else "kubectl"

    def __call__(self, *args: str, check: bool = True, capture: bool = True, input: str | None = None):
        env = dict(os.environ, KUBECONFIG=self.kubeconfig)
        r = subprocess.run([self.bin, *args], env=env, text=True, input=input,
                           stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)
        if check and r.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r

    def json(self, *args: str):
        r = self(*args, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None


# ----------------------------------------------------------------- pieces


def start_operator(kubeconfig: str) -> None:
    stop_bg("operator", grace=15)  # always the checkout's code
    env = dict(os.environ, KUBECONFIG=kubeconfig, PYTHONUNBUFFERED="1")
    # 8080 / 9090 as in a pod when free (another main job or test may hold them)
    live, prom = free_port("0.0.0.0", 8080), free_port("0.0.0.0", 9090)
    pid = start_bg("operator", [sys.executable, "-m", "pd_operator", "--all-namespaces", "--liveness-port", str(live),
                                "--metrics-port", str(prom)], env=env, marker="pd_operator")
    wait("the operator's /healthz", lambda: http_ok(f"http://127.0.0.1:{live}/healthz") or _dead("operator", pid), 60)
    say(f"operator: pid {pid}, log {RUN / 'operator.log'}, metrics http://127.0.0.1:{prom}/metrics")


def _dead(name: str, pid: int) -> bool:
    if not _alive(pid):
        tail = "\n".join((RUN / f"{name}.log").read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"{name} exited; the end of {RUN / (name + '.log')}:\n{tail}")
    return False


def start_prometheus(kubeconfig: str, namespace: str) -> str:
    """Real Prometheus with the shipped scrape job (plus kubeconfig_file: it runs
    outside the cluster), discovering the namespace's engine pods."""
    binary = cluster.binary("prometheus")
    if not binary.is_file():
        raise FileNotFoundError(f"{binary} missing: e2e/controlplane/build.sh builds it")
    job = yaml.safe_load(SCRAPE_JOB.read_text())[0]
    job["scrape_interval"] = SCRAPE_INTERVAL
    for sd in job["kubernetes_sd_configs"]:
        sd["kubeconfig_file"] = kubeconfig
        sd["namespaces"] = {"names": [namespace]}
    cfg = yaml.safe_dump({"global": {"scrape_interval": SCRAPE_INTERVAL}, "scrape_configs": [job]})
    conf = RUN / "prometheus.yml"
    addr_file = RUN / "prometheus.addr"
    pid = running("prometheus")
    if pid and conf.is_file() and conf.read_text() == cfg and addr_file.is_file():
        url = "http://" + addr_file.read_text().strip()
        if http_ok(url + "/-/ready"):
            say(f"prometheus: already running, {url} (pid {pid})")
            return url
    stop_bg("prometheus")
    # a fresh TSDB: series left by an earlier cluster carry the same namespace and
    # service labels, and would be read as this service's latency (seen: a new
    # service reporting the previous demo's 4.3 s TTFT and scaled on it)
    shutil.rmtree(RUN / "prometheus-data", ignore_errors=True)
    conf.write_text(cfg)
    prev = int(addr_file.read_text().split(":")[1]) if addr_file.is_file() else 19090
    addr = f"127.0.0.1:{free_port(prefer=prev)}"
    addr_file.write_text(addr + "\n")
    pid = start_bg("prometheus", [str(binary), f"--config.file={conf}", f"--storage.tsdb.path={RUN / 'prometheus-data'}",
                                  f"--web.listen-address={addr}", "--storage.tsdb.retention.time=1d"],
                   marker=f"--web.listen-address={addr}")
    url = f"http://{addr}"
    wait("Prometheus /-/ready", lambda: http_ok(url + "/-/ready") or _dead("prometheus", pid), 60)
    say(f"prometheus: {url} (pid {pid}), scraping the engine pods of {namespace} every {SCRAPE_INTERVAL} "
        f"with {SCRAPE_JOB.relative_to(ROOT)}; log {RUN / 'prometheus.log'}")
    return url


def start_harness(kubeconfig: str, namespace: str) -> None:
    harness = _load("harness")
    router_py = harness.ensure_router_python()
    marker = f"--log-dir {RUN / 'pods'}"
    pid = running("harness")
    state = read_state()
    if pid and state.get("harness_namespace") == namespace and state.get("kubeconfig") == kubeconfig:
        say(f"harness: already running (pid {pid})")
        return
    stop_bg("harness")
    stop_pod_leftovers()
    pid = start_bg("harness", [sys.executable, str(HERE / "harness.py"), "-n", namespace, "--kubeconfig", kubeconfig,
                               "--router-python", str(router_py), "--sim-opt=--efficiency=pytorch",
                               "--log-dir", str(RUN / "pods")], marker=marker)
    write_state(harness_namespace=namespace, kubeconfig=kubeconfig)
    time.sleep(0.5)
    _dead("harness", pid)
    say(f"harness: pid {pid} (simulated engines + real router for the pods of {namespace}); "
        f"log {RUN / 'harness.log'}, pod logs {RUN / 'pods'}")


def read_state() -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(STATE.read_text())
    return {}


def write_state(**kw) -> dict:
    s = read_state() | kw
    STATE.write_text(json.dumps(s, indent=1))
    return s


def prepare_example(path: Path, prom_url: str | None) -> tuple[dict, Path]:
    doc = yaml.safe_load(path.read_text())
    if prom_url:
        doc.setdefault("spec", {}).setdefault("autoscaling", {}).setdefault("prometheus", {})["url"] = prom_url
    doc["metadata"].setdefault("namespace", "default")
    out = RUN / "example.yaml"
    out.write_text(f"# {path} with spec.autoscaling.prometheus.url set by e2e/run.sh\n" + yaml.safe_dump(doc, sort_keys=False))
    return doc, out


def _containers(template: dict) -> list[tuple]:
    return [(c.get("name"), c.get("image"), c.get("command"), c.get("args"))
            for c in ((template.get("spec") or {}).get("containers") or [])]


def rolled_out(kube: Kube, doc: dict) -> bool:
    """Every StatefulSet and Deployment the operator renders for ``doc`` carries this
    rendering's containers and has rolled out: every pod updated and Ready.

    On a warm cluster the service may still say Ready from an operator of an earlier
    checkout while this one's rendering replaces the pods (`kubectl wait` returns at
    once on that stale condition); this waits for what `kubectl rollout status`
    waits for, on the objects as this checkout renders them.
    """
    from pd_operator.api.models import PDInferenceService
    from pd_operator.render import render

    ns = doc["metadata"]["namespace"]
    for obj in render(PDInferenceService.model_validate(doc)):
        if obj["kind"] not in ("StatefulSet", "Deployment"):
            continue
        live = kube.json("get", obj["kind"].lower(), "-n", ns, obj["metadata"]["name"])
        if not live or _containers(live["spec"]["template"]) != _containers(obj["spec"]["template"]):
            return False
        st, want = live.get("status") or {}, live["spec"].get("replicas", 1)
        if st.get("observedGeneration", 0) < live["metadata"].get("generation", 0):
            return False
        if any((st.get(k) or 0) != want for k in ("replicas", "updatedReplicas", "readyReplicas")):
            return False
        if obj["kind"] == "StatefulSet" and st.get("currentRevision") != st.get("updateRevision"):
            return False
    return True


def router_url(kube: Kube, ns: str, name: str) -> str | None:
    pods = kube.json("get", "pods", "-n", ns, "-l", f"pdserving.io/service={name},pdserving.io/role=router")
    for pod in (pods or {}).get("items", []):
        ip = pod.get("status", {}).get("podIP")
        port = next((p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])
                     if p.get("name") == "http"), None)
        if ip and port and pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp"):
            return f"http://{ip}:{port}"
    return None


def workers(url: str) -> dict[str, int]:
    try:
        with urllib.request.urlopen(url + "/workers", timeout=3) as resp:
            doc = json.loads(resp.read())
    except Exception:  # noqa: BLE001 - not yet
        return {}
    out: dict[str, int] = {}
    for w in doc.get("workers", []):
        if w.get("is_healthy", True):
            out[w.get("worker_type", "?")] = out.get(w.get("worker_type", "?"), 0) + 1
    return out


def targets_up(prom: str, ns: str) -> int:
    q = urllib.parse.urlencode({"query": f'up{{job="pd-engines", namespace="{ns}"}} == 1'})
    try:
        with urllib.request.urlopen(f"{prom}/api/v1/query?{q}", timeout=3) as resp:
            return len(json.loads(resp.read())["data"]["result"])
    except Exception:  # noqa: BLE001
        return 0


def curl_argv(url: str, model: str, api_key: str | None = None, tokens: int = 16) -> list[str]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What does PD disaggregation buy?"}],
                       "max_tokens": tokens})
    argv = ["curl", "-sS", "--max-time", "60", f"{url}/v1/chat/completions", "-H", "Content-Type: application/json"]
    if api_key:
        argv += ["-H", f"Authorization: Bearer {api_key}"]
    return argv + ["-d", body]


def chat_once(url: str, model: str, api_key: str | None = None) -> dict:
    argv = curl_argv(url, model, api_key)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    if r.returncode:
        raise RuntimeError(f"curl failed ({r.returncode}): {r.stderr.strip()}")
    try:
        return json.loads(r.stdout)
    except ValueError:
        raise RuntimeError(f"the router answered: {r.stdout[:300]}") from None


def fresh_metrics(kube: Kube, ns: str, name: str, since: float) -> dict | None:
    """status.metrics once the autoscaler read both signals from Prometheus after
    ``since`` (epoch s): MetricsAvailable True, "latest signals read <stamp>".
    The status of an earlier session keeps its figures, so mere presence is no proof."""
    import datetime as dt

    status = (kube.json("get", "pdservices", "-n", ns, name) or {}).get("status") or {}
    metrics = status.get("metrics") or {}
    cond = next((c for c in status.get("conditions", []) if c.get("type") == "MetricsAvailable"), {})
    stamp = (cond.get("message") or "").removeprefix("latest signals read ").strip()
    try:
        at = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    if cond.get("status") == "True" and at >= since and metrics.get("ttft") and metrics.get("itl"):
        return metrics
    return None


# ----------------------------------------------------------------- commands


def up(example: Path) -> int:
    RUN.mkdir(parents=True, exist_ok=True)
    external = os.environ.get("KUBECONFIG")
    local = not external
    if local:
        say("local cluster (no $KUBECONFIG): control-plane binaries, then the cluster")
        cluster.ensure_built()
        kubeconfig = str(cluster.up())
        say(f"cluster {cluster.DEFAULT_NAME}: {kubeconfig} (pods in 127.{cluster.pod_octet()}.0.0/16)")
    else:
        kubeconfig = external
        say(f"your cluster ($KUBECONFIG={kubeconfig}): the operator runs here, the rest is yours to provide")
    kube = Kube(kubeconfig, local)
    if not local:
        r = kube("get", "--raw", "/readyz", "--request-timeout=10s", check=False)
        if r.returncode:
            print(f"e2e/run.sh: the cluster of KUBECONFIG={kubeconfig} does not answer ({r.stderr.strip()[:300]}); "
                  "fix the kubeconfig, or unset KUBECONFIG for the local cluster", file=sys.stderr)
            return 2
    # The repository's CRD is the truth: take over its fields from whoever applied
    # an older one (an earlier checkout, the integration tests on this cluster).
    kube("apply", "--server-side", "--force-conflicts", "--field-manager=pd-operator-crd",
         "-f", str(ROOT / "crds" / "pdinferenceservices.yaml"))
    kube("wait", "--for=condition=Established", "crd/pdinferenceservices.pdserving.io", "--timeout=60s")
    say("CRD applied")
    start_operator(kubeconfig)

    raw = yaml.safe_load(example.read_text())
    ns, name = raw["metadata"].get("namespace", "default"), raw["metadata"]["name"]
    spec = raw.get("spec", {})
    model = spec.get("model", {}).get("servedName") or spec.get("model", {}).get("name")
    if local:
        prom = start_prometheus(kubeconfig, ns)
        start_harness(kubeconfig, ns)
    else:
        prom = os.environ.get("PD_PROMETHEUS_URL") or (spec.get("autoscaling", {}).get("prometheus") or {}).get("url")
        expect_on_cluster(raw, prom)
    doc, applied = prepare_example(example, prom)
    r = subprocess.run([sys.executable, "-m", "pd_operator.cli", "validate", "-f", str(applied)], text=True,
                       capture_output=True)
    if r.returncode:
        print(r.stdout + r.stderr, file=sys.stderr)
        return 2
    api_key = ensure_api_key(kube, doc)
    kube("apply", "-f", str(applied))
    say(f"applied {example} (as {applied})")
    write_state(local=local, namespace=ns, name=name, model=model, api_key=api_key, prometheus=prom,
                kubeconfig=kubeconfig)
    if not local:
        r = kube("wait", "-n", ns, "--for=condition=Ready", f"pdservice/{name}", "--timeout=180s", check=False)
        print(kube("get", "pdservices", "-A", check=False).stdout)
        if r.returncode:
            print(kube("get", "pdservice", "-n", ns, name, "-o", "jsonpath={range .status.conditions[*]}"
                       "{.type}={.status} {.reason}: {.message}{'\\n'}{end}", check=False).stdout)
        print(f"endpoint: the Service {name}-router in {ns}; from here:\n"
              f"  kubectl port-forward -n {ns} svc/{name}-router 8000:8000 &\n"
              f"  {shlex.join(curl_argv('http://127.0.0.1:8000', model, api_key))}\n"
              "stop the operator with: e2e/run.sh down (your cluster and the service stay)")
        return 0 if r.returncode == 0 else 1

    kube("wait", "-n", ns, "--for=condition=Ready", f"pdservice/{name}", "--timeout=180s")
    wait("the pools and the router to roll out as this checkout renders them", lambda: rolled_out(kube, doc), 300)
    say(f"pdservice {ns}/{name} Ready")
    pools = {r: int(spec.get(r, {}).get("replicas") or 1) for r in ("prefill", "decode")}
    url = wait("the router pod's process", lambda: (u := router_url(kube, ns, name)) and http_ok(u + "/readiness") and u,
               90)
    wait(f"the router to discover {pools['prefill']} prefill + {pools['decode']} decode workers",
         lambda: (w := workers(url)).get("prefill", 0) >= pools["prefill"] and w.get("decode", 0) >= pools["decode"],
         90)
    say(f"router {url}: workers {workers(url)} (found by label selector, with its own ServiceAccount)")
    wait("Prometheus scraping every engine pod", lambda: targets_up(prom, ns) >= sum(pools.values()), 60)
    since = time.time() - 1  # the RFC 3339 stamps have whole seconds
    answer = chat_once(url, model, api_key)
    say(f"curl through the router: {answer['usage']['completion_tokens']} tokens, "
        f"\"{answer['choices'][0]['message']['content'][:60]}...\"")
    write_state(endpoint=url)

    # status.metrics: the autoscaler reads TTFT (prefill) and ITL (decode) from
    # Prometheus every spec.autoscaling.interval; a rate needs two scrapes around
    # a request, so keep a request going until both columns are filled.
    last = [time.monotonic()]

    def nudge():
        if time.monotonic() - last[0] > 8:
            last[0] = time.monotonic()
            with contextlib.suppress(Exception):
                chat_once(url, model, api_key)

    m = wait("TTFT and ITL in status.metrics (Prometheus -> operator)",
             lambda: fresh_metrics(kube, ns, name, since), 120, every=1, tick=nudge)
    say(f"status.metrics: TTFT {m['ttft']}, ITL {m['itl']}")
    print()
    print(kube("get", "pdservices", "-A").stdout)
    print(f"endpoint: {url}  (the router pod's IP; Prometheus {prom})")
    print("try it:\n  " + shlex.join(curl_argv(url, model, api_key)))
    print(f"\nwatch:  KUBECONFIG={kubeconfig} kubectl get pdservices -w   (or e2e/cluster.sh kubectl get pdservices -w)")
    print("load:   e2e/run.sh demo        stop: e2e/run.sh down")
    print(f"logs:   {RUN}")
    say("up")
    return 0


def ensure_api_key(kube: Kube, doc: dict) -> str | None:
    ref = (doc["spec"].get("engine") or {}).get("apiKeySecretRef")
    if not ref:
        return None
    ns = doc["metadata"]["namespace"]
    secret = kube.json("get", "secret", "-n", ns, ref["name"])
    if secret and ref["key"] in (secret.get("data") or {}):
        import base64

        return base64.b64decode(secret["data"][ref["key"]]).decode()
    if not kube.local:
        raise SystemExit(f"spec.engine.apiKeySecretRef: Secret {ns}/{ref['name']} with key {ref['key']} is missing: "
                         f"create it (kubectl create secret generic {ref['name']} -n {ns} --from-literal={ref['key']}=...)")
    import secrets

    key = secrets.token_urlsafe(24)
    kube("create", "secret", "generic", ref["name"], "-n", ns, f"--from-literal={ref['key']}={key}")
    say(f"created Secret {ns}/{ref['name']} (the engines' API key)")
    return key


def expect_on_cluster(raw: dict, prom: str | None) -> None:
    spec = raw.get("spec", {})
    image = (spec.get("router") or {}).get("image", "")
    lines = ["On your cluster, this job expects (it starts none of them):",
             f"  - GPU nodes with the pools' resources and labels (gpuProduct {spec.get('prefill', {}).get('gpuProduct', '-')})",
             f"  - the router image, built and pushed: spec.router.image = {image or '(default)'}",
             "  - the engine image pullable by the nodes (spec.engine.image, or the engine's default)",
             "  - a Prometheus scraping the engine pods with manifests/prometheus/scrape-engines.yaml, reachable",
             f"    from the operator (here: this machine) at spec.autoscaling.prometheus.url = {prom or '(unset)'}",
             "    (PD_PROMETHEUS_URL=... overrides it; without it TTFT/ITL stay empty and autoscaling holds)"]
    if "registry.example.com" in image:
        lines.append(f"WARNING: {image} is the example's placeholder: the router pod will not pull it")
    print("\n".join(lines), flush=True)


def demo(args: list[str]) -> int:
    st = read_state()
    if not st.get("endpoint"):
        print("e2e/run.sh demo: nothing is serving; run e2e/run.sh first", file=sys.stderr)
        return 2
    kube = Kube(st["kubeconfig"], st["local"])
    ns, name = st["namespace"], st["name"]
    plot, csv, out = RUN / "demo.png", RUN / "demo.csv", RUN / "demo.json"
    bench = [sys.executable, "-m", "pd_operator.cli", "bench", "--url", st["endpoint"], "--model", st["model"],
             "--rate", "8", "-n", "480", "--duration", "60", "--isl", "lognormal:4000:0.5", "--osl", "uniform:150:0.5",
             "--warmup", "2", "--ttft-slo", "1", "--itl-slo", "0.05", "--seed", "1",
             "--plot", str(plot), "--csv", str(csv), "--json", str(out), *args]
    if st.get("api_key"):
        bench += ["--api-key", st["api_key"]]
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def sample():
        while True:
            p = kube.json("get", "statefulset", "-n", ns, f"{name}-prefill")
            d = kube.json("get", "statefulset", "-n", ns, f"{name}-decode")
            if p and d:
                samples.append((time.time(), p["spec"]["replicas"], d["spec"]["replicas"]))
            if stop.wait(2):
                return

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    print(f"$ pdctl bench {shlex.join(bench[4:])}", flush=True)
    rc = subprocess.run(bench, cwd=ROOT).returncode
    stop.set()
    th.join(10)
    changes, last = [], None
    try:
        doc = json.loads(out.read_text())
        t0 = doc["summary"]["started_at"]
    except (OSError, ValueError, KeyError):
        doc, t0 = None, samples[0][0] if samples else time.time()
    timeline = [(t - t0, p, d) for t, p, d in samples]
    for t, p, d in timeline:
        if (p, d) != last:
            changes.append(f"  {t:6.0f}s  prefill {p}  decode {d}")
            last = (p, d)
    print("\nreplicas during the run (the autoscaler, each pool on its own signal; "
          "t = seconds since the load began):\n" + "\n".join(changes))
    if doc is not None and timeline:  # the plot again, with the replicas panel
        from pd_operator_tools.loadgen import Result
        from pd_operator_tools.loadgen.plot import write_png

        fields = set(Result.__dataclass_fields__)
        results = [Result(**{k: v for k, v in r.items() if k in fields}) for r in doc["requests"]]
        write_png(str(plot), results, doc["summary"]["slo"]["ttft_s"], doc["summary"]["slo"]["mean_itl_s"],
                  replicas=timeline)
    print(kube("get", "pdservices", "-n", ns, name, check=False).stdout)
    print(f"plot: {plot}\ncsv:  {csv}\njson: {out}")
    return rc


def down() -> int:
    st = read_state()
    for name in ("harness", "prometheus", "operator"):
        stop_bg(name)
    left = stop_pod_leftovers()
    if left:
        say(f"killed pod processes the harness left: {left}")
    if not os.environ.get("KUBECONFIG") and st.get("local", True):
        cluster.down()
    STATE.unlink(missing_ok=True)
    still = [n for n in ("harness", "prometheus", "operator") if running(n)]
    if still:
        print(f"still running: {still}", file=sys.stderr)
        return 1
    say("down: nothing of the main job is running")
    return 0


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "up"
    if cmd == "down":
        return down()
    if cmd == "demo":
        return demo(argv[1:])
    if cmd == "up":
        argv = argv[1:]
    example = Path(argv[0]) if argv else DEFAULT_EXAMPLE
    RUN.mkdir(parents=True, exist_ok=True)
    return up(example.resolve())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
