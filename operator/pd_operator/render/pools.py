"""The prefill and decode pools: StatefulSet, headless Service, PDB."""

from __future__ import annotations

import hashlib
import json
import math

from ..api.models import PDInferenceService
from .common import child_name, labels, metadata, selector_labels
from .engines import EngineAdapter
from .engines.base import HF_HOME, MODELS_DIR
from .engines.vllm import LMCACHE_CONFIG_DIR
from .overlay import apply_overlay

# Model load (download + weights to GPU + CUDA graphs) can take many minutes
# for large models: the startup probe allows spec.model.startupSeconds (30
# minutes by default) before liveness starts.
STARTUP_PERIOD_S = 10


def startup_failures(svc: PDInferenceService) -> int:
    """Startup probe failureThreshold: the budget in probe periods."""
    return math.ceil(svc.spec.model.startup_seconds / STARTUP_PERIOD_S)
SHM_SIZE = "16Gi"
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
CONFIG_HASH_ANNOTATION = "pdserving.io/config-hash"


# LeaderWorkerSet (sigs.k8s.io/lws v0.9.0, api/leaderworkerset/v1/leaderworkerset_types.go).
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"


def gpu_count(svc: PDInferenceService, role: str) -> int:
    """GPUs of one engine pod: a replica's GPUs, split over its nodes when it spans several."""
    return svc.spec.pool(role).gpus_per_pod(svc.spec.topology.gpus_per_node)


def nodes_per_replica(svc: PDInferenceService, role: str) -> int:
    return svc.spec.pool(role).nodes(svc.spec.topology.gpus_per_node)


def spans_nodes(svc: PDInferenceService, role: str) -> bool:
    """A replica of this pool is a group of pods on several nodes (a LeaderWorkerSet)."""
    return nodes_per_replica(svc, role) > 1


def pool_kind(svc: PDInferenceService, role: str) -> str:
    """The kind of the object that runs a pool."""
    return "LeaderWorkerSet" if spans_nodes(svc, role) else "StatefulSet"


def serving_selector(svc: PDInferenceService, role: str) -> dict[str, str]:
    """Labels of the pods that serve a pool's HTTP API: every pod of a one-node
    pool; only the leader (LWS worker index 0) of each group of a pool whose
    replicas span nodes (the other nodes serve no HTTP)."""
    sel = dict(selector_labels(svc, role))
    if spans_nodes(svc, role):
        sel[LWS_WORKER_INDEX_LABEL] = "0"
    return sel


# Default requests of an engine container, per GPU it gets (overridable key by
# key through pool.resources). Without them the pod is BestEffort: the kubelet
# evicts it first under node memory pressure, with a memory-backed /dev/shm and
# LMCache's CPU tier resident. Sized for HGX nodes (8 GPUs, >= 200 CPUs and
# >= 1.5 TiB): 8 x (4 CPU, 32Gi) leaves most of the node to others; a GB200
# compute tray (4 GPUs) takes 16 CPU and 128Gi + shm.
CPU_PER_GPU = 4
MEMORY_PER_GPU_GI = 32
EPHEMERAL_STORAGE = "20Gi"
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 10**-3}


def quantity_bytes(q) -> float:
    """Bytes in a Kubernetes quantity (16Gi, 64G, 1e9, 1024)."""
    text = str(q)
    for suffix, factor in (*_BINARY.items(), *_DECIMAL.items()):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def default_requests(svc: PDInferenceService, role: str) -> dict:
    """cpu, memory and ephemeral-storage requests a pool's engine container
    gets when the user sets neither a request nor a limit for the key."""
    spec = svc.spec
    pool = spec.pool(role)
    gpus = gpu_count(svc, role)
    memory = MEMORY_PER_GPU_GI * gpus * 2**30 + quantity_bytes(pool.shm_size)
    lm = spec.kv_transfer.lmcache
    if spec.backend() == "lmcache" and lm.local_cpu:
        # LMCache's max_local_cpu_size is in GB, for each engine worker (one per GPU).
        memory += lm.max_local_cpu_size_gb * 1e9 * gpus
    return {
        "cpu": str(CPU_PER_GPU * gpus),
        "memory": f"{math.ceil(memory / 2**30)}Gi",
        "ephemeral-storage": EPHEMERAL_STORAGE,
    }


def _resources(svc: PDInferenceService, role: str) -> dict:
    spec = svc.spec
    pool = spec.pool(role)
    requests = {k: v for k, v in pool.resources.requests.items()}
    limits = {k: v for k, v in pool.resources.limits.items()}
    for key, value in default_requests(svc, role).items():
        # A limit alone is also the request (Kubernetes defaults it): keep it.
        if key not in requests and key not in limits:
            requests[key] = value
    extended = _extended_resources(svc, role)
    # Extended resources must be equal in requests and limits.
    requests.update(extended)
    limits.update(extended)
    return {"requests": requests, "limits": limits}


def _extended_resources(svc: PDInferenceService, role: str) -> dict[str, int]:
    """The extended resources one pod of the pool requests: its GPUs and RDMA devices."""
    spec = svc.spec
    extended = {spec.gpu_resource_name(): gpu_count(svc, role)}
    rdma = spec.kv_transfer.rdma
    if rdma.resource_name:
        extended[rdma.resource_name] = rdma.count
    for rail in rdma.rail_resource_names:
        extended[rail] = extended.get(rail, 0) + 1
    return extended


def _affinity(svc: PDInferenceService, role: str) -> dict:
    spec = svc.spec
    topo = spec.topology
    pool = spec.pool(role)
    affinity: dict = {}
    if pool.gpu_product:
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": spec.gpu_product_label(), "operator": "In", "values": [pool.gpu_product]}]}
                ]
            }
        }
    if topo.colocate == "none":
        return affinity
    peer = "decode" if role == "prefill" else "prefill"
    peer_selector = {"matchLabels": selector_labels(svc, peer)}
    # Prefer the peer pool's NVLink domain only. The same host buys nothing:
    # two pods are two containers, each seeing only its own GPUs, so CUDA IPC
    # between them is not possible and KV goes through the NIC anyway, while
    # one node failure would take a replica of both pools. The domain label
    # (GFD's nvidia.com/gpu.clique) exists only on multi-node NVLink systems
    # (NVL72), so on HGX nodes this term is inert and the anti-affinity below
    # spreads the pools over hosts (tests/contract/FACTS.md, "Placement").
    preferred = [
        {"weight": 100, "podAffinityTerm": {"labelSelector": peer_selector, "topologyKey": topo.nvlink_domain_key}}
    ]
    pod_affinity: dict = {"preferredDuringSchedulingIgnoredDuringExecution": preferred}
    if topo.nvlink_domain_key != "kubernetes.io/hostname":
        affinity["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "podAffinityTerm": {"labelSelector": peer_selector, "topologyKey": "kubernetes.io/hostname"}}
        ]}
    if topo.colocate == "required" and role == "decode":
        # Only decode requires its peer: if both sides required each other the
        # first pod of either pool could never schedule. Prefill goes first
        # anywhere; decode follows it into its NVLink domain.
        pod_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = [
            {"labelSelector": peer_selector, "topologyKey": topo.nvlink_domain_key}
        ]
    affinity["podAffinity"] = pod_affinity
    return affinity


def _volumes(svc: PDInferenceService, engine: EngineAdapter, role: str) -> tuple[list[dict], list[dict]]:
    src = svc.spec.model.source
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(svc.spec.pool(role).shm_size)}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    cache = svc.spec.model.effective_cache()
    if src.type == "pvc":
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": src.claim_name, "readOnly": True}})
        mounts.append({"name": "models", "mountPath": MODELS_DIR, "readOnly": True})
    elif cache.kind == "image":
        # Kubernetes image volume (core/v1 ImageVolumeSource: reference,
        # pullPolicy): the weights' image is pulled by the kubelet and mounted
        # read-only; nothing is downloaded at start.
        image = {"reference": cache.reference}
        if cache.pull_policy:
            image["pullPolicy"] = cache.pull_policy
        volumes.append({"name": "models", "image": image})
        mounts.append({"name": "models", "mountPath": MODELS_DIR, "readOnly": True})
    else:
        source = {
            "emptyDir": {"emptyDir": {}},
            "pvc": {"persistentVolumeClaim": {"claimName": cache.claim_name}},
            "hostPath": {"hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}},
        }[cache.kind]
        volumes.append({"name": "hf-cache", **source})
        mounts.append({"name": "hf-cache", "mountPath": HF_HOME})
    if engine.config_files():
        volumes.append({"name": "engine-config", "configMap": {"name": config_map_name(svc)}})
        mounts.append({"name": "engine-config", "mountPath": LMCACHE_CONFIG_DIR, "readOnly": True})
    return volumes, mounts


def config_map_name(svc: PDInferenceService) -> str:
    return child_name(svc, "config")


def engine_security_context(rdma: bool) -> dict:
    """What the engines tolerate (tests/contract/FACTS.md, "Engine pod security"):
    no privilege escalation and no capability but IPC_LOCK, which RDMA
    memory registration needs (pinned memory beyond RLIMIT_MEMLOCK). The
    engine images run as root and write caches under the home directory, so
    neither runAsNonRoot nor a read-only root filesystem is set: Pod Security
    "baseline" without RDMA, "privileged" with it (IPC_LOCK is outside
    baseline's capability list)."""
    caps: dict = {"drop": ["ALL"]}
    if rdma:
        caps["add"] = ["IPC_LOCK"]
    return {"allowPrivilegeEscalation": False, "capabilities": caps}


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def _pod_template(svc: PDInferenceService, engine: EngineAdapter, role: str, command: list[str],
                  serves_http: bool = True, extra_ports: list[dict] | None = None,
                  scraped: bool | None = None) -> dict:
    """A pool's pod template. ``serves_http``: the pod serves the API (probes); ``scraped``
    (default: the same): it serves /metrics on ``http`` and is annotated for the scrape."""
    spec = svc.spec
    pool = spec.pool(role)
    rdma = spec.kv_transfer.rdma
    volumes, mounts = _volumes(svc, engine, role)

    annotations = {}
    if serves_http if scraped is None else scraped:
        annotations.update({
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(engine.http_port),
            "prometheus.io/path": engine.metrics_path(),
        })
    if rdma.networks:
        annotations[MULTUS_ANNOTATION] = ",".join(rdma.networks)
    files = engine.config_files()
    if files:
        digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
        annotations[CONFIG_HASH_ANNOTATION] = digest
    annotations.update(pool.annotations)

    container: dict = {
        "name": "engine",
        "image": spec.engine.effective_image(),
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": command,
        "env": engine.env(role),
        "ports": engine.ports(role) + list(extra_ports or []),
        "resources": _resources(svc, role),
        "volumeMounts": mounts,
    }
    if serves_http:
        container.update({
            "startupProbe": _probe(engine.ready_path(), STARTUP_PERIOD_S, startup_failures(svc)),
            "readinessProbe": _probe(engine.ready_path(), pool.probes.readiness.period_seconds, pool.probes.readiness.failure_threshold,
                                     pool.probes.readiness.timeout_seconds),
            "livenessProbe": _probe("/health", pool.probes.liveness.period_seconds, pool.probes.liveness.failure_threshold,
                                    pool.probes.liveness.timeout_seconds),
        })
    if pool.drain_seconds:
        # Kubelet's own sleep action: no shell needed in the image. The router
        # sees the pod terminating and stops sending it requests (sglang-router:
        # unless the pod had turned NotReady before, then only once its own
        # health checks fail, routers.py health_check_args; FACTS.md) while
        # in-flight ones finish within terminationGracePeriodSeconds.
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": pool.drain_seconds}}}
    container["securityContext"] = engine_security_context(engine.rdma_enabled())

    pod_spec: dict = {
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": pool.termination_grace_period_seconds,
        "enableServiceLinks": False,
        # the engines never call the Kubernetes API: no token in the pod
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    affinity = _affinity(svc, role)
    if affinity:
        pod_spec["affinity"] = affinity
    pod_spec["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": spec.topology.spread_key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": serving_selector(svc, role)},
        }
    ]
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    tolerations = [t.dump() for t in pool.tolerations]
    # What the ExtendedResourceToleration admission plugin adds to a pod that requests an
    # extended resource (plugin/pkg/admission/extendedresourcetoleration): nodes tainted
    # with the resource's name (GKE's GPU pools: nvidia.com/gpu=present:NoSchedule) are
    # meant for exactly these pods. Rendered, so pods land there where the plugin is off
    # too, and the free-GPU fit (autoscale/fit.py) reads the same tolerations as the pods.
    for name in _extended_resources(svc, role):
        own = {"key": name, "operator": "Exists", "effect": "NoSchedule"}
        if own not in tolerations:
            tolerations.append(own)
    pod_spec["tolerations"] = tolerations
    if pool.priority_class_name:
        pod_spec["priorityClassName"] = pool.priority_class_name
    return apply_overlay(svc, engine, role, {"metadata": {"labels": labels(svc, role), "annotations": annotations},
                                             "spec": pod_spec})


def statefulset(svc: PDInferenceService, engine: EngineAdapter, role: str, replicas: int | None = None) -> dict:
    pool = svc.spec.pool(role)
    name = child_name(svc, role)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(svc, name, role),
        "spec": {
            "serviceName": name,
            "replicas": pool.desired_replicas(replicas),
            # Replicas start and stop independently: scaling a pool must not wait
            # for the model load of each pod in turn.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "selector": {"matchLabels": selector_labels(svc, role)},
            "template": _pod_template(svc, engine, role, engine.command(role)),
        },
    }


def leaderworkerset(svc: PDInferenceService, engine: EngineAdapter, role: str, replicas: int | None = None) -> dict:
    """A pool whose replicas span nodes: one LWS group per replica, the leader
    (worker index 0, node rank 0) serving the API, the workers only computing.
    RecreateGroupOnPodRestart: a lost pod takes its whole group down and LWS
    recreates it, as the engines cannot re-admit a node into a running group."""
    spec = svc.spec
    pool = spec.pool(role)
    name = child_name(svc, role)
    ports = engine.group_ports(role)
    leader = _pod_template(svc, engine, role, engine.group_command(role, leader=True), extra_ports=ports)
    worker = _pod_template(svc, engine, role, engine.group_command(role, leader=False), serves_http=False,
                           scraped="http" not in engine.leader_only_ports)
    # Workers serve no API: without a readiness probe a worker is Ready once its
    # container runs; the leader's /health answers only once every node joined.
    # Nor do they declare the ports only the leader listens on (SGLang: bootstrap).
    # SGLang's serve their own schedulers' metrics (with attention DP, the DP groups
    # whose first rank is on that node): scraped, as the leader reports only its own.
    worker["spec"]["containers"][0]["ports"] = [p for p in worker["spec"]["containers"][0]["ports"]
                                                if p["name"] not in engine.leader_only_ports]
    for tmpl in (leader, worker):
        _prefer_group_domain(svc, role, tmpl["spec"])
    meta = metadata(svc, name, role)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": {
            "replicas": pool.desired_replicas(replicas),
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": nodes_per_replica(svc, role),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def _prefer_group_domain(svc: PDInferenceService, role: str, pod_spec: dict) -> None:
    """The pods of one group prefer the NVLink domain (rack) of each other: an
    affinity term keyed on LWS's per-group label (group-key, set by the LWS pod
    webhook on every pod of a group) through matchLabelKeys, so it only pulls
    toward the same group's pods. Preferred, not LWS's exclusive-topology
    annotation, which would also keep every other group out of the domain;
    inert where nodes lack the label (HGX nodes: no clique label)."""
    topo = svc.spec.topology
    if topo.nvlink_domain_key == "kubernetes.io/hostname":
        return
    affinity = pod_spec.setdefault("affinity", {})
    terms = affinity.setdefault("podAffinity", {}).setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    terms.insert(0, {"weight": 100, "podAffinityTerm": {
        "labelSelector": {"matchLabels": selector_labels(svc, role)},
        "matchLabelKeys": [LWS_GROUP_KEY_LABEL],
        "topologyKey": topo.nvlink_domain_key,
    }})


def pool_workload(svc: PDInferenceService, engine: EngineAdapter, role: str, replicas: int | None = None) -> dict:
    """The object that runs a pool: a StatefulSet, or a LeaderWorkerSet when a replica spans nodes."""
    if spans_nodes(svc, role):
        return leaderworkerset(svc, engine, role, replicas)
    return statefulset(svc, engine, role, replicas)


def headless_service(svc: PDInferenceService, engine: EngineAdapter, role: str) -> dict:
    """Stable DNS names for the pool's pods (NAME-prefill-0.NAME-prefill...)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(svc, child_name(svc, role), role),
        "spec": {
            "clusterIP": "None",
            # Pods are published before they are ready so peers can handshake
            # with a pod that is still warming up.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(svc, role),
            "ports": [{"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"} for p in engine.ports(role)],
        },
    }
