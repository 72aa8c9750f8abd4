"""The PD router: one adapter per router, and its Deployment, Service and RBAC.

Both pinned routers (vllm-router 0.1.17, sglang-router 0.3.2; flag sets in
engines/flagsets/) discover workers through the Kubernetes API by label
selector (``--service-discovery --prefill-selector ... --decode-selector``),
so scaling a pool needs no router restart. They read a prefill pod's
bootstrap port from a pod annotation (``vllm.ai/bootstrap-port`` /
``sglang.ai/bootstrap-port``). Their ``--api-key`` is the key the router
presents to the workers: it is the engine key, from the same Secret, so the
two auth layers cannot disagree; it reaches the router through its
environment and the launcher of render/launch.py, never its command line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..api.constants import ROUTER_VERSIONS
from ..api.models import PDInferenceService
from .pools import serving_selector
from .common import ROUTER_DISCOVERY_PORT, child_name, metadata, secret_env, selector_labels
from .engines import EngineAdapter
from .launch import with_secret_flag

ROUTER_PORT = 8000
ROUTER_METRICS_PORT = 29000
WORKER_KEY_ENV = "ROUTER_WORKER_API_KEY"
# Without --service-discovery-namespace both routers watch all namespaces, which
# the namespaced Role forbids. A service rendered with no namespace (pdctl render
# without -n) gets the pod's own, from the downward API, expanded by the kubelet
# in the command (not a secret: visible in argv is fine).
NAMESPACE_ENV = "POD_NAMESPACE"


class RouterAdapter(ABC):
    kind: str
    module: str
    bootstrap_annotation: str
    flagset_component: str

    def __init__(self, svc: PDInferenceService, engine: EngineAdapter):
        self.svc = svc
        self.spec = svc.spec
        self.engine = engine
        self.version = ROUTER_VERSIONS[self.kind]

    def selector_args(self, role: str) -> list[str]:
        # only the pods that serve HTTP: the leaders of a pool whose replicas span nodes
        return [f"{k}={v}" for k, v in serving_selector(self.svc, role).items()]

    @abstractmethod
    def pd_args(self) -> list[str]:
        """Flags that switch the router into PD mode for this engine/backend."""

    def extra_pd_args(self) -> list[str]:
        return []

    def args(self) -> list[str]:
        """Router flags (without the interpreter and module)."""
        spec = self.spec
        argv = ["--host", "0.0.0.0", "--port", str(ROUTER_PORT)]
        argv += self.pd_args()
        argv += self.discovery_args()
        argv += ["--prefill-policy", spec.router.prefill_policy, "--decode-policy", spec.router.decode_policy]
        argv += ["--prometheus-host", "0.0.0.0", "--prometheus-port", str(ROUTER_METRICS_PORT)]
        argv += self.extra_pd_args()
        argv += list(spec.router.extra_args)
        return argv

    def discovery_args(self) -> list[str]:
        """How the router finds its workers: pods by label selector."""
        argv = ["--service-discovery", "--service-discovery-namespace", self.svc.metadata.namespace or f"$({NAMESPACE_ENV})"]
        argv += ["--service-discovery-port", str(self.engine.http_port)]
        argv += ["--prefill-selector", *self.selector_args("prefill")]
        argv += ["--decode-selector", *self.selector_args("decode")]
        return argv

    def registration_port(self) -> int | None:
        """The port workers register on (ZMQ), when they register themselves."""
        return None

    def readiness_path(self) -> str:
        """The router's readiness endpoint: 503 until it holds a healthy prefill and decode worker."""
        return "/readiness"

    def command(self) -> list[str]:
        if self.spec.engine.api_key_secret_ref:
            # --api-key reads no environment variable: the launcher appends it
            # inside the process (render/launch.py), never in argv
            return with_secret_flag(self.module, self.args(), "--api-key", WORKER_KEY_ENV)
        return ["python3", "-m", self.module] + self.args()

    def key_env_names(self) -> list[str]:
        """Env vars that carry the engine key into the router."""
        return [WORKER_KEY_ENV]

    def prefill_annotations(self) -> dict[str, str]:
        """Annotations the router reads from prefill pods (the bootstrap port)."""
        if self.uses_bootstrap():
            return {self.bootstrap_annotation: str(self.spec.kv_transfer.bootstrap_port)}
        return {}

    @abstractmethod
    def uses_bootstrap(self) -> bool:
        """Whether prefill pods publish a bootstrap port to the router."""

    managed_flags = frozenset(
        {
            "--host", "--port", "--pd-disaggregation", "--vllm-pd-disaggregation", "--kv-connector",
            "--service-discovery", "--service-discovery-namespace", "--service-discovery-port",
            "--prefill-selector", "--decode-selector", "--selector", "--prefill", "--decode",
            "--worker-urls", "--prefill-policy", "--decode-policy", "--policy",
            "--prometheus-host", "--prometheus-port", "--api-key", "--vllm-discovery-address",
        }
    )

    def check_extra_args(self) -> None:
        from .args import check_user_args

        check_user_args(
            self.flagset_component,
            self.version,
            self.managed_flags,
            [("spec.router.extraArgs", self.spec.router.extra_args)],
            ["python3", "-m", self.module],
            self.svc.metadata.name,
        )


class VLLMRouter(RouterAdapter):
    kind = "vllm-router"
    module = "vllm_router.launch_router"
    bootstrap_annotation = "vllm.ai/bootstrap-port"
    flagset_component = "vllm-router"

    def kv_connector(self) -> str:
        # vllm-router knows nixl, mooncake and moriio (mooncake is refused with
        # vllm: a rule in api/models.py, FACTS.md "vllm-router and Mooncake"); the lmcache backend
        # hands KV from prefill to decode over NIXL (LMCache is the cache tier).
        backend = self.spec.backend()
        return "nixl" if backend == "lmcache" else backend

    def pd_args(self) -> list[str]:
        return ["--vllm-pd-disaggregation", "--kv-connector", self.kv_connector()]

    def registration_port(self) -> int | None:
        # In moriio mode vllm-router dispatches a request only once an engine has
        # registered its transfer mode (READ/WRITE) over ZMQ; with pod discovery
        # alone every request fails with "No MoRI-IO instances have registered a
        # transfer mode" (tests/contract/FACTS.md, "MoRIIO and vllm-router discovery").
        return ROUTER_DISCOVERY_PORT if self.kv_connector() == "moriio" else None

    def discovery_args(self) -> list[str]:
        port = self.registration_port()
        if port is None:
            return super().discovery_args()
        # With --vllm-discovery-address the router is built in discovery mode and
        # takes its workers from the registrations only: pod discovery is left off.
        return ["--vllm-discovery-address", f"0.0.0.0:{port}"]

    def readiness_path(self) -> str:
        # In discovery mode /readiness counts the static worker registry, which
        # stays empty: 503 forever. /health counts the registered workers
        # (tests/contract/FACTS.md, "MoRIIO and vllm-router discovery").
        return "/readiness" if self.registration_port() is None else "/health"

    def key_env_names(self) -> list[str]:
        # vllm-router 0.1.17 sends --api-key only on its /render calls; the PD
        # prefill/decode requests carry "Authorization: Bearer $OPENAI_API_KEY"
        # (seen on the wire by the e2e harness): give it the engine key too.
        return [WORKER_KEY_ENV, "OPENAI_API_KEY"]

    def uses_bootstrap(self) -> bool:
        return self.spec.backend() == "mooncake"


class SGLangRouter(RouterAdapter):
    kind = "sglang-router"
    module = "sglang_router.launch_router"
    bootstrap_annotation = "sglang.ai/bootstrap-port"
    flagset_component = "sglang-router"

    def pd_args(self) -> list[str]:
        return ["--pd-disaggregation"]

    def extra_pd_args(self) -> list[str]:
        # Let in-flight requests finish when the router pod is stopped: as long
        # as the engines may take (its default, 180 s, cut longer streams).
        return (["--shutdown-grace-period-secs", str(router_grace_seconds(self.svc) - ROUTER_PRESTOP_S - ROUTER_EXIT_MARGIN_S)]
                + self.health_check_args())

    def health_check_args(self) -> list[str]:
        # sglang-router ignores a pod that turns NotReady (it only adds Ready
        # pods): its own health checks of the workers' /health take a failing
        # engine out, every 60 s and after 3 failures by default. Check as the
        # kubelet's readiness probes do (the strictest pool; flags are global),
        # on the readiness probe's path (SGLang /ready: /health stays 200 on an
        # engine a failed warmup left unhealthy).
        probes = [self.spec.pool(role).probes.readiness for role in ("prefill", "decode")]
        return [
            "--health-check-endpoint", self.engine.ready_path(),
            "--health-check-interval-secs", str(min(p.period_seconds for p in probes)),
            "--health-failure-threshold", str(min(p.failure_threshold for p in probes)),
            "--health-check-timeout-secs", str(max(p.timeout_seconds for p in probes)),
        ]

    def uses_bootstrap(self) -> bool:
        return True  # every SGLang PD backend bootstraps through the prefill server


ROUTER_PRESTOP_S = 5       # the router pod's preStop sleep: the Service drops it before SIGTERM
ROUTER_EXIT_MARGIN_S = 10  # of the grace period, kept for sglang-router's exit after its own deadline


def router_grace_seconds(svc: PDInferenceService) -> int:
    """The router pod's terminationGracePeriodSeconds: its preStop sleep plus the
    longest grace period of the pools, so a request the router is streaming when
    it is stopped may run as long as a stopping engine may (sglang-router waits
    --shutdown-grace-period-secs, vllm-router 0.1.17 waits with no deadline of its
    own: tests/contract/FACTS.md, "SIGTERM")."""
    spec = svc.spec
    return ROUTER_PRESTOP_S + max(spec.prefill.termination_grace_period_seconds,
                                  spec.decode.termination_grace_period_seconds)


ROUTERS: dict[str, type[RouterAdapter]] = {"vllm-router": VLLMRouter, "sglang-router": SGLangRouter}


def router_for(svc: PDInferenceService, engine: EngineAdapter) -> RouterAdapter:
    return ROUTERS[svc.spec.router_kind()](svc, engine)


# --------------------------------------------------------------------------
# Objects
# --------------------------------------------------------------------------


def rbac(svc: PDInferenceService) -> list[dict]:
    """The router watches the pool pods in its namespace, nothing else."""
    name = child_name(svc, "router")
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(svc, name, "router")}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(svc, name, "router"),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(svc, name, "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, **({"namespace": svc.metadata.namespace} if svc.metadata.namespace else {})}],
    }
    return [sa, role, binding]


def deployment(svc: PDInferenceService, router: RouterAdapter) -> dict:
    spec = svc.spec
    name = child_name(svc, "router")
    env = []
    if f"$({NAMESPACE_ENV})" in router.args():
        env.append({"name": NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    if spec.engine.api_key_secret_ref:
        env += [secret_env(n, spec.engine.api_key_secret_ref) for n in router.key_env_names()]
    container = {
        "name": "router",
        "image": spec.router.effective_image(spec.engine.kind),
        "imagePullPolicy": spec.router.image_pull_policy,
        "command": router.command(),
        "ports": [
            {"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
        ] + ([{"name": "discovery", "containerPort": router.registration_port(), "protocol": "TCP"}]
             if router.registration_port() else []),
        "readinessProbe": {"httpGet": {"path": router.readiness_path(), "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_PRESTOP_S}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if env:
        container["env"] = env
    resources = {k: v for k, v in spec.router.resources.dump().items() if v}
    container["resources"] = resources or {"requests": {"cpu": "1", "memory": "1Gi"}}
    pod_spec = {
        "serviceAccountName": name,
        "containers": [container],
        "terminationGracePeriodSeconds": router_grace_seconds(svc),
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if spec.router.replicas > 1:
        # one node's loss or drain takes one router, not all: the scheduler's default spread
        # (maxSkew 3 per node: pkg/scheduler/framework/plugins/podtopologyspread/plugin.go
        # systemDefaultConstraints) lets three share a node. Soft, so a one-node cluster still
        # runs them; the ReplicaSet's own hash label keeps a rollout's old pods out of the count.
        pod_spec["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector_labels(svc, "router")}, "matchLabelKeys": ["pod-template-hash"],
        }]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(svc, name, "router"),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": selector_labels(svc, "router")},
            "strategy": _strategy(router),
            "template": {
                "metadata": {
                    "labels": metadata(svc, name, "router")["labels"],
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(ROUTER_METRICS_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def _strategy(router: RouterAdapter) -> dict:
    if router.registration_port() is not None:
        # Workers register over one long-lived connection each, through the
        # discovery Service: a surge pod would get none of them while the old
        # pod lives, so it would never be Ready and the rollout would stall.
        return {"type": "Recreate"}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def service(svc: PDInferenceService) -> dict:
    """The one endpoint clients call."""
    spec = svc.spec.router.service
    meta = metadata(svc, child_name(svc, "router"), "router")
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": spec.type,
            "selector": selector_labels(svc, "router"),
            "ports": [{"name": "http", "port": spec.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def discovery_service(svc: PDInferenceService, router: RouterAdapter) -> list[dict]:
    """A ClusterIP Service in front of the router's registration port, apart
    from the client Service (which may be a LoadBalancer): the engines send
    their heartbeats to it."""
    port = router.registration_port()
    if port is None:
        return []
    return [{
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(svc, child_name(svc, "router-discovery"), "router"),
        "spec": {
            "type": "ClusterIP",
            # the router is Ready only once workers have registered: the
            # registrations must reach it before then
            "publishNotReadyAddresses": True,
            "selector": selector_labels(svc, "router"),
            "ports": [{"name": "discovery", "port": port, "targetPort": "discovery", "protocol": "TCP"}],
        },
    }]


def endpoint(svc: PDInferenceService) -> str:
    ns = svc.metadata.namespace or "default"
    return f"http://{child_name(svc, 'router')}.{ns}.svc:{svc.spec.router.service.port}/v1"
