"""Pydantic v2 models of the PDInferenceService resource.

Every field has a description: they flow into the generated CRD and so into
``kubectl explain pdservices.spec``. Defaults here are the CRD's defaults. A few
defaults depend on other fields (the engine image follows the engine kind, the
KV backend follows the engine, the served name follows the model name); the API
server cannot express those, so they stay empty in the stored object and
accessors such as :meth:`PDInferenceServiceSpec.backend` resolve them on read
(for ``pdctl`` and the operator alike).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from .constants import (
    API_VERSION,
    DEFAULT_BACKEND,
    DEFAULT_ROUTER,
    ENGINE_BACKENDS,
    ENGINE_TEARDOWN_MARGIN_S,
    ENGINE_IMAGES,
    ENGINE_VERSIONS,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    KIND,
    ROUTER_IMAGE_RECIPE,
    ROUTER_VERSIONS,
)
from ..perfmodel.engine_defaults import VLLM_BATCHED_DP_MAX_NUM_BATCHED_TOKENS, VLLM_H200_MAX_NUM_BATCHED_TOKENS
from .podtemplate import check_pod_template
from .rules import Rule, cel_list

# --------------------------------------------------------------------------
# Scalar types
# --------------------------------------------------------------------------

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A Kubernetes label key / resource name with an optional DNS prefix.
QUALIFIED_NAME = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
DURATION = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$"

DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL, min_length=1, max_length=63)]
SecretName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)]
QualifiedName = Annotated[str, StringConstraints(pattern=QUALIFIED_NAME, min_length=1, max_length=316)]
Duration = Annotated[str, StringConstraints(pattern=DURATION, max_length=32)]
# A duration above zero (a latency target: the autoscaler divides by it)
POSITIVE_DURATION = r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)(ms|s|m|h)$"
PositiveDuration = Annotated[str, StringConstraints(pattern=POSITIVE_DURATION, max_length=32)]
Arg = Annotated[str, StringConstraints(max_length=4096)]
ShortStr = Annotated[str, StringConstraints(max_length=253)]

# A Kubernetes resource quantity ("8", "16Gi", "500m") or an integer.
Quantity = Annotated[
    int | Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$", max_length=64)],
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]

MAX_ARGS = 64
MAX_ENV = 64

# A partial PodTemplateSpec, kept whole by the API server; its shape is checked
# by check_pod_template (api/podtemplate.py), which names the field and the fix.
PodTemplateOverlay = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def duration_seconds(value: str) -> float:
    """Seconds in a duration string such as ``50ms``, ``1s``, ``2m``."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * units[unit]
    raise ValueError(f"not a duration: {value!r}")


def _schema_rules(schema: dict, cls: type) -> None:
    """Put a model's cross-field rules into its JSON schema as CEL validations."""
    rules = getattr(cls, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.to_crd() for r in rules]


# status.<pool>.lastScaleReason: the CRD's maxLength (the autoscaler cuts longer reasons)
SCALE_REASON_MAX = 1024


class Base(BaseModel):
    """camelCase on the wire, unknown fields refused, cross-field rules checked."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        json_schema_extra=_schema_rules,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self):
        failed = [r for r in type(self).rules if not r.check(self)]
        if failed:
            raise PydanticCustomError(
                "pd_rule",
                "{message}",
                {
                    "message": "; ".join(r.message for r in failed),
                    "rules": [(r.field_path, r.message) for r in failed],
                },
            )
        return self

    def dump(self) -> dict:
        """The object as the API server stores it: camelCase, no nulls."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def obj(**kw):
    """A nested-object field that defaults to its class's defaults.

    The CRD default is the whole defaulted object, not ``{}``: the API server
    checks a default against the CEL rules as written, before nested defaults.
    """
    kw.setdefault("json_schema_extra", {})["default"] = kw["default_factory"]().dump()
    return Field(**kw)


# --------------------------------------------------------------------------
# Small shared shapes
# --------------------------------------------------------------------------


class SecretKeyRef(Base):
    """A key of a Secret in the service's namespace."""

    name: SecretName = Field(description="Name of the Secret, in the same namespace as the PDInferenceService.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        "api-key", description="Key inside the Secret whose value is used."
    )


class KeyRef(Base):
    """A key of a Secret or ConfigMap, as in a Kubernetes EnvVarSource."""

    name: SecretName = Field(description="Name of the Secret or ConfigMap.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(description="Key to read.")
    optional: Optional[bool] = Field(None, description="Whether the key may be missing.")


class FieldRef(Base):
    """A field of the pod, as in a Kubernetes ObjectFieldSelector."""

    field_path: ShortStr = Field(description="Path of the pod field, e.g. status.podIP.")


class EnvVarSource(Base):
    """Where an environment variable's value comes from (one of the fields)."""

    secret_key_ref: Optional[KeyRef] = Field(None, description="A key of a Secret.")
    config_map_key_ref: Optional[KeyRef] = Field(None, description="A key of a ConfigMap.")
    field_ref: Optional[FieldRef] = Field(None, description="A field of the pod.")

    rules = (
        Rule(
            cel="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)].filter(x, x).size() == 1",
            message="valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef",
            check=lambda s: sum(x is not None for x in (s.secret_key_ref, s.config_map_key_ref, s.field_ref)) == 1,
        ),
    )


class EnvVar(Base):
    """An environment variable for the engine containers."""

    name: Annotated[str, StringConstraints(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", min_length=1, max_length=253)] = Field(
        description="Variable name."
    )
    value: Optional[Annotated[str, StringConstraints(max_length=32768)]] = Field(None, description="Literal value. Never put secrets here: use valueFrom.secretKeyRef.")
    value_from: Optional[EnvVarSource] = Field(None, description="Take the value from a Secret, ConfigMap or pod field.")

    rules = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set value or valueFrom, not both",
            check=lambda s: not (s.value is not None and s.value_from is not None),
        ),
    )


class Toleration(Base):
    """A Kubernetes toleration, e.g. for tainted GPU nodes."""

    key: Optional[ShortStr] = Field(None, description="Taint key to tolerate; empty with operator Exists means all.")
    operator: Optional[Literal["Exists", "Equal"]] = Field(None, description="Exists or Equal (default Equal).")
    value: Optional[ShortStr] = Field(None, description="Taint value for operator Equal.")
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = Field(None, description="Taint effect to tolerate; empty means all.")
    toleration_seconds: Optional[int] = Field(None, description="For NoExecute: how long the pod stays bound after the taint appears.")


class Resources(Base):
    """CPU, memory and other non-GPU resources of a container.

    GPUs are not set here: the operator requests tensorParallelSize x
    pipelineParallelSize x dataParallelSize of ``topology.gpuResourceName``.
    """

    requests: dict[QualifiedName, Quantity] = Field(default_factory=dict, description="Minimum resources, e.g. {cpu: 16, memory: 128Gi}.", max_length=16)
    limits: dict[QualifiedName, Quantity] = Field(default_factory=dict, description="Maximum resources, e.g. {memory: 256Gi}.", max_length=16)


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


class ModelSource(Base):
    """Where the engines load the weights from."""

    type: Literal["huggingface", "pvc"] = Field(
        "huggingface",
        description="huggingface: the engine downloads model.name from the Hugging Face hub into a cache volume; "
        "pvc: the weights are already on a PersistentVolumeClaim, mounted read-only at /models.",
    )
    revision: Optional[Annotated[str, StringConstraints(max_length=128, pattern=r"^[-._/a-zA-Z0-9]+$")]] = Field(
        None, description="Hugging Face revision (branch, tag or commit) to load. Pin it in production."
    )
    token_secret_ref: Optional[SecretKeyRef] = Field(
        None, description="Secret holding a Hugging Face token (HF_TOKEN) for gated models."
    )
    claim_name: Optional[DnsLabel] = Field(None, description="type pvc: the PersistentVolumeClaim holding the weights.")
    path: Optional[Annotated[str, StringConstraints(max_length=512, pattern=r"^[^.][-._/a-zA-Z0-9]*$")]] = Field(
        None, description="type pvc: directory of the weights inside the claim (relative)."
    )
    cache_claim_name: Optional[DnsLabel] = Field(
        None,
        description="type huggingface: a PersistentVolumeClaim used as the Hugging Face cache so restarts skip the download. "
        "The older spelling of model.cache {kind: pvc, claimName}: set one of the two.",
    )

    rules = (
        Rule(
            cel="self.type != 'pvc' || has(self.claimName)",
            message="source.type pvc needs source.claimName: name the PersistentVolumeClaim that holds the weights",
            check=lambda s: s.type != "pvc" or s.claim_name is not None,
            field_path=".claimName",
        ),
    )


ABS_PATH = r"^/[-._/a-zA-Z0-9]*$"
REL_PATH = r"^[^./][-._/a-zA-Z0-9]*$"


class ModelCache(Base):
    """Where the weights are kept between pod starts."""

    kind: Literal["emptyDir", "pvc", "hostPath", "image"] = Field(
        "emptyDir",
        description="emptyDir: each pod downloads the weights from the hub at every start (the default); "
        "pvc: a shared ReadWriteMany claim (claimName) used as the Hugging Face cache, filled by the first pod that "
        "starts and read by the others (the operator does not create it; start one replica first, or fill it with a "
        "Job, since the engines' download lock is in each pod's own temp directory); hostPath: a directory on each "
        "node (hostPath) used as the Hugging Face cache, filled once per node (Pod Security baseline forbids hostPath "
        "volumes: the namespace needs privileged); image: the weights are files in an OCI image (reference), mounted "
        "read-only at /models as a Kubernetes image volume (the ImageVolume feature) and loaded from /models/<path>, "
        "no download.",
    )
    claim_name: Optional[DnsLabel] = Field(None, description="kind pvc: the ReadWriteMany PersistentVolumeClaim that holds the Hugging Face cache.")
    host_path: Optional[Annotated[str, StringConstraints(max_length=512, pattern=ABS_PATH)]] = Field(
        None, description="kind hostPath: absolute directory on the node, created when missing (e.g. /var/lib/pd-operator/hf)."
    )
    reference: Optional[Annotated[str, StringConstraints(min_length=1, max_length=512)]] = Field(
        None, description="kind image: the image or OCI artifact holding the weights, as in a container image reference."
    )
    pull_policy: Optional[Literal["Always", "IfNotPresent", "Never"]] = Field(
        None, description="kind image: pull policy of the weights image (Kubernetes' default: Always for :latest, else IfNotPresent)."
    )
    path: Optional[Annotated[str, StringConstraints(max_length=512, pattern=REL_PATH)]] = Field(
        None, description="kind image: directory of the weights inside the image (relative); the image's root when unset."
    )

    rules = (
        Rule(
            cel="self.kind != 'pvc' || has(self.claimName)",
            message="model.cache kind pvc needs claimName: name a ReadWriteMany PersistentVolumeClaim (the operator does "
            "not create it) so all pods of both pools share the cache",
            check=lambda s: s.kind != "pvc" or s.claim_name is not None,
            field_path=".claimName",
        ),
        Rule(
            cel="self.kind != 'hostPath' || has(self.hostPath)",
            message="model.cache kind hostPath needs hostPath: an absolute directory on each node, e.g. /var/lib/pd-operator/hf",
            check=lambda s: s.kind != "hostPath" or s.host_path is not None,
            field_path=".hostPath",
        ),
        Rule(
            cel="self.kind != 'image' || has(self.reference)",
            message="model.cache kind image needs reference: the OCI image that holds the weights",
            check=lambda s: s.kind != "image" or s.reference is not None,
            field_path=".reference",
        ),
    )


class ModelSpec(Base):
    """The model served by both pools."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[-._/a-zA-Z0-9]+$")] = Field(
        description="Model to load: a Hugging Face id such as Qwen/Qwen3-32B."
    )
    served_name: Optional[Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[-._/:a-zA-Z0-9]+$")]] = Field(
        None,
        description="The model name clients send in requests. The same name is given to both engines and the router "
        "and shown in status. Defaults to model.name. No ':' with SGLang (its 'model:adapter' LoRA syntax).",
    )
    source: ModelSource = obj(description="Where the weights come from.", default_factory=ModelSource)
    cache: Optional[ModelCache] = Field(
        None,
        description="Where the weights are kept between pod starts: emptyDir (download at every start), pvc, hostPath "
        "or image. Unset: pvc when source.cacheClaimName is set, else emptyDir. Only with source.type huggingface.",
    )
    startup_seconds: int = Field(
        1800, ge=60, le=86400,
        description="Startup budget of an engine pod: how long the model load (download, weights to GPU, CUDA graphs) may "
        "take before the kubelet restarts the engine (the startup probe). Status shows how much of it loading pods used.",
    )
    max_model_len: Optional[int] = Field(None, ge=16, le=10_000_000, description="Maximum context length (prompt + output) in tokens; the engine's default (from the model config) when unset.")
    trust_remote_code: bool = Field(False, description="Allow the model's custom code from the hub to run in the engine.")

    rules = (
        Rule(
            cel="!has(self.cache) || !has(self.source.cacheClaimName)",
            message="model.source.cacheClaimName is the older spelling of model.cache {kind: pvc, claimName}: keep one of them",
            check=lambda s: s.cache is None or s.source.cache_claim_name is None,
            field_path=".source.cacheClaimName",
        ),
        Rule(
            cel="self.source.type != 'pvc' || !has(self.cache) || self.cache.kind == 'emptyDir'",
            message="model.cache applies to downloaded weights; with source.type pvc the weights are already on the claim: "
            "remove model.cache, or use source.type huggingface with the cache",
            check=lambda s: s.source.type != "pvc" or s.cache is None or s.cache.kind == "emptyDir",
            field_path=".cache",
        ),
        Rule(
            cel="!has(self.cache) || self.cache.kind != 'image' || !has(self.source.revision)",
            message="model.cache kind image: the image holds the weights, nothing is downloaded, so source.revision does "
            "not apply: remove it and pin the image reference instead",
            check=lambda s: s.cache is None or s.cache.kind != "image" or s.source.revision is None,
            field_path=".source.revision",
        ),
    )

    def effective_cache(self) -> ModelCache:
        """The cache in use: model.cache, else source.cacheClaimName as a pvc cache, else emptyDir."""
        if self.cache is not None:
            return self.cache
        if self.source.cache_claim_name:
            return ModelCache(kind="pvc", claim_name=self.source.cache_claim_name)
        return ModelCache()

    def downloads(self) -> bool:
        """The engine downloads the weights from the hub (into HF_HOME)."""
        return self.source.type == "huggingface" and self.effective_cache().kind != "image"


# --------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------


class EngineSpec(Base):
    """The inference engine that runs both pools."""

    kind: Literal["vllm", "sglang"] = Field(description="Inference engine: vllm or sglang.")
    version: Optional[Annotated[str, StringConstraints(max_length=32)]] = Field(
        None,
        description="Engine version the image contains; it selects the flags the operator renders. Supported: "
        + ", ".join(f"{k} {'|'.join(v)}" for k, v in ENGINE_VERSIONS.items())
        + ". Defaults to the newest supported one.",
    )
    image: Optional[Annotated[str, StringConstraints(min_length=1, max_length=512)]] = Field(
        None, description="Engine container image. Defaults to the official image of engine.version."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Image pull policy of the engine containers.")
    accelerator: Literal["nvidia", "amd"] = Field(
        "nvidia", description="GPU vendor the image is built for: nvidia (CUDA) or amd (ROCm)."
    )
    extra_args: list[Arg] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description="Extra engine flags for both pools, checked against the pinned engine's flag set. "
        "Flags the operator manages (ports, model, parallel sizes, KV transfer) are refused: use their fields.",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV, description="Extra environment variables for both pools.")
    api_key_secret_ref: Optional[SecretKeyRef] = Field(
        None,
        description="Secret key holding the engine API key. The engines then refuse requests without it, and the "
        "router sends it. Passed through the environment, never as a literal.",
    )

    rules = (
        Rule(
            cel="!has(self.version) || (self.kind == 'vllm' ? self.version in "
            + cel_list(ENGINE_VERSIONS["vllm"])
            + " : self.version in "
            + cel_list(ENGINE_VERSIONS["sglang"])
            + ")",
            message="engine.version is not supported: use "
            + " or ".join(f"{'|'.join(v)} for {k}" for k, v in ENGINE_VERSIONS.items())
            + ", or leave it empty for the default",
            check=lambda s: s.version is None or s.version in ENGINE_VERSIONS[s.kind],
            field_path=".version",
        ),
        Rule(
            cel="self.accelerator != 'amd' || has(self.image)",
            message="engine.accelerator amd needs engine.image: the default images are CUDA builds; set a ROCm image",
            check=lambda s: s.accelerator != "amd" or s.image is not None,
            field_path=".image",
        ),
    )

    def effective_version(self) -> str:
        return self.version or ENGINE_VERSIONS[self.kind][0]

    def effective_image(self) -> str:
        return self.image or ENGINE_IMAGES[self.kind].format(version=self.effective_version())


# --------------------------------------------------------------------------
# KV transfer
# --------------------------------------------------------------------------


class NixlOptions(Base):
    """NIXL transfer options (vLLM NixlConnector, SGLang nixl backend)."""

    backends: list[Literal["UCX", "LIBFABRIC"]] = Field(
        ["UCX"], min_length=1, max_length=2,
        description="NIXL backends: UCX (InfiniBand/RoCE) or LIBFABRIC (AWS EFA).",
    )
    side_channel_port: int = Field(5600, ge=1024, le=65535, description="vLLM: NIXL side-channel (handshake) port on each prefill/decode pod.")


class MooncakeOptions(Base):
    """Mooncake transfer options (vLLM MooncakeConnector, SGLang mooncake backend)."""

    protocol: Optional[Literal["rdma", "tcp"]] = Field(
        None,
        description="Mooncake transfer protocol: rdma, or tcp for clusters without RDMA (vLLM mooncake_protocol; SGLang "
        "backend mooncake_tcp). Unset: rdma when kvTransfer.rdma names a resource or IB devices, else tcp (the Ready "
        "condition says so): the engines' default, rdma, fails at start on a pod without an RDMA device.",
    )


class LMCacheOptions(Base):
    """LMCache options (vLLM LMCacheConnectorV1). With backend lmcache, KV goes
    from prefill to decode over NIXL (vllm-router's PD protocol) and LMCache
    adds a CPU and optional shared remote cache tier on both pools
    (vLLM MultiConnector: NixlConnector + LMCacheConnectorV1)."""

    remote_url: Optional[Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^[a-z]+://[^\s]+$")]] = Field(
        None,
        description="A shared LMCache backend for both pools, e.g. lm://lmcache-server.default.svc:65432 or redis://redis:6379; "
        "only the local CPU tier when unset.",
    )
    chunk_size: int = Field(256, ge=16, le=8192, description="Tokens per LMCache chunk.")
    local_cpu: bool = Field(True, description="Keep a CPU-memory tier on each pod.")
    max_local_cpu_size_gb: float = Field(5.0, gt=0, le=4096, description="Size of the CPU-memory tier per pod, in GB.")


class MoRIIOOptions(Base):
    """MoRIIO options (vLLM MoRIIOConnector, ROCm only)."""

    handshake_port: int = Field(6301, ge=1024, le=65535, description="MoRIIO handshake port on each pod.")
    notify_port: int = Field(61005, ge=1024, le=65535, description="MoRIIO notify port on each pod.")
    read_mode: bool = Field(False, description="Decode reads KV from prefill (read mode) instead of prefill writing it (write mode, the default).")


class RdmaSpec(Base):
    """RDMA NICs for the KV transfer. Resource names differ per cluster: nothing is assumed."""

    resource_name: Optional[QualifiedName] = Field(
        None,
        description="Device-plugin resource that gives a pod its RDMA NIC, e.g. rdma/rdma_shared_device_a (Mellanox shared "
        "plugin), rdma/ib, nvidia.com/hostdev (SR-IOV), vpc.amazonaws.com/efa (AWS). Unset: no RDMA resource is requested.",
    )
    count: int = Field(1, ge=1, le=32, description="How many of resourceName each engine pod requests.")
    rail_resource_names: list[QualifiedName] = Field(
        default_factory=list, max_length=16,
        description="One device-plugin resource per NIC (rail-optimised fabrics: each GPU's own NIC, e.g. "
        "[nvidia.com/rail0, ..., nvidia.com/rail7]); each engine pod requests one of each. Used alongside or instead of "
        "resourceName/count.",
    )
    gid_index: Optional[int] = Field(
        None, ge=0, le=255,
        description="RoCE GID index of the NICs (often 3 for RoCEv2): sets NCCL_IB_GID_INDEX and NVSHMEM_IB_GID_INDEX "
        "(DeepEP's internode all-to-all runs on NVSHMEM) on pools whose replicas span nodes or use deepepMode, and "
        "MC_GID_INDEX (Mooncake's KV transfer over RDMA) on every SGLang pod with kvTransfer.backend mooncake.",
    )
    traffic_class: Optional[int] = Field(
        None, ge=0, le=255,
        description="IB/RoCE traffic class (QoS) for collective traffic: sets NCCL_IB_TC and NVSHMEM_IB_TRAFFIC_CLASS "
        "on pools whose replicas span nodes or use deepepMode.",
    )
    networks: list[Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-a-z0-9./@]+$")]] = Field(
        default_factory=list, max_length=16,
        description="Multus networks to attach (k8s.v1.cni.cncf.io/networks annotation), e.g. [default/rdma-net].",
    )
    ib_devices: list[Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_]+(:[0-9]+)?$")]] = Field(
        default_factory=list, max_length=16,
        description="InfiniBand/RoCE devices to use, e.g. [mlx5_0, mlx5_1]; sets UCX_NET_DEVICES and SGLang's --disaggregation-ib-device.",
    )
    roce: bool = Field(False, description="The fabric is RoCE (Ethernet): sets UCX_IB_ADDR_TYPE=eth.")


class KVTransferSpec(Base):
    """How KV cache moves from prefill to decode."""

    backend: Optional[Literal["nixl", "mooncake", "lmcache", "moriio"]] = Field(
        None,
        description="KV transfer backend. vllm: nixl (default), lmcache, moriio (ROCm only); mooncake is refused with "
        "vllm (vllm-router 0.1.17 hands Mooncake KV to decode only for static prefill URLs, not discovered pods); "
        "sglang: mooncake (default), nixl.",
    )
    bootstrap_port: int = Field(
        8998, ge=1024, le=65535,
        description="Bootstrap port the prefill servers listen on and decode connects to "
        "(SGLang, any backend).",
    )
    nixl: NixlOptions = obj(description="Options for backend nixl.", default_factory=NixlOptions)
    mooncake: MooncakeOptions = obj(description="Options for backend mooncake.", default_factory=MooncakeOptions)
    lmcache: LMCacheOptions = obj(description="Options for backend lmcache.", default_factory=LMCacheOptions)
    moriio: MoRIIOOptions = obj(description="Options for backend moriio.", default_factory=MoRIIOOptions)
    rdma: RdmaSpec = obj(description="RDMA NICs, device-plugin resource and Multus networks.", default_factory=RdmaSpec)


# --------------------------------------------------------------------------
# Pools and autoscaling
# --------------------------------------------------------------------------


class ScalingPolicy(Base):
    """One rate limit on scaling, as in HPA v2."""

    type: Literal["Pods", "Percent"] = Field(description="Pods: at most value pods; Percent: at most value percent of the current replicas.")
    value: int = Field(ge=1, le=10000, description="Amount of change allowed per period.")
    period_seconds: int = Field(ge=1, le=1800, description="Length of the window the limit applies to.")


class ScalingRules(Base):
    """Scaling behaviour in one direction, as in HPA v2."""

    stabilization_window_seconds: Optional[int] = Field(None, ge=0, le=3600, description="Look-back window: scale-down acts on the highest, scale-up on the lowest recommendation inside it.")
    select_policy: Optional[Literal["Max", "Min", "Disabled"]] = Field(None, description="Which policy wins when several apply; Disabled forbids scaling in this direction.")
    policies: list[ScalingPolicy] = Field(default_factory=list, max_length=10, description="Rate limits; none means the defaults.")


class ScalingBehavior(Base):
    """Scale-up and scale-down behaviour, as in HPA v2."""

    scale_up: Optional[ScalingRules] = Field(None, description="Behaviour when adding replicas.")
    scale_down: Optional[ScalingRules] = Field(None, description="Behaviour when removing replicas.")


class LatencyTarget(Base):
    """The latency quantile a pool is sized to hold."""

    quantile: float = Field(0.99, ge=0.5, le=0.999, description="Quantile of the latency distribution to hold at the target, e.g. 0.99.")
    value: PositiveDuration = Field(description="Target latency above zero, e.g. 1s or 50ms.")


class PrefillTarget(LatencyTarget):
    """Prefill is sized on time to first token (TTFT)."""

    metric: Literal["ttft"] = Field("ttft", description="Signal: ttft (time to first token).")
    value: PositiveDuration = Field("1s", description="TTFT target above zero, e.g. 1s.")


class DecodeTarget(LatencyTarget):
    """Decode is sized on inter-token latency (ITL)."""

    metric: Literal["itl"] = Field("itl", description="Signal: itl (inter-token latency).")
    value: PositiveDuration = Field("50ms", description="ITL target above zero, e.g. 50ms.")


SecondaryMetric = Literal["queueDepth", "kvCacheUsage"]


class SecondaryTarget(Base):
    """A secondary signal of a pool, like an HPA v2 Pods metric with an AverageValue target: it recommends ceil(ready replicas x observed / averageValue)."""

    metric: SecondaryMetric = Field(
        description="queueDepth: requests waiting per replica (vllm:num_requests_waiting, sglang:num_queue_reqs); "
        "kvCacheUsage: fraction 0..1 of the KV cache in use per replica (vllm:kv_cache_usage_perc, sglang:token_usage). "
        "Both averaged over the pool's pods and over the query window.",
    )
    average_value: float = Field(
        gt=0.0, le=100000.0,
        description="Target average per replica: waiting requests for queueDepth (> 0), "
        "a fraction in (0, 1] for kvCacheUsage (e.g. 0.8).",
    )

    rules = (
        Rule(
            cel="self.metric != 'kvCacheUsage' || double(self.averageValue) <= 1.0",
            message="secondaryTargets: kvCacheUsage averageValue is a fraction of the KV cache: use a value in (0, 1], e.g. 0.8",
            check=lambda s: s.metric != "kvCacheUsage" or s.average_value <= 1.0,
            field_path=".averageValue",
        ),
    )


class PoolAutoscaling(Base):
    """Autoscaling of one pool (filled in by the autoscaler; off by default)."""

    enabled: bool = Field(False, description="Let the autoscaler own this pool's replicas (spec replicas is then only the starting size).")
    min_replicas: int = Field(1, ge=1, le=1000, description="Fewest replicas the autoscaler keeps.")
    max_replicas: Optional[int] = Field(None, ge=1, le=1000, description="Most replicas the autoscaler may create (required when enabled).")
    tolerance: float = Field(0.1, ge=0.0, le=1.0, description="No scaling while the signal is within this fraction of the target.")
    behavior: ScalingBehavior = obj(description="Scale-up/down stabilization windows and rate limits, as in HPA v2.", default_factory=ScalingBehavior)
    secondary_targets: list[SecondaryTarget] = Field(
        default_factory=list, max_length=len(get_args(SecondaryMetric)),
        description="Optional secondary signals, at most one per metric (queueDepth, kvCacheUsage). As with several "
        "metrics in HPA v2, each gives a recommendation and the pool takes the largest of them and of the latency "
        "target's; a secondary without data is left out (never holds the latency target back, never scales down).",
    )
    capacity_per_replica: Optional[float] = Field(
        None, gt=0.0, le=1e9,
        description="What one replica serves at the target: prompt tokens/s for prefill, generated tokens/s for "
        "decode. It sets the demand floor (the pool never gets fewer than demand / capacityPerReplica replicas). "
        "Unset: estimated from the calibrated H200 cost model when the model and the GPU are known, else latency "
        "feedback only.",
    )

    rules = (
        Rule(
            cel="!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
            message="minReplicas must be <= maxReplicas: lower minReplicas or raise maxReplicas",
            check=lambda s: s.max_replicas is None or s.min_replicas <= s.max_replicas,
            field_path=".minReplicas",
        ),
        Rule(
            cel="!self.enabled || has(self.maxReplicas)",
            message="autoscaling.enabled needs maxReplicas: set the largest size the pool may reach",
            check=lambda s: not s.enabled or s.max_replicas is not None,
            field_path=".maxReplicas",
        ),
        Rule(
            cel="!has(self.secondaryTargets) || self.secondaryTargets.all(t, self.secondaryTargets.exists_one(u, u.metric == t.metric))",
            message="secondaryTargets: at most one entry per metric (queueDepth, kvCacheUsage): remove the duplicate",
            check=lambda s: len({t.metric for t in s.secondary_targets}) == len(s.secondary_targets),
            field_path=".secondaryTargets",
        ),
    )

    def secondary_metrics(self) -> frozenset[str]:
        """The secondary signals this pool asks for (what the signal source must query)."""
        return frozenset(t.metric for t in self.secondary_targets)


class PrefillAutoscaling(PoolAutoscaling):
    """Prefill autoscaling: TTFT drives the prefill pool."""

    target: PrefillTarget = obj(description="TTFT quantile and value to hold.", default_factory=PrefillTarget)


class DecodeAutoscaling(PoolAutoscaling):
    """Decode autoscaling: ITL drives the decode pool."""

    target: DecodeTarget = obj(description="ITL quantile and value to hold.", default_factory=DecodeTarget)


class ProbeTiming(Base):
    """Timing of one Kubernetes probe of the engine: liveness on /health; readiness (and startup) on /health for
    vLLM, on /ready for SGLang."""

    period_seconds: int = Field(description="How often the probe runs.", ge=1, le=3600)
    timeout_seconds: int = Field(description="How long one probe may take.", ge=1, le=3600)
    failure_threshold: int = Field(description="Failures in a row before the pod is restarted (liveness) or taken out of the Service (readiness).", ge=1, le=1000)


class ProbesSpec(Base):
    """Liveness and readiness probe timing of the engine containers. The startup
    probe's budget for the model load is spec.model.startupSeconds."""

    liveness: ProbeTiming = obj(description="Liveness: a failing engine is restarted.",
                                default_factory=lambda: ProbeTiming(period_seconds=10, timeout_seconds=5, failure_threshold=6))
    readiness: ProbeTiming = obj(description="Readiness: a failing engine is marked NotReady (vLLM /health; SGLang "
                                 "/ready, which also fails while the engine drains, is paused or was left unhealthy "
                                 "by a failed warmup). vllm-router drops a NotReady pod; sglang-router ignores NotReady "
                                 "pods it already routes to, and its own health checks of the engines take a failing one "
                                 "out, with the strictest pool's periodSeconds and failureThreshold and the largest "
                                 "timeoutSeconds (router flags are global).",
                                 default_factory=lambda: ProbeTiming(period_seconds=5, timeout_seconds=5, failure_threshold=3))


class PoolSpec(Base):
    """One pool of engine replicas (prefill or decode)."""

    replicas: Optional[int] = Field(
        None, ge=0, le=1000,
        description="Number of replicas (pods). Unset: 1 when the pool is created, then the pool keeps its size "
        "(so an apply that omits replicas never resets a scaled pool). Ignored while autoscaling.enabled: the "
        "autoscaler owns the size, within minReplicas..maxReplicas.",
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs a model copy is split across (tensor parallelism).")
    pipeline_parallel_size: int = Field(1, ge=1, le=16, description="Pipeline stages per replica.")
    data_parallel_size: int = Field(1, ge=1, le=64, description="Data-parallel engine ranks inside one replica (vLLM --data-parallel-size, SGLang --dp-size, "
                                    "or --attn-dp-size with dataParallelAttention).")
    data_parallel_attention: bool = Field(
        False,
        description="SGLang only: dataParallelSize is the attention data-parallel width inside the tensor-parallel group "
        "(--attn-dp-size, formerly --dp-size with --enable-dp-attention): the DP ranks share the "
        "tensorParallelSize x pipelineParallelSize GPUs, and tensorParallelSize must be a multiple of dataParallelSize.",
    )
    nodes_per_replica: Optional[int] = Field(
        None, ge=1, le=128,
        description="Nodes one replica spans: one pod per node, the GPUs of the replica split evenly over them "
        "(SGLang --nnodes/--node-rank; vLLM headless data-parallel workers). Unset: 1 when the replica's GPUs fit "
        "on one node (topology.gpusPerNode), else GPUs / gpusPerNode rounded up. A replica of more than one node "
        "is rendered as a LeaderWorkerSet (one group per replica) instead of a StatefulSet.",
    )
    expert_parallel: bool = Field(
        False,
        description="Shard the MoE experts over the replica's GPUs (SGLang --ep-size tensorParallelSize; vLLM "
        "--enable-expert-parallel, expert-parallel width tensorParallelSize x dataParallelSize).",
    )
    deepep_mode: Optional[Literal["auto", "normal", "low_latency"]] = Field(
        None,
        description="DeepEP all-to-all for expert parallelism (needs expertParallel). SGLang: --moe-a2a-backend deepep "
        "--deepep-mode MODE (auto: low_latency for decode batches, normal for prefill batches). vLLM: --all2all-backend "
        "deepep_high_throughput (normal) or deepep_low_latency (low_latency); vLLM has no auto.",
    )
    gpu_product: Optional[Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[-._a-zA-Z0-9]+$")]] = Field(
        None,
        description="Required GPU model, matched against the node label topology.gpuProductLabel, e.g. NVIDIA-H200 (GPU Feature Discovery) or AMD_Instinct_MI300X_OAM (AMD node labeller).",
    )
    resources: Resources = obj(
        description="CPU/memory requests and limits of each engine container (GPUs are added by the operator). "
        "A key set neither here as a request nor as a limit gets a default request, so engine pods are never "
        "BestEffort (the first evicted): cpu 4 per GPU, memory 32Gi per GPU plus shmSize plus the LMCache CPU tier, "
        "ephemeral-storage 20Gi. No memory limit is set unless you set one.",
        default_factory=Resources,
    )
    gpu_memory_utilization: Optional[float] = Field(None, gt=0.0, lt=1.0, description="Fraction of GPU memory for weights and KV cache (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static).")
    max_running_requests: Optional[int] = Field(None, ge=1, le=65536, description="Most requests batched at once (vLLM --max-num-seqs, SGLang --max-running-requests).")
    max_batched_tokens: Optional[int] = Field(None, ge=16, le=10_000_000, description="Token budget of one scheduler step (vLLM --max-num-batched-tokens, SGLang --chunked-prefill-size).")
    enable_prefix_caching: Optional[bool] = Field(
        None,
        description="Prefix (radix) cache on or off; the engine default when unset. SGLang's default is on, except on "
        "a decode pool: its PD decode server turns the radix cache off unless given "
        "--disaggregation-decode-enable-radix-cache (experimental in SGLang), which true renders there.",
    )
    extra_args: list[Arg] = Field(default_factory=list, max_length=MAX_ARGS, description="Extra engine flags for this pool only, checked against the pinned engine's flag set.")
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV, description="Extra environment variables for this pool only.")
    node_selector: dict[QualifiedName, Annotated[str, StringConstraints(max_length=63)]] = Field(default_factory=dict, max_length=32, description="Node labels the pool's pods must match.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32, description="Tolerations for tainted (GPU) nodes.")
    priority_class_name: Optional[SecretName] = Field(None, description="PriorityClass of the pool's pods.")
    annotations: dict[QualifiedName, Annotated[str, StringConstraints(max_length=4096)]] = Field(default_factory=dict, max_length=32, description="Extra annotations on the pool's pods.")
    probes: ProbesSpec = obj(description="Liveness and readiness probe timing of this pool's engines.", default_factory=ProbesSpec)
    drain_seconds: int = Field(
        10, ge=0, le=600,
        description="On scale-down, the pod waits this long (preStop) before the engine gets SIGTERM, so the router stops "
        "sending it new requests. The engine then drains its in-flight requests for the rest of "
        f"terminationGracePeriodSeconds, less {ENGINE_TEARDOWN_MARGIN_S} s kept for its teardown "
        "(vLLM --shutdown-timeout; SGLang drains until all requests are done).",
    )
    shm_size: Quantity = Field(
        "16Gi",
        description="Size of the memory-backed /dev/shm of each pod (NCCL and the engines' shared-memory queues use it). "
        "tmpfs pages are charged to the pod's memory, so the default memory request includes it.",
    )
    pod_template: Optional[PodTemplateOverlay] = Field(
        None,
        description="Pod-template overlay for this pool's pods: a partial PodTemplateSpec (metadata.labels/annotations "
        "and spec fields such as volumes, sidecar containers, initContainers, imagePullSecrets, securityContext, "
        "hostNetwork, serviceAccountName, tolerations) merged into the rendered pod as a strategic merge patch would: "
        "containers, initContainers, volumes, imagePullSecrets and env by name, volumeMounts by mountPath, ports by "
        "containerPort, maps key by key, other lists replaced. Settings add to the engine container when the entry "
        "is named engine. Refused, with the field that sets them instead: the engine container's command and args "
        "(extraArgs, env), GPU and RDMA resources in any container (parallel sizes, kvTransfer.rdma), the ports the "
        "router and the peer pool use (any container), the operator's labels (selectors use them), its volumes and "
        "mount paths (shmSize, model.cache), and terminationGracePeriodSeconds. hostNetwork gets dnsPolicy "
        "ClusterFirstWithHostNet unless set.",
    )

    @field_validator("pod_template")
    @classmethod
    def _pod_template_shape(cls, value):
        problems = check_pod_template(value) if value is not None else []
        if problems:
            raise PydanticCustomError(
                "pd_rule", "{message}",
                {"message": "; ".join(m for _, m in problems), "rules": problems},
            )
        return value

    def desired_replicas(self, current: int | None) -> int:
        """The replica count to apply, given the pool's current size (None: not created yet).

        One writer: the spec when autoscaling is off, the autoscaler when it is
        on (it changes ``current``; here the size is only kept within bounds).
        """
        if self.autoscaling.enabled:
            base = current if current is not None else (self.replicas if self.replicas is not None else self.autoscaling.min_replicas)
            upper = self.autoscaling.max_replicas if self.autoscaling.max_replicas is not None else base
            return max(self.autoscaling.min_replicas, min(base, upper))
        if self.replicas is not None:
            return self.replicas
        return current if current is not None else 1

    def gpus_per_replica(self) -> int:
        """GPUs one replica uses. SGLang 0.5.23 gives each DP replica its own
        TP x PP GPUs (data_parallel_controller.py launch_dp_schedulers), while
        attention-DP ranks share the TP GPUs (launch_dp_attention_schedulers)."""
        if self.data_parallel_attention:
            return self.tensor_parallel_size * self.pipeline_parallel_size
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes (pods) one replica spans: nodesPerReplica, else as few as hold its GPUs."""
        if self.nodes_per_replica is not None:
            return self.nodes_per_replica
        return max(1, -(-self.gpus_per_replica() // gpus_per_node))

    def gpus_per_pod(self, gpus_per_node: int) -> int:
        """GPUs of each pod of a replica: the replica's GPUs split over its nodes
        (SGLang: tp_size * pp_size // nnodes GPUs per node, data_parallel_controller.py;
        vLLM: world_size // nnodes, arg_utils.py). A layout that does not split
        evenly is refused by the layout rule."""
        return self.gpus_per_replica() // self.nodes(gpus_per_node)

    def attention_tp_size(self) -> int:
        """The TP width KV is sharded over, which the KV transfer maps between
        pools: SGLang's attn_tp_size = tp_size // attn_dp_size (runtime_context.py)."""
        if self.data_parallel_attention and self.tensor_parallel_size % self.data_parallel_size == 0:
            return self.tensor_parallel_size // self.data_parallel_size
        return self.tensor_parallel_size  # (not a multiple: refused by its own rule)

    def engine_shutdown_timeout(self) -> int:
        """Seconds the engine may drain in-flight requests after SIGTERM: what the
        grace period leaves after the preStop sleep and the teardown margin."""
        return self.termination_grace_period_seconds - self.drain_seconds - ENGINE_TEARDOWN_MARGIN_S


def _grace_rule(pool: str) -> Rule:
    need = ENGINE_TEARDOWN_MARGIN_S + 1
    return Rule(
        cel=f"self.terminationGracePeriodSeconds >= self.drainSeconds + {need}",
        message=f"{pool}.terminationGracePeriodSeconds must be at least drainSeconds + {need}: after the preStop sleep "
        f"(drainSeconds) the engine drains in-flight requests for terminationGracePeriodSeconds - drainSeconds - "
        f"{ENGINE_TEARDOWN_MARGIN_S} s ({ENGINE_TEARDOWN_MARGIN_S} s are kept for its teardown), and with no time "
        "left it would abort them: raise terminationGracePeriodSeconds or lower drainSeconds",
        check=lambda s: s.engine_shutdown_timeout() >= 1,
        field_path=".terminationGracePeriodSeconds",
    )


def _gpus_cel(pool: str) -> str:
    p = f"self.{pool}"
    return (f"({p}.dataParallelAttention ? {p}.tensorParallelSize * {p}.pipelineParallelSize : "
            f"{p}.tensorParallelSize * {p}.pipelineParallelSize * {p}.dataParallelSize)")


def _attn_tp_cel(pool: str) -> str:
    p = f"self.{pool}"
    return (f"({p}.dataParallelAttention && {p}.tensorParallelSize % {p}.dataParallelSize == 0 ? "
            f"{p}.tensorParallelSize / {p}.dataParallelSize : {p}.tensorParallelSize)")


class PrefillPool(PoolSpec):
    """The prefill pool: reads prompts, fills KV cache, hands it to decode."""

    termination_grace_period_seconds: int = Field(120, ge=0, le=86400, description="How long a stopping prefill pod may take to finish in-flight prefills (preStop drainSeconds included). "
                                                  "SGLang keeps a prefill until decode has taken its KV, up to its 300 s "
                                                  "SGLANG_DISAGGREGATION_WAITING_TIMEOUT: with decode backed up, requests still waiting "
                                                  "when this ends are cut; raise it where decode can fall that far behind.")
    autoscaling: PrefillAutoscaling = obj(description="TTFT-driven autoscaling of the prefill pool.", default_factory=PrefillAutoscaling)

    rules = (_grace_rule("prefill"),)


class DecodePool(PoolSpec):
    """The decode pool: generates output tokens from transferred KV cache."""

    termination_grace_period_seconds: int = Field(600, ge=0, le=86400, description="How long a stopping decode pod may take to finish in-flight generations (preStop drainSeconds included).")
    autoscaling: DecodeAutoscaling = obj(description="ITL-driven autoscaling of the decode pool.", default_factory=DecodeAutoscaling)

    rules = (_grace_rule("decode"),)


# --------------------------------------------------------------------------
# Router, topology, global autoscaling
# --------------------------------------------------------------------------

RouterPolicy = Literal["cache_aware", "round_robin", "random", "power_of_two"]


class RouterServiceSpec(Base):
    """The Service clients call."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    port: int = Field(8000, ge=1, le=65535, description="Port clients connect to (OpenAI-compatible API under /v1).")
    annotations: dict[QualifiedName, Annotated[str, StringConstraints(max_length=4096)]] = Field(default_factory=dict, max_length=32, description="Annotations on the Service (e.g. for a cloud load balancer).")


class RouterSpec(Base):
    """The PD router: the one endpoint clients use. It sends each request to a
    prefill and a decode worker, which it finds by label selector. It presents
    engine.apiKeySecretRef to the workers, so the two auth layers cannot
    disagree. sglang-router 0.3.2 also requires that key from clients;
    vllm-router 0.1.17 has no client-key check of its own: put client
    authentication in the gateway or ingress in front of its Service."""

    kind: Literal["auto", "vllm-router", "sglang-router"] = Field(
        "auto", description="Router implementation; auto picks vllm-router for vllm and sglang-router for sglang."
    )
    image: Optional[Annotated[str, StringConstraints(min_length=1, max_length=512)]] = Field(None, description="Router image (required): one with the pinned router's Python package installed (vllm-router 0.1.17 or sglang-router 0.3.2), built from operator/images/router.Dockerfile. No published image is defaulted.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Image pull policy of the router.")
    replicas: int = Field(1, ge=1, le=100, description="Router replicas behind the Service.")
    prefill_policy: RouterPolicy = Field("cache_aware", description="How the router picks a prefill worker.")
    decode_policy: RouterPolicy = Field("round_robin", description="How the router picks a decode worker.")
    service: RouterServiceSpec = obj(description="The client-facing Service.", default_factory=RouterServiceSpec)
    resources: Resources = obj(description="CPU/memory of the router container.", default_factory=Resources)
    extra_args: list[Arg] = Field(default_factory=list, max_length=MAX_ARGS, description="Extra router flags, checked against the pinned router's flag set.")

    def effective_kind(self, engine_kind: str) -> str:
        return DEFAULT_ROUTER[engine_kind] if self.kind == "auto" else self.kind

    def effective_image(self, engine_kind: str) -> str:
        assert self.image is not None, "router.image is required (RouterSpec rule)"
        return self.image


class TopologySpec(Base):
    """GPU resources and placement."""

    gpu_resource_name: Optional[QualifiedName] = Field(
        None,
        description="Extended resource that counts GPUs. Unset: follows engine.accelerator, nvidia.com/gpu (NVIDIA "
        "device plugin) or amd.com/gpu (ROCm device plugin).",
    )
    gpu_product_label: Optional[QualifiedName] = Field(
        None,
        description="Node label holding the GPU model that pool gpuProduct is matched against. Unset: follows "
        "engine.accelerator, nvidia.com/gpu.product (GPU Feature Discovery) or amd.com/gpu.product-name (AMD node "
        "labeller, e.g. AMD_Instinct_MI300X_OAM).",
    )
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs on one node; a replica with more GPUs spans nodes (pool nodesPerReplica).")
    nvlink_domain_key: QualifiedName = Field(
        "nvidia.com/gpu.clique",
        description="Node label that names an NVLink domain (GB200 NVL72: nvidia.com/gpu.clique). On clusters without it use kubernetes.io/hostname.",
    )
    colocate: Literal["none", "preferred", "required"] = Field(
        "preferred",
        description="Place decode pods in the NVLink domain (nvlinkDomainKey) of prefill pods: preferred (default; a soft "
        "preference, inert on nodes without the label, e.g. HGX H100/H200, where GPU Feature Discovery sets no clique), "
        "required (decode pods only schedule in a prefill pod's domain: Pending forever where no node carries the label), "
        "or none. Unless nvlinkDomainKey is kubernetes.io/hostname, the pools also prefer different hosts: two pods on "
        "one node cannot reach each other's GPUs (separate containers), so sharing a node buys no KV bandwidth and "
        "loses a replica of both pools when it fails.",
    )
    spread_key: QualifiedName = Field("kubernetes.io/hostname", description="Topology key each pool spreads its replicas over.")


class LabelSelector(Base):
    """Labels to match, as in a Kubernetes label selector's matchLabels."""

    match_labels: dict[QualifiedName, Annotated[str, StringConstraints(max_length=63)]] = Field(default_factory=dict, max_length=16, description="Labels that must all match; empty matches everything.")


class NetworkPeer(Base):
    """Pods allowed to scrape the engines' metrics."""

    namespace_selector: Optional[LabelSelector] = Field(None, description="Namespaces the pods may be in; unset means the service's own namespace.")
    pod_selector: Optional[LabelSelector] = Field(None, description="The pods; unset means all pods of the selected namespaces.")


# Scrapers reach the engines' API port (it serves /metrics too): by default only
# Prometheus pods of the namespace named monitoring, not of any namespace.
METRICS_NAMESPACE = "monitoring"


def _default_metrics_peers() -> list:
    return [NetworkPeer(namespace_selector=LabelSelector(match_labels={"kubernetes.io/metadata.name": METRICS_NAMESPACE}),
                        pod_selector=LabelSelector(match_labels={"app.kubernetes.io/name": "prometheus"}))]


class NetworkPolicySpec(Base):
    """Who may reach the engine pods."""

    enabled: bool = Field(True, description="Render NetworkPolicies: engine ports open only to the router, the peer pool and metricsFrom; the router's API port only to clientsFrom, its metrics port to metricsFrom.")
    metrics_from: list[NetworkPeer] = Field(
        default_factory=_default_metrics_peers,
        max_length=16,
        description="Who may scrape the engines' /metrics (served on the API port, so a scraper can also reach "
        "the engine API) and the router's metrics port. Default: pods labelled app.kubernetes.io/name=prometheus "
        "in the namespace monitoring.",
        json_schema_extra={"default": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": METRICS_NAMESPACE}},
                                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]},
    )
    clients_from: list[NetworkPeer] = Field(
        default_factory=list,
        max_length=16,
        description="Who may call the router (its API port). Empty (default): every pod of the service's own "
        "namespace, nothing else: traffic from other namespaces and from outside the cluster (LoadBalancer, "
        "NodePort) is dropped; name an ingress gateway's pods here to let it in.",
    )


class PrometheusSpec(Base):
    """Where the autoscaler reads TTFT and ITL."""

    url: Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^https?://[^\s]+$")] = Field(description="Prometheus base URL, e.g. http://prometheus.monitoring.svc:9090.")
    bearer_token_secret_ref: Optional[SecretKeyRef] = Field(None, description="Secret key holding a bearer token for Prometheus.")


class GlobalAutoscaling(Base):
    """Settings shared by the two pools' autoscalers."""

    prometheus: Optional[PrometheusSpec] = Field(None, description="Prometheus that scrapes the engines.")
    interval: Duration = Field("30s", description="How often the autoscaler decides.")
    max_total_gpus: Optional[int] = Field(None, ge=1, le=100000, alias="maxTotalGPUs", description="GPU budget shared by both pools.")


# --------------------------------------------------------------------------
# Spec
# --------------------------------------------------------------------------


def _backend_cel() -> str:
    return "(has(self.kvTransfer.backend) ? self.kvTransfer.backend : (self.engine.kind == 'vllm' ? 'nixl' : 'mooncake'))"


def _router_kind_cel() -> str:
    return "(self.router.kind == 'auto' ? (self.engine.kind == 'vllm' ? 'vllm-router' : 'sglang-router') : self.router.kind)"


def _nodes_cel(pool: str) -> str:
    p = f"self.{pool}"
    gpus, gpn = _gpus_cel(pool), "self.topology.gpusPerNode"
    return f"(has({p}.nodesPerReplica) ? {p}.nodesPerReplica : ({gpus} <= {gpn} ? 1 : ({gpus} + {gpn} - 1) / {gpn}))"


def _pool_layout_rules(pool: str) -> tuple[Rule, ...]:
    """The layout of a replica over nodes, as the engines split it (tests/contract/FACTS.md, "Replicas that span nodes")."""
    gpus, nodes, gpn = _gpus_cel(pool), _nodes_cel(pool), "self.topology.gpusPerNode"
    p = f"self.{pool}"

    def pool_of(s):
        return getattr(s, pool)

    def layout_ok(s) -> bool:
        pl, g = pool_of(s), s.topology.gpus_per_node
        n = pl.nodes(g)
        return n <= pl.gpus_per_replica() and pl.gpus_per_replica() % n == 0 and pl.gpus_per_replica() // n <= g

    return (
        Rule(
            cel=f"{nodes} <= {gpus} && {gpus} % {nodes} == 0 && {gpus} / {nodes} <= {gpn}",
            message=f"{pool}: a replica's GPUs (tensorParallelSize x pipelineParallelSize, x dataParallelSize unless "
            "dataParallelAttention) must split evenly over its nodes (nodesPerReplica, or GPUs / topology.gpusPerNode "
            "rounded up), at most topology.gpusPerNode per node: SGLang refuses a tp_size x pp_size its --nnodes do not "
            "divide, vLLM a world size its --nnodes do not divide. Change nodesPerReplica or the parallel sizes",
            check=layout_ok,
            field_path=f".{pool}.nodesPerReplica",
        ),
        Rule(
            cel=f"self.engine.kind != 'sglang' || {nodes} == 1 || {p}.dataParallelSize == 1 || {p}.dataParallelAttention",
            message=f"{pool}: SGLang refuses data-parallel replicas (--dp-size) across nodes (\"multi-node data-parallel "
            "replicas are not supported; use attention DP (--attn-dp-size) across nodes\"): set dataParallelAttention "
            "true, or dataParallelSize 1, or a replica that fits one node",
            check=lambda s: s.engine.kind != "sglang" or pool_of(s).nodes(s.topology.gpus_per_node) == 1
            or pool_of(s).data_parallel_size == 1 or pool_of(s).data_parallel_attention,
            field_path=f".{pool}.dataParallelSize",
        ),
        Rule(
            cel=f"self.engine.kind != 'vllm' || {nodes} == 1 || {p}.dataParallelSize % {nodes} == 0",
            message=f"{pool}: a vLLM replica spans nodes through data parallelism: each node runs dataParallelSize / "
            "nodesPerReplica data-parallel ranks (--data-parallel-size-local; the other nodes as --headless workers with "
            "--data-parallel-start-rank), each rank on its own tensorParallelSize x pipelineParallelSize GPUs of one "
            "node, so dataParallelSize must be a multiple of the nodes (a tensor- or pipeline-parallel group across "
            "nodes is not rendered): raise dataParallelSize or lower tensorParallelSize",
            check=lambda s: s.engine.kind != "vllm" or pool_of(s).nodes(s.topology.gpus_per_node) == 1
            or pool_of(s).data_parallel_size % pool_of(s).nodes(s.topology.gpus_per_node) == 0,
            field_path=f".{pool}.dataParallelSize",
        ),
        Rule(
            # moriio_common.py get_port_offset(dp_rank, tp_rank) = dp_rank + tp_rank at the bind sites
            # (moriio_connector.py side_channel_port, moriio_common.py notify_port), and a dense model's
            # DP ranks all run as rank 0 (v1/engine/core.py reconfigure_for_independent_dp_rank)
            cel=f"{_backend_cel()} != 'moriio' || {p}.dataParallelSize == 1 || "
            f"({p}.tensorParallelSize == 1 && {p}.expertParallel)",
            message=f"{pool}: vLLM's MoRIIO connector gives each rank the handshake and notify ports base + DP rank + "
            "TP rank, so with dataParallelSize > 1 two ranks bind the same port (DP 1 / TP 0 and DP 0 / TP 1), and a "
            "dense model's DP ranks all count as rank 0; the engine then hangs at start: set dataParallelSize 1, or "
            "tensorParallelSize 1 with expertParallel true (an MoE model)",
            check=lambda s: s.backend() != "moriio" or pool_of(s).data_parallel_size == 1
            or (pool_of(s).tensor_parallel_size == 1 and pool_of(s).expert_parallel),
            field_path=f".{pool}.dataParallelSize",
        ),
        Rule(
            cel=f"!has({p}.deepepMode) || {p}.expertParallel",
            message=f"{pool}.deepepMode is the all-to-all of expert parallelism: set {pool}.expertParallel true, or unset deepepMode",
            check=lambda s: pool_of(s).deepep_mode is None or pool_of(s).expert_parallel,
            field_path=f".{pool}.deepepMode",
        ),
        Rule(
            cel=f"self.engine.kind != 'vllm' || !has({p}.deepepMode) || {p}.deepepMode != 'auto'",
            message=f"{pool}.deepepMode auto is SGLang's: vLLM's --all2all-backend has deepep_high_throughput and "
            "deepep_low_latency only: set normal or low_latency",
            check=lambda s: s.engine.kind != "vllm" or pool_of(s).deepep_mode != "auto",
            field_path=f".{pool}.deepepMode",
        ),
    )


def _divides(a: int, b: int) -> bool:
    """One of two TP sizes divides the other."""
    return a % b == 0 or b % a == 0


def _dp_attention_rule(pool: str) -> Rule:
    return Rule(
        cel=f"!self.{pool}.dataParallelAttention || self.{pool}.tensorParallelSize % self.{pool}.dataParallelSize == 0",
        message=f"{pool}: with dataParallelAttention, tensorParallelSize must be a multiple of dataParallelSize "
        "(SGLang splits the TP group into dataParallelSize attention groups): change one of them",
        check=lambda s: not getattr(s, pool).data_parallel_attention
        or getattr(s, pool).tensor_parallel_size % getattr(s, pool).data_parallel_size == 0,
        field_path=f".{pool}.dataParallelSize",
    )


def _vllm_default_step_tokens_rule(pool: str) -> Rule:
    p = f"self.{pool}"
    budget, batched = VLLM_H200_MAX_NUM_BATCHED_TOKENS, VLLM_BATCHED_DP_MAX_NUM_BATCHED_TOKENS
    tier = "H100|H200|H20"  # the GPUs of vLLM's 70-160 GiB tier (and the cost model's); not a MIG slice of them

    def ok(s) -> bool:
        q = getattr(s, pool)
        if s.engine.kind != "vllm" or q.max_batched_tokens is not None or q.max_running_requests is None:
            return True
        if q.deepep_mode == "low_latency" and q.expert_parallel and q.data_parallel_size > 1:
            return q.max_running_requests <= batched  # on every GPU
        if q.gpu_product is not None and (not re.search(f"(?i){tier}", q.gpu_product)
                                          or re.search("(?i)MIG", q.gpu_product)):
            return True
        return q.max_running_requests <= budget

    return Rule(
        # vLLM 0.33.0: an unset --max-num-batched-tokens defaults to 8192 on H100/H200
        # (engine/arg_utils.py get_batch_defaults), 256 with batched data-parallel MoE on any GPU
        # (ParallelConfig.use_batched_dp_moe, ahead of the GPU's table), raised only with chunked prefill off
        # (_set_default_max_num_seqs_and_batched_tokens_args), and the scheduler refuses a budget
        # under --max-num-seqs (config/scheduler.py SchedulerConfig.verify_max_model_len)
        cel=f"self.engine.kind != 'vllm' || has({p}.maxBatchedTokens) || !has({p}.maxRunningRequests) || "
        f"((has({p}.deepepMode) && {p}.deepepMode == 'low_latency' && has({p}.expertParallel) && "
        f"{p}.expertParallel && has({p}.dataParallelSize) && {p}.dataParallelSize > 1) ? "
        f"{p}.maxRunningRequests <= {batched} : "
        f"((has({p}.gpuProduct) && (!{p}.gpuProduct.matches('(?i){tier}') || {p}.gpuProduct.matches('(?i)MIG'))) || "
        f"{p}.maxRunningRequests <= {budget}))",
        message=f"{pool}.maxRunningRequests above vLLM's default step budget needs {pool}.maxBatchedTokens: on an "
        f"H100/H200 the budget is {budget} tokens ({batched} with deepepMode low_latency, expertParallel and "
        "dataParallelSize above 1; doubled under --performance-mode throughput) and vLLM refuses to start with fewer "
        "than --max-num-seqs (\"max_num_batched_tokens must be greater than or equal to max_num_seqs\"): set "
        f"{pool}.maxBatchedTokens to at least {pool}.maxRunningRequests, or lower {pool}.maxRunningRequests",
        check=ok,
        field_path=f".{pool}.maxRunningRequests",
    )


def _vllm_step_tokens_rule(pool: str) -> Rule:
    p = f"self.{pool}"
    return Rule(
        # vLLM 0.33.0 vllm/config/scheduler.py:331-336 (SchedulerConfig.verify_max_model_len, from __post_init__);
        # with one of the two unset vLLM lowers its default to fit (engine/arg_utils.py:3232-3234)
        cel=f"self.engine.kind != 'vllm' || !has({p}.maxBatchedTokens) || !has({p}.maxRunningRequests) || "
        f"{p}.maxBatchedTokens >= {p}.maxRunningRequests",
        message=f"{pool}.maxBatchedTokens must be at least {pool}.maxRunningRequests with vLLM: the engine refuses to "
        "start when --max-num-batched-tokens is under --max-num-seqs (\"max_num_batched_tokens must be greater than or "
        "equal to max_num_seqs\"): raise maxBatchedTokens, lower maxRunningRequests, or unset one of them",
        check=lambda s: s.engine.kind != "vllm" or getattr(s, pool).max_batched_tokens is None
        or getattr(s, pool).max_running_requests is None
        or getattr(s, pool).max_batched_tokens >= getattr(s, pool).max_running_requests,
        field_path=f".{pool}.maxBatchedTokens",
    )


def _gpu_resource_cel() -> str:
    return ("(has(self.topology.gpuResourceName) ? self.topology.gpuResourceName : "
            f"(self.engine.accelerator == 'amd' ? '{GPU_RESOURCE['amd']}' : '{GPU_RESOURCE['nvidia']}'))")


def _no_gpu_in_resources_rule(pool: str) -> Rule:
    gpu = _gpu_resource_cel()
    return Rule(
        cel=f"(!has(self.{pool}.resources.requests) || !({gpu} in self.{pool}.resources.requests)) && "
        f"(!has(self.{pool}.resources.limits) || !({gpu} in self.{pool}.resources.limits))",
        message=f"{pool}.resources must not set the GPU resource: the operator requests "
        f"tensorParallelSize x pipelineParallelSize x dataParallelSize GPUs; set those instead",
        check=lambda s: s.gpu_resource_name() not in getattr(s, pool).resources.requests
        and s.gpu_resource_name() not in getattr(s, pool).resources.limits,
        field_path=f".{pool}.resources",
    )


class PDInferenceServiceSpec(Base):
    """Desired state of a prefill/decode-disaggregated inference service."""

    model: ModelSpec = Field(description="The model both pools serve.")
    engine: EngineSpec = Field(description="The inference engine (vllm or sglang) and its image.")
    kv_transfer: KVTransferSpec = obj(description="How KV cache moves from prefill to decode.", default_factory=KVTransferSpec)
    prefill: PrefillPool = obj(description="The prefill pool.", default_factory=PrefillPool)
    decode: DecodePool = obj(description="The decode pool.", default_factory=DecodePool)
    router: RouterSpec = obj(description="The PD router and the client-facing Service.", default_factory=RouterSpec)
    topology: TopologySpec = obj(description="GPU resource names and placement.", default_factory=TopologySpec)
    autoscaling: GlobalAutoscaling = obj(description="Settings shared by both pools' autoscalers.", default_factory=GlobalAutoscaling)
    network_policy: NetworkPolicySpec = obj(description="NetworkPolicy for the engine pods.", default_factory=NetworkPolicySpec)

    rules = (
        Rule(
            cel=f"(self.engine.kind == 'vllm' ? {cel_list(ENGINE_BACKENDS['vllm'])} : {cel_list(ENGINE_BACKENDS['sglang'])}).exists(b, b == {_backend_cel()})",
            message="kvTransfer.backend is not supported by this engine: vllm supports "
            + ", ".join(ENGINE_BACKENDS["vllm"])
            + "; sglang supports "
            + ", ".join(ENGINE_BACKENDS["sglang"]),
            check=lambda s: s.backend() in ENGINE_BACKENDS[s.engine.kind],
            field_path=".kvTransfer.backend",
        ),
        Rule(
            cel=f"self.engine.kind != 'vllm' || {_backend_cel()} != 'mooncake'",
            message="kvTransfer.backend mooncake is refused with engine.kind vllm: the pinned vllm-router "
            f"{ROUTER_VERSIONS['vllm-router']} asks a Mooncake prefill for its bootstrap address only for static "
            "--prefill URLs, never for the prefill pods it discovers, so decode would get no kv_transfer_params and "
            "compute every prompt again (no disaggregation, and no error): use kvTransfer.backend nixl (or lmcache) "
            "with vllm, or engine.kind sglang for Mooncake",
            check=lambda s: s.engine.kind != "vllm" or s.backend() != "mooncake",
            field_path=".kvTransfer.backend",
        ),
        Rule(
            cel="self.engine.kind != 'vllm' || (self.prefill.tensorParallelSize % self.decode.tensorParallelSize == 0 || "
            "self.decode.tensorParallelSize % self.prefill.tensorParallelSize == 0)",
            message="vLLM's KV connectors (NixlConnector, MooncakeConnector) map tensor-parallel ranks between prefill and decode "
            "only when one tensorParallelSize divides the other (e.g. 4 and 8, 2 and 1; not 4 and 6): make one a "
            "multiple of the other",
            check=lambda s: s.engine.kind != "vllm" or _divides(s.prefill.tensor_parallel_size, s.decode.tensor_parallel_size),
            field_path=".decode.tensorParallelSize",
        ),
        Rule(
            cel=f"self.engine.kind != 'sglang' || ({_attn_tp_cel('prefill')} % {_attn_tp_cel('decode')} == 0 || "
            f"{_attn_tp_cel('decode')} % {_attn_tp_cel('prefill')} == 0)",
            message="SGLang maps attention tensor-parallel ranks between prefill and decode by integer division, so one "
            "pool's attention TP (tensorParallelSize, divided by dataParallelSize with dataParallelAttention) must divide "
            "the other's; otherwise some prefill ranks' KV is never read: make one a multiple of the other",
            check=lambda s: s.engine.kind != "sglang"
            or _divides(s.prefill.attention_tp_size(), s.decode.attention_tp_size()),
            field_path=".decode.tensorParallelSize",
        ),
        Rule(
            cel=f"self.engine.kind != 'vllm' || !({_backend_cel()} in ['nixl', 'lmcache']) || self.decode.pipelineParallelSize == 1",
            message="vLLM NixlConnector does not support pipeline parallelism on decode (kv_consumer): set "
            "decode.pipelineParallelSize 1 (prefill may use pipeline parallelism)",
            check=lambda s: s.engine.kind != "vllm" or s.backend() not in ("nixl", "lmcache")
            or s.decode.pipeline_parallel_size == 1,
            field_path=".decode.pipelineParallelSize",
        ),
        Rule(
            cel="self.engine.kind == 'sglang' || (!self.prefill.dataParallelAttention && !self.decode.dataParallelAttention)",
            message="dataParallelAttention is an SGLang setting: vLLM's data-parallel ranks each use their own "
            "tensorParallelSize GPUs; unset it",
            check=lambda s: s.engine.kind == "sglang" or not (s.prefill.data_parallel_attention or s.decode.data_parallel_attention),
            field_path=".engine.kind",
        ),
        _dp_attention_rule("prefill"),
        _dp_attention_rule("decode"),
        Rule(
            # SGLang 0.5.23 arg_groups/validation_hook.py check_server_args
            cel="self.engine.kind != 'sglang' || !has(self.model.servedName) || !self.model.servedName.contains(':')",
            message="SGLang refuses a served model name with a colon: \"served_model_name cannot contain a colon (':') "
            "character. The colon is reserved for the 'model:adapter' syntax used in LoRA adapter specification\": "
            "choose a model.servedName without ':'",
            check=lambda s: s.engine.kind != "sglang" or ":" not in (s.model.served_name or ""),
            field_path=".model.servedName",
        ),
        Rule(
            cel="!has(self.kvTransfer.mooncake.protocol) || self.kvTransfer.mooncake.protocol != 'rdma' || "
            "has(self.kvTransfer.rdma.resourceName) || (has(self.kvTransfer.rdma.ibDevices) && size(self.kvTransfer.rdma.ibDevices) > 0) || "
            "(has(self.kvTransfer.rdma.railResourceNames) && size(self.kvTransfer.rdma.railResourceNames) > 0)",
            message="kvTransfer.mooncake.protocol rdma needs an RDMA device in the pods (the Mooncake transfer engine fails "
            "to start without one): set kvTransfer.rdma.resourceName (and ibDevices), or protocol tcp, or leave protocol "
            "unset to get tcp without RDMA",
            check=lambda s: s.kv_transfer.mooncake.protocol != "rdma" or s.rdma_configured(),
            field_path=".kvTransfer.mooncake.protocol",
        ),
        Rule(
            cel=f"{_backend_cel()} != 'moriio' || self.engine.accelerator == 'amd'",
            message="kvTransfer.backend moriio (vLLM MoRIIOConnector) runs on AMD ROCm only: set engine.accelerator amd "
            "with a ROCm vLLM image, or use nixl on NVIDIA GPUs",
            check=lambda s: s.backend() != "moriio" or s.engine.accelerator == "amd",
            field_path=".kvTransfer.backend",
        ),
        Rule(
            cel=f"{_backend_cel()} != 'moriio' || self.router.replicas == 1",
            message="kvTransfer.backend moriio: vllm-router learns MoRIIO workers only from their registration "
            "heartbeats, which each engine sends to one address (the router's discovery Service, so one router pod): "
            "set router.replicas 1",
            check=lambda s: s.backend() != "moriio" or s.router.replicas == 1,
            field_path=".router.replicas",
        ),
        Rule(
            cel=f"{_router_kind_cel()} == (self.engine.kind == 'vllm' ? 'vllm-router' : 'sglang-router')",
            message="router.kind must match the engine: vllm-router for vllm, sglang-router for sglang (or auto)",
            check=lambda s: s.router_kind() == DEFAULT_ROUTER[s.engine.kind],
            field_path=".router.kind",
        ),
        Rule(
            cel="has(self.router.image)",
            message="router.image is required: no published image carries the pinned router's Python launcher. Build "
            "and push one, then set router.image to it: "
            + "; ".join(f"for {k}: " + ROUTER_IMAGE_RECIPE.format(kind=k, version=v) for k, v in ROUTER_VERSIONS.items()),
            check=lambda s: s.router.image is not None,
            field_path=".router.image",
        ),
        *_pool_layout_rules("prefill"),
        *_pool_layout_rules("decode"),
        _no_gpu_in_resources_rule("prefill"),
        _no_gpu_in_resources_rule("decode"),
        _vllm_step_tokens_rule("prefill"),
        _vllm_step_tokens_rule("decode"),
        _vllm_default_step_tokens_rule("prefill"),
        _vllm_default_step_tokens_rule("decode"),
    )

    # Defaults that depend on other fields: resolved on read, never stored.
    def served_model_name(self) -> str:
        return self.model.served_name or self.model.name

    def backend(self) -> str:
        return self.kv_transfer.backend or DEFAULT_BACKEND[self.engine.kind]

    def router_kind(self) -> str:
        return self.router.effective_kind(self.engine.kind)

    def gpu_resource_name(self) -> str:
        """The extended resource that counts GPUs: the one set, else the accelerator's device plugin's."""
        return self.topology.gpu_resource_name or GPU_RESOURCE[self.engine.accelerator]

    def gpu_product_label(self) -> str:
        """The node label gpuProduct is matched against: the one set, else the accelerator's labeller's."""
        return self.topology.gpu_product_label or GPU_PRODUCT_LABEL[self.engine.accelerator]

    def rdma_configured(self) -> bool:
        rdma = self.kv_transfer.rdma
        return bool(rdma.resource_name or rdma.ib_devices or rdma.rail_resource_names)

    def mooncake_protocol(self) -> str:
        """The Mooncake protocol the engines get: the one set, else rdma only when the pods get an RDMA device."""
        return self.kv_transfer.mooncake.protocol or ("rdma" if self.rdma_configured() else "tcp")

    def pool(self, role: str) -> "PrefillPool | DecodePool":
        """The pool of a role: ``prefill`` or ``decode``."""
        return self.prefill if role == "prefill" else self.decode


# --------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------


class Condition(Base):
    """A status condition, following the Kubernetes conventions."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(description="Ready, PrefillReady, DecodeReady, RouterReady, Progressing, Degraded, AutoscalingActive or MetricsAvailable.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Optional[Annotated[str, StringConstraints(max_length=128)]] = Field(None, description="One-word CamelCase reason.")
    message: Optional[Annotated[str, StringConstraints(max_length=32768)]] = Field(None, description="What is wrong and how to fix it.")
    last_transition_time: Optional[str] = Field(None, description="When status last changed (RFC 3339).", json_schema_extra={"format": "date-time"})
    observed_generation: Optional[int] = Field(None, ge=0, description="The metadata.generation this condition was computed from.")


class AutoscalerMemory(Base):
    """What the autoscaler remembers of a pool between rounds (its stabilization windows and rate limits),
    kept in status so that the replica taking over after a failover decides as the one before would have."""

    recommendations: list[Annotated[list[float], Field(min_length=2, max_length=2)]] = Field(
        default_factory=list, max_length=64, description="Recent recommendations: [unix time, replicas].")
    changes: list[Annotated[list[float], Field(min_length=3, max_length=3)]] = Field(
        default_factory=list, max_length=64, description="Recent resizes: [unix time, from, to].")
    capacity_factor: Optional[float] = Field(
        None, ge=0.0, le=1.0, description="Per-replica capacity observed at saturation over the estimate's (1: as estimated).")
    step_ratio: Optional[float] = Field(
        None, ge=0.0, le=10.0, description="The engines' measured step time over the cost model's (0.8: 20% faster).")
    start_seconds: Optional[float] = Field(
        None, ge=0.0, description="Seconds from the last scale-up to its pods Ready, as observed.")
    demands: list[Annotated[list[float], Field(min_length=2, max_length=2)]] = Field(
        default_factory=list, max_length=64, description="Recent offered demand: [unix time, tokens/s] (the trend).")
    saturated_since: Optional[float] = Field(
        None, ge=0.0, description="Unix time since when the pool has been saturated without a break (the capacity "
        "correction waits for a whole rate window of it).")
    futile: Optional[float] = Field(
        None, ge=0.0, description="Latency (seconds) that adding replicas was shown not to lower: the latency "
        "feedback is left out until the latency is back within the target's band.")
    overloads: list[Annotated[list[float], Field(min_length=4, max_length=4)]] = Field(
        default_factory=list, max_length=64, description="Sizes seen above the latency target's band, the newest per "
        "size: [unix time, ready replicas, tokens/s each replica produced, latency (seconds)]. For an hour, unless "
        "refuted, a scale-down does not go back to one while the load per replica it would carry is at least that "
        "less the tolerance.")
    basis: Optional[Annotated[str, StringConstraints(max_length=64)]] = Field(
        None, description="Digest of the engine, model and pool settings capacityFactor and stepRatio were learned on; "
        "a change of them forgets both.")


class PoolStatus(Base):
    """Observed state of one pool."""

    replicas: int = Field(0, ge=0, description="Pods that exist.")
    ready_replicas: int = Field(0, ge=0, description="Pods that are Ready.")
    desired_replicas: int = Field(0, ge=0, description="Replicas the operator (or the autoscaler) wants.")
    pending_replicas: int = Field(0, ge=0, description="Pods not scheduled yet.")
    last_scale_time: Optional[str] = Field(None, description="When the pool was last resized (RFC 3339).", json_schema_extra={"format": "date-time"})
    last_scale_reason: Optional[Annotated[str, StringConstraints(max_length=SCALE_REASON_MAX)]] = Field(None, description="Why the pool was last resized.")
    autoscaler: Optional[AutoscalerMemory] = Field(None, description="The autoscaler's memory of this pool (written by the autoscaler).")


class MetricsStatus(Base):
    """Latest latency figures seen by the autoscaler."""

    ttft: Optional[Annotated[str, StringConstraints(max_length=32)]] = Field(
        None, description="The prefill pool's time to first token at the quantile its autoscaling targets, e.g. 420ms p99.")
    itl: Optional[Annotated[str, StringConstraints(max_length=32)]] = Field(
        None, description="The decode pool's inter-token latency at the quantile its autoscaling targets, e.g. 31ms p99.")
    request_rate: Optional[Annotated[str, StringConstraints(max_length=32)]] = Field(None, description="Requests per second.")
    observed_at: Optional[str] = Field(None, description="When these figures were read (RFC 3339).", json_schema_extra={"format": "date-time"})


class PDInferenceServiceStatus(Base):
    """Observed state, written by the operator."""

    observed_generation: Optional[int] = Field(None, ge=0, description="The metadata.generation the operator last acted on.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16,
        description="Ready, PrefillReady, DecodeReady, RouterReady, Progressing, Degraded, AutoscalingActive, MetricsAvailable.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: PoolStatus = obj(description="The prefill pool.", default_factory=PoolStatus)
    decode: PoolStatus = obj(description="The decode pool.", default_factory=PoolStatus)
    prefill_ready: Optional[Annotated[str, StringConstraints(max_length=32)]] = Field(None, description="Prefill ready/desired, for kubectl get.")
    decode_ready: Optional[Annotated[str, StringConstraints(max_length=32)]] = Field(None, description="Decode ready/desired, for kubectl get.")
    served_model_name: Optional[Annotated[str, StringConstraints(max_length=256)]] = Field(None, description="The model name clients send.")
    endpoint: Optional[Annotated[str, StringConstraints(max_length=512)]] = Field(None, description="The URL clients call, e.g. http://NAME-router.NS.svc:8000/v1.")
    metrics: MetricsStatus = obj(description="Latest TTFT/ITL figures.", default_factory=MetricsStatus)


# --------------------------------------------------------------------------
# The resource
# --------------------------------------------------------------------------


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads; the rest passes through."""

    model_config = ConfigDict(extra="allow")
    name: Annotated[str, StringConstraints(pattern=DNS_LABEL, min_length=1, max_length=40)] = Field(
        description="Name of the service (a DNS label of at most 40 characters, so child names stay valid)."
    )
    namespace: Optional[DnsLabel] = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PDInferenceService(BaseModel):
    """A prefill/decode-disaggregated LLM inference service."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: Literal[API_VERSION] = Field(API_VERSION, alias="apiVersion")  # type: ignore[valid-type]
    kind: Literal[KIND] = KIND  # type: ignore[valid-type]
    metadata: ObjectMeta
    spec: PDInferenceServiceSpec
    status: Optional[PDInferenceServiceStatus] = None
