#!/usr/bin/env python3
"""Pods backed by processes: the e2e harness for the local (kwok) cluster.

kwok plays the kubelet but runs no containers. This harness watches one
namespace and, for every Running pod the operator created, starts a local
process that stands in for its container, as a kubelet would:

* engine pods (label ``pdserving.io/role=prefill|decode``): the simulated
  engine, ``python -m pd_operator_tools.enginesim --bind <pod IP> -- <container command +
  args>``; the exact command the operator rendered, checked by the sim with
  the engine's real parser;
* router pods (``pdserving.io/role=router``): the REAL router
  (vllm-router / sglang-router) from the routers' venv, with the rendered
  command; ``python3`` becomes that venv's python.

The container environment is resolved as the kubelet does: ``value`` (with
``$(VAR)`` expansion from earlier entries), ``secretKeyRef`` / ``configMapKeyRef``
read from the API, ``fieldRef`` (``status.podIP``, ``metadata.name``, ...),
``envFrom``; ``$(VAR)`` in command/args is expanded from that environment.
A pod's process does not inherit the harness's environment (only PATH, HOME
and the like, so Python starts).

Kubernetes access as in a pod: a router pod gets a token of its own
ServiceAccount (rendered ``NAME-router``) from the TokenRequest API, bound to
the pod, written with the API server address and CA of the admin kubeconfig
into a kubeconfig passed as ``KUBECONFIG``. The router's label-selector
discovery therefore runs with exactly the Role the operator rendered; it
finds workers by pod IP + ``--service-discovery-port``, as in a cluster.

The one substitution: in a cluster each pod has its own network namespace,
so the rendered ``--host 0.0.0.0`` / ``--prometheus-host 0.0.0.0`` bind the
pod's own interface. Here all processes share the host's, and pod IPs are
loopback addresses (e2e/cluster.py), so every process binds its pod IP
instead (the sim via ``--bind``, the router by replacing the ``0.0.0.0``
values of ``--host`` / ``--prometheus-host``). Ports stay as rendered.

A pod that goes away (deleted, scaled down, being deleted) takes its process
with it as the kubelet would: its preStop sleep, then SIGTERM, then SIGKILL
when its terminationGracePeriodSeconds is over; ``stop()`` kills all. A pod
that kwok gives the IP of a running pod is deleted, to be recreated with
another (``ip_conflicts``).
A process that exits is not restarted (it is logged and kept in
``exited``: a test should see a crash, not hide it). Each process's output
goes to ``<log_dir>/<pod>.log``.

Known difference from a kubelet: kwok marks a pod Ready as soon as it runs;
no readiness probe gates it on the process. A router can therefore see a new
pod (e.g. after a scale-up) a second before its sim listens. So that it never
meets a refused connection there (seen: prefill requests failing with HTTP 500
during a scale-up in ``e2e/run.sh demo``), the harness binds the engine pod's
API port itself and hands the listening socket to the sim (``--listen-fd``):
a request sent meanwhile waits in the backlog for the ~1-2 s the sim takes to
start, where a cluster would not have routed it yet. Workers the routers
health-check before use are re-checked after
``--worker-startup-check-interval`` (30 s by default), so such a scaled-up
worker may join up to ~30 s late here.

    .venv/bin/python e2e/harness.py -n NAMESPACE [--kubeconfig FILE] [--log-dir DIR]

(the project's Python: the sims are started with the harness's interpreter;
the routers with --router-python, default the routers' venv), or, from pytest::

    with Harness(kubeconfig, namespace, log_dir) as h:
        h.wait_serving("decode", 1)
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Self

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

ROLE_LABEL = "pdserving.io/role"
ENGINE_ROLES = ("prefill", "decode")
ROUTER_ROLE = "router"
# environment a pod's process inherits from the harness: only what makes the
# interpreter start; everything else comes from the pod spec.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "XDG_CACHE_HOME")


# The routers the operator renders for, pinned (the routers' venv holds exactly these).
ROUTER_PINS = ("vllm-router==0.1.17", "sglang-router==0.3.2")


def default_router_python() -> Path:
    """The routers' venv (ensure_router_python() creates it)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pd-operator" / "venvs" / "routers" / "bin" / "python"


def router_python_ok(py: Path) -> bool:
    check = [str(py), "-c", "import vllm_router, sglang_router, importlib.metadata as m; "
             + " and ".join(f"m.version({n!r}) == {v!r}" for n, v in (pin.split("==") for pin in ROUTER_PINS))
             + " or exit(1)"]
    return py.exists() and subprocess.run(check, capture_output=True).returncode == 0


def ensure_router_python(py: Path | None = None) -> Path:
    """The routers' venv with the pinned routers, created (pip) when missing."""
    py = Path(py or default_router_python())
    if router_python_ok(py):
        return py
    venv = py.parent.parent
    log(f"creating the routers' venv {venv} ({', '.join(ROUTER_PINS)})")
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", *ROUTER_PINS], check=True, timeout=900)
    if not router_python_ok(py):
        raise RuntimeError(f"{py}: the pinned routers ({', '.join(ROUTER_PINS)}) do not import")
    return py


def log(msg: str) -> None:
    print(f"[harness {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion: defined vars are replaced, undefined ones
    stay as written, ``$$`` is an escaped ``$``."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(sub, text)


@dataclasses.dataclass
class PodProcess:
    pod: str
    uid: str
    role: str
    ip: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen
    http_port: int | None
    prestop_seconds: float = 0.0   # the container's preStop sleep
    grace_seconds: float = 30.0    # the pod's terminationGracePeriodSeconds
    started: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.http_port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def serves_api(self) -> bool:
        """Not a worker of a replica over several nodes (LWS worker index >= 1): those serve no
        API, though SGLang's answer /health and /metrics on the API port."""
        return self.env.get("LWS_WORKER_INDEX", "0") == "0"


class Harness:
    """Backs the engine and router pods of one namespace with local processes."""

    def __init__(self, kubeconfig: str, namespace: str, log_dir: str | Path | None = None, *,
                 router_python: str | Path | None = None, sim_opts: list[str] | tuple = (),
                 poll_interval: float = 0.5, grace_seconds: float = 5.0):
        self.kubeconfig, self.namespace = str(kubeconfig), namespace
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix=f"pd-harness-{namespace}-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.router_python = Path(router_python or default_router_python())
        self.sim_opts = list(sim_opts)
        self.poll_interval, self.grace_seconds = poll_interval, grace_seconds
        self.api = config.new_client_from_config(config_file=self.kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.procs: dict[str, PodProcess] = {}  # by pod uid
        self.exited: list[PodProcess] = []
        self.draining: list[PodProcess] = []  # pods gone, processes in their preStop/grace period
        self.ip_conflicts: list[str] = []  # pods kwok gave a live pod's IP (see _ip_conflict)
        self.errors: list[str] = []  # pods whose process could not even be started
        self._failed: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Harness:
        if not self.router_python.exists():
            raise FileNotFoundError(f"router python {self.router_python} missing "
                                    "(tests/sim/conftest.py:router_python() creates the venv)")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"harness-{self.namespace}", daemon=True)
        self._thread.start()
        log(f"watching {self.namespace}; logs in {self.log_dir}")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        with self._lock:
            procs = list(self.procs.values()) + self.draining
            for pp in procs:  # SIGTERM all first: their grace periods run in parallel
                self._signal(pp, signal.SIGTERM, "harness stopped")
            for pp in procs:
                self._terminate(pp, "harness stopped", signalled=True)
            for pp in procs:
                if not pp.alive():
                    (self.log_dir / f"{pp.pod}.pid").unlink(missing_ok=True)
            self.procs.clear()
            self.draining.clear()
        self.api.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- queries

    def processes(self, role: str | None = None) -> list[PodProcess]:
        with self._lock:
            return sorted((p for p in self.procs.values() if role is None or p.role == role), key=lambda p: p.pod)

    def wait_serving(self, role: str, count: int, timeout: float = 60.0, path: str | None = None) -> list[PodProcess]:
        """Wait until ``count`` pods of ``role`` that serve the API have a live process
        answering ``path`` (engines: /health, router: /readiness) with 200."""
        path = path or ("/readiness" if role == ROUTER_ROLE else "/health")
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.errors:
                raise RuntimeError("harness errors: " + "; ".join(self.errors))
            ready = []
            for pp in self.processes(role):
                if not pp.alive() or not pp.serves_api:
                    continue
                try:
                    with urllib.request.urlopen(pp.url + path, timeout=2) as resp:
                        if resp.status == 200:
                            ready.append(pp)
                except Exception as exc:  # noqa: BLE001 - keep polling
                    last = f"{pp.pod}: {exc}"
            if len(ready) >= count:
                return ready
            time.sleep(0.25)
        dead = [f"{p.pod} exited {p.proc.returncode}: {tail(p.log_path)}" for p in self.exited if p.role == role]
        raise TimeoutError(f"{count} {role} pod(s) not serving {path} after {timeout}s "
                           f"(have {[p.pod for p in self.processes(role)]}; last: {last}; exited: {dead})")

    # ---------------------------------------------------------------- the loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except ApiException as exc:
                log(f"list pods failed: {exc.status} {exc.reason}")
            except Exception as exc:  # noqa: BLE001 - keep the harness alive, but say it
                log(f"sync failed: {exc!r}")
            self._stop.wait(self.poll_interval)

    def sync(self) -> None:
        """One reconcile pass: processes for Running pods, none for the rest."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=ROLE_LABEL).items
        want = {}
        for pod in pods:
            role = (pod.metadata.labels or {}).get(ROLE_LABEL)
            if role not in (*ENGINE_ROLES, ROUTER_ROLE):
                continue
            if pod.metadata.deletion_timestamp or pod.status.phase != "Running" or not pod.status.pod_ip:
                continue
            want[pod.metadata.uid] = pod
        with self._lock:
            # stop first: a new pod may get the IP of one that just went away
            self.draining = [pp for pp in self.draining if pp.alive()]
            for uid, pp in list(self.procs.items()):
                if uid not in want:
                    del self.procs[uid]
                    self._drain(pp)
                elif not pp.alive():
                    log(f"{pp.pod}: process exited with {pp.proc.returncode} (see {pp.log_path})")
                    self.exited.append(pp)
                    del self.procs[uid]
                    want.pop(uid)  # not restarted: a crash must stay visible
            for uid, pod in want.items():
                if uid in self.procs or uid in self._failed or any(e.uid == uid for e in self.exited):
                    continue
                holder = next((pp for pp in self.procs.values() if pp.ip == pod.status.pod_ip), None)
                if holder is not None:
                    self._ip_conflict(pod, holder)
                    continue
                try:
                    self.procs[uid] = self._start_pod(pod)
                except Exception as exc:  # noqa: BLE001 - report, do not kill the loop
                    msg = f"{pod.metadata.name}: cannot start: {exc!r}"
                    log(msg)
                    self.errors.append(msg)
                    self._failed.add(uid)  # not retried, like a crash

    # ---------------------------------------------------------------- one pod

    def _start_pod(self, pod) -> PodProcess:
        name, role, ip = pod.metadata.name, pod.metadata.labels[ROLE_LABEL], pod.status.pod_ip
        container = pod.spec.containers[0]
        for old in [pp for pp in self.draining if pp.ip == ip and pp.alive()]:
            # kwok handed a draining pod's IP to a new pod (a kubelet would not free it
            # before the old sandbox is gone): the old process must give way
            self._signal(old, signal.SIGKILL, f"IP {ip} reused by {name}")
        env = self.container_env(pod, container)
        argv = [expand(a, env) for a in [*(container.command or []), *(container.args or [])]]
        if not argv:
            raise ValueError("container has no command (the image's entrypoint cannot be known here)")
        http_port = next((p.container_port for p in container.ports or [] if p.name == "http"), None)
        proc_env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        proc_env.update(env)
        proc_env["PYTHONUNBUFFERED"] = "1"
        if role == ROUTER_ROLE:
            argv = self.router_argv(argv, ip)
            proc_env["KUBECONFIG"] = str(self.pod_kubeconfig(pod))
        else:
            argv = [sys.executable, "-m", "pd_operator_tools.enginesim", "--bind", ip, *self.sim_opts, "--", *argv]
            proc_env.update(sim_env_for_pod(pod))
            if "LWS_LEADER_ADDRESS" in env:
                # a pod of a LeaderWorkerSet group: its leader's DNS name
                # (<lws>-<group>.<subdomain>.<ns>) has no DNS here; the sim
                # joins the leader pod's IP instead (enginesim/group.py)
                leader = self.core.read_namespaced_pod(env["LWS_LEADER_ADDRESS"].split(".", 1)[0], pod.metadata.namespace)
                if not leader.status.pod_ip:
                    raise RuntimeError(f"the group leader {leader.metadata.name} has no IP yet")
                proc_env["PD_SIM_LEADER_IP"] = leader.status.pod_ip
            # the sim is our package: make it importable whatever the cwd
            pkg_root = str(Path(__file__).resolve().parents[1] / "operator")
            proc_env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, proc_env.get("PYTHONPATH")]))
        pass_fds: tuple[int, ...] = ()
        listener = None
        if role != ROUTER_ROLE and http_port:
            # The pod's API port listens before the sim starts (~1-2 s of imports):
            # kwok marks the pod Ready at once, with no readiness probe run, so a
            # router may send to it right away; held in the backlog, that request
            # waits for the engine instead of failing with a refused connection.
            listener = listen(ip, int(http_port))
            sep = argv.index("--")  # the sim's options end here
            argv[sep:sep] = ["--listen-fd", str(listener.fileno())]
            pass_fds = (listener.fileno(),)
        log_path = self.log_dir / f"{name}.log"
        fh = log_path.open("ab")
        fh.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} pod {name} ({role}) ip {ip}\n# argv: {argv}\n".encode())
        fh.flush()
        try:
            proc = subprocess.Popen(argv, env=proc_env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.log_dir, start_new_session=True, pass_fds=pass_fds)
        finally:
            fh.close()
            if listener is not None:
                listener.close()  # the process holds its own copy
        # a pid file per process: whoever stops a harness that could not clean up
        # (killed) finds what is left (e2e/run.py down)
        (self.log_dir / f"{name}.pid").write_text(f"{proc.pid}\n")
        log(f"{name} ({role}) on {ip}: pid {proc.pid}")
        return PodProcess(name, pod.metadata.uid, role, ip, argv, env, log_path, proc, http_port,
                          prestop_seconds=prestop_sleep(container),
                          grace_seconds=float(pod.spec.termination_grace_period_seconds
                                              if pod.spec.termination_grace_period_seconds is not None else 30))

    def router_argv(self, argv: list[str], ip: str) -> list[str]:
        """python3 -> the router venv's python; 0.0.0.0 binds -> the pod IP."""
        out = list(argv)
        if Path(out[0]).name.startswith("python"):
            out[0] = str(self.router_python)
        for i, a in enumerate(out[:-1]):
            if a in ("--host", "--prometheus-host") and out[i + 1] == "0.0.0.0":
                out[i + 1] = ip
        return out

    def container_env(self, pod, container) -> dict[str, str]:
        """The container's environment as the kubelet builds it."""
        ns = pod.metadata.namespace
        env: dict[str, str] = {}
        for src in container.env_from or []:
            prefix = src.prefix or ""
            if src.config_map_ref:
                data = self._configmap(ns, src.config_map_ref.name, src.config_map_ref.optional) or {}
            elif src.secret_ref:
                data = self._secret(ns, src.secret_ref.name, src.secret_ref.optional) or {}
            else:
                data = {}
            env.update({prefix + k: v for k, v in data.items()})
        for e in container.env or []:
            if e.value_from is None:
                env[e.name] = expand(e.value or "", env)
                continue
            vf = e.value_from
            if vf.field_ref:
                env[e.name] = self._field(pod, vf.field_ref.field_path)
            elif vf.secret_key_ref or vf.config_map_key_ref:
                ref, read, kind = ((vf.secret_key_ref, self._secret, "secret") if vf.secret_key_ref
                                   else (vf.config_map_key_ref, self._configmap, "configmap"))
                data = read(ns, ref.name, ref.optional)
                if data is not None and ref.key in data:
                    env[e.name] = data[ref.key]
                elif not ref.optional:
                    raise LookupError(f"{kind} {ns}/{ref.name} has no key {ref.key!r}")
            elif vf.resource_field_ref:
                continue  # limits.* of a kwok pod mean nothing to a local process
        return env

    @staticmethod
    def _field(pod, path: str) -> str:
        simple = {
            "status.podIP": pod.status.pod_ip, "status.hostIP": pod.status.host_ip,
            "metadata.name": pod.metadata.name, "metadata.namespace": pod.metadata.namespace,
            "metadata.uid": pod.metadata.uid, "spec.nodeName": pod.spec.node_name,
            "spec.serviceAccountName": pod.spec.service_account_name,
        }
        if path in simple:
            return simple[path] or ""
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return (getattr(pod.metadata, m.group(1)) or {}).get(m.group(2), "")
        if path == "status.podIPs":
            return ",".join(p.ip for p in pod.status.pod_i_ps or [])
        raise ValueError(f"fieldRef {path} not supported by the harness")

    def _secret(self, ns: str, name: str, optional: bool | None) -> dict[str, str] | None:
        try:
            s = self.core.read_namespaced_secret(name, ns)
        except ApiException as exc:
            if exc.status == 404 and optional:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()}

    def _configmap(self, ns: str, name: str, optional: bool | None) -> dict[str, str] | None:
        try:
            return dict(self.core.read_namespaced_config_map(name, ns).data or {})
        except ApiException as exc:
            if exc.status == 404 and optional:
                return None
            raise

    def pod_kubeconfig(self, pod) -> Path:
        """A kubeconfig with a token of the pod's ServiceAccount, bound to the pod."""
        sa = pod.spec.service_account_name or "default"
        req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=3 * 3600,
            bound_object_ref=client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod.metadata.name,
                                                           uid=pod.metadata.uid)))
        token = self.core.create_namespaced_service_account_token(sa, pod.metadata.namespace, req).status.token
        server, ca_data = admin_cluster(self.kubeconfig)
        kc = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
            "users": [{"name": f"system:serviceaccount:{pod.metadata.namespace}:{sa}", "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "cluster", "namespace": pod.metadata.namespace,
                                                     "user": f"system:serviceaccount:{pod.metadata.namespace}:{sa}"}}],
            "current-context": "pod",
        }
        path = self.log_dir / f"{pod.metadata.name}.kubeconfig"
        path.write_text(yaml.safe_dump(kc))
        path.chmod(0o600)
        return path

    @staticmethod
    def _signal(pp: PodProcess, sig: int, why: str) -> None:
        if pp.alive():
            log(f"{pp.pod}: {why}: {signal.Signals(sig).name} to pid {pp.proc.pid}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pp.proc.pid, sig)  # its own session: the whole process group

    def _ip_conflict(self, pod, holder: PodProcess) -> None:
        """kwok handed a new pod the IP of a pod that is still running (its IP pool
        can free an address twice around a restart of the cluster). A kubelet's CNI
        would fail that pod's sandbox; here the pod is deleted so its controller
        makes a new one with another IP. Logged and kept in ``ip_conflicts``."""
        name = pod.metadata.name
        msg = f"{name}: got IP {pod.status.pod_ip}, which running pod {holder.pod} holds; deleted it to be recreated"
        log(msg)
        self.ip_conflicts.append(msg)
        self._failed.add(pod.metadata.uid)
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    def _drain(self, pp: PodProcess) -> None:
        """What the kubelet does with a deleted pod, without blocking the loop:
        the preStop sleep (the router, watching the pods, stops sending it work
        meanwhile), then SIGTERM, then SIGKILL when the grace period (counted from
        the deletion, preStop included) is over."""
        self.draining.append(pp)

        def run() -> None:
            log(f"{pp.pod}: pod gone: preStop {pp.prestop_seconds:g}s, grace {pp.grace_seconds:g}s")
            if self._stop.wait(min(pp.prestop_seconds, pp.grace_seconds)):
                return  # the harness is stopping: stop() terminates it
            self._signal(pp, signal.SIGTERM, "preStop done")
            left = max(0.0, pp.grace_seconds - pp.prestop_seconds)
            try:
                pp.proc.wait(left)
            except subprocess.TimeoutExpired:
                self._signal(pp, signal.SIGKILL, "grace period over")

        threading.Thread(target=run, name=f"drain-{pp.pod}", daemon=True).start()

    def _terminate(self, pp: PodProcess, why: str, signalled: bool = False) -> None:
        """SIGTERM (as the kubelet does), SIGKILL after the grace period."""
        if not pp.alive():
            return
        if not signalled:
            self._signal(pp, signal.SIGTERM, why)
        try:
            pp.proc.wait(self.grace_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pp.proc.pid, signal.SIGKILL)
            pp.proc.wait(10)


def listen(ip: str, port: int, timeout: float = 3.0) -> socket.socket:
    """A listening socket on ip:port; retried briefly while a killed process of
    the pod that had this IP before still holds it."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
            sock.listen(1024)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# Resources that are not devices: the kubelet's own, and hugepages-<size>.
_NOT_DEVICES = ("cpu", "memory", "ephemeral-storage")


def rdma_device_count(pod) -> int:
    """RDMA devices the pod's engine container was given: the sum of its
    extended resources that count neither CPU/memory/storage nor GPUs (a
    device plugin's ``*/gpu``). render/pools.py requests
    ``kvTransfer.rdma.resourceName`` (``count``) and one of each rail resource
    there, equal in requests and limits; a limit alone is also the request."""
    container = pod.spec.containers[0]
    res = container.resources
    amounts = dict((res.limits or {}) if res else {})
    amounts.update((res.requests or {}) if res else {})
    total = 0
    for name, value in amounts.items():
        if name in _NOT_DEVICES or name.startswith("hugepages-") or name.endswith("/gpu"):
            continue
        total += int(str(value))  # extended resources are whole numbers
    return total


def sim_env_for_pod(pod) -> dict[str, str]:
    """What the simulated engine is told about the pod's hardware (enginesim
    refuses a Mooncake RDMA transfer with PDSIM_RDMA_DEVICES=0, as the engine
    does when it finds no usable RDMA device)."""
    return {"PDSIM_RDMA_DEVICES": str(rdma_device_count(pod))}


def prestop_sleep(container) -> float:
    """Seconds of the container's ``lifecycle.preStop.sleep`` hook (0: none).
    Only the sleep action is emulated; an exec or httpGet hook is refused."""
    hook = container.lifecycle.pre_stop if container.lifecycle else None
    if hook is None:
        return 0.0
    if hook.sleep is not None:
        return float(hook.sleep.seconds)
    raise ValueError(f"preStop hook {hook} is not emulated (only sleep is)")


def admin_cluster(kubeconfig: str) -> tuple[str, str]:
    """(server, base64 CA) of the kubeconfig's current context."""
    doc = yaml.safe_load(Path(kubeconfig).read_text())
    ctx_name = doc.get("current-context")
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
    ca = cluster.get("certificate-authority-data")
    if not ca and cluster.get("certificate-authority"):
        ca_path = Path(cluster["certificate-authority"])
        if not ca_path.is_absolute():
            ca_path = Path(kubeconfig).resolve().parent / ca_path
        ca = base64.b64encode(ca_path.read_bytes()).decode()
    return cluster["server"], ca


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--namespace", required=True)
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or
                   str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                       / "pd-operator" / "clusters" / "pd-local" / "kubeconfig"))
    p.add_argument("--log-dir", help="process logs (default: a new temporary directory)")
    p.add_argument("--router-python", default=str(default_router_python()))
    p.add_argument("--sim-opt", action="append", default=[], metavar="OPT",
                   help="option for every sim, before its '--' (repeat; e.g. --sim-opt=--kv-link=nvlink)")
    args = p.parse_args(argv)
    h = Harness(args.kubeconfig, args.namespace, args.log_dir, router_python=args.router_python,
                sim_opts=args.sim_opt)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with h:
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
