#!/usr/bin/env python3
"""Local Kubernetes control plane with GPU-shaped fake nodes, for tests and demos.

    e2e/cluster.sh up [--profile P]   build what is missing, start (or create)
                            the cluster, register the GPU nodes of node profile P
                            (default hgx-h200, or $PD_NODE_PROFILE; see
                            e2e/nodeprofiles.py --list), print the kubeconfig path
    e2e/cluster.sh down     stop every process of the cluster, keep its state
                            (the next `up` is a warm start)
    e2e/cluster.sh delete   stop and remove the cluster's state
    e2e/cluster.sh status   print state, kubeconfig path and nodes
    e2e/cluster.sh kubeconfig  print the kubeconfig path only
    e2e/cluster.sh kubectl ARGS...   run the pinned kubectl against the cluster

The pytest fixtures (tests/integration/conftest.py) import this module and call
the same functions: ``up()``, ``down()``, ``is_running()``.

What runs (all real binaries, built by e2e/controlplane/build.sh):
  etcd 3.6, kube-apiserver, kube-controller-manager, kube-scheduler (the real
  ones: CRD validation and CEL, SSA, GC, StatefulSet controller and the
  GPU-aware scheduler are all genuine) and kwok-controller, which plays the
  kubelet for the fake nodes of the cluster's node profile (e2e/nodeprofiles.py;
  the default profile is also e2e/controlplane/nodes.yaml). A cluster keeps
  the profile it was created with; asking for another one recreates it.

Supervision is kwokctl's `binary` runtime: it writes certificates and
configuration, starts each component as a detached process with a pid file and
stops them again. Every binary path is given to it explicitly, so it never
downloads anything (its downloader is only used for http(s) sources; a local
path is symlinked). kwokctl's work directory is our cache directory:

  ${XDG_CACHE_HOME:-~/.cache}/pd-operator/clusters/<name>/        kwokctl workdir
  ${XDG_CACHE_HOME:-~/.cache}/pd-operator/clusters/<name>/kubeconfig

Pod IPs, and why loopback: kwok gives each pod an IP from its node's
spec.podCIDR. The nodes get 127.<P>.<N>.0/24, where P, the cluster's pod
octet, is derived from the cluster name (``pod_octet()``: stable, in 16..95),
so the main job's cluster (pd-local) and the tests' (pd-test) never hand out
the same pod IP and their harnesses never bind each other's addresses. kwok's
fallback CIDR (127.<P>.255.0/24) and node IPs are loopback as well, so every address that the cluster
reports for a pod is in 127.0.0.0/8. Linux routes the whole /8 to `lo`, so a
test harness can start a local process bound to exactly the pod's IP and port
(e.g. a simulated engine standing in for pod 127.100.1.3:8000) with no network
setup, no root and no namespace; and no test traffic can ever leave the
machine by accident (a 10.x pod IP would be routed to the default gateway).
The price: the API server refuses loopback addresses in Endpoints and
EndpointSlices, so Services cannot list their pods' IPs. The endpoint
controllers of kube-controller-manager are therefore switched off (they would
only retry failing writes and emit warning events; measured ~20 refused writes
and ~7 events per Service in its first minute): Services exist, select pods and
get ClusterIPs, but have no endpoints. Anything that finds pods by label through
the API (the routers' Kubernetes discovery, Prometheus' pod role, our tests)
works unchanged; nothing may wait for a Service's endpoints here. The
alternative, a private range on interfaces inside a network namespace, would
make Services complete but force every harness process into that namespace;
not worth it for these tests.
The service ClusterIP range is moved into loopback too (127.96.0.0/16) for the
same reason: nothing should ever dial a 10.96.x.x address from this machine.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONTROLPLANE = HERE / "controlplane"
NODES_YAML = CONTROLPLANE / "nodes.yaml"
# The node profile a new cluster gets when up() is not given one.
NODE_PROFILE_ENV = "PD_NODE_PROFILE"
# PD_CLUSTER_NAME: run a second, separate local cluster (own ports, own state).
DEFAULT_NAME = os.environ.get("PD_CLUSTER_NAME") or "pd-local"

# The service ClusterIP range and kwok's own fallbacks: all loopback (see above).
SERVICE_CIDR = "127.96.0.0/16"
KWOK_FALLBACK_NODE_IP = "127.101.0.254"  # nodes without an InternalIP
# Pod octets: 127.<P>.0.0/16 per cluster, P in [16, 96): below the service range
# (127.96/16) and the node IPs (127.101), away from 127.0.0.1 and from the random
# 127.101-250 addresses the tests' own servers bind (tests/sim/conftest.py).
POD_OCTETS = range(16, 96)


def pod_octet(name: str = DEFAULT_NAME) -> int:
    """Second octet of the cluster's pod range, from its name: stable across runs
    and machines, distinct for pd-local (84) and pd-test (81). Two arbitrary
    names can share one (80 values); tests/unit/test_node_profiles.py checks
    the project's own cluster names do not."""
    import hashlib

    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return POD_OCTETS.start + h % len(POD_OCTETS)


# Component ports: kwokctl picks free ones from 32767 down when a cluster is
# created, so two clusters created while the other was stopped get the same
# ports and cannot run together (seen: pd-test's etcd holding 32766 made a warm
# start of another local cluster wait for an API server that could not
# listen). Each cluster gets its own block instead, from the same per-name
# octet: 30000 + 8 * (P - 16), below the kernel's ephemeral range (32768+).
PORT_NAMES = ("etcdPeerPort", "etcdPort", "kubeApiserverPort", "kubeControllerManagerPort",
              "kubeSchedulerPort", "kwokControllerPort")
PORT_BASE, PORT_BLOCK = 30000, 8


def ports(name: str = DEFAULT_NAME) -> dict[str, int]:
    """The cluster's component ports (kwokctl options), a block of its own."""
    base = PORT_BASE + PORT_BLOCK * (pod_octet(name) - POD_OCTETS.start)
    return {k: base + i for i, k in enumerate(PORT_NAMES)}


def kwok_fallback_pod_cidr(name: str = DEFAULT_NAME) -> str:
    """kwok's CIDR for pods on nodes without a podCIDR: still the cluster's own range."""
    return f"127.{pod_octet(name)}.255.0/24"


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def versions() -> dict[str, str]:
    out = {}
    for line in (CONTROLPLANE / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pd-operator"


def bin_dirs() -> dict[str, Path]:
    v = versions()
    b = cache_root() / "bin"
    return {
        "k8s": b / f"kubernetes-{v['K8S_VERSION']}",
        "etcd": b / f"etcd-{v['ETCD_VERSION']}",
        "kwok": b / f"kwok-{v['KWOK_VERSION']}",
        "helm": b / f"helm-{v['HELM_VERSION']}",
        "prometheus": b / f"prometheus-{v['PROMETHEUS_VERSION']}",
        "lws": b / f"lws-{v['LWS_VERSION']}",
        "cert-manager": b / f"cert-manager-{v['CERT_MANAGER_VERSION']}",
    }


def binary(name: str) -> Path:
    d = bin_dirs()
    where = {
        "kube-apiserver": d["k8s"], "kube-controller-manager": d["k8s"],
        "kube-scheduler": d["k8s"], "kubectl": d["k8s"], "etcd": d["etcd"],
        "kwok": d["kwok"], "kwokctl": d["kwok"], "helm": d["helm"],
        "prometheus": d["prometheus"], "promtool": d["prometheus"],
        "lws-controller": d["lws"],
    }[name]
    return where / name


def binaries_present() -> bool:
    return all(binary(n).is_file() for n in (
        "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
        "etcd", "kwok", "kwokctl", "lws-controller"))


def ensure_built() -> None:
    """Build the pinned binaries if any is missing (cold build: tens of minutes)."""
    if binaries_present():
        return
    log("control-plane binaries missing: running e2e/controlplane/build.sh")
    subprocess.run(["bash", str(CONTROLPLANE / "build.sh")], check=True)


def workdir(name: str = DEFAULT_NAME) -> Path:
    return cache_root() / "clusters" / name


def _run_dir() -> Path:
    """Our own per-cluster files (lock, generated kwokctl config); kept out of
    clusters/, which kwokctl expects to hold cluster directories only."""
    d = cache_root() / "run"
    d.mkdir(parents=True, exist_ok=True)
    return d


def kubeconfig_path(name: str = DEFAULT_NAME) -> Path:
    return workdir(name) / "kubeconfig"


def _kwok_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KWOK_")}
    # kwokctl keeps clusters in $KWOK_WORKDIR/clusters/<name>, its download
    # cache (never used: every binary is a local path) in $KWOK_WORKDIR/cache.
    env["KWOK_WORKDIR"] = str(cache_root())
    env.pop("KUBECONFIG", None)
    return env


def _kwokctl(*args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    # -v WARN: kwokctl logs every step as JSON at INFO; keep errors only.
    cmd = [str(binary("kwokctl")), "-v", os.environ.get("PD_KWOKCTL_LOG", "WARN"), *args]
    return subprocess.run(cmd, env=_kwok_env(), check=check, text=True,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)


def kubectl(*args: str, name: str = DEFAULT_NAME, check: bool = True,
            capture: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig_path(name)))
    return subprocess.run([str(binary("kubectl")), *args], env=env, check=check, text=True,
                          input=input, stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)


def _kwokctl_config(name: str = DEFAULT_NAME) -> str:
    """kwokctl configuration: local binaries only, real KCM + scheduler enabled."""
    v = versions()
    opts = {
        "runtime": "binary",
        "kubeVersion": v["K8S_VERSION"],
        "etcdVersion": v["ETCD_VERSION"].lstrip("v"),
        "kwokVersion": v["KWOK_VERSION"],
        "kubeApiserverBinary": binary("kube-apiserver"),
        "kubeControllerManagerBinary": binary("kube-controller-manager"),
        "kubeSchedulerBinary": binary("kube-scheduler"),
        "kubectlBinary": binary("kubectl"),
        "etcdBinary": binary("etcd"),
        "kwokControllerBinary": binary("kwok"),
        "quietPull": "true",
        # Listen on loopback only (kwokctl's default is 0.0.0.0): nothing
        # outside this machine has any business with this cluster.
        "bindAddress": "127.0.0.1",
        # Short node leases, no heartbeat scaling (kwokctl's default factor 5
        # makes them 200 s): after a warm start the new kwok-controller takes
        # the nodes over when the old leases expire, so this bounds warm start.
        "heartbeatFactor": "1",
        "nodeLeaseDurationSeconds": "10",
        # kwokctl's defaults, spelled out: secure port with RBAC and the
        # default admission chain, like a real cluster.
        "securePort": "true",
        "kubeAuthorization": "true",
        "kubeAdmission": "true",
        **ports(name),
    }
    lines = ["apiVersion: config.kwok.x-k8s.io/v1alpha1",
             "kind: KwokctlConfiguration", "options:"]
    lines += [f"  {k}: {val if val in ('true', 'false') or str(val).isdigit() else repr(str(val))}"
              for k, val in opts.items()]
    # Real controller-manager and scheduler: the component list is kwokctl's
    # default one, written out so that nothing can switch them off.
    lines += ["  components:"] + [f"  - {c}" for c in (
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")]
    lines += [
        "componentsPatches:",
        "- name: kube-apiserver",
        "  extraArgs:",
        "  - key: service-cluster-ip-range",
        f"    value: {SERVICE_CIDR}",
        # On top of the default plugins (the flag adds to them), the one that
        # OpenShift and hardened clusters run and kube-apiserver leaves off:
        # an ownerReference with blockOwnerDeletion is refused unless its
        # writer may update the owner's finalizers (plugin/pkg/admission/gc).
        # The chart's RBAC is tested against it by every install test.
        "  - key: enable-admission-plugins",
        "    value: OwnerReferencesPermissionEnforcement",
        # Single instances that we supervise: no leader election. With it, a
        # warm start stalls ~15 s until the lease of the previous (killed)
        # process expires, and no controller runs meanwhile.
        "- name: kube-controller-manager",
        "  extraArgs:",
        "  - key: service-cluster-ip-range",
        f"    value: {SERVICE_CIDR}",
        "  - key: leader-elect",
        "    value: 'false'",
        # The endpoint controllers could only fail here: every pod IP is
        # loopback, which the API server refuses in Endpoints/EndpointSlices
        # (measured: ~20 refused writes and ~7 warning events per Service in
        # its first minute, then backing off). Off, Services simply have no
        # endpoints, which is what they would end up with anyway.
        "  - key: controllers",
        "    value: '*,-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller'",
        "- name: kube-scheduler",
        "  extraArgs:",
        "  - key: leader-elect",
        "    value: 'false'",
        # kwok's fallbacks as flags: a KwokConfiguration document in this
        # file would replace kwokctl's defaults for all other kwok options
        # (kwok v0.8.0 then fails on zero parallelism).
        "- name: kwok-controller",
        "  extraArgs:",
        "  - key: cidr",
        f"    value: {kwok_fallback_pod_cidr(name)}",
        "  - key: node-ip",
        f"    value: {KWOK_FALLBACK_NODE_IP}",
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _lock(name: str):
    """Serialise up/down of one cluster across processes (pytest-xdist, shells)."""
    path = _run_dir() / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def created(name: str = DEFAULT_NAME) -> bool:
    return (workdir(name) / "kwok.yaml").is_file() and kubeconfig_path(name).is_file()


def _pids(name: str) -> dict[str, int]:
    """Pid files kwokctl keeps for each component (binary runtime)."""
    out = {}
    pid_dir = workdir(name) / "pids"
    if pid_dir.is_dir():
        for p in pid_dir.glob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                out[p.stem] = int(p.read_text().strip())
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _ours(name: str, component: str, pid: int) -> bool:
    """The pid runs this cluster's component: kwokctl starts each one as
    <workdir>/bin/<component>, which is argv[0]."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except OSError:
        return False
    return argv0 == str(workdir(name) / "bin" / component)


def running_components(name: str = DEFAULT_NAME) -> dict[str, int]:
    return {c: p for c, p in _pids(name).items() if _alive(p) and _ours(name, c, p)}


def _clear_stale_pid_files(name: str) -> None:
    """Remove pid files whose process is gone (or a zombie, or a reused pid).
    kwokctl trusts a pid file blindly: after its processes were killed from
    outside (e.g. the end of a CI job), `start` would skip a component whose
    pid now belongs to someone else, and `stop` would kill that stranger."""
    for comp, pid in _pids(name).items():
        if not (_alive(pid) and _ours(name, comp, pid)):
            (workdir(name) / "pids" / f"{comp}.pid").unlink(missing_ok=True)


def is_running(name: str = DEFAULT_NAME) -> bool:
    """True when the API server answers /readyz with our kubeconfig."""
    if not created(name) or not binary("kubectl").is_file():
        return False
    r = kubectl("get", "--raw", "/readyz", "--request-timeout=3s", name=name, check=False)
    return r.returncode == 0 and r.stdout.strip() == "ok"


def _wait(what: str, fn, timeout: float, interval: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if fn():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _nodeprofiles():
    """e2e/nodeprofiles.py, imported by path (e2e/ is not a package)."""
    import importlib.util

    mod_name = "pd_e2e_nodeprofiles"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, HERE / "nodeprofiles.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[mod_name]


def default_profile() -> str:
    return os.environ.get(NODE_PROFILE_ENV) or _nodeprofiles().DEFAULT_PROFILE


def _profile_file(name: str) -> Path:
    return _run_dir() / f"{name}.profile"


def profile_of(name: str = DEFAULT_NAME) -> str | None:
    """The node profile the cluster was created with (None: not recorded)."""
    f = _profile_file(name)
    return f.read_text().strip() if f.is_file() else None


def _node_count(name: str) -> int:
    return len(_nodeprofiles().nodes(profile_of(name) or default_profile()))


def _nodes_ready(name: str) -> bool:
    r = kubectl("get", "nodes", "-l", "type=kwok", "-o",
                'jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}',
                name=name, check=False)
    if r.returncode != 0:
        return False
    lines = [ln for ln in r.stdout.splitlines() if ln]
    return len(lines) >= _node_count(name) and all(ln.endswith("=True") for ln in lines)


def _default_sa_exists(name: str) -> bool:
    # Pods cannot be created in "default" before the service-account
    # controller (kube-controller-manager) has made the default SA.
    return kubectl("get", "serviceaccount", "default", "-n", "default",
                   name=name, check=False).returncode == 0


def _node_leases(name: str) -> list[tuple[str, str, float]]:
    """(node, holder, renewTime as epoch seconds) of the GPU nodes' leases."""
    r = kubectl("get", "leases", "-n", "kube-node-lease", "-o",
                'jsonpath={range .items[*]}{.metadata.name} {.spec.holderIdentity} {.spec.renewTime}{"\\n"}{end}',
                name=name, check=False)
    out = []
    for ln in r.stdout.splitlines() if r.returncode == 0 else []:
        parts = ln.split()
        if len(parts) == 3 and parts[0].startswith("gpu-node-"):
            ts = parts[2].replace("Z", "+00:00")
            out.append((parts[0], parts[1], _dt.datetime.fromisoformat(ts).timestamp()))
    return out


def _kwok_owns_nodes(name: str, started: float) -> bool:
    leases = _node_leases(name)
    return (len(leases) >= _node_count(name) and len({h for _, h, _ in leases}) == 1
            and all(t >= started - 1 for _, _, t in leases))


def register_nodes(name: str = DEFAULT_NAME) -> None:
    """Create the GPU nodes of the cluster's profile. Node status (capacity) can
    only be set at creation time through the main resource, so nodes are
    created, not applied; existing ones are left as they are (labels are
    re-applied: one field manager, so a label the profile no longer has goes)."""
    profile = profile_of(name) or default_profile()
    kubectl("apply", "--server-side", "--field-manager=pd-e2e", "--force-conflicts",
            "-f", "-", name=name, input=_nodeprofiles().to_yaml(profile, pod_octet(name)))


def up(name: str = DEFAULT_NAME, timeout: float = 180.0, profile: str | None = None) -> Path:
    """Idempotent start with the GPU nodes of ``profile`` (default: the
    cluster's own, else $PD_NODE_PROFILE, else hgx-h200). Returns the
    kubeconfig path."""
    ensure_built()
    profile = profile or profile_of(name) or default_profile()
    _nodeprofiles().nodes(profile)  # unknown profile: fail before anything starts
    with _lock(name):
        t0 = time.monotonic()
        started = time.time()
        warm = False
        cfg = _run_dir() / f"{name}.kwokctl.yaml"
        want = _kwokctl_config(name)
        if created(name) and (not cfg.is_file() or cfg.read_text() != want):
            # versions.env or this file changed since the cluster was made:
            # kwokctl only reads its configuration at creation, so recreate.
            log(f"cluster {name} was created with another configuration: recreating it")
            _delete_locked(name)
        if created(name) and profile_of(name) not in (None, profile):
            # Node capacity is fixed at node creation: another profile is another cluster.
            log(f"cluster {name} has node profile {profile_of(name)}, not {profile}: recreating it")
            _delete_locked(name)
        if is_running(name):
            log(f"cluster {name} already running")
        elif created(name):
            log(f"starting existing cluster {name} (warm start)")
            _clear_stale_pid_files(name)
            _kwokctl("start", "cluster", "--name", name, "--timeout", f"{int(timeout)}s")
            warm = True
        else:
            log(f"creating cluster {name}")
            wd = workdir(name)
            if wd.exists():  # half-created leftovers
                shutil.rmtree(wd)
            wd.parent.mkdir(parents=True, exist_ok=True)
            cfg.write_text(want)
            # --kubeconfig always: kwokctl's default is to add the context to
            # ~/.kube/config and make it current, which we never want.
            _kwokctl("create", "cluster", "--name", name, "--config", str(cfg),
                     "--kubeconfig", str(kubeconfig_path(name)),
                     "--timeout", f"{int(timeout)}s", "--wait", f"{int(timeout)}s")
        _wait("kube-apiserver /readyz", lambda: is_running(name), timeout)
        if warm:
            # kwok-controller's identity is random per process: it manages a
            # node only once it holds the node's lease, i.e. after the lease of
            # the previous process expired (nodeLeaseDurationSeconds below).
            _wait("kwok-controller to hold the node leases",
                  lambda: _kwok_owns_nodes(name, started), timeout)
        _profile_file(name).write_text(profile + "\n")
        register_nodes(name)
        _wait(f"{_node_count(name)} GPU nodes Ready ({profile})", lambda: _nodes_ready(name), timeout)
        _wait("default service account", lambda: _default_sa_exists(name), timeout)
        start_lws(name)
        log(f"cluster {name} up in {time.monotonic() - t0:.1f}s")
    return kubeconfig_path(name)


def _wait_exited(name: str, procs: dict[str, int], timeout: float = 30) -> None:
    """Wait for the component processes seen before a stop to be gone. The pid
    files are no proof: kwokctl removes them while the processes still shut down
    (seen: kube-apiserver alive after `down` returned). Nor is the command line:
    a process tearing down reads an empty /proc/<pid>/cmdline before it is gone
    (seen: kube-apiserver alive after `down` returned, under load), so a pid
    checked ours before the stop counts until it is gone or a zombie."""
    _wait("components to exit",
          lambda: not running_components(name) and not [p for p in procs.values() if _alive(p)],
          timeout)
# --- LeaderWorkerSet controller ------------------------------------------------
#
# The real LWS controller (sigs.k8s.io/lws, built by build.sh) runs as one more
# local process next to the control plane, supervised here (kwokctl knows only
# its own components): pid file and log under clusters/<name>/lws/. Its
# webhooks are required, not optional: the pod webhook is what labels each pod
# with its worker index and writes LWS_LEADER_ADDRESS / LWS_WORKER_INDEX into
# its env (pkg/webhooks/pod_webhook.go), and the LWS webhook defaults the spec.
# The API server reaches them on loopback through `clientConfig.url`
# https://127.0.0.1:LWS_WEBHOOK_PORT/<path> (no Service: the cluster has no
# endpoints, see above). LWS's own certificate rotation writes certs for the
# Service's DNS name only, so it is switched off (internalCertManagement) and
# the controller serves a certificate for IP 127.0.0.1 made here with openssl,
# whose CA is the caBundle of the webhook configurations.

LWS_WEBHOOK_PORT = 32790
LWS_HEALTH_PORT = 32791


def _lws_dir(name: str) -> Path:
    return workdir(name) / "lws"


def _lws_pid(name: str) -> int | None:
    pidfile = _lws_dir(name) / "lws-controller.pid"
    with contextlib.suppress(ValueError, OSError):
        pid = int(pidfile.read_text().strip())
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
        if _alive(pid) and argv0 == str(binary("lws-controller")):
            return pid
    return None


def _lws_certs(d: Path) -> bytes:
    """CA and a serving certificate for IP 127.0.0.1 (kept across warm starts); returns the CA PEM."""
    certs = d / "certs"
    if not (certs / "tls.crt").is_file():
        certs.mkdir(parents=True, exist_ok=True)
        run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=pd-e2e-lws-ca",
            "-keyout", str(certs / "ca.key"), "-out", str(certs / "ca.crt"))
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", str(certs / "tls.key"), "-out", str(certs / "tls.csr"))
        ext = certs / "san.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
        run("x509", "-req", "-in", str(certs / "tls.csr"), "-CA", str(certs / "ca.crt"), "-CAkey", str(certs / "ca.key"),
            "-CAcreateserial", "-days", "3650", "-extfile", str(ext), "-out", str(certs / "tls.crt"))
    return (certs / "ca.crt").read_bytes()


def lws_webhook_configurations(ca_pem: bytes, port: int = LWS_WEBHOOK_PORT) -> list[dict]:
    """LWS's webhook configurations (config/webhook of the built module), with
    the kustomize patches it ships applied (each replaces a whole webhook
    entry: the pod webhooks restricted to pods carrying the LWS name label), and
    each Service reference replaced by a loopback URL."""
    import base64

    import yaml

    src = binary("lws-controller").parent / "webhook"
    docs = [d for d in yaml.safe_load_all((src / "manifests.yaml").read_text()) if d]
    patches = {"MutatingWebhookConfiguration": src / "mutating-patch.yaml",
               "ValidatingWebhookConfiguration": src / "validating-patch.yaml"}
    ca = base64.b64encode(ca_pem).decode()
    for doc in docs:
        for op in yaml.safe_load(patches[doc["kind"]].read_text()) or []:
            assert op["op"] == "replace" and op["path"].startswith("/webhooks/"), op
            doc["webhooks"][int(op["path"].rsplit("/", 1)[1])] = op["value"]
        doc["metadata"]["name"] = "pd-e2e-lws-" + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
    return docs


def start_lws(name: str = DEFAULT_NAME, timeout: float = 60.0) -> None:
    """Install LWS's CRD and webhooks and start its controller (idempotent)."""
    import json

    d = _lws_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    crd = binary("lws-controller").parent / "crds"  # every CRD the controller watches
    def must(*args: str, input: str | None = None) -> str:
        r = kubectl(*args, name=name, check=False, input=input)
        if r.returncode:
            raise RuntimeError(f"kubectl {' '.join(args[:3])} failed: {r.stderr.strip()}")
        return r.stdout

    must("apply", "--server-side", "--force-conflicts", "-f", str(crd))  # the directory

    def established() -> bool:
        r = kubectl("get", "crd", "leaderworkersets.leaderworkerset.x-k8s.io", "-o",
                    "jsonpath={.status.conditions[?(@.type=='Established')].status}", name=name, check=False)
        return r.returncode == 0 and r.stdout.strip() == "True"

    _wait("LeaderWorkerSet CRD established", established, timeout)
    ca = _lws_certs(d)
    must("apply", "--server-side", "--force-conflicts", "-f", "-",
         input="\n---\n".join(json.dumps(doc) for doc in lws_webhook_configurations(ca)))
    if _lws_pid(name):
        log("lws-controller already running")
        return
    cfg = d / "config.yaml"
    cfg.write_text("\n".join([
        "apiVersion: config.lws.x-k8s.io/v1alpha1",
        "kind: Configuration",
        "leaderElection:",
        "  leaderElect: false",          # one instance, supervised here
        "internalCertManagement:",
        "  enable: false",               # certificate for 127.0.0.1 from _lws_certs
        "webhook:",
        "  host: 127.0.0.1",
        f"  port: {LWS_WEBHOOK_PORT}",
        f"  certDir: {d / 'certs'}",
        "metrics:",
        "  bindAddress: '0'",            # off: nothing scrapes it here
        "health:",
        f"  healthProbeBindAddress: 127.0.0.1:{LWS_HEALTH_PORT}",
        "",
    ]))
    t0 = time.monotonic()
    with open(d / "lws-controller.log", "ab") as logf:
        proc = subprocess.Popen(
            [str(binary("lws-controller")), "--config", str(cfg), "--kubeconfig", str(kubeconfig_path(name)), "--zap-log-level=info"],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (d / "lws-controller.pid").write_text(f"{proc.pid}\n")

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"lws-controller exited ({proc.returncode}); see {d / 'lws-controller.log'}")
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{LWS_HEALTH_PORT}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    _wait("lws-controller ready", ready, timeout)
    log(f"lws-controller {versions()['LWS_VERSION']} up in {time.monotonic() - t0:.1f}s (pid {proc.pid})")


def stop_lws(name: str = DEFAULT_NAME) -> None:
    pid = _lws_pid(name)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    _wait("lws-controller to exit", lambda: not _alive(pid), 30)
    (_lws_dir(name) / "lws-controller.pid").unlink(missing_ok=True)


def down(name: str = DEFAULT_NAME) -> None:
    """Stop every component; state (etcd data, certs) is kept for a warm start."""
    if not created(name) or not binary("kwokctl").is_file():
        log(f"cluster {name} does not exist")
        return
    with _lock(name):
        _clear_stale_pid_files(name)
        procs = running_components(name)
        stop_lws(name)
        _kwokctl("stop", "cluster", "--name", name, check=False)
        _wait_exited(name, procs)
        log(f"cluster {name} stopped")


def _delete_locked(name: str) -> None:
    _clear_stale_pid_files(name)
    procs = running_components(name)
    stop_lws(name)
    # --kubeconfig: kwokctl would otherwise edit ~/.kube/config.
    _kwokctl("delete", "cluster", "--name", name,
             "--kubeconfig", str(kubeconfig_path(name)), check=False)
    _wait_exited(name, procs)
    if workdir(name).exists():
        shutil.rmtree(workdir(name))
    (_run_dir() / f"{name}.kwokctl.yaml").unlink(missing_ok=True)
    _profile_file(name).unlink(missing_ok=True)
    log(f"cluster {name} deleted")


def delete(name: str = DEFAULT_NAME) -> None:
    if not binary("kwokctl").is_file():
        return
    with _lock(name):
        _delete_locked(name)


def status(name: str = DEFAULT_NAME) -> int:
    print(f"name:       {name}")
    print(f"kubeconfig: {kubeconfig_path(name)}")
    print(f"created:    {created(name)}")
    print(f"profile:    {profile_of(name) or '-'}")
    comps = running_components(name)
    print("processes:  " + (", ".join(f"{c}={p}" for c, p in sorted(comps.items())) or "none"))
    up_ = is_running(name)
    print(f"apiserver:  {'ready' if up_ else 'not running'}")
    if up_:
        print(kubectl("get", "nodes", "-o", "wide", name=name).stdout, end="")
    return 0 if up_ else 1


def main(argv: list[str]) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="e2e/cluster.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default=DEFAULT_NAME)
    ap.add_argument("--profile", default=None, help="node profile for up (e2e/nodeprofiles.py --list)")
    ap.add_argument("command", choices=["up", "down", "delete", "status", "kubeconfig", "kubectl", "build"])
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.command == "up":
        print(up(a.name, profile=a.profile))
    elif a.command == "down":
        down(a.name)
    elif a.command == "delete":
        delete(a.name)
    elif a.command == "status":
        return status(a.name)
    elif a.command == "kubeconfig":
        print(kubeconfig_path(a.name))
    elif a.command == "build":
        ensure_built()
    elif a.command == "kubectl":
        return kubectl(*a.args, name=a.name, check=False, capture=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
