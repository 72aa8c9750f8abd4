"""Names and pinned versions shared by the API, the CRD and the renderer."""

GROUP = "pdserving.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PDInferenceService"
PLURAL = "pdinferenceservices"
SINGULAR = "pdinferenceservice"
SHORT_NAMES = ["pdservice", "pdservices", "pds"]
CATEGORIES = ["pd"]

# Engine versions whose flags the renderer emits, verified against the engines'
# own argument parsers (operator/pd_operator/render/engines/flagsets/).
# The first entry of each tuple is the default.
ENGINE_VERSIONS: dict[str, tuple[str, ...]] = {
    "vllm": ("0.33.0",),
    "sglang": ("0.5.23",),
}
ROUTER_VERSIONS: dict[str, str] = {
    "vllm-router": "0.1.17",
    "sglang-router": "0.3.2",
}

# Default images, pinned to the versions above.
ENGINE_IMAGES: dict[str, str] = {
    "vllm": "docker.io/vllm/vllm-openai:v{version}",
    "sglang": "docker.io/lmsysorg/sglang:v{version}",
}
# Router images: none is defaulted. No upstream image is known to hold the pinned
# router's Python launcher (the render runs `python -m <router>.launch_router`):
# the SGLang engine image builds sgl-router from its own source tree at whatever
# version that tag carries, and vllm-project/router publishes vllm/vllm-router
# with the Rust binary as its command (tests/contract/FACTS.md, "Images").
# spec.router.image is required; this is the recipe the error gives.
ROUTER_IMAGE_RECIPE = (
    "docker build -f operator/images/router.Dockerfile --build-arg ROUTER={kind} --build-arg VERSION={version} "
    "-t <registry>/{kind}:{version} . && docker push <registry>/{kind}:{version}"
)

# Which KV-transfer backends each engine can use for PD disaggregation.
ENGINE_BACKENDS: dict[str, tuple[str, ...]] = {
    "vllm": ("nixl", "mooncake", "lmcache", "moriio"),
    "sglang": ("mooncake", "nixl"),
}
DEFAULT_BACKEND: dict[str, str] = {"vllm": "nixl", "sglang": "mooncake"}
DEFAULT_ROUTER: dict[str, str] = {"vllm": "vllm-router", "sglang": "sglang-router"}

# Per engine.accelerator: the device plugin's GPU resource and the node label
# with the GPU model (tests/contract/FACTS.md, "Node labels of real GPU
# clusters": NVIDIA k8s-device-plugin and GPU Feature Discovery; ROCm
# k8s-device-plugin and its node labeller). Used when topology leaves them unset.
GPU_RESOURCE: dict[str, str] = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
GPU_PRODUCT_LABEL: dict[str, str] = {"nvidia": "nvidia.com/gpu.product", "amd": "amd.com/gpu.product-name"}

# Label keys the operator puts on everything it creates.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_VERSION = "app.kubernetes.io/version"
ROLES = ("prefill", "decode")   # the engine pools of a service, in this order

LABEL_ROLE = f"{GROUP}/role"          # prefill | decode | router
LABEL_SERVICE = f"{GROUP}/service"    # the PDInferenceService name
LABEL_ENGINE = f"{GROUP}/engine"      # vllm | sglang

# Seconds of the grace period kept for the engine's teardown after it has
# drained (processes exit, GPU memory released). vLLM 0.33.0 gives its engine
# process 15 s for that on ROCm (v1/engine/utils.py,
# ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S); the same window is kept on CUDA.
ENGINE_TEARDOWN_MARGIN_S = 15
