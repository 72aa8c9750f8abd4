"""What every engine adapter knows, and the parts both engines share."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod

from ...api.models import PDInferenceService
from ..common import secret_env

MODELS_DIR = "/models"
HF_HOME = "/cache/huggingface"

# UCX transports for NIXL/UCX KV transfer: RDMA (rc_x, rc) plus the GPU-memory
# transports of the accelerator. UCX names them cuda_copy/cuda_ipc (src/uct/cuda/)
# and rocm_copy/rocm_ipc (src/uct/rocm/copy, src/uct/rocm/ipc); a CUDA name on
# a ROCm build matches no transport (tests/contract/FACTS.md, "AMD accelerators").
UCX_TLS: dict[str, str] = {
    "nvidia": "rc_x,rc,cuda_copy,cuda_ipc",
    "amd": "rc_x,rc,rocm_copy,rocm_ipc",
}


class EngineAdapter(ABC):
    """One inference engine at one pinned version: flags, env, ports, probes."""

    kind: str
    http_port: int
    # Flags the operator renders itself; extraArgs may not set them.
    managed_flags: frozenset[str] = frozenset()
    # flags the operator does not set but cannot work with: flag -> why (the refusal's message)
    refused_flags: dict[str, str] = {}

    # The engine's flags for settings both engines have (field -> flag).
    model_len_flag: str
    memory_fraction_flag: str
    max_seqs_flag: str
    step_tokens_flag: str

    def __init__(self, svc: PDInferenceService):
        self.svc = svc
        self.spec = svc.spec
        self.version = svc.spec.engine.effective_version()

    # -- the container -------------------------------------------------------
    def prefix_caching_args(self, enabled: bool | None) -> list[str]:
        """Flags for ``enablePrefixCaching`` (None: the engine's default)."""
        return []

    def model_and_pool_args(self, pool) -> list[str]:
        """Flags for the model and pool settings both engines have, in each one's spelling."""
        spec = self.spec
        argv: list[str] = []
        if spec.model.max_model_len:
            argv += [self.model_len_flag, str(spec.model.max_model_len)]
        if spec.model.downloads() and spec.model.source.revision:
            argv += ["--revision", spec.model.source.revision]
        if spec.model.trust_remote_code:
            argv.append("--trust-remote-code")
        if pool.gpu_memory_utilization is not None:
            argv += [self.memory_fraction_flag, f"{pool.gpu_memory_utilization:g}"]
        if pool.max_running_requests is not None:
            argv += [self.max_seqs_flag, str(pool.max_running_requests)]
        if pool.max_batched_tokens is not None:
            argv += [self.step_tokens_flag, str(pool.max_batched_tokens)]
        return argv + self.prefix_caching_args(pool.enable_prefix_caching)

    @abstractmethod
    def command(self, role: str) -> list[str]:
        """The full command line of the engine container for a role."""

    def group_command(self, role: str, leader: bool) -> list[str]:
        """The command of a leader or worker pod of a replica that spans nodes."""
        raise NotImplementedError(f"{self.kind}: replicas over several nodes")

    def group_ports(self, role: str) -> list[dict]:
        """Extra container ports of a group's leader (the engine's multi-node rendezvous)."""
        return []

    # Names of ports (of ``ports``) that only a group's leader listens on: a worker
    # pod of a replica over several nodes does not declare them. A worker that keeps
    # ``http`` serves /metrics there (its own ranks' series) and is scraped.
    leader_only_ports: frozenset[str] = frozenset({"http"})

    @abstractmethod
    def engine_env(self, role: str) -> list[dict]:
        """Engine-specific environment of a role (KV transfer, auth)."""

    def ports(self, role: str) -> list[dict]:
        """Container ports; ``http`` serves the API, /health and /metrics."""
        return [{"name": "http", "containerPort": self.http_port, "protocol": "TCP"}]

    def listen_ports(self, role: str) -> list[tuple[int, str, str]]:
        """Every port the engine listens on in a pod of a role:
        (port, spec field that sets it, what it is). The API port is fixed."""
        return [(self.http_port, "", f"the {self.kind} API port")]

    def check_ports(self) -> None:
        """Refuse a spec whose pods would listen twice on one port (the second bind fails at start)."""
        from ...api.errors import SpecError

        problems: dict[str, str] = {}
        for role in ("prefill", "decode"):
            seen: dict[int, tuple[str, str]] = {}
            for port, field, what in self.listen_ports(role):
                if port in seen:
                    other_field, other = seen[port]
                    blame = field or other_field
                    problems.setdefault(
                        f"spec.{blame}",
                        f"port {port} is used twice on a {role} pod: {what} and {other}; choose another {blame.rsplit('.', 1)[-1]}",
                    )
                else:
                    seen[port] = (field, what)
        if problems:
            raise SpecError(list(problems.items()), self.svc.metadata.name)

    def metrics_path(self) -> str:
        return "/metrics"

    def ready_path(self) -> str:
        """Path of the startup and readiness probes: 200 once the engine serves
        requests and while it does (the liveness probe stays on /health)."""
        return "/health"

    def config_files(self) -> dict[str, str]:
        """Files both pools read (file name -> text), shipped in one ConfigMap."""
        return {}

    # -- shared helpers ----------------------------------------------------------
    def model_arg(self) -> str:
        """What the engine loads: the hub id, or the weights' path on the PVC."""
        model = self.spec.model
        src = model.source
        if src.type == "pvc":
            return f"{MODELS_DIR}/{src.path}".rstrip("/") if src.path else MODELS_DIR
        cache = model.effective_cache()
        if cache.kind == "image":
            # A local directory: both engines load it without the hub (vLLM
            # default_loader.py, SGLang weight_utils: os.path.isdir).
            return f"{MODELS_DIR}/{cache.path}".rstrip("/") if cache.path else MODELS_DIR
        return model.name

    def pool(self, role: str):
        return self.spec.pool(role)

    def gpu_product(self, role: str) -> str | None:
        """The GPU product the pool's pods land on, when the spec names it (gpuProduct, or the
        product label in nodeSelector)."""
        pool = self.spec.pool(role)
        return pool.gpu_product or pool.node_selector.get(self.spec.gpu_product_label())

    def env(self, role: str) -> list[dict]:
        """The container's whole environment, in a stable order; user env last."""
        spec = self.spec
        env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        if spec.model.downloads():
            env.append({"name": "HF_HOME", "value": HF_HOME})
            if spec.model.source.token_secret_ref:
                env.append(secret_env("HF_TOKEN", spec.model.source.token_secret_ref))
        env += self.ucx_env()
        env += self.fabric_env(role)
        env += self.engine_env(role)
        # One entry per name (the API server refuses a container with two):
        # engine.env replaces what the operator set, the pool's env replaces
        # both; a replaced entry keeps its place, so $(VAR) references that
        # follow it still see it defined first.
        return merge_env(env, [e.dump() for e in spec.engine.env], [e.dump() for e in self.pool(role).env])

    def rdma_enabled(self) -> bool:
        return self.spec.rdma_configured()

    def fabric_env(self, role: str) -> list[dict]:
        """The collective libraries' NIC settings, for a pool whose traffic
        crosses nodes (a replica over several nodes, or DeepEP's all-to-all):
        NCCL (NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_IB_TC: NCCL's environment
        variables) and NVSHMEM, which DeepEP's internode kernels use
        (NVSHMEM_HCA_LIST with NVSHMEM_ENABLE_NIC_PE_MAPPING=1,
        NVSHMEM_IB_GID_INDEX, NVSHMEM_IB_TRAFFIC_CLASS: NVSHMEM's env_defs.h).
        tests/contract/FACTS.md, "Replicas that span nodes"."""
        pool = self.pool(role)
        if pool.nodes(self.spec.topology.gpus_per_node) == 1 and not pool.deepep_mode:
            return []
        rdma = self.spec.kv_transfer.rdma
        env: list[dict] = []
        if rdma.ib_devices:
            env.append({"name": "NCCL_IB_HCA", "value": ",".join(d.split(":")[0] for d in rdma.ib_devices)})
            env.append({"name": "NVSHMEM_ENABLE_NIC_PE_MAPPING", "value": "1"})
            env.append({"name": "NVSHMEM_HCA_LIST", "value": ",".join(d if ":" in d else f"{d}:1" for d in rdma.ib_devices)})
        if rdma.gid_index is not None:
            env += [{"name": "NCCL_IB_GID_INDEX", "value": str(rdma.gid_index)},
                    {"name": "NVSHMEM_IB_GID_INDEX", "value": str(rdma.gid_index)}]
        if rdma.traffic_class is not None:
            env += [{"name": "NCCL_IB_TC", "value": str(rdma.traffic_class)},
                    {"name": "NVSHMEM_IB_TRAFFIC_CLASS", "value": str(rdma.traffic_class)}]
        return env

    def ucx_env(self) -> list[dict]:
        """UCX settings for NIXL/UCX over InfiniBand or RoCE (only with RDMA configured)."""
        spec = self.spec
        if self.spec.backend() not in ("nixl", "lmcache") or "UCX" not in spec.kv_transfer.nixl.backends or not self.rdma_enabled():
            return []
        rdma = spec.kv_transfer.rdma
        env = [{"name": "UCX_TLS", "value": UCX_TLS[spec.engine.accelerator]}]
        if rdma.ib_devices:
            devices = ",".join(d if ":" in d else f"{d}:1" for d in rdma.ib_devices)
            env.append({"name": "UCX_NET_DEVICES", "value": devices})
        if rdma.roce:
            env.append({"name": "UCX_IB_ADDR_TYPE", "value": "eth"})
        return env

    # -- user flags --------------------------------------------------------------
    flagset_component: str

    def flagset_argv(self) -> list[str]:
        """The smallest valid command line (without the executable) that user
        flags are appended to for the flag-set check."""
        return []

    def check_extra_args(self) -> None:
        """Refuse extraArgs that set a managed flag or that the pinned engine lacks."""
        from ..args import check_user_args

        check_user_args(
            self.flagset_component,
            self.version,
            self.managed_flags,
            [
                ("spec.engine.extraArgs", self.spec.engine.extra_args),
                ("spec.prefill.extraArgs", self.spec.prefill.extra_args),
                ("spec.decode.extraArgs", self.spec.decode.extra_args),
            ],
            self.flagset_argv(),
            self.svc.metadata.name,
            self.refused_flags,
        )


def merge_env(*layers: list[dict]) -> list[dict]:
    """Env lists merged by name, later layers winning, in first-seen order."""
    merged: dict[str, dict] = {}
    for layer in layers:
        for entry in layer:
            merged[entry["name"]] = entry
    return list(merged.values())


def compact_json(value) -> str:
    """JSON for a flag value: compact and with a stable key order."""
    return json.dumps(value, separators=(",", ":"), sort_keys=False)
